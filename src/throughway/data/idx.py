"""Reader for the IDX format of the MNIST and Fashion-MNIST distributions (plain or gzipped).

Format (LeCun's MNIST page): two zero bytes, a type code, the number of dimensions, each
dimension as a big-endian int32, then the values in C order. The reader checks that the file holds
exactly the bytes its header promises, so a truncated or padded file is an error, never short data.
"""

from __future__ import annotations

import gzip
import os
from pathlib import Path

import numpy as np

__all__ = ["read_idx", "write_idx", "IDX_TYPES"]

IDX_TYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}


def _read_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as handle:
                return handle.read()
        return path.read_bytes()
    except (OSError, EOFError) as exc:  # gzip raises EOFError/BadGzipFile on truncation
        raise ValueError(f"{path}: cannot read ({exc}); the file is truncated or damaged, obtain it again") from exc


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Return the array stored in the IDX file `path` (".gz" files are decompressed).

    Raises ValueError naming the file when the magic number, type code or size is wrong.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: IDX file not found")
    data = _read_bytes(path)
    if len(data) < 4 or data[0] != 0 or data[1] != 0:
        raise ValueError(f"{path}: not an IDX file (bad magic number)")
    type_code, ndim = data[2], data[3]
    if type_code not in IDX_TYPES:
        raise ValueError(f"{path}: unknown IDX type code 0x{type_code:02x}")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ValueError(f"{path}: truncated IDX header")
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    dtype = IDX_TYPES[type_code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(data) - header != expected:
        raise ValueError(
            f"{path}: IDX header promises shape {shape} ({expected} bytes) but the file holds "
            f"{len(data) - header} bytes; it is truncated or damaged, obtain it again"
        )
    array = np.frombuffer(data, dtype=dtype, offset=header).reshape(shape)
    return array.astype(dtype.newbyteorder("="), copy=True)


def write_idx(path: str | os.PathLike[str], array: np.ndarray) -> None:
    """Write `array` as an IDX file (gzipped when `path` ends in ".gz"). Used by the tests' fixtures."""
    path = Path(path)
    codes = {np.dtype(v).newbyteorder("=").str: k for k, v in IDX_TYPES.items()}
    key = array.dtype.newbyteorder("=").str
    if key not in codes:
        raise ValueError(f"dtype {array.dtype} has no IDX type code")
    code = codes[key]
    header = bytes([0, 0, code, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    payload = header + np.ascontiguousarray(array, dtype=IDX_TYPES[code]).tobytes()
    if path.suffix == ".gz":
        payload = gzip.compress(payload)
    path.write_bytes(payload)
