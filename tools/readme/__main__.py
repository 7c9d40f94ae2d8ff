"""`python -m tools.readme [--check] [--results DIR] [FILE ...]`: rewrite (or check) generated blocks.

Without FILE: README.md and every docs/**/*.md of this checkout. Exit 0 when every block matches
(or was rewritten), 1 with --check when some differ (naming the file and the blocks), 2 when a
block is unknown or a results file it reads is missing (naming it).
"""

from __future__ import annotations

import argparse
import sys
from typing import Sequence

from . import generated_files, update_file


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite or check the generated blocks of the given markdown files; returns the exit status."""
    parser = argparse.ArgumentParser(prog="python -m tools.readme", description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", metavar="FILE",
                        help="markdown files (default: README.md and docs/**/*.md of this checkout)")
    parser.add_argument("--results", metavar="DIR", help="the results folder (default: results/ of this checkout)")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 naming the blocks that differ from what the results give")
    args = parser.parse_args(argv)
    files = args.files or generated_files()
    differing = 0
    for path in files:
        try:
            names = update_file(path, args.results, check=args.check)
        except (KeyError, ValueError, OSError) as exc:
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
            print(f"{path}: error: {message}", file=sys.stderr)
            return 2
        if names and args.check:
            differing += 1
            print(f"{path}: generated blocks differ from the results files: {', '.join(names)}; "
                  f"run `python -m tools.readme`")
        elif names:
            print(f"{path}: rewrote {len(names)} block(s): {', '.join(names)}")
    if args.check and not differing:
        print(f"every generated block of {len(files)} file(s) matches the results files")
    return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
