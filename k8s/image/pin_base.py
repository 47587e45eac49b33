"""The base image's Python environment as pip constraints, and the check that it
is still what it was.

    python3 pin_base.py > base-constraints.txt          # name==version, every distribution installed
    python3 pin_base.py --check base-constraints.txt    # exit 1 if one changed or went away

k8s/image/Dockerfile writes the constraints before it installs anything and
hands them to every ``pip install`` (``-c``): runmgr's dependencies are added
to the base's environment, none of the base's packages is replaced. torch above
all: the base's build is the one its CUDA or CANN, its Transformer Engine,
apex, torch_npu and MindSpeed were built against. After the installs it checks
that every pinned version is still installed. Only the standard library is
used: the base's Python is all there is.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys

REQUIRED = "torch"
"""The distribution the base must hold: the recipe installs no torch of its own."""
_LOCAL_OR_PUBLIC = re.compile(r"^v?(\d+!)?\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?(\+[a-z0-9]+([._-][a-z0-9]+)*)?$",
                              re.IGNORECASE)
"""A PEP 440 version pip can pin (2.6.0a0+ecf3bae40a.nv25.01 included); others cannot be constraints."""


def canonical(name: str) -> str:
    """PEP 503's normalised name: Transformer_Engine and transformer-engine are one."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed() -> dict[str, str]:
    """Canonical name -> version of every distribution on sys.path (the first one where
    a name is installed twice: the one Python imports)."""
    found: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name, version = dist.metadata["Name"], dist.version
        if name and version:
            found.setdefault(canonical(name), version)
    return found


def constraints(versions: dict[str, str]) -> tuple[list[str], list[str]]:
    """(``name==version`` lines, names whose version pip cannot pin)."""
    pinned = [f"{name}=={version}" for name, version in sorted(versions.items()) if _LOCAL_OR_PUBLIC.match(version)]
    unpinnable = [f"{name} {version}" for name, version in sorted(versions.items())
                  if not _LOCAL_OR_PUBLIC.match(version)]
    return pinned, unpinnable


def read_constraints(text: str) -> dict[str, str]:
    return {canonical(name): version for name, _, version in
            (line.partition("==") for line in text.splitlines() if line.strip() and not line.startswith("#"))}


def changes(pinned: dict[str, str], now: dict[str, str]) -> list[str]:
    """What is no longer as pinned: one line per distribution."""
    return [f"{name} {version} -> {now.get(name, 'removed')}" for name, version in sorted(pinned.items())
            if now.get(name) != version]


def main(argv: list[str]) -> int:
    now = installed()
    if argv[:1] == ["--check"] and len(argv) == 2:
        with open(argv[1], encoding="utf-8") as handle:
            changed = changes(read_constraints(handle.read()), now)
        for line in changed:
            print(f"pin_base: the base's {line}", file=sys.stderr)
        return 1 if changed else 0
    if argv:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    if REQUIRED not in now:
        print(f"pin_base: no {REQUIRED} in this Python ({sys.executable}): BASE must be an image with its own "
              f"torch (NGC PyTorch, a MindSpeed-LLM / CANN image)", file=sys.stderr)
        return 1
    pinned, unpinnable = constraints(now)
    print(f"# {sys.executable}: every distribution of the base, pinned")
    for name in unpinnable:
        print(f"# not pinnable (not a PEP 440 version): {name}")
    print("\n".join(pinned))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
