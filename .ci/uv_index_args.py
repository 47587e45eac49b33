"""Where pip installs from, as ``uv pip install`` arguments: ``make setup`` installs with uv
(about 15 s against pip's 70 s on an idle 2-core machine, and 18 s against 3.5 min on a
loaded one), and uv reads no pip configuration. A machine whose pip is pointed at a mirror,
a folder of wheels or a constraints file (CI's: ``pip config list``) gets the same packages
from uv as from pip; a machine with no pip configuration gets uv's default, PyPI, as pip's.

Prints one line of shell words. pip's settings are read with ``pip config list`` (its own
precedence: environment over the ``install`` section over ``global``). A setting that changes
what is installed and that uv cannot take is refused in one line (exit 2), never dropped;
settings that do not (timeouts, the version check) need no counterpart.
"""

from __future__ import annotations

import ast
import shlex
import subprocess
import sys

FLAGS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url",
         "find-links": "--find-links", "constraint": "--constraint"}
"""pip's settings that say where packages come from, and uv's flag for each (several values
allowed, space-separated, as in pip's configuration)."""
SWITCHES = {"no-index": "--no-index", "pre": "--prerelease=allow"}
"""pip's yes/no settings that change what is installed, and uv's flag for each."""
NO_EFFECT = {"timeout", "default-timeout", "disable-pip-version-check", "cert", "quiet", "verbose",
             "progress-bar", "no-cache-dir", "cache-dir", "root-user-action", "retries", "no-color",
             "break-system-packages", "trusted-host", "proxy", "no-input", "no-warn-script-location"}
"""pip's settings that do not change which packages are installed (``cert``, ``proxy`` and
``trusted-host`` only say how to reach an index: uv reads the system's certificates and the
usual proxy variables itself)."""
PRECEDENCE = (":env:", "install", "global")


def effective_settings(listing: str) -> dict[str, str]:
    """``pip config list``'s lines (``section.key='value'``), one value per key by pip's own
    precedence."""
    found: dict[str, dict[str, str]] = {}
    for line in listing.splitlines():
        name, _, value = line.partition("=")
        section, _, key = name.rpartition(".")
        if section and key:
            found.setdefault(key, {})[section] = ast.literal_eval(value)
    return {key: next(by[s] for s in PRECEDENCE if s in by)
            for key, by in found.items() if any(s in by for s in PRECEDENCE)}


def uv_arguments(settings: dict[str, str]) -> list[str]:
    """uv's flags for pip's settings; ValueError names a setting uv cannot take."""
    words: list[str] = []
    for key, value in sorted(settings.items()):
        if key in FLAGS:
            for item in value.split():
                words += [FLAGS[key], item]
        elif key in SWITCHES:
            if value.strip().lower() in ("1", "true", "yes", "on"):
                words.append(SWITCHES[key])
        elif key not in NO_EFFECT:
            raise ValueError(f"pip's setting {key!r} has no uv counterpart here: install with "
                             f"`make setup INSTALLER=pip`, or add it to .ci/uv_index_args.py")
    return words


def main() -> int:
    listing = subprocess.run([sys.executable, "-m", "pip", "config", "list"], check=True,
                             capture_output=True, text=True).stdout
    try:
        print(shlex.join(uv_arguments(effective_settings(listing))))
    except ValueError as refusal:
        print(f"make setup: {refusal}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
