"""Docs page "Command line": every `throughway` command's `--help`, generated from the argparse parser.

The page (docs/cli.md) holds one generated block, `cli-reference`, so `python -m tools.readme --check`
fails when an option is added, renamed or re-documented and the page was not regenerated.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Iterator

# The help text is wrapped at this width whatever the terminal, so the page does not depend on it.
WIDTH = 100


def _commands(parser: argparse.ArgumentParser, prog: str) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    """(full command, parser) of `parser` and of every sub-command under it, depth first, in declaration order."""
    yield prog, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{prog} {name}")


def cli_reference(root: Path) -> str:
    """Markdown: one section per command with its `--help` as printed at WIDTH columns (`root` is unused:
    the page is rendered from the parser, not from results files)."""
    from throughway.cli import build_parser

    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(WIDTH)
    try:
        parts = []
        for prog, parser in _commands(build_parser(), "throughway"):
            parser.prog = prog
            level = "#" * min(4, 1 + prog.count(" "))
            parts += [f"#{level} `{prog}`", "", "```text", parser.format_help().rstrip(), "```", ""]
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    return "\n".join(parts)
