"""A study split into shards that run at the same time, on one machine or on a cluster's job array.

Every study of many runs has the two options of `study.options.StudyOptions`, the base of its Config:

    shard: str      # --shard i/N | auto (resolved here: `resolve_shard`)
    merge: bool     # --merge

and hands `config.shard` to `run_stacked` / `run_many` (which train only this shard's part) and to
`StudySummary` (which writes the shared summary under the summary lock). `throughway reproduce`
takes `study_lock(out, shard, merge)` around the study.

What a shard is: the study's stacks (`stacking.group_specs` over *all* its runs, the
stacks an unsharded study trains; for `run_many` each run is a stack of one), dealt in the study's
order: shard i takes stacks i, i + N, i + 2N, ... So each shard is a whole number of the same
stacks, and a run's numbers do not depend on how the study was split.

Shards of one study run at the same time into one shared folder (a cluster's shared file system):

* each run has its own folder and lock (`train.rundir`), so shards never write the same file;
* each shard holds its own lock, `DIR/shards/<i>-of-<N>/.lock`, for as long as it trains (two
  processes of the same shard are refused) and records there, in `state.json`, its runs' failures;
* the study lock (`DIR/.lock`) is held only by an unsharded study, for its whole run (as before:
  one unsharded process per folder); a shard checks at its start that none holds it;
* the summary (results.json, table, figures) is written under `DIR/.summary.lock`, waited for
  rather than refused, by each shard as its batches end and at its end: the last shard to finish
  writes the summary of every run, and `--merge` writes it again from the runs on disk.

`--shard auto` reads the shard from a job array's environment (`SCHEDULERS`): SLURM
(SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_COUNT, SLURM_ARRAY_TASK_MIN/MAX/STEP), Sun/Univa/Son of Grid
Engine (SGE_TASK_ID, SGE_TASK_FIRST, SGE_TASK_LAST, SGE_TASK_STEPSIZE) and PBS Pro (PBS_ARRAY_INDEX,
which carries no count and no first id: N comes from THROUGHWAY_SHARD_COUNT, the first id from
THROUGHWAY_SHARD_FIRST). An array must number its tasks contiguously from 0 or 1 (`--array=1-8` or
`0-7`), and every task must know which: where the scheduler's first-id variable is not set, a task
is refused unless THROUGHWAY_SHARD_FIRST says 0 or 1 (guessing from the task's own id would give
tasks 0 and 1 of a 0-based array the same shard and leave shard N untrained). Anything else is
refused with exit status 2, because a partial array (`--array=3`, a rerun) cannot tell N: rerun a
shard with `--shard 3/8`.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence, TypeVar

from .._io import atomic_write_json
from ..train.distributed import SHARD_ENV

__all__ = ["parse_shard", "resolve_shard", "select_shard", "study_lock",
           "summary_lock", "shard_folder", "write_shard_state", "shard_states", "shard_environment", "check_shard_fresh",
           "SCHEDULERS", "SHARD_COUNT_ENV", "SHARD_FIRST_ENV", "SHARDS_FOLDER"]

T = TypeVar("T")
SHARDS_FOLDER = "shards"
SUMMARY_LOCK = ".summary.lock"
# N for schedulers whose array variables carry no count (PBS Pro), or to override the count.
SHARD_COUNT_ENV = "THROUGHWAY_SHARD_COUNT"
# The array's first task id, 0 or 1, for schedulers whose array variables do not say it (PBS Pro).
SHARD_FIRST_ENV = "THROUGHWAY_SHARD_FIRST"

# scheduler -> (task id, first id, last id, step, count): the environment variables `--shard auto` reads.
SCHEDULERS: dict[str, tuple[str, str | None, str | None, str | None, str | None]] = {
    "SLURM": ("SLURM_ARRAY_TASK_ID", "SLURM_ARRAY_TASK_MIN", "SLURM_ARRAY_TASK_MAX", "SLURM_ARRAY_TASK_STEP",
              "SLURM_ARRAY_TASK_COUNT"),
    "Grid Engine": ("SGE_TASK_ID", "SGE_TASK_FIRST", "SGE_TASK_LAST", "SGE_TASK_STEPSIZE", None),
    "PBS Pro": ("PBS_ARRAY_INDEX", None, None, None, None),
}


def parse_shard(text: str) -> tuple[int, int]:
    """'i/N' → (i, N) with 1 ≤ i ≤ N; ValueError naming --shard and the accepted form otherwise."""
    try:
        i, n = (int(v) for v in str(text).split("/"))
    except ValueError:
        raise ValueError(f"--shard {text!r}: expected i/N, e.g. 3/10 (i = 1..N), or auto (from a job array's "
                         f"environment)") from None
    if not 1 <= i <= n:
        raise ValueError(f"--shard {text!r}: need 1 ≤ i ≤ N (i = 1..N)")
    return i, n


def _integer(env: Mapping[str, str], name: str | None) -> int | None:
    if name is None or env.get(name, "") == "":
        return None
    text = env[name]
    if not text.lstrip("-").isdigit():
        raise ValueError(f"--shard auto: ${name}={text!r} is not an integer")
    return int(text)


def resolve_shard(text: str, env: Mapping[str, str] | None = None) -> str:
    """`text` as 'i/N': itself when it is one (checked), else, for 'auto', the shard of this job array
    task read from `env` (default os.environ; see SCHEDULERS): shard task id − first id + 1 of N, the same
    rule for every task. ValueError naming the variables when none is set, when nothing gives the first
    id (the scheduler's variable, else $THROUGHWAY_SHARD_FIRST) or N, or when they do not describe one
    contiguous array numbered from 0 or 1."""
    if str(text).strip() != "auto":
        i, n = parse_shard(text)
        return f"{i}/{n}"
    env = os.environ if env is None else env
    found = [(name, names) for name, names in SCHEDULERS.items() if env.get(names[0], "") != ""]
    if not found:
        variables = ", ".join(names[0] for names in SCHEDULERS.values())
        raise ValueError(f"--shard auto: none of {variables} is set, so this is not a job array task; give the "
                         f"shard as i/N (e.g. --shard 1/4), or run inside an array job (sbatch --array=1-N)")
    name, (id_var, first_var, last_var, step_var, count_var) = found[0]
    task = _integer(env, id_var)
    first, last, step = _integer(env, first_var), _integer(env, last_var), _integer(env, step_var)
    count = _integer(env, count_var)
    override = _integer(env, SHARD_COUNT_ENV)
    assert task is not None
    if step is not None and step != 1:
        raise ValueError(f"--shard auto: ${step_var}={step}: the array's task ids must be contiguous (step 1, e.g. "
                         f"--array=1-8); give the shard as i/N instead")
    given_first = _integer(env, SHARD_FIRST_ENV)
    if given_first is not None and given_first not in (0, 1):
        raise ValueError(f"--shard auto: ${SHARD_FIRST_ENV}={given_first}: accepted: 0 (an array numbered 0..N-1) or "
                         f"1 (numbered 1..N)")
    if first is None and given_first is None:
        # A task cannot tell from its own id whether the array starts at 0 or 1 (task 1 is the first
        # of 1..N or the second of 0..N-1), and a guess per task deals two tasks one shard.
        where = f"${first_var} is not set" if first_var else f"{name} exports no first task id"
        raise ValueError(f"--shard auto: {name}'s ${id_var}={task} is set, but {where}, so the task cannot tell "
                         f"whether the array numbers its tasks from 0 or 1: set ${SHARD_FIRST_ENV}=0 for an array "
                         f"numbered 0..N-1 (e.g. qsub -J 0-3) or ${SHARD_FIRST_ENV}=1 for 1..N, or give the shard "
                         f"as i/N")
    if first is not None and given_first is not None and first != given_first:
        raise ValueError(f"--shard auto: ${first_var}={first} and ${SHARD_FIRST_ENV}={given_first} disagree on the "
                         f"array's first task id; unset ${SHARD_FIRST_ENV}")
    if first is None:
        first = given_first
    assert first is not None
    if first not in (0, 1):
        raise ValueError(f"--shard auto: ${first_var}={first}: the array must number its tasks from 0 or 1 (e.g. "
                         f"--array=1-8) so that each task knows its shard; a partial array (a rerun of some tasks) "
                         f"cannot tell N: give the shard as i/N (e.g. --shard {task}/N --resume)")
    if count is None and last is not None:
        count = last - first + 1
    if override is not None:
        count = override
    if count is None:
        raise ValueError(f"--shard auto: {name}'s ${id_var} is set but nothing gives the number of shards: set "
                         f"${SHARD_COUNT_ENV}=N, or give the shard as i/N")
    if last is not None and override is None and last - first + 1 != count:
        raise ValueError(f"--shard auto: ${first_var}={first}, ${last_var}={last} and ${count_var}={count} do not "
                         f"describe one contiguous array (ids {first}..{last} are {last - first + 1} tasks); use "
                         f"--array={first}-{first + count - 1}, or give the shard as i/N")
    index = task - first + 1
    if not 1 <= index <= count:
        raise ValueError(f"--shard auto: ${id_var}={task} is outside the array's {count} tasks numbered from {first}")
    return f"{index}/{count}"


def select_shard(batches: Sequence[T], shard: str | None) -> list[T]:
    """The batches shard `shard` ('i/N', None for all) trains: batches i, i + N, i + 2N, ... (1-based)
    of `batches`, in their order."""
    if shard is None:
        return list(batches)
    i, n = parse_shard(shard)
    return list(batches[i - 1::n])


def is_sharded(shard: str | None) -> bool:
    """Whether `shard` names a part of a study (N > 1)."""
    return shard is not None and parse_shard(shard)[1] > 1


def shard_folder(out: str | os.PathLike[str], shard: str) -> Path:
    """The folder of shard 'i/N' of the study in `out`: `out`/shards/<i>-of-<N> (its lock and state.json)."""
    i, n = parse_shard(shard)
    return Path(out) / SHARDS_FOLDER / f"{i}-of-{n}"


def _other_counts(out: Path, n: int) -> list[str]:
    folder = out / SHARDS_FOLDER
    if not folder.is_dir():
        return []
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.endswith(f"-of-{n}"))


@contextlib.contextmanager
def study_folder_lock(out: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the exclusive lock of a study's output folder `out` while the block runs (an unsharded
    study holds it throughout; `study_lock`, study.shards, says who takes which lock): a second study
    process on the same folder fails at once with RunLockedError naming the holder (pid, host,
    command) instead of racing the first for its runs' locks and summary.
    The same lock as a run directory's (`train.rundir.RunDir.locked`), which refuses a linked study
    folder; a linked `out`/runs is refused too. A folder created for the lock is removed again when
    the study wrote nothing into it (a study refused before any work)."""
    from ..train.rundir import RunDir

    out = Path(out)
    runs = out / "runs"
    if runs.is_symlink():  # the runs would be trained, and files overwritten, wherever it points
        raise ValueError(f"--out {out}: {runs} is a symbolic link (to {os.readlink(runs)}); refused, nothing was "
                         f"changed: replace it by a real folder, or choose another --out")
    created = not out.exists()
    try:
        with RunDir(out, "--out").locked():
            yield
    finally:
        if created:
            from ..train.rundir import LOCK_TARGET

            with contextlib.suppress(OSError):
                if [p.name for p in out.iterdir()] == [LOCK_TARGET]:
                    (out / LOCK_TARGET).unlink()  # the lock's own empty file, in a folder made for it
                out.rmdir()  # only succeeds when empty


@contextlib.contextmanager
def study_lock(out: str | os.PathLike[str], shard: str | None = None, merge: bool = False) -> Iterator[None]:
    """Hold the locks a study process needs in its folder `out` while the block runs.

    Unsharded (`shard` None or 'i/1'), training: the study lock, exclusively, for the whole study: a
    second study process on the folder fails at once with RunLockedError naming the holder, as does one while a shard of the folder is running. Shard 'i/N' with N > 1: the
    shard's own lock (`shard_folder`), so shards run side by side, after checking that no unsharded
    process holds the study lock and that the folder was not split into another number of shards
    (ValueError: shards of 1/4 and 1/8 would train the same runs). `merge`: no lock here (the summary
    is written under `summary_lock`). A folder created for a lock is removed again when the study
    wrote nothing into it.
    """
    out = Path(out)
    if merge:
        yield
        return
    if not is_sharded(shard):
        with study_folder_lock(out):
            busy = [p.name for p in _live_shards(out)]
            if busy:
                from ..train.rundir import RunLockedError

                raise RunLockedError(f"{out} is in use by shards {', '.join(busy)} of this study; wait for them to "
                                     f"end, or run this one as a shard too (--shard i/N)")
            yield
        return
    assert shard is not None
    i, n = parse_shard(shard)
    _check_no_unsharded(out)
    others = _other_counts(out, n)
    if others:
        raise ValueError(f"--shard {shard}: {out / SHARDS_FOLDER} holds shards of another split ({', '.join(others)}); "
                         f"shards of one folder must share N: use --shard i/{others[0].rsplit('-of-', 1)[1]}, or "
                         f"delete {out / SHARDS_FOLDER} to split it anew (the runs are kept)")
    from ..train.rundir import RunDir

    with RunDir(shard_folder(out, shard), "--shard").locked():
        yield


def _check_no_unsharded(out: Path, wait_s: float = 30.0) -> None:
    """RunLockedError naming the holder when an unsharded study holds `out`'s study lock. Another
    shard may hold it for an instant (a shard starting alongside this one, before this check
    existed): the lock is waited for up to `wait_s`, then released at once."""
    import filelock

    from ..train.rundir import LOCK_TARGET, RunDir, RunLockedError

    out.mkdir(parents=True, exist_ok=True)
    target = out / LOCK_TARGET
    if target.is_symlink():
        raise ValueError(f"--out {out}: {LOCK_TARGET} is a symbolic link; a study's lock must be a plain file "
                         f"(remove the link)")
    lock = filelock.FileLock(target, timeout=wait_s)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise RunLockedError(f"{out} is in use by an unsharded study ({RunDir(out).holder()}); shards of a folder "
                             f"run only beside other shards: wait for it to end, or choose another --out") from None
    lock.release()


def _live_shards(out: Path) -> list[Path]:
    """The shard folders of `out` whose lock another process holds now."""
    import filelock

    from ..train.rundir import LOCK_TARGET

    folder = out / SHARDS_FOLDER
    live = []
    if folder.is_dir():
        for path in sorted(folder.iterdir()):
            target = path / LOCK_TARGET
            if not target.is_file() or target.is_symlink():
                continue
            lock = filelock.FileLock(target, timeout=0)
            try:
                lock.acquire()
                lock.release()
            except filelock.Timeout:
                live.append(path)
    return live


@contextlib.contextmanager
def summary_lock(out: str | os.PathLike[str], timeout_s: float = 600.0) -> Iterator[None]:
    """Hold `out`/.summary.lock while the block writes the study's summary, waiting (up to `timeout_s`)
    while another process of the study writes it: shards write one summary in turn."""
    import filelock

    path = Path(out) / SUMMARY_LOCK
    if path.is_symlink():
        raise ValueError(f"{path} is a symbolic link; the summary lock must be a plain file (remove the link)")
    lock = filelock.FileLock(path, timeout=timeout_s)
    try:
        lock.acquire()
    except filelock.Timeout:
        raise TimeoutError(f"{path}: another process has held the summary lock for {timeout_s:.0f} s; is a "
                           f"shard stuck? (the runs are kept; write the summary later with --merge)") from None
    try:
        yield
    finally:
        lock.release()


def write_shard_state(out: str | os.PathLike[str], shard: str, done: Sequence[str], errors: Mapping[str, str],
                      command: str) -> None:
    """Record in shard `shard`'s state.json the runs it finished in this process and its failures."""
    atomic_write_json(shard_folder(out, shard) / "state.json", {
        "shard": shard, "done": list(done), "errors": dict(errors), "command": command,
        "host": socket.gethostname(), "pid": os.getpid(), "updated": time.strftime("%Y-%m-%dT%H:%M:%S%z")})


def shard_states(out: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every shard's state.json under `out`/shards, in shard order (unreadable ones named, not raised:
    a summary must not fail on a shard's bookkeeping)."""
    folder = Path(out) / SHARDS_FOLDER
    states = []
    if folder.is_dir():
        for path in sorted(folder.glob("*/state.json"), key=lambda p: tuple(int(v) for v in
                                                                          p.parent.name.split("-of-") if v.isdigit())):
            try:
                state = json.loads(path.read_text(encoding="utf-8"))
                if not isinstance(state, dict) or not isinstance(state.get("errors", {}), dict):
                    raise ValueError("not a shard state")
            except (OSError, ValueError):
                state = {"shard": path.parent.name, "unreadable": str(path)}
            states.append(state)
    return states


@contextlib.contextmanager
def shard_environment(shard: str | None) -> Iterator[None]:
    """Set $THROUGHWAY_SHARD to `shard` while the block runs (worker processes inherit it), so that
    every run's results.json records the shard that trained it (`train.distributed.launch_info`)."""
    previous = os.environ.get(SHARD_ENV)
    os.environ[SHARD_ENV] = shard or "1/1"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(SHARD_ENV, None)
        else:
            os.environ[SHARD_ENV] = previous


def check_shard_fresh(names: Sequence[str], runs_dir: str | os.PathLike[str], shard: str | None,
                      resume: bool) -> None:
    """RunExistsError when a sharded study's shard, not resumed, finds some of its runs `names` already
    in `runs_dir` (an unsharded study checks its summary instead, `folders.check_study_folder`)."""
    if resume or not is_sharded(shard):
        return
    from ..train import RESULTS_FILE, RunExistsError

    started = [name for name in names if (Path(runs_dir) / name / RESULTS_FILE).is_file()]
    if started:
        raise RunExistsError(f"{runs_dir} already holds {len(started)} of shard {shard}'s {len(names)} runs (e.g. "
                             f"{started[0]}); pass --resume to continue them, or choose another --out")
