"""Which files of throughway a command goes through, and how often it goes back.

    python tools/trace_calls.py [--outside-loop] [--list] -- train --model mlp_gated_residual --depth 2 ...

Runs `throughway.cli.main(ARGS)` in this process under `sys.setprofile` and records the *first* call
of every function defined in the package's source (src/throughway, or wherever `throughway` is
imported from): module bodies, class bodies and comprehensions are not functions and are not
counted; lambdas are. The profiler is set before `throughway.cli` is imported, so functions called
while the package's modules are imported (registries filled at import time) count too.

From that sequence of first calls it prints:

* files entered: the files of the first calls, consecutive calls in the same file merged;
* distinct files: how many files the command enters;
* moves: steps from one file to another in that sequence (files entered − 1);
* returns: moves into a file entered before and left since;
* ping-pongs: returns straight back, A → B → A in the files entered (files[i] == files[i-2] != files[i-1]),
  with the pairs {A, B} and how often each occurs. A reader following the route goes to B and comes back
  to A for something new: the measure of a route that does not read one way (a file that calls
  several helpers of another file one after another, with steps of its own between them, counts once
  per return);
  A ping-pong with no call between its two files (`ping_pongs_by_call`) is marked: the walk moved between
  them because the file that made the call had had all its functions called before;
* calls across files: first calls whose caller (the nearest calling frame in the package, skipping
  generated code, importlib and torch) is in another file, and of them those into a file that had a
  first call before, listed (caller -> callee). Unlike the sequence, a function's first call of
  another function of its own file after a call elsewhere has returned is not a move here.

`--outside-loop` leaves out the training loop itself: every first call made while
`throughway/train/loop.py`'s `fit` is running (what `fit` calls: the steps, the evaluation, the
callbacks it invokes, e.g. the run directory's ResultsFiles, the checks of train/checks.py and
train/inputs.py it makes). The call of `fit` itself counts, as one entry into train/loop.py.

`--collapse FILE:QUALNAME` (repeatable) treats another function the same way, e.g.
`data/loader.py:load_dataset` to count reading the data as one entry into data/loader.py.
`--after-import` imports throughway.cli before recording (the registries' import-time calls left out).

`--list` also prints every first call (file:line function), the ones left out marked "(under)".
The command's exit status is printed, and is this script's.

What tests/test_trace_calls.py holds the train route to, `throughway train --model mlp_gated_residual
--depth 2 --epochs 1 --limit 200` (a route of 200 fake MNIST images):

* traced after importing throughway.cli (`--after-import`): the block types and models registered while
  the package is imported are the same for every command, `throughway --version` included, and are not
  this command's route;
* at most 5 ping-pongs outside the training loop (`--outside-loop`: what `fit` calls, its checks, steps,
  evaluation and callbacks, is one entry into train/loop.py), where the command line, the config's
  check, the model's construction, the run directory and the data are read;
* at most 13 with the loop's inside counted too: the loop is an orchestrator that calls the
  distributed helpers, the schedule, the first step's checks, the optimiser and the gates' values
  between steps of its own, each such return one ping-pong.

Nothing was moved under `fit` or into import time to lower the first count. Measured before the route
was reworked: 24 ping-pongs over the whole walk with the import (22 after it), 9 outside the loop (7
after the import); the rework counts 15 (13) and 7 (5).
"""

from __future__ import annotations

import argparse
import sys
import types
from pathlib import Path
from typing import Any, Callable

_CO_OPTIMIZED = 0x0001  # a function's code (class and module bodies lack it)
_LOOP_FIT = "train/loop.py:fit"


def _is_function(code: types.CodeType) -> bool:
    if not code.co_flags & _CO_OPTIMIZED:
        return False  # a module or class body
    return code.co_name == "<lambda>" or not code.co_name.startswith("<")  # not <listcomp>, <genexpr>, ...


Call = tuple[str, int, str, bool, str]


def trace(argv: list[str], package_root: Path, collapse: tuple[str, ...] = (_LOOP_FIT,),
          after_import: bool = False) -> tuple[int, list[Call]]:
    """Run `throughway ARGV` in-process; return (exit status, first calls as (file relative to the package,
    line, qualified name, made while one of the `collapse` functions ("file:qualname") runs, the caller's
    file: that of the nearest calling frame in the package, "" for none)).
    `after_import`: import throughway.cli before the profiler is set."""
    if after_import:
        import throughway.cli  # noqa: F401

    def command() -> int:
        from throughway.cli import main

        try:
            return main(argv)
        except SystemExit as exc:  # --help, argparse errors
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)

    return trace_call(command, package_root, collapse)


def trace_call(function: Callable[[], Any], package_root: Path,
               collapse: tuple[str, ...] = (_LOOP_FIT,)) -> tuple[Any, list[Call]]:
    """`trace` of any call: run `function()` under the profiler; return (what it returned, its first calls).
    For a route that no command line reaches alone (a stack trained by `train.stack.train_stacked`)."""
    root = str(package_root) + "/"
    seen: set[types.CodeType] = set()
    calls: list[Call] = []
    depth = 0  # how many `collapse` functions are running

    def caller(frame: types.FrameType) -> str:
        back = frame.f_back  # skipping frames outside the package: dataclasses' generated code, importlib, torch
        while back is not None and not back.f_code.co_filename.startswith(root):
            back = back.f_back
        return back.f_code.co_filename[len(root):] if back is not None else ""

    def profile(frame: types.FrameType, event: str, arg: Any) -> None:
        nonlocal depth
        if event not in ("call", "return"):
            return
        code = frame.f_code
        filename = code.co_filename
        if not filename.startswith(root):
            return
        relative = filename[len(root):]
        if f"{relative}:{code.co_qualname}" in collapse:
            if event == "call":
                if code not in seen:  # the collapsed function itself counts, as one entry into its file
                    seen.add(code)
                    calls.append((relative, code.co_firstlineno, code.co_qualname, depth > 0, caller(frame)))
                depth += 1
            else:
                depth -= 1
            return
        if event != "call" or code in seen or not _is_function(code):
            return
        seen.add(code)
        calls.append((relative, code.co_firstlineno, code.co_qualname, depth > 0, caller(frame)))

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        result = function()
    finally:
        sys.setprofile(previous)
    return result, calls


def crossings(calls: list[Call]) -> tuple[list[Call], list[Call]]:
    """(the first calls made from another file of the package, or from outside it: the calls that enter a
    file; those of them that enter a file which had a first call before: the calls that go back)."""
    entering, back = [], []
    visited: set[str] = set()
    for call in calls:
        if call[4] != call[0]:
            entering.append(call)
            if call[0] in visited:
                back.append(call)
        visited.add(call[0])
    return entering, back


def summarise(files: list[str]) -> dict[str, Any]:
    """Files entered (consecutive repeats merged), distinct files, moves, returns and ping-pongs (`ping_pongs`)
    of a sequence of files."""
    entered: list[str] = []
    for name in files:
        if not entered or entered[-1] != name:
            entered.append(name)
    returns = sum(1 for i, name in enumerate(entered) if name in entered[:i])
    return {"entered": entered, "distinct": len(set(entered)), "moves": max(len(entered) - 1, 0), "returns": returns,
            "ping_pongs": ping_pongs(entered)}


def ping_pongs(entered: list[str]) -> list[tuple[str, str]]:
    """The returns A → B → A of a sequence of files entered (consecutive repeats already merged), each as
    (A, B) in the order they occur."""
    return [(entered[i - 2], entered[i - 1]) for i in _returns_straight_back(entered)]


def _returns_straight_back(entered: list[str]) -> list[int]:
    """The positions i of `entered` (consecutive repeats merged) that end an A → B → A."""
    return [i for i in range(2, len(entered)) if entered[i] == entered[i - 2] != entered[i - 1]]


def ping_pongs_by_call(calls: list[Call]) -> list[tuple[str, str, bool]]:
    """`ping_pongs` of the files of `calls`, each as (A, B, whether a call joins the two files: B's first call
    there made from A, or A's first call on its return made from B). Without one, the walk moved between
    files that do not call each other at that point: a file entered before whose functions were all called
    already (a loop's later turn, an orchestrator a few frames up) made the call, and the walk does not show
    it. The count the tests hold is `ping_pongs`'; this tells a reader which pairs to look at in the code."""
    runs: list[tuple[str, str]] = []  # (file entered, the caller's file of its first call)
    for call in calls:
        if not runs or runs[-1][0] != call[0]:
            runs.append((call[0], call[4]))
    return [(runs[i - 2][0], runs[i - 1][0], runs[i - 1][1] == runs[i - 2][0] or runs[i][1] == runs[i - 1][0])
            for i in _returns_straight_back([file for file, _ in runs])]


def pairs(bounces: list[tuple[str, str]]) -> dict[tuple[str, str], int]:
    """How often each unordered pair of files occurs among `bounces` (A ⇄ B counts with B ⇄ A), most often first."""
    counts: dict[tuple[str, str], int] = {}
    for a, b in bounces:
        key = (min(a, b), max(a, b))
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0])))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     usage="%(prog)s [--outside-loop] [--list] -- THROUGHWAY_ARGS ...")
    parser.add_argument("--outside-loop", action="store_true",
                        help="leave out every first call made while train/loop.py's fit runs (fit itself counts)")
    parser.add_argument("--collapse", action="append", default=[], metavar="FILE:QUALNAME",
                        help="with --outside-loop, also leave out what this function calls (e.g. "
                             "data/loader.py:load_dataset); repeatable")
    parser.add_argument("--after-import", action="store_true",
                        help="import throughway.cli before recording (leaves out what its import calls)")
    parser.add_argument("--list", action="store_true", help="also print every first call, in order")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="the throughway command line")
    options = parser.parse_args(argv)
    args = options.args[1:] if options.args[:1] == ["--"] else options.args
    import importlib.util

    spec = importlib.util.find_spec("throughway")
    if spec is None or spec.origin is None:
        parser.error("throughway is not importable (set PYTHONPATH=src)")
    package_root = Path(spec.origin).resolve().parent
    collapse = (_LOOP_FIT, *options.collapse)
    status, calls = trace(args, package_root, collapse, after_import=options.after_import)
    sys.stdout.flush()
    if options.list:
        for file, line, name, in_fit, by in calls:
            print(f"  {'(under) ' if in_fit else ''}{file}:{line} {name}  <- {by or '(outside)'}")
    kept = [c for c in calls if not (options.outside_loop and c[3])]
    summary = summarise([c[0] for c in kept])
    print(f"throughway {' '.join(args)}  (exit status {status}; package {package_root})")
    scope = (f"outside {', '.join(collapse)} (first calls under them left out)" if options.outside_loop
             else "every first call")
    print(f"{scope}{', after importing throughway.cli' if options.after_import else ''}: {len(kept)} functions")
    print("files entered: " + " → ".join(summary["entered"]))
    print(f"distinct files: {summary['distinct']}; moves: {summary['moves']}; returns: {summary['returns']}")
    counted = pairs(summary["ping_pongs"])
    unjoined = pairs([(a, b) for a, b, joined in ping_pongs_by_call(kept) if not joined])
    print(f"ping-pongs: {len(summary['ping_pongs'])} over {len(counted)} pairs"
          + "".join(f"\n  {n} × {a} ⇄ {b}" + (f"  ({unjoined[a, b]} with no call between the two files)"
                                              if (a, b) in unjoined else "")
                    for (a, b), n in counted.items()))
    entering, back = crossings(kept)
    print(f"calls across files: {len(entering)}; into a file already entered: {len(back)}"
          + "".join(f"\n  {c[4] or '(outside)'} -> {c[0]}:{c[1]} {c[2]}" for c in back))
    return int(status or 0)


if __name__ == "__main__":
    sys.exit(main())
