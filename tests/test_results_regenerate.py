"""The recorded commands of every committed result under results/ still run, and what they write has the
committed shape (issue 15). What is recomputed and compared is said per check below; most checks compare
file names, JSON keys or rendered text, not freshly trained numbers (issue 23).

The recorded commands are read from every results/*/COMMAND.txt (lines that are not comments; `\\`
continuations joined; `export`, `VAR=value`, `env` and `nice -n N` prefixes and `> FILE` redirects
understood), from the `command:` first line of every results/**/benchmark_*.txt, and from the
`command` field of every JSON file under results/ (outside runs/). Then:

* every `throughway ...` command parses with the real CLI parser (`throughway.cli.build_parser`),
  a `reproduce` command also builds its experiment's config, and the inputs it names exist;
* every `throughway reproduce ...` runs as its quick variant (`--quick` where the experiment has
  one, else the small configuration in `SMALL` below; `--out` in tmp_path, `--jobs 1`, no `--merge`)
  on the fake MNIST of tests/conftest.py, and the test compares STRUCTURE only: the fresh folder has
  the committed folder's files (by name), and its results.json the same top-level keys, the same keys
  in every row/cell, and at least the committed config's keys (options added since are allowed). No
  number of a committed study is recomputed (the fake data and the quick settings give other numbers);
* every committed experiment summary (results.json with an "experiment" field) re-renders through
  `throughway report` from a copy of its results.json alone into exactly the committed table.md,
  byte for byte, and the committed figures by name (every `throughway report results/X` recorded is
  one of them): the rendering is checked, from the committed numbers; the folders' make_report.py
  scripts remake their committed table.md byte for byte the same way; `analyze redraw` redraws the
  committed analysis figures (compared by name) from their JSON files alone;
* the `throughway analyze ...` commands run on the committed runs (fake data where they read data)
  and write the committed files with the committed JSON keys; `analyze gates` reads no data, and its
  k values and dead-gate counts are the only recomputed numbers here compared exactly with the
  committed ones;
* `throughway sdi ...` commands run and print a table; benchmark and measurement scripts run with
  small options or `--help` (see SCRIPTS), and a script that writes a file beside itself writes the
  committed keys.

Known problems of committed results are xfail(strict=True) with the problem named (KNOWN_PROBLEMS),
so that a regenerated result that fixes one fails the test until its entry is removed.
`throughway train` commands are checked by parsing only: their committed results.json files are
copies of single runs (their tables are checked through the make_report.py scripts). That a
committed run's numbers come back bit for bit when it is trained again is tests/test_bit_for_bit.py's
check (results/reference-run). Each failure message names the file that records the command, its
line, and the command.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest
import torch

import throughway
from throughway.cli import build_parser, main
from throughway.data.sources import save_cache
from throughway.data.text import save_text_cache

from conftest import GATE_FAMILY_QUICK_ARGV, built_once, make_arrays

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
SRC = Path(throughway.__file__).resolve().parents[1]
FIGURE_SUFFIXES = (".png", ".svg", ".pdf")


# --------------------------------------------------------------------------------------------
# The recorded commands.

@dataclass(frozen=True)
class Recorded:
    """One recorded command: where it is written, and what it runs."""

    source: Path                # the file that records it
    line: int                   # its first line there (1-based)
    text: str                   # the command as written (continuation lines joined)
    program: str                # "throughway", "python", or the unrecognised first word
    argv: tuple[str, ...]       # the arguments after the program (for python: the script first)
    stdout: str | None = None   # the file of a `> FILE` redirect
    env: tuple[tuple[str, str], ...] = field(default=())

    @property
    def where(self) -> str:
        return f"{self.source.relative_to(REPO)}:{self.line}: `{self.text}`"

    def option(self, name: str) -> list[str] | None:
        """The values of long option `name` (None when it is not given)."""
        for opt, values in split_options(self.argv):
            if opt == name:
                return values
        return None

    def id(self) -> str:
        return f"{self.source.relative_to(RESULTS)}:{self.line}"


_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=.*")


def parse_command(text: str, source: Path, line: int) -> Recorded | None:
    """The command of one shell line (None for a comment, an empty line or an `export`)."""
    try:
        tokens = shlex.split(text, comments=True)
    except ValueError as exc:  # e.g. an unclosed quote: test_recorded_command_is_a_known_form names it
        return Recorded(source, line, text.strip(), f"<not a shell line: {exc}>", ())
    if not tokens or tokens[0] == "export":
        return None
    env = []
    while tokens:  # the prefixes: VAR=value, env, nice [-n N]
        if _ASSIGNMENT.fullmatch(tokens[0]):
            env.append(tuple(tokens.pop(0).split("=", 1)))
        elif tokens[0] == "env":
            tokens.pop(0)
        elif tokens[0] == "nice":
            tokens.pop(0)
            if tokens and tokens[0] == "-n":
                del tokens[:2]
            elif tokens and re.fullmatch(r"-\d+", tokens[0]):
                tokens.pop(0)
        else:
            break
    stdout = None
    if ">" in tokens:
        at = tokens.index(">")
        stdout, tokens = tokens[at + 1], tokens[:at]
    program, argv = tokens[0], tokens[1:]
    if Path(program).name.startswith("python"):
        program = "python"
        if argv[:2] == ["-m", "throughway"]:
            program, argv = "throughway", argv[2:]
    # A study started as `python src/throughway/cli.py ...` records that path as its program.
    elif program == "throughway" or program.endswith(("/throughway", "throughway/cli.py", "throughway/__main__.py")):
        program = "throughway"
    return Recorded(source, line, " ".join(text.split("#", 1)[0].split()), program, tuple(argv), stdout,
                    tuple(env))  # type: ignore[arg-type]


def parse_command_file(path: Path) -> list[Recorded]:
    """The commands of a COMMAND.txt: every line that is not a comment, continuations joined."""
    lines = path.read_text().splitlines()
    commands = []
    i = 0
    while i < len(lines):
        first, text = i, lines[i]
        while text.rstrip().endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text.rstrip()[:-1] + " " + lines[i].strip()
        i += 1
        command = parse_command(text, path, first + 1)
        if command is not None:
            commands.append(command)
    return commands


def split_options(argv: tuple[str, ...] | list[str]) -> list[tuple[str | None, list[str]]]:
    """argv as (option, values) pairs; positionals before the first option come as (None, [value])."""
    pairs: list[tuple[str | None, list[str]]] = []
    for token in argv:
        if token.startswith("--"):
            pairs.append((token, []))
        elif pairs and pairs[-1][0] is not None:
            pairs[-1][1].append(token)
        else:
            pairs.append((None, [token]))
    return pairs


def join_options(pairs: list[tuple[str | None, list[str]]]) -> list[str]:
    return [t for opt, values in pairs for t in ([opt] if opt else []) + values]


def with_options(argv: tuple[str, ...], changes: dict[str, list[str] | None]) -> list[str]:
    """argv with each option in `changes` replaced by its values (None: dropped), added when absent."""
    pairs = [(opt, values) for opt, values in split_options(argv) if opt not in changes]
    pairs += [(opt, values) for opt, values in changes.items() if values is not None]
    return join_options(pairs)


COMMAND_FILES = sorted(RESULTS.glob("*/COMMAND.txt"))

# A folder made by an earlier version of its study, which today's code neither re-runs nor re-renders: its
# COMMAND.txt says so in a line of this form naming the commit, keeps its commands as comments, and the
# folder's page says so too (test_an_earlier_versions_folder_is_named_as_such_on_its_page).
EARLIER_VERSION = re.compile(r"^# The study's FIRST VERSION, as it stood at commit ([0-9a-f]{7,40})\.", re.M)
EARLIER = {path.parent: match.group(1) for path in COMMAND_FILES
           if (match := EARLIER_VERSION.search(path.read_text()))}


def _of_earlier_version(path: Path) -> bool:
    return any(folder == path or folder in path.parents for folder in EARLIER)
BENCHMARK_LOGS = sorted(RESULTS.rglob("benchmark_*.txt"))


def _json_commands() -> list[Recorded]:
    found = []
    for path in sorted(RESULTS.rglob("*.json")):
        if "runs" in path.relative_to(RESULTS).parts or _of_earlier_version(path):
            continue
        try:
            data = json.loads(path.read_text())
        except ValueError:
            continue  # not this test's concern: the tests that read it fail
        if isinstance(data, dict) and isinstance(data.get("command"), str):
            command = parse_command(data["command"], path, 1)
            if command is not None:
                found.append(command)
    return found


def _benchmark_commands() -> list[Recorded]:
    found = []
    for path in BENCHMARK_LOGS:
        first = (path.read_text().splitlines() or [""])[0]
        command = parse_command(first[len("command: "):], path, 1) if first.startswith("command: ") else None
        if command is not None:  # else test_every_benchmark_log_records_its_command fails
            found.append(command)
    return found


FROM_COMMAND_FILES = [c for path in COMMAND_FILES for c in parse_command_file(path)]
ALL_COMMANDS = FROM_COMMAND_FILES + _benchmark_commands() + _json_commands()
THROUGHWAY = [c for c in ALL_COMMANDS if c.program == "throughway"]


def _ids(commands: list[Recorded]) -> list[str]:
    return [c.id() for c in commands]


def _by_kind(kind: str, sub: str | None = None) -> list[Recorded]:
    return [c for c in FROM_COMMAND_FILES if c.program == "throughway" and c.argv[:1] == (kind,)
            and (sub is None or c.argv[1:2] == (sub,))]


# --------------------------------------------------------------------------------------------
# Known problems of committed results (found by this test; src/ is not changed here). Each is keyed by
# the case's id and xfails strictly: when the committed result is regenerated the entry must go.

KNOWN_PROBLEMS: dict[str, str] = {
}


def _known(case_id: str) -> list[Any]:
    reason = KNOWN_PROBLEMS.get(case_id)
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


# --------------------------------------------------------------------------------------------
# Helpers: the fake data, running the CLI, comparing structures.

@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> Iterator[Path]:
    """A fake MNIST and Fashion-MNIST cache (tests/conftest.py's arrays) and a toy shakespeare-char text;
    $THROUGHWAY_DATA points at it."""
    root = tmp_path_factory.mktemp("regen-data")
    save_cache(root / "mnist", make_arrays(), "test fixture")
    save_cache(root / "fashion-mnist", make_arrays(seed=1, name="fashion-mnist"), "test fixture")
    line = "to be, or not to be: that is the question.\n"
    save_text_cache(root / "shakespeare-char", "shakespeare-char", {"train": line * 40, "val": line * 8,
                                                                    "test": line * 8}, {"train": ("toy",)},
                    "test fixture")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("THROUGHWAY_DATA", str(root))
        yield root


def run_cli(argv: list[str], where: str) -> str:
    """Run `throughway argv` in this process; its stdout, or a failure naming the recorded command."""
    out, err = io.StringIO(), io.StringIO()
    # One thread, as the recorded commands ran (OMP_NUM_THREADS=1): on 2 cores shared with another
    # process, 2 threads made the mnist-depth quick run 17 times slower here (340 s instead of 20 s).
    # The thread count of the other tests is restored.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        finally:
            torch.set_num_threads(threads)
    if code != 0:
        pytest.fail(f"{where}\n  ran as: throughway {shlex.join(argv)}\n  exit status {code}\n"
                    f"{err.getvalue()[-3000:]}")
    return out.getvalue()


def run_script(argv: list[str], where: str, data: Path | None, cwd: Path = REPO) -> str:
    """Run `python argv` in a child process with this checkout's sources; its stdout."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    if data is not None:
        env["THROUGHWAY_DATA"] = str(data)
    proc = subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        pytest.fail(f"{where}\n  ran as: python {shlex.join(argv)}\n  exit status {proc.returncode}\n"
                    f"{proc.stderr[-3000:]}")
    return proc.stdout


def _diff(committed: Path, fresh: Path, lines: int = 30) -> str:
    """The first lines of a unified diff, committed → fresh (line ends shown)."""
    diff = difflib.unified_diff(committed.read_text().splitlines(keepends=True), fresh.read_text().splitlines(keepends=True),
                                "committed", "re-rendered")
    return "".join(repr(line)[1:-1] + "\n" for line in list(diff)[:lines])


def _files(folder: Path, suffixes: tuple[str, ...] = (".json", ".md", *FIGURE_SUFFIXES)) -> set[str]:
    return {p.name for p in folder.iterdir() if p.is_file() and p.suffix in suffixes}


def _figures(folder: Path) -> set[str]:
    return _files(folder, FIGURE_SUFFIXES)


def _row_keys(value: Any) -> set[str] | None:
    """The union of the keys of `value`'s rows (a list of dicts) or cells (a dict of dicts); None otherwise."""
    rows = value if isinstance(value, list) else list(value.values()) if isinstance(value, dict) else []
    if rows and all(isinstance(r, dict) for r in rows):
        return set().union(*rows)
    return None


def structure_problems(fresh: dict[str, Any], committed: dict[str, Any], aspect: str) -> list[str]:
    """What differs between two results.json files in `aspect`: "top-level keys", "row keys" (rows of
    lists, cells of dicts), "config keys" (the fresh config may add options, not lose them)."""
    if aspect == "top-level keys":
        if set(fresh) != set(committed):
            return [f"top-level keys: only in the fresh run {sorted(set(fresh) - set(committed))}, "
                    f"only in the committed file {sorted(set(committed) - set(fresh))}"]
        return []
    if aspect == "config keys":
        lost = set(committed.get("config", {})) - set(fresh.get("config", {}))
        return [f"config keys the fresh run no longer writes: {sorted(lost)}"] if lost else []
    problems = []
    for key in sorted(set(fresh) & set(committed)):
        if key in ("config", "environment"):
            continue
        theirs, ours = _row_keys(committed[key]), _row_keys(fresh[key])
        if theirs is None:
            continue
        if ours is None:
            problems.append(f"{key!r}: committed rows/cells with keys {sorted(theirs)}, the fresh run has none")
        elif ours != theirs:
            problems.append(f"{key!r} row/cell keys: only in the fresh run {sorted(ours - theirs)}, "
                            f"only in the committed file {sorted(theirs - ours)}")
    return problems


# --------------------------------------------------------------------------------------------
# 0. Every folder records its commands, in forms this test understands.

def test_every_results_folder_records_its_commands():
    for folder in sorted(p for p in RESULTS.iterdir() if p.is_dir()):
        logs = [p for p in folder.glob("*.txt") if p.read_text().startswith("command: ")]
        # results/batched (a benchmark) and results/timings (the test suite's own timing) record their
        # command in the first line of their one .txt file instead of a COMMAND.txt.
        assert (folder / "COMMAND.txt").is_file() or logs, \
            f"{folder.relative_to(REPO)}: no COMMAND.txt and no .txt file starting with `command: `"


@pytest.mark.parametrize("log", BENCHMARK_LOGS, ids=[str(p.relative_to(RESULTS)) for p in BENCHMARK_LOGS])
def test_every_benchmark_log_records_its_command(log: Path):
    first = (log.read_text().splitlines() or [""])[0]
    assert first.startswith("command: ") and parse_command(first[len("command: "):], log, 1) is not None, \
        f"{log.relative_to(REPO)}: its first line should be `command: ...` (the command that printed it)"


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=_ids(ALL_COMMANDS))
def test_recorded_command_is_a_known_form(command: Recorded):
    assert command.program in ("throughway", "python"), \
        f"{command.where}: runs {command.program!r}, neither `throughway` nor `python SCRIPT`"
    if command.program == "python":
        script = REPO / command.argv[0]
        assert script.is_file(), f"{command.where}: {command.argv[0]} does not exist"
        assert script.parent.name == "benchmarks" or script.parent.parent == RESULTS, \
            f"{command.where}: a script outside benchmarks/ and results/*/"


# --------------------------------------------------------------------------------------------
# 1. Every recorded `throughway ...` command is still a valid command.

def _parse(command: Recorded) -> argparse.Namespace:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            return build_parser().parse_args(list(command.argv))
        except SystemExit:
            pass
    pytest.fail(f"{command.where}\n  no longer parses: {err.getvalue().strip()}")


@pytest.mark.parametrize("command", THROUGHWAY, ids=_ids(THROUGHWAY))
def test_recorded_throughway_command_parses(command: Recorded):
    args = _parse(command)
    if args.command == "reproduce":  # the experiment's config is built as `cmd_reproduce` builds it
        from throughway.experiments import get_experiment
        from throughway.study.options import config_from_args

        module = get_experiment(args.experiment)
        try:
            if hasattr(module, "config_from_args"):
                module.config_from_args(args)
            else:
                config_from_args(module.Config, args, device=args.device, data_dir=args.data_dir)
        except (ValueError, TypeError, KeyError) as exc:
            pytest.fail(f"{command.where}\n  parses, but its config is refused: {exc}")
    elif args.command == "train":
        from throughway.models import list_models
        from throughway.train import get_recipe

        assert args.model in {m.name for m in list_models()}, f"{command.where}\n  unknown model {args.model!r}"
        try:
            get_recipe(args.recipe)
        except (KeyError, ValueError) as exc:
            pytest.fail(f"{command.where}\n  unknown recipe: {exc}")
    elif args.command == "analyze" and command.source.name == "COMMAND.txt":
        # the committed inputs the analyses read are in the repository
        if args.analysis == "redraw":
            assert (REPO / args.dir).is_dir(), f"{command.where}\n  {args.dir} is not a folder"
        else:
            for name in getattr(args, "run_dirs", None) or [args.run_dir]:  # bn-stats takes several
                run_dir = REPO / name
                assert (run_dir / "results.json").is_file() and (run_dir / "model.safetensors").is_file(), \
                    f"{command.where}\n  {name} has no results.json + model.safetensors"
    elif args.command == "report" and args.dir is not None:
        assert (REPO / args.dir / "results.json").is_file(), f"{command.where}\n  {args.dir}/results.json is missing"


# --------------------------------------------------------------------------------------------
# 2. `throughway reproduce ...`: the quick variant writes the committed structure.

# Options of each experiment changed for its small variant (None: the option is dropped), after
# `--quick` where the experiment has one. Measured here (2 shared cores, the fake MNIST of 600
# training images): mnist-depth's own --quick (2 epochs, 2 seeds; the recorded --seeds 1 kept) at depths 2
# and 10 for the 3 archs takes a few seconds; highway-depth's --quick about 2 s (its recorded --trials / --epochs dropped for --quick's 4 and
# 2, its --limit kept). The other experiments have no --quick: the small configurations of their own
# options below take 0.5-3 s each (sdi-table reads no data and runs as recorded in about 1 s).
SMALL: dict[str, dict[str, list[str] | None]] = {
    # depths 2 and 10 whatever was recorded (the files and keys do not depend on which depths ran; d = 50 and
    # 100 were most of each quick run's time, and the val study's per-depth commands become one run)
    "mnist-depth": {"--depths": ["2", "10"]},
    "highway-depth": {"--trials": None, "--epochs": None},  # --quick's 4 trials, 2 epochs; --limit kept
    "hessian-init": {"--depths": ["2", "4"], "--runs": ["2"], "--theorem2-depths": ["6"]},
    "hessian-dynamics": {"--depth": ["4"], "--seeds": ["1"], "--epochs": ["10"], "--hessian-points": ["3"]},
    "shortcut-lr": {"--depths": ["2", "4"], "--lr-exponents": ["-2", "-1"], "--epochs": ["10"], "--subset": ["100"]},
    "weight-norms": {"--depths": ["2", "4"], "--epochs": ["10"], "--relu-epochs": ["10"], "--relu-subset": ["100"]},
    "sdi-table": {},
    "identity-distance": {"--depth": ["2"], "--epochs": ["1"]},
    "gate-family-init": {},  # --quick: d = 2, 6, 2 seeds, width-3 Hessian proxies on 32 images
    # --quick: d = 2, 10, 2 seeds, 2 epochs, 2,000 images. The second dataset's commands (--dataset fashion-mnist
    # at d = 50, 100) write the same files and keys through the same study code, so their quick variant is the
    # session's quick study too (a second one would cost the suite a minute); --dataset is checked by parsing
    # and building the config here, and that every run trains on it by tests/test_gate_family.py
    "gate-family": {"--dataset": None, "--depths": None, "--families": None},
    "transformer-gates": {"--depths": None},  # --quick: 1 and 4 layers, 1 seed, 1 epoch, 64 images, width 8
    # --quick's sizes made smaller still, on data_root's toy text: 2 layers of width 8, 4 steps, 2 seeds
    "layer-drop": {"--depth": ["2"], "--width": ["8"], "--heads": ["2"], "--context": ["8"], "--batch-size": ["2"],
                   "--steps": ["4"], "--eval-every": ["2"], "--eval-blocks": ["2"], "--calibration-blocks": ["2"],
                   "--heal-steps": ["1"], "--seeds": ["2"], "--limit": None},
}


def _has_quick(experiment: str) -> bool:
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            build_parser().parse_args(["reproduce", experiment, "--quick"])
        except SystemExit:
            return False
    return True


def quick_variant(command: Recorded) -> list[str]:
    """The recorded reproduce command, small: --quick (where there is one) and SMALL's options, one job,
    no --out / --resume / --merge (the caller adds --out)."""
    experiment = command.argv[1]
    assert experiment in SMALL, f"{command.where}\n  no small configuration in SMALL for {experiment!r}"
    # --merge (build the summary of runs made elsewhere) has no runs to merge in a fresh folder: the quick
    # variant trains the runs it would merge.
    # --compile: compiling each depth's batch took 287 s of the mnist-depth-val quick variant (16.5 s
    # eager); the files and keys do not depend on it, and test_compiled_quick_batch_trains_as_eager checks
    # the compiled path once. --threads: run_cli trains on one thread whatever is recorded, so the gate-family
    # commands that differ only by `--threads 1` are one quick run, not two.
    changes: dict[str, list[str] | None] = {"--out": None, "--resume": None, "--jobs": ["1"], "--quiet": [],
                                            "--device": None, "--merge": None, "--compile": None, "--threads": None,
                                            **SMALL[experiment]}
    if _has_quick(experiment):
        changes["--quick"] = []
    return with_options(command.argv, changes)


def _without_jobs(argv: list[str] | tuple[str, ...]) -> list[str]:
    # --jobs changes how many processes train the runs, not the files or keys they write
    return with_options(tuple(argv), {"--jobs": None})


def test_recorded_gate_family_commands_share_the_sessions_quick_study():
    # the recorded gate-family commands (MNIST's and Fashion-MNIST's) give one quick run: SMALL above
    recorded = [c for c in REPRODUCE if c.argv[1] == "gate-family"]
    assert recorded and all(_without_jobs(quick_variant(c)) == _without_jobs(GATE_FAMILY_QUICK_ARGV) for c in recorded)


def committed_output(command: Recorded) -> Path:
    """The committed copy of what `command` wrote: its --out when that is under results/, else its
    COMMAND.txt's folder (the outputs of runs made outside the repository are copied there), or the
    file its stdout was redirected to."""
    if command.stdout is not None:
        return REPO / command.stdout
    out = command.option("--out")
    if out and (REPO / out[0] / "results.json").is_file() and (REPO / out[0]).resolve().is_relative_to(RESULTS):
        return REPO / out[0]
    return command.source.parent


REPRODUCE = _by_kind("reproduce")
REPRODUCE_CASES = [
    pytest.param(c, aspect, id=f"{c.id()}-{aspect}", marks=_known(f"{c.id()}-{aspect}"))
    for c in REPRODUCE
    for aspect in (("estimate",) if c.stdout else ("files", "top-level keys", "row keys", "config keys"))
]


def _quick_run(command: Recorded, tmp_path_factory, request: pytest.FixtureRequest) -> tuple[Path, str]:
    """The quick variant's output folder and what it printed, or its failure: made once per session whichever
    worker asks first (conftest.built_once; equal variants of two recorded commands run once, and a failed
    run is not retried by each aspect)."""
    argv = quick_variant(command)
    if _without_jobs(argv) == _without_jobs(GATE_FAMILY_QUICK_ARGV):  # trained once per session (conftest.py)
        return request.getfixturevalue("gate_family_quick")
    request.getfixturevalue("data_root")  # $THROUGHWAY_DATA: the fake MNIST

    def build(folder: Path) -> None:
        try:
            (folder / "printed.txt").write_text(run_cli([*argv, "--out", str(folder / "out")], command.where))
        except pytest.fail.Exception as exc:
            (folder / "failure.txt").write_text(str(exc))

    name = "quick-" + hashlib.sha256("\0".join(argv).encode()).hexdigest()[:16]
    folder = built_once(tmp_path_factory, name, build)
    if (folder / "failure.txt").exists():
        pytest.fail((folder / "failure.txt").read_text())
    return folder / "out", (folder / "printed.txt").read_text()


@pytest.mark.parametrize("command,aspect", REPRODUCE_CASES)
@pytest.mark.slow
def test_reproduce_quick_variant_writes_committed_structure(command: Recorded, aspect: str, tmp_path_factory,
                                                            request):
    out, stdout = _quick_run(command, tmp_path_factory, request)
    committed = committed_output(command)
    where = f"{command.where}\n  (quick variant: throughway {shlex.join(quick_variant(command))}; " \
            f"compared with {committed.relative_to(REPO)})"
    if aspect == "estimate":  # `--estimate > FILE`: the same table columns and summary line
        ours, theirs = stdout.strip().splitlines(), committed.read_text().strip().splitlines()
        header = [line for line in theirs if line.startswith("| arch")]
        assert header and header == [line for line in ours if line.startswith("| arch")], \
            f"{where}\n  the estimate's table header differs: {header} vs {ours[:4]}"
        assert ours[0].split(":")[0] == theirs[0].split(":")[0] and ours[-1].split(";")[0].split()[:2] == \
            theirs[-1].split(";")[0].split()[:2], f"{where}\n  the estimate's first or last line differs"
        return
    if aspect == "files":
        ours, theirs = _files(out), _files(committed)
        assert ours == theirs, f"{where}\n  files: only in the fresh run {sorted(ours - theirs)}, " \
                               f"only committed {sorted(theirs - ours)}"
        assert (out / "runs").is_dir() == (committed / "runs").is_dir(), f"{where}\n  runs/ folder differs"
        return
    fresh = json.loads((out / "results.json").read_text())
    problems = structure_problems(fresh, json.loads((committed / "results.json").read_text()), aspect)
    assert not problems, f"{where}\n  " + "\n  ".join(problems)


@pytest.mark.slow
def test_compiled_quick_batch_trains_as_eager(data_root, tmp_path):
    """What the recorded `--compile` (results/mnist-depth-val, results/gate-family) adds, checked once
    instead of in each quick variant: a batch of the three MNIST-depth architectures trained through
    torch.compile writes the files an eager batch writes, with the same losses (to float32 rounding)."""
    from throughway.data import load_dataset
    from throughway.train.stack import train_stacked
    from throughway.train.config import RunConfig

    configs = [RunConfig(model=model, depth=2, recipe="gresnet-mnist", epochs=1, seed=seed, model_kwargs={"width": 8})
               for model in ("mlp_plain", "mlp_residual", "mlp_gated_residual") for seed in (0,)]
    data = load_dataset("mnist", str(data_root))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        eager = train_stacked(configs, [tmp_path / f"eager-{i}" for i in range(3)], progress=False, data=data)
        compiled = train_stacked(configs, [tmp_path / f"compiled-{i}" for i in range(3)], progress=False, data=data,
                                 compile=True)
    finally:
        torch.set_num_threads(threads)
    for i, (a, b) in enumerate(zip(eager, compiled)):
        assert _files(tmp_path / f"eager-{i}") == _files(tmp_path / f"compiled-{i}")
        assert b["history"][-1]["train_loss"] == pytest.approx(a["history"][-1]["train_loss"], rel=1e-4), configs[i].model


# --------------------------------------------------------------------------------------------
# 3. `throughway report`: every committed experiment summary re-renders into its committed table.

SUMMARIES = sorted(p.parent for p in RESULTS.rglob("results.json")
                   if "runs" not in p.relative_to(RESULTS).parts and not _of_earlier_version(p.parent)
                   and "experiment" in json.loads(p.read_text()))


def test_an_earlier_versions_folder_is_named_as_such_on_its_page():
    for folder, commit in EARLIER.items():
        text = (folder / "COMMAND.txt").read_text()
        assert all(line.startswith("#") for line in text.splitlines() if line.strip()), \
            f"{folder}: an earlier version's commands are comments (today's code does not run them)"
        pages = [p for p in (REPO / "docs").rglob("*.md") if f"results/{folder.name}/" in p.read_text()]
        assert pages and all(commit in p.read_text() and "first version" in p.read_text() for p in pages), \
            f"{folder}: every page quoting it names the commit {commit} and calls it the study's first version"


def test_every_recorded_report_command_is_checked():
    for command in _by_kind("report"):
        args = _parse(command)
        assert (REPO / args.dir).resolve() in {s.resolve() for s in SUMMARIES}, \
            f"{command.where}\n  {args.dir} is not an experiment summary checked by test_report_rerenders_committed_table"


@pytest.mark.parametrize("folder", SUMMARIES, ids=[str(s.relative_to(RESULTS)) for s in SUMMARIES])
def test_report_rerenders_committed_table(folder: Path, tmp_path):
    recorded = [c for c in _by_kind("report") if (REPO / c.argv[1]).resolve() == folder.resolve()]
    if recorded:
        where = recorded[0].where
    else:  # e.g. results/hessian/COMMAND.txt's comment "remade with throughway report results/hessian/<folder>"
        record = next(p / "COMMAND.txt" for p in (folder, *folder.parents) if (p / "COMMAND.txt").is_file())
        where = f"{record.relative_to(REPO)} (not a line of its own): `throughway report {folder.relative_to(REPO)}`"
    copy = tmp_path / folder.name
    copy.mkdir()
    shutil.copyfile(folder / "results.json", copy / "results.json")  # results.json alone
    run_cli(["report", str(copy)], where)
    assert (copy / "table.md").read_bytes() == (folder / "table.md").read_bytes(), \
        f"{where}\n  the re-rendered table.md differs from the committed {folder.relative_to(REPO)}/table.md:\n" \
        + _diff(folder / "table.md", copy / "table.md")
    assert _figures(copy) == _figures(folder), \
        f"{where}\n  figures: re-rendered {sorted(_figures(copy))}, committed {sorted(_figures(folder))}"


MAKE_REPORTS = sorted(RESULTS.glob("*/make_report.py"))


@pytest.mark.parametrize("script", MAKE_REPORTS, ids=[s.parent.name for s in MAKE_REPORTS])
def test_make_report_script_rerenders_committed_table(script: Path, tmp_path):
    """`python results/X/make_report.py RUNS` (a comment of its COMMAND.txt) remakes table.md and the
    figures from the copied results.json files alone: run from a copy of the folder, with no RUNS."""
    where = f"{script.parent.relative_to(REPO)}/COMMAND.txt: `python {script.relative_to(REPO)} RUNS`"
    assert f"python {script.relative_to(REPO)}" in (script.parent / "COMMAND.txt").read_text(), \
        f"{where}\n  not recorded in its COMMAND.txt"
    copy = tmp_path / script.parent.name
    shutil.copytree(script.parent, copy)
    for name in ["table.md", *_figures(copy)]:
        (copy / name).unlink()
    (tmp_path / "no-runs").mkdir()
    run_script([str(copy / script.name), str(tmp_path / "no-runs")], where, data=None)
    assert (copy / "table.md").read_bytes() == (script.parent / "table.md").read_bytes(), \
        f"{where}\n  the remade table.md differs from the committed one:\n" + _diff(script.parent / "table.md", copy / "table.md")
    assert _figures(copy) == _figures(script.parent), f"{where}\n  figures: {_figures(copy)} vs {_figures(script.parent)}"


# --------------------------------------------------------------------------------------------
# 4. `throughway analyze ...` on the committed runs.

# `--orders 10` random removal orders of the d = 100 nets' 50 blocks take about 40 s per prune
# command here; 2 orders (a mean and a spread) write the same files and keys in about 8 s.
ANALYZE_SMALL: dict[str, list[str] | None] = {"--orders": ["2"]}
ANALYZE = [c for c in _by_kind("analyze") if c.argv[1] != "redraw"]
REDRAW = _by_kind("analyze", "redraw")


def _analysis_out(command: Recorded) -> str:
    """The folder an analysis writes (read from argv, not parsed: this runs at collection)."""
    out = command.option("--out")
    return out[0] if out else str(Path(command.argv[2]) / "analysis")


@pytest.fixture(scope="module")
def analyses(data_root, tmp_path_factory) -> Callable[[Recorded], Path]:
    """The output folder of a recorded analysis, or a failure naming it. The analyses of one COMMAND.txt run
    together, in its order, writing into tmp/<their recorded --out> (--compare paths under results/ point at
    those copies too), once per session whichever worker asks first (conftest.built_once): two workers make
    two COMMAND.txt's analyses at once."""
    def build_source(source: Path) -> Callable[[Path], None]:
        def build(root: Path) -> None:
            failures: dict[str, str] = {}
            for command in (c for c in ANALYZE if c.source == source):
                out = root / _analysis_out(command)
                changes: dict[str, list[str] | None] = {"--out": [str(out)], "--quiet": []}
                changes.update({opt: values for opt, values in ANALYZE_SMALL.items()
                                if command.option(opt) is not None})
                compare = command.option("--compare")
                if compare:
                    changes["--compare"] = [str(root / p) if p.startswith("results/") else p for p in compare]
                try:
                    run_cli(with_options(command.argv, changes), command.where)
                except pytest.fail.Exception as exc:  # reported by each test of this command
                    failures[command.id()] = str(exc)
            (root / "failures.json").write_text(json.dumps(failures))
        return build

    def output(command: Recorded) -> Path:
        name = "analyses-" + str(command.source.parent.relative_to(RESULTS)).replace("/", "-")
        root = built_once(tmp_path_factory, name, build_source(command.source))
        failure = json.loads((root / "failures.json").read_text()).get(command.id())
        if failure is not None:
            pytest.fail(failure)
        return root / _analysis_out(command)
    return output


ANALYSIS_FILE = {"gates": "gates", "prune": "prune", "lesion": "lesion", "highway": "highway", "bn-stats": "bn_stats"}
ANALYZE_CASES = [pytest.param(c, id=f"{c.id()}-json keys", marks=_known(f"{c.id()}-json keys")) for c in ANALYZE]


@pytest.mark.parametrize("command", ANALYZE_CASES)
@pytest.mark.slow
def test_analysis_writes_committed_keys(command: Recorded, analyses):
    out = analyses(command)
    what = ANALYSIS_FILE[command.argv[1]]
    committed = REPO / _analysis_out(command)
    fresh = json.loads((out / f"{what}.json").read_text())
    theirs = json.loads((committed / f"{what}.json").read_text())
    problems = structure_problems(fresh, theirs, "top-level keys")
    assert not problems, f"{command.where}\n  {what}.json: " + "\n  ".join(problems)
    assert (out / f"{what}.txt").is_file(), f"{command.where}\n  wrote no {what}.txt"
    if what == "gates":  # reads no data: the same weights give the same k, exactly
        for key in ("k", "k_mean", "num_dead", "dead_blocks", "num_blocks"):
            assert fresh[key] == theirs[key], f"{command.where}\n  gates.json {key!r} differs from the committed one"


ANALYSIS_FOLDERS = sorted({(c.source, _analysis_out(c)) for c in ANALYZE})


@pytest.mark.parametrize("source,folder", ANALYSIS_FOLDERS,
                         ids=[f"{s.relative_to(RESULTS)}-{Path(f).name}" for s, f in ANALYSIS_FOLDERS])
def test_analyses_write_committed_files(source: Path, folder: str, analyses):
    commands = [c for c in ANALYZE if c.source == source and _analysis_out(c) == folder]
    where = f"{source.relative_to(REPO)}: the analyses writing {folder} (lines {', '.join(str(c.line) for c in commands)})"
    out = [analyses(c) for c in commands][0]
    ours, theirs = _files(out, (".json", ".txt", *FIGURE_SUFFIXES)), _files(REPO / folder, (".json", ".txt", *FIGURE_SUFFIXES))
    theirs.discard("COMMAND.txt")  # an analysis may write into its results folder's top (bn-stats)
    assert ours == theirs, f"{where}\n  files: only fresh {sorted(ours - theirs)}, only committed {sorted(theirs - ours)}"


@pytest.mark.parametrize("command", REDRAW, ids=_ids(REDRAW))
def test_redraw_remakes_committed_figures(command: Recorded, tmp_path):
    """`analyze redraw DIR` redraws the committed figures from a copy of the committed JSON files alone."""
    args = _parse(command)
    committed = REPO / args.dir
    copy = tmp_path / committed.name
    shutil.copytree(committed, copy)
    for name in _figures(copy):
        (copy / name).unlink()
    run_cli(["analyze", "redraw", str(copy)], command.where)
    assert _figures(copy) == _figures(committed), \
        f"{command.where}\n  redrew {sorted(_figures(copy))}, committed {sorted(_figures(committed))}"


# --------------------------------------------------------------------------------------------
# 5. `throughway sdi ...`, benchmarks and measurement scripts.

SDI = _by_kind("sdi")


@pytest.mark.parametrize("command", SDI, ids=_ids(SDI))
def test_sdi_command_runs(command: Recorded):
    printed = run_cli(list(command.argv), command.where)
    assert printed.startswith("| layer | init |"), f"{command.where}\n  printed {printed[:200]!r}"


# Per script: the options that make it small (replacing the recorded ones; None: drop), or None for
# `--help` only. None of the scripts has a --quick.
SCRIPTS: dict[str, dict[str, list[str] | None] | None] = {
    # runs, on the recorded trained model: 1 timing round on a batch of 10 (about 2 s)
    "benchmarks/prune_speed.py": {"--batch": ["10"], "--rounds": ["1"], "--threads": ["1"]},
    # runs the toolkit way at depth 2 in its child process, without the plain torch.func way (about 5 s)
    "benchmarks/hessian_speed.py": {"--depth": ["2"], "--plain-depth": ["2"], "--skip-plain": [], "--threads": ["1"]},
    # runs one timed step of batch 2 of both loops on its random CIFAR-shaped data (about 3 s)
    "benchmarks/wrn_step_throughput.py": {"--steps": ["1"], "--batch": ["2"], "--threads": ["1"]},
    # runs a 1-layer width-16 GPT on random tokens (no download), 2 rounds of 1 step, one size (about 3 s)
    "benchmarks/lm_step.py": {"--synthetic": [], "--depth": ["1"], "--width": ["16"], "--heads": ["2"],
                              "--context": ["8"], "--batch": ["2"], "--steps": ["1"], "--rounds": ["2"],
                              "--sizes": ["1x32"], "--threads": ["1"]},
    # --help only: even its smallest options take about 7 s (its fixed matmul-ceiling measurements),
    # and the recorded --compile minutes
    "benchmarks/batched_throughput.py": None,
    # --help only: each of its stacks compiles in a fresh process (ten seconds and more even at depth 2)
    "benchmarks/compile_blocks.py": None,
    # runs both contenders at depth 2 with 1 seed on 640 images, eager (its docstring's check; a few seconds)
    "benchmarks/mnist_depth_protocol.py": {"--depths": ["2"], "--seeds": ["1"], "--samples": ["640"],
                                           "--rounds": ["1"], "--compile": None},
    # runs from a copy of its folder (it writes cost.json beside itself): 1 timed step per width (about 4 s)
    "results/highway-conv-authors/measure_cost.py": {"--steps": ["1"]},
}
# Scripts that write a file beside themselves (not to stdout): run from a copy of their folder, and
# the file they write is compared with the committed one (top-level and row keys).
SCRIPT_WRITES = {"results/highway-conv-authors/measure_cost.py": "cost.json"}
# One case per distinct script command (a benchmark's COMMAND.txt line and its log's `command:` line are
# often the same command).
PYTHON = list({c.argv: c for c in reversed(ALL_COMMANDS) if c.program == "python"}.values())[::-1]


@pytest.mark.parametrize("command", PYTHON, ids=_ids(PYTHON))
@pytest.mark.slow
def test_script_runs_small(command: Recorded, data_root, tmp_path):
    script = command.argv[0]
    assert script in SCRIPTS, f"{command.where}\n  {script}: no small option set in SCRIPTS"
    small = SCRIPTS[script]
    if small is None:
        printed = run_script([script, "--help"], command.where, data_root)
        assert "usage:" in printed, f"{command.where}\n  --help printed {printed[:200]!r}"
        return
    argv = [script, *with_options(command.argv[1:], small)]
    written = SCRIPT_WRITES.get(script)
    if written is not None:  # run from a copy of its folder: it writes beside itself
        folder = REPO / Path(script).parent
        copy = tmp_path / folder.name
        shutil.copytree(folder, copy)
        (copy / written).unlink()
        run_script([str(copy / Path(script).name), *argv[1:]], command.where, data_root)
        fresh, theirs = json.loads((copy / written).read_text()), json.loads((folder / written).read_text())
        problems = structure_problems(fresh, theirs, "top-level keys") + structure_problems(fresh, theirs, "row keys")
        assert not problems, f"{command.where}\n  {written}: " + "\n  ".join(problems)
        return
    printed = run_script(argv, command.where, data_root)
    assert printed.strip(), f"{command.where}\n  printed nothing"
