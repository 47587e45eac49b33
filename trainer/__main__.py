"""Entry point of ``python -m trainer`` and ``torchrun -m trainer``; see trainer.cli."""

import sys

from trainer.cli import main

if __name__ == "__main__":
    sys.exit(main())
