"""The ``trash-panda`` console command: the same code as the native binary, through the binding,
plus ``generate``, which runs a model with torch and so lives here (see generate.py)."""

from __future__ import annotations

import sys

from . import _core


def main() -> None:
    args = sys.argv[1:]
    if args[:1] == ["generate"]:
        from .generate import main as generate

        sys.exit(generate(args[1:]))
    sys.exit(_core.cli_main(["trash-panda", *args]))


if __name__ == "__main__":
    main()
