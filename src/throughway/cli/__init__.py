"""`throughway ...`: the command line (`throughway COMMAND --help` for each command's options).

    throughway list                          models, recipes and experiments, one per line, name first
    throughway train --model NAME --depth D  one training run into --out
    throughway reproduce EXPERIMENT          a paper's table or figure, with the paper's numbers beside ours
                                             (`throughway reproduce --help` lists the experiments)
    throughway report DIR                    remake an experiment's table and figures from DIR/results.json
    throughway analyze gates|prune|highway|lesion RUN_DIR   what a finished run's gates learned
    throughway analyze bn-stats RUN_DIR ... --out DIR       test error with BatchNorm statistics re-estimated
    throughway analyze redraw DIR            redraw an analysis folder's figures from its JSON files
    throughway sdi                           squared distance to identity (SDI/TSDI) of layers at initialisation
    throughway data fetch DATASET            fetch, verify and cache a dataset
    throughway --version                     the installed version

(This text is `throughway --help`'s description. The parser is built in cli.parser, each command's
work is done in cli.commands; this module dispatches: bad input becomes a message and exit status 2,
a bug of the toolkit its traceback and exit status 1, told apart as cli.errors says.)
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Callable, Sequence

from .commands import cmd_analyze, cmd_data, cmd_list, cmd_report, cmd_reproduce, cmd_sdi, cmd_train
from .errors import error_message, is_input_error, report_bug
from .parser import build_parser, command_of

__all__ = ["main", "build_parser"]

# Each command's work, given its parsed arguments.
COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "list": lambda args: cmd_list(), "train": cmd_train, "reproduce": cmd_reproduce, "report": cmd_report,
    "data": cmd_data, "sdi": cmd_sdi, "analyze": cmd_analyze}


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `throughway` console script; returns the exit status.

    Parses `argv` with the parser of the sub-command being run (`command_of`: `train` imports no
    experiment) and hands the arguments to that command's `cmd_*`, which checks what is its own. Bad
    input (an exception one of the toolkit's checks raised, or the machine's: a file, a full disk) becomes
    "throughway: error: <message>" and exit status 2; any other exception is a bug of the toolkit: its
    traceback, a line asking for a bug report, and exit status 1 (`cli.errors`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(command_of(argv))
    args = parser.parse_args(argv)
    with contextlib.ExitStack() as contexts:
        if args.command != "train":  # train's results.json records its config, and it draws no figure
            from ..report.figures import figure_format
            from ..study.command import invoked_with

            contexts.enter_context(figure_format(getattr(args, "format", "png")))  # `--format` of the commands that draw
            # a study's results.json records the arguments it was given, not the process's sys.argv: main(argv) called
            # from Python (or a test) would otherwise record the caller's own command line
            contexts.enter_context(invoked_with(argv))
        try:
            if getattr(args, "device", None) is not None and args.command != "train":  # train: in check_config
                from ..train.config import check_device

                check_device(args.device)
            if getattr(args, "threads", None) is not None:  # before any data or model exists
                from ..study.workers import set_threads

                set_threads(args.threads)
            if args.command in COMMANDS:
                return COMMANDS[args.command](args)
        except KeyboardInterrupt:
            print("interrupted: finished epochs are checkpointed; rerun with --resume to continue", file=sys.stderr)
            return 130
        except Exception as exc:  # noqa: BLE001 - every exception is told to the user, one way or the other
            if not is_input_error(exc):  # the toolkit's own bug: its traceback, and where to report it
                report_bug(exc, argv)
                return 1
            # Bad input (options, files, JSON), a held lock, a full disk: the message names the option or the
            # file (cli.errors says how this is told apart from a bug).
            print(f"throughway: error: {error_message(exc)}", file=sys.stderr)
            return 2
    parser.error(f"unknown command {args.command!r}")
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
