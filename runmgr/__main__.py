import sys

from runmgr.cli import main

sys.exit(main())
