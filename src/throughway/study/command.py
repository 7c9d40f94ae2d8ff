"""The command that made a study's results, as its results.json records it (`command_line`)."""

from __future__ import annotations

import contextlib
import contextvars
import shlex
import sys
from typing import Iterator, Sequence

__all__ = ["invoked_with", "command_line"]

# The arguments `throughway.cli.main` parsed, while it runs (`invoked_with`); None outside it.
_INVOKED: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar("throughway_invoked", default=None)


@contextlib.contextmanager
def invoked_with(argv: Sequence[str]) -> Iterator[None]:
    """While the block runs, `command_line()` is `throughway ARGV...`: the arguments `cli.main` parsed,
    which differ from the process's sys.argv when main([...]) is called from Python."""
    token = _INVOKED.set(tuple(argv))
    try:
        yield
    finally:
        _INVOKED.reset(token)


def command_line() -> str:
    """The command that made the results, shell-quoted, with the console script's name: the arguments
    `cli.main` parsed (`invoked_with`), else the process's sys.argv (a study run from Python)."""
    invoked = _INVOKED.get()
    if invoked is not None:
        return " ".join(shlex.quote(a) for a in ("throughway", *invoked))
    argv = list(sys.argv)
    if argv and (argv[0].endswith("throughway") or argv[0].endswith("__main__.py") or argv[0] == "-m"):
        argv[0] = "throughway"
    return " ".join(shlex.quote(a) for a in argv)
