"""The ``trash-panda`` console command: the same code as the native binary, through the binding."""

from __future__ import annotations

import sys

from . import _core


def main() -> None:
    sys.exit(_core.cli_main(["trash-panda", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
