"""Small shared helpers: atomic file writes, JSON that stays valid, and the run environment.

Every file the toolkit writes (results, checkpoints, caches, tables, figures) goes through
`atomic_write_bytes`, so a crash or an interrupt leaves either the old file or the new one,
never a half-written one. This module imports only the standard library, so every room of the
package may use it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

__all__ = [
    "WriteError",
    "atomic_write_bytes",
    "atomic_write_text",
    "atomic_write_json",
    "read_json",
    "read_json_object",
    "json_safe",
    "sha256_file",
    "git_revision",
    "environment_info",
    "cpu_model",
]


class WriteError(OSError):
    """A file could not be written (full disk, no permission, ...); its previous version is intact.

    The message names the file and says that nothing finished was lost: every write is atomic, so
    the files of finished work (an earlier epoch's checkpoint, results.json) are unchanged.
    """


def _write_error(path: Path, exc: OSError) -> WriteError:
    reason = "no space left on device" if exc.errno == errno.ENOSPC else (exc.strerror or str(exc))
    return WriteError(exc.errno, f"{path}: could not be written ({reason}); its previous version is unchanged and "
                                 f"nothing finished was lost (every file is written atomically). Free the space or "
                                 f"fix the cause, then rerun (with --resume for an interrupted run)")


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write `data` to `path` atomically: a temporary file in the same folder, fsync, rename.

    Readers see the old content or the new content, never a partial file. Parent folders are
    created. Returns the path written. An OSError while writing (e.g. ENOSPC, a full disk) leaves
    no temporary file behind and is raised as `WriteError`, whose message names `path`.
    """
    path = Path(path)
    tmp = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; results and caches are meant to be shared
        os.replace(tmp, path)
    except BaseException as exc:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except FileNotFoundError:
                pass
        if isinstance(exc, OSError) and not isinstance(exc, WriteError):
            raise _write_error(path, exc) from exc
        raise
    return path


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write UTF-8 `text` to `path` atomically (see `atomic_write_bytes`)."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def json_safe(value: Any) -> Any:
    """Return `value` with every non-finite float replaced by None, recursively.

    Standard JSON has no NaN or infinity; a diverged run's loss is recorded as null instead.
    Tuples become lists; Paths become strings.
    """
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write `obj` as indented, strictly valid JSON (NaN/inf become null), atomically."""
    text = json.dumps(json_safe(obj), indent=2, allow_nan=False, sort_keys=False) + "\n"
    return atomic_write_text(path, text)


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file, raising a ValueError that names the file when it is not valid JSON (or nested
    too deeply to read)."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc}); the file is damaged, delete it or rerun") from exc
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text ({exc}); the file is damaged, delete it or rerun") from exc
    except RecursionError:  # "[" * 100000: Python's parser gives up; the file's fault, not a crash
        raise ValueError(f"{path}: JSON nested too deeply to read (arrays or objects inside each other beyond "
                         f"Python's recursion limit); the file was edited or damaged, delete it or rerun") from None


def read_json_object(path: str | os.PathLike[str], what: str = "a JSON object") -> dict[str, Any]:
    """Read a JSON file that must hold an object (a dict); ValueError naming the file otherwise.

    `what` describes the expected content in the message (e.g. "a run's results").
    """
    value = read_json(path)
    if not isinstance(value, dict):
        raise ValueError(f"{path}: holds {type(value).__name__} {_short(value)}; expected {what} "
                         f"(a JSON object); the file was edited or damaged")
    return value


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= limit else text[:limit] + "…"


def sha256_file(path: str | os.PathLike[str], chunk_size: int = 1 << 20) -> str:
    """Return the hex SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(chunk_size), b""):
            digest.update(chunk)
    return digest.hexdigest()


def git_revision(start: str | os.PathLike[str] | None = None) -> str:
    """Return the git revision of the checkout holding this package (or `start`), or "unknown".

    A "-dirty" suffix marks uncommitted changes to tracked files.
    """
    where = Path(start) if start is not None else Path(__file__).resolve().parent
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=where, capture_output=True, text=True, timeout=10
        )
        if rev.returncode != 0:
            return "unknown"
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=where, capture_output=True, text=True, timeout=10,
        )
        suffix = "-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else ""
        return rev.stdout.strip() + suffix
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo's first "model name"; elsewhere platform.processor()),
    or "unknown". Float results can differ between CPUs (their vector instructions pick other kernels)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                if line.startswith("model name") and ":" in line:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def environment_info(device: str | None = None) -> dict[str, Any]:
    """Describe where a result was measured: torch version, device, threads, CPU model, git revision,
    host: with the data's checksums (which runs add) what a bit-for-bit re-run needs.

    Written into every results file (docs/design.md, "A results file is JSON with ... the environment").
    """
    info: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "git_revision": git_revision(),
    }
    try:
        import torch

        info["torch_version"] = torch.__version__
        info["threads"] = torch.get_num_threads()
        # The vector instruction set torch dispatches to (AVX2, AVX512, ...): CPUs sold under one model
        # name (a VM's "AMD EPYC") may differ here, and with it the last bits of every sum.
        info["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
        info["cuda_available"] = bool(torch.cuda.is_available())
        if device is not None:
            info["device"] = str(device)
            if str(device).startswith("cuda") and torch.cuda.is_available():
                info["device_name"] = torch.cuda.get_device_name(torch.device(device))
    except ImportError:  # pragma: no cover - torch is a hard dependency
        pass
    return info
