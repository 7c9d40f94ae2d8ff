"""What the Demystifying ResNet figures read off a Hessian spectrum: condition numbers, the index,
and whether the Hessian is zero or singular to tolerance (see analysis.hessian's module docstring
for the tolerance; analysis.hessian re-exports every name here).
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from typing import Any

import torch

__all__ = ["condition_number", "default_rtol", "singular_to_tolerance", "apply_tolerance", "SingularHessianWarning",
           "plain_condition_number", "index", "SpectrumSummary", "spectrum_summary"]

def _abs_eigenvalues(eigenvalues: torch.Tensor) -> torch.Tensor:
    values = torch.as_tensor(eigenvalues, dtype=torch.float64).reshape(-1)
    if values.numel() == 0:
        raise ValueError("eigenvalues is empty")
    if not torch.isfinite(values).all():
        raise ValueError("eigenvalues contain NaN or infinity")
    return values.abs()



class SingularHessianWarning(UserWarning):
    """A Hessian is singular to tolerance: its plain condition number and index are undefined."""



def default_rtol(size: int) -> float:
    """The default relative tolerance for a spectrum of `size` eigenvalues: size · eps(float64)."""
    return max(1, int(size)) * torch.finfo(torch.float64).eps



def singular_to_tolerance(min_abs: float, max_abs: float, size: int, rtol: float | None = None) -> bool:
    """True when min |λ| ≤ rtol · max |λ| (rtol default `default_rtol(size)`), or the matrix is zero.

    Works from stored summaries (min |λ|, max |λ|, P) as well as from spectra.
    """
    tol = (default_rtol(size) if rtol is None else float(rtol)) * max_abs
    return max_abs == 0.0 or min_abs <= tol



def condition_number(eigenvalues: torch.Tensor, low_percentile: float = 10.0, rtol: float | None = None) -> float | None:
    """max |λ| / (the `low_percentile`-th percentile of |λ|): Demystifying ResNet appendix B.

    The paper uses the 10th percentile because min |λ| is very unstable. The percentile is linear
    interpolation between order statistics (numpy's default). Returns None when the ratio is
    undefined: a zero Hessian (max |λ| = 0) or a percentile within the tolerance rtol · max |λ|
    (rtol default P · eps, see the module docstring) — never NaN or infinity.
    Use `spectrum_summary` to tell the two apart.
    """
    if not 0.0 <= low_percentile <= 100.0:
        raise ValueError(f"low_percentile={low_percentile}: must be between 0 and 100")
    values = _abs_eigenvalues(eigenvalues)
    top = float(values.max())
    low = float(torch.quantile(values, low_percentile / 100.0))
    tol = (default_rtol(values.numel()) if rtol is None else float(rtol)) * top
    if top == 0.0 or low <= tol:
        return None
    return top / low



def plain_condition_number(eigenvalues: torch.Tensor, rtol: float | None = None) -> float | None:
    """max |λ| / min |λ|, or None when the Hessian is singular to tolerance (including zero)."""
    values = _abs_eigenvalues(eigenvalues)
    low, top = float(values.min()), float(values.max())
    return None if singular_to_tolerance(low, top, values.numel(), rtol) else top / low



def index(eigenvalues: torch.Tensor, tol: float = 0.0) -> float:
    """The fraction of eigenvalues below −tol (the index of a critical point; paper figure 6).

    A zero Hessian has index 0. `spectrum_summary` reports None instead for a Hessian that is
    singular to tolerance.
    """
    values = torch.as_tensor(eigenvalues, dtype=torch.float64).reshape(-1)
    if values.numel() == 0:
        raise ValueError("eigenvalues is empty")
    return float((values < -abs(tol)).double().mean())



@dataclass(frozen=True)
class SpectrumSummary:
    """What the paper's figures read off a Hessian spectrum (see `spectrum_summary`)."""

    size: int
    max_abs: float
    low_abs: float
    min_abs: float
    low_percentile: float
    condition: float | None
    plain_condition: float | None
    index: float | None
    zero: bool
    singular: bool
    rtol: float

    def to_dict(self) -> dict[str, Any]:
        """The summary as a JSON-able dict (None where undefined)."""
        return asdict(self)



def spectrum_summary(eigenvalues: torch.Tensor, low_percentile: float = 10.0, zero_tol: float = 0.0,
                     rtol: float | None = None, warn: bool = True) -> SpectrumSummary:
    """max |λ|, the low percentile of |λ|, min |λ|, both condition numbers, the index, whether the
    Hessian is zero (max |λ| ≤ zero_tol) and whether it is singular to tolerance (min |λ| ≤
    rtol · max |λ|, rtol default P · eps; see the module docstring).

    Undefined values are None: both condition numbers of a zero Hessian; the plain condition
    number and the index of a singular one (with a `SingularHessianWarning` when `warn`); the
    paper's condition number when its percentile is within the tolerance.
    """
    values = _abs_eigenvalues(eigenvalues)
    top = float(values.max())
    bottom = float(values.min())
    rtol = default_rtol(values.numel()) if rtol is None else float(rtol)
    zero = top <= zero_tol
    singular = zero or singular_to_tolerance(bottom, top, values.numel(), rtol)
    if singular and not zero and warn:
        warnings.warn(f"the Hessian is singular to tolerance (min |λ| = {bottom:.3g} ≤ {rtol:.2g} · max |λ| = "
                      f"{rtol * top:.3g}): its plain condition number and index are undefined",
                      SingularHessianWarning, stacklevel=2)
    return SpectrumSummary(
        size=int(values.numel()), max_abs=top,
        low_abs=float(torch.quantile(values, low_percentile / 100.0)), min_abs=bottom,
        low_percentile=low_percentile,
        condition=None if zero else condition_number(eigenvalues, low_percentile, rtol),
        plain_condition=None if singular else top / bottom,
        index=None if singular else index(eigenvalues), zero=zero, singular=singular, rtol=rtol)



def apply_tolerance(stored: dict[str, Any], prefix: str = "", rtol: float | None = None) -> dict[str, Any]:
    """A stored spectrum summary (the fields of `SpectrumSummary.to_dict()`, each name after `prefix`)
    with `singular` and `rtol` set from its min |λ|, max |λ| and size, and the undefined values
    None: the plain condition number and index of a singular Hessian, the paper's condition number
    when its percentile is within the tolerance. For results files written before the tolerance
    existed; returns a new dict."""
    out = dict(stored)
    size, top, bottom, low = (stored[prefix + k] for k in ("size", "max_abs", "min_abs", "low_abs"))
    rtol = default_rtol(size) if rtol is None else float(rtol)
    singular = bool(stored.get(prefix + "zero")) or singular_to_tolerance(bottom, top, size, rtol)
    out[prefix + "singular"] = singular
    out[prefix + "rtol"] = rtol
    if singular:
        out[prefix + "plain_condition"] = None
        out[prefix + "index"] = None
    if top == 0.0 or low <= rtol * top:
        out[prefix + "condition"] = None
    return out
