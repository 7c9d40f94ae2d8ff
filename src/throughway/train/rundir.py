"""The run directory as untrusted input: its paths, an exclusive lock, validated file names, cleanup.

Single runs (`run.run_training`) and stacks (`stack.train_stacked`) write their files through
a `RunDir`, which promises:

* nothing outside the directory is read or deleted because of a name found in one of its JSON
  files: every such name must match the pattern the toolkit writes (`CHECKPOINT_FILE`,
  `BATCH_FILE`) and resolve inside the directory (`member_file`), else ValueError naming the file
  and the field;
* one process at a time: `locked()` takes an exclusive lock on the directory's `.lock` file
  (`filelock`: fcntl.flock on POSIX, msvcrt on Windows, so no platform module is imported here) and
  records the holder (pid, host, command) in `.lock.json`; a second process gets `RunLockedError`
  naming that holder. The operating system drops the lock when its process dies, so a killed run
  never leaves a stale lock behind (the empty `.lock` file stays and is reused);
* the temporary files of an interrupted atomic write (`.<name>.<random>.tmp`) are removed when the
  same run starts again (under the lock, so never another process's write in progress).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import filelock

from .._io import atomic_write_bytes, atomic_write_json, read_json, sha256_file

__all__ = ["RunDir", "RunLockedError", "member_file", "write_rotating", "interrupts_deferred", "CHECKPOINT_FILE", "BATCH_FILE", "LOCK_FILE",
           "RESULTS_FILE", "CHECKPOINT_JSON", "MODEL_FILE", "MAX_HOLDER_BYTES"]

RESULTS_FILE = "results.json"
CHECKPOINT_JSON = "checkpoint.json"
MODEL_FILE = "model.safetensors"
LOCK_FILE = ".lock.json"
# The empty file that `filelock` locks (fcntl.flock on POSIX, msvcrt on Windows); LOCK_FILE names the holder.
LOCK_TARGET = ".lock"
# The only file names a checkpoint.json / batch.json may point to (what save_checkpoint writes).
# Epochs are written with at least four digits (`e{epoch:04d}`), so a run of 10,000 epochs or more
# writes five: the patterns accept four or more, or such a run could not resume.
CHECKPOINT_FILE = re.compile(r"checkpoint-e\d{4,}\.safetensors")
BATCH_FILE = re.compile(r"batch-e\d{4,}\.safetensors")
METRICS_FILE = "metrics.csv"
# atomic_write_bytes' temporary files, mkstemp(prefix=".<name>.", suffix=".tmp"), of the files the
# toolkit writes into a run directory (a user's own .tmp files are left alone).
_TMP_FILE = re.compile(r"\.(results\.json|metrics\.csv|checkpoint\.json|model\.safetensors|checkpoint-e\d{4,}\.safetensors|"
                       r"\.lock\.json|batch\.json|batch-e\d{4,}\.safetensors)\.[A-Za-z0-9_]{8}\.tmp")
# A lock file is read only to name the holder in a message; a larger one is not ours.
MAX_HOLDER_BYTES = 4096


class RunLockedError(RuntimeError):
    """Another process holds the run directory's lock."""


def member_file(folder: str | os.PathLike[str], name: Any, pattern: re.Pattern[str], *, source: str | os.PathLike[str],
                field: str) -> Path:
    """`folder`/`name` when `name` (read from field `field` of file `source`) is a string matching
    `pattern` whose path resolves inside `folder`; otherwise ValueError naming `source` and `field`.

    Symbolic links leading out of `folder` are refused too, so the returned path can be read or
    deleted without touching anything outside the folder.
    """
    folder = Path(folder)
    if not isinstance(name, str) or not pattern.fullmatch(name):
        raise ValueError(f"{source}: field {field!r} is {name!r}; accepted: a file name matching "
                         f"{pattern.pattern!r} inside {folder} (the file was edited or damaged; nothing was deleted)")
    path = folder / name
    if path.resolve().parent != folder.resolve():
        raise ValueError(f"{source}: field {field!r} names {path}, which leads outside {folder} (a symbolic link?); "
                         f"refused, nothing was read or deleted")
    return path


def write_rotating(folder: str | os.PathLike[str], json_name: str, name: str, payload: bytes,
                   meta: dict[str, Any], pattern: re.Pattern[str]) -> Path:
    """Replace the checkpoint that `folder`/`json_name` names by a new one; return the new file's path.

    The one write sequence of run checkpoints (checkpoint.json) and batch states (batch.json), in the
    order that loses nothing at any crash: `payload` is written atomically as `folder`/`name`, then
    the JSON is rewritten atomically as `meta` with `file` (the new name) and `sha256` (its
    checksum), and only then is the file the old JSON named deleted. That old name is read from
    untrusted JSON, so it is deleted only when `member_file` accepts it (matches `pattern`, inside
    `folder`); a damaged or tampered JSON leaves every other file alone.
    """
    folder = Path(folder)
    json_path = folder / json_name
    path = atomic_write_bytes(folder / name, payload)
    previous: Path | None = None
    if json_path.is_file():
        try:
            old = read_json(json_path)
            previous = member_file(folder, old.get("file"), pattern, source=json_path, field="file") \
                if isinstance(old, dict) else None
        except ValueError:
            previous = None
    atomic_write_json(json_path, {**meta, "file": name, "sha256": sha256_file(path)})
    if previous is not None and previous.name != name:
        previous.unlink(missing_ok=True)
    return path


class RunDir:
    """One run directory: its file paths, an exclusive lock, and the checks made before writing.

    `option` names where the path came from in messages (e.g. "--out").
    """

    def __init__(self, path: str | os.PathLike[str], option: str = "--out") -> None:
        self.path = Path(path)
        self.option = option

    # -- paths ----------------------------------------------------------------------------------
    @property
    def results(self) -> Path:
        """results.json."""
        return self.path / RESULTS_FILE

    @property
    def checkpoint_json(self) -> Path:
        """checkpoint.json (points to the current checkpoint file)."""
        return self.path / CHECKPOINT_JSON

    @property
    def model(self) -> Path:
        """model.safetensors (written when the run ends)."""
        return self.path / MODEL_FILE

    @property
    def lock_file(self) -> Path:
        """.lock.json: who holds the lock (informational; the lock is on the directory)."""
        return self.path / LOCK_FILE

    def checkpoint_file(self, name: Any, *, field: str = "file") -> Path:
        """The checkpoint file `name` as read from checkpoint.json, validated by `member_file`."""
        return member_file(self.path, name, CHECKPOINT_FILE, source=self.checkpoint_json, field=field)

    @property
    def metrics(self) -> Path:
        """metrics.csv (one row per epoch)."""
        return self.path / METRICS_FILE

    def checkpoint_files(self) -> list[Path]:
        """Files named like checkpoints (checkpoint-eNNNN.safetensors), sorted by epoch; empty when the folder is absent."""
        if not self.path.is_dir():
            return []
        return sorted((p for p in self.path.iterdir() if CHECKPOINT_FILE.fullmatch(p.name)),
                      key=lambda p: (len(p.name), p.name))  # e10000 after e9999

    def artifacts(self) -> list[str]:
        """Names of the run files present (results.json, metrics.csv, checkpoint.json, checkpoints,
        model.safetensors): every file a run writes, so that none of a user's files of these names is
        overwritten without --resume."""
        names = [p.name for p in (self.results, self.metrics, self.checkpoint_json, self.model)
                 if p.exists() or p.is_symlink()]
        return names + [p.name for p in self.checkpoint_files()]

    # -- checks ---------------------------------------------------------------------------------
    def check_usable(self) -> None:
        """ValueError (naming the option and the path) when the directory cannot be created or used:
        the path or one of its parents is a file, or the path or a file the toolkit writes in it is a
        symbolic link (a link would make the run write, or resume, wherever it
        points). Creates nothing."""
        self.refuse_links()
        for candidate in (self.path, *self.path.parents):
            if candidate.exists():
                if not candidate.is_dir():
                    what = "is a file" if candidate == self.path else f"lies in {candidate}, which is a file"
                    raise ValueError(f"{self.option} {self.path}: {what}, not a directory; choose a directory")
                if not os.access(candidate, os.W_OK | os.X_OK):
                    raise ValueError(f"{self.option} {self.path}: {candidate} is not writable")
                return

    def refuse_links(self) -> None:
        """ValueError naming the link when the directory itself, or one of the files the toolkit writes
        in it (results.json, metrics.csv, checkpoint.json, model.safetensors, .lock.json, checkpoints),
        is a symbolic link: the toolkit writes, reads back and deletes only real files in real folders."""
        links = [self.path] if self.path.is_symlink() else []
        if not links and self.path.is_dir():
            names = {RESULTS_FILE, METRICS_FILE, CHECKPOINT_JSON, MODEL_FILE, LOCK_FILE}
            links = sorted(p for p in self.path.iterdir()
                           if p.is_symlink() and (p.name in names or CHECKPOINT_FILE.fullmatch(p.name)))
        if links:
            link = links[0]
            raise ValueError(f"{self.option} {self.path}: {link} is a symbolic link (to {os.readlink(link)}); refused: "
                             f"the toolkit never writes, reads back or deletes through a link (nothing was changed); "
                             f"replace the link by a real folder or file, or choose another {self.option}")

    def create(self) -> None:
        """Create the directory (and parents), with errors naming the option instead of a traceback."""
        self.check_usable()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ValueError(f"{self.option} {self.path}: cannot create the directory ({exc.strerror or exc})") from exc

    # -- lock -----------------------------------------------------------------------------------
    def holder(self) -> str:
        """Who holds the lock, as `.lock.json` says (pid, host, command, since), or "unknown"."""
        try:
            if self.lock_file.stat().st_size > MAX_HOLDER_BYTES:
                return "unknown holder"
            info = json.loads(self.lock_file.read_text(encoding="utf-8"))
            return (f"pid {int(info['pid'])} on {str(info['host'])[:100]}, since {str(info['since'])[:40]}, "
                    f"command: {str(info['command'])[:300]}")
        except (OSError, ValueError, KeyError, TypeError, RecursionError):
            return "unknown holder (it has not written .lock.json yet)"

    @contextlib.contextmanager
    def locked(self) -> Iterator["RunDir"]:
        """Hold an exclusive lock on the directory (created when absent) while the block runs.

        Raises RunLockedError naming the holder when another process holds it. On entry, stray
        temporary files of interrupted writes are removed (`clean_tmp`) and the holder is recorded in
        `.lock.json`, which is removed again on exit.
        """
        self.create()
        target = self.path / LOCK_TARGET
        if target.is_symlink():  # a lock through a link would create or truncate a file outside the run directory
            raise ValueError(f"{self.option} {self.path}: {LOCK_TARGET} is a symbolic link; a run directory's lock "
                             f"must be a plain file (remove the link)")
        lock = filelock.FileLock(target, timeout=0)
        try:
            lock.acquire()
        except filelock.Timeout:
            raise RunLockedError(f"{self.path} is in use by another throughway process ({self.holder()}); "
                                 f"wait for it to end, or choose another {self.option}") from None
        written: bytes | None = None
        try:
            self._check_lock_file()
            self.clean_tmp()
            atomic_write_json(self.lock_file, {
                "pid": os.getpid(), "host": socket.gethostname(), "command": " ".join(sys.argv),
                "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
            written = self.lock_file.read_bytes()
            yield self
        finally:
            # Removed only by its owner: the file this process wrote, still as it wrote it (never a user's
            # file of the same name, nor another process's lock).
            with contextlib.suppress(OSError):
                if written is not None and not self.lock_file.is_symlink() and self.lock_file.read_bytes() == written:
                    self.lock_file.unlink()
            lock.release()

    def _check_lock_file(self) -> None:
        """ValueError naming `.lock.json` when it exists but is not a holder record the toolkit writes
        (an object with pid, host, command and since): it is then a user's file, never overwritten or
        deleted. A record left by a killed run is the toolkit's own and is replaced."""
        path = self.lock_file
        if not (path.exists() or path.is_symlink()):
            return
        try:
            ours = path.is_file() and not path.is_symlink() and path.stat().st_size <= MAX_HOLDER_BYTES
            info = json.loads(path.read_text(encoding="utf-8")) if ours else None
            ours = isinstance(info, dict) and set(info) == {"pid", "host", "command", "since"}
        except (OSError, ValueError, RecursionError):
            ours = False
        if not ours:
            raise ValueError(f"{path}: exists but is not a lock record written by throughway (an object with pid, "
                             f"host, command, since); refused, the file was not changed: move it away, or choose "
                             f"another {self.option}")

    def clean_tmp(self) -> list[Path]:
        """Delete the `.<name>.<random>.tmp` files an interrupted atomic write left in the directory
        (not in sub-folders); return them. Call it only while holding the lock."""
        removed: list[Path] = []
        if not self.path.is_dir():
            return removed
        for entry in self.path.iterdir():
            if _TMP_FILE.fullmatch(entry.name) and entry.is_file() and not entry.is_symlink():
                with contextlib.suppress(FileNotFoundError):
                    entry.unlink()
                    removed.append(entry)
        return removed


@contextlib.contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Hold back Ctrl-C (SIGINT) while the block runs, then raise it: an epoch's files are written whole.

    An interrupt between a run's checkpoint and its results.json left checkpoint.json one epoch ahead of
    the history (seen under load in tests/test_rundir.py::test_two_processes_on_one_out). Each file
    is atomic on its own; this makes the pair atomic against an interrupt. Outside the main thread (where
    Python delivers signals) it does nothing. SIGKILL and power loss still land anywhere: resume then
    trusts checkpoint.json, and results.json is rewritten from it.
    """
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.SIG_DFL)
    if received:
        raise KeyboardInterrupt
