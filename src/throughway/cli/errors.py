"""How the command line tells the user's mistakes from the toolkit's own bugs.

Bad input (an option out of range, a file that does not hold what it should) is the user's to fix: a
one-line message and exit status 2. A bug is ours: its traceback, so that it can be found, and a line
asking for a report, exit status 1. The two are told apart by where the exception began, not by its
type, because a `KeyError` is bad input when the toolkit raises it naming an unknown model and a bug
when a typo in the package looks up a field that does not exist:

* `raised_on_purpose`: the exception began at a `raise` statement in throughway's own source. Every
  check of the user's input is such a statement (with a message naming the option, the file or the
  field); an exception that began anywhere else (a subscript, an attribute, a call into Python or a
  library) is one that no check of ours meant to raise. An `AssertionError` is an invariant of the
  code, never input, wherever it began.
* `is_environment_error`: the machine's limits, which no code can prevent and the user can fix: an
  `OSError` (a missing or unreadable file, no permission, a full disk, no network) and running out of
  memory.

Two commands do nothing but read files a user may have edited: `report` (a study's results.json) and
`analyze redraw` (an analysis folder's JSON files). For them the whole command is the checked boundary:
cli.commands says an exception while they read as the file's fault, naming the file. A study's
`reproduce` trains too, so there an exception no check raised is a bug, never blamed on its files.
"""

from __future__ import annotations

import dis
import shlex
import sys
import traceback
from pathlib import Path
from types import CodeType, TracebackType
from typing import TextIO

__all__ = ["raised_on_purpose", "is_environment_error", "is_input_error", "error_message", "report_bug",
           "ISSUE_TRACKER"]

# The package's own source folder: a `raise` in it is the toolkit's; one in a test or a library is not.
_PACKAGE = Path(__file__).resolve().parent.parent

ISSUE_TRACKER = "throughway's issue tracker"
"""Where a bug is reported, unless the installed package names its tracker (`_issue_tracker`)."""


def _innermost(tb: TracebackType) -> TracebackType:
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def _in_package(code: CodeType) -> bool:
    try:
        return Path(code.co_filename).resolve().is_relative_to(_PACKAGE)
    except (OSError, ValueError):  # a code object without a real file ("<string>")
        return False


def _is_raise(code: CodeType, offset: int) -> bool:
    """Whether the instruction at `offset` of `code` is a `raise` statement's (RAISE_VARARGS): not a
    subscript, an attribute lookup or a call, whose exceptions Python or a library raised."""
    return any(ins.offset == offset and ins.opname == "RAISE_VARARGS" for ins in dis.get_instructions(code))


def raised_on_purpose(exc: BaseException) -> bool:
    """Whether `exc` began at a `raise` statement in throughway's own source (see the module docstring).

    Follows the traceback to the frame where the exception began: an exception re-raised unchanged (a
    bare `raise`) keeps that frame, so it is judged where it began; one raised anew from a caught one
    (`raise ValueError(...) from exc`) began at that new `raise`, a deliberate translation."""
    if exc.__traceback__ is None or isinstance(exc, AssertionError):
        return False
    tb = _innermost(exc.__traceback__)
    return _in_package(tb.tb_frame.f_code) and _is_raise(tb.tb_frame.f_code, tb.tb_lasti)


def is_environment_error(exc: BaseException) -> bool:
    """Whether `exc` is the machine's limit rather than the toolkit's fault: an OSError (a file, a
    permission, a full disk, the network) or running out of memory (host or device)."""
    if isinstance(exc, (OSError, MemoryError)):
        return True
    torch = sys.modules.get("torch")  # only a run that imported torch can run out of device memory
    out_of_memory = getattr(getattr(torch, "cuda", None), "OutOfMemoryError", None)
    return out_of_memory is not None and isinstance(exc, out_of_memory)


def is_input_error(exc: BaseException) -> bool:
    """Whether the command line should report `exc` as a message and exit status 2: raised on purpose
    by one of the toolkit's checks, or the environment's (`is_environment_error`). Anything else is a bug."""
    return raised_on_purpose(exc) or is_environment_error(exc)


def error_message(exc: BaseException) -> str:
    """`exc` as the one line after "throughway: error: ": a KeyError's message without the quotes
    `str()` adds, an OSError from `_io.WriteError` by its message (which names the file)."""
    if isinstance(exc, KeyError) and exc.args:
        return str(exc.args[0])
    if isinstance(exc, OSError) and exc.filename is None and len(exc.args) == 2:
        return str(exc.args[1])  # WriteError: its message already names the file
    return str(exc)


def _issue_tracker() -> str:
    """The installed package's issue tracker (a Project-URL labelled Issues, Bug Tracker, ...), else
    `ISSUE_TRACKER`."""
    from importlib.metadata import PackageNotFoundError, metadata

    try:
        urls = metadata("throughway").get_all("Project-URL") or []
    except PackageNotFoundError:
        return ISSUE_TRACKER
    for entry in urls:
        label, _, url = entry.partition(",")
        if any(word in label.lower() for word in ("issue", "bug", "tracker")) and url.strip():
            return url.strip()
    return ISSUE_TRACKER


def report_bug(exc: BaseException, argv: list[str], stream: TextIO | None = None) -> None:
    """Print `exc`'s traceback and a line asking for a bug report that says where and with what: the
    command (`argv`) and the traceback."""
    stream = stream if stream is not None else sys.stderr
    traceback.print_exception(exc, file=stream)
    command = shlex.join(["throughway", *argv])
    print(f"throughway: internal error: this is a bug in throughway, not in your input. Please report it at "
          f"{_issue_tracker()} with the command ({command}) and the traceback above.", file=stream, flush=True)
