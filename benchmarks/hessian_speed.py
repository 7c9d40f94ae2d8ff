"""Exact Hessian + full spectrum of a depth-96, width-10 linear network (9,600 parameters): the
toolkit's way against plain torch.func, and Lanczos's top eigenvalue against the full spectrum.

    python benchmarks/hessian_speed.py [--depth 96] [--plain-depth 48] [--threads 2] [--memory-limit-gb 12]

The network is `shortcut_net` (plain, orthogonal init, no biases) on whitened MNIST condensed to
its second moments (20 samples; the loss of a linear network is exactly that of all 60,000
images), the setting of Demystifying ResNet's Hessian figures. Each way runs in its own child
process, so that its peak resident memory (VmHWM, the whole process with torch loaded) is its
own, and each warms torch.func up on a tiny model first:
* toolkit: `exact_hessian` (vmapped forward-over-reverse products with basis vectors, block row by
  block row, lower block triangle only, float64) + `torch.linalg.eigvalsh`; then
  `lanczos(HessianOperator, k=1, tol=1e-6)` (the top eigenvalue to ~1e-12 relative);
* plain: `torch.func.hessian` (jacfwd over jacrev on all 9,600 directions at once) +
  `torch.linalg.eigvalsh`, under an address-space limit; if it cannot run at the full depth
  (memory or error), both ways are also timed at `--plain-depth` and that ratio is printed,
  labelled with its depth.
Prints: time of each way, the ratio plain / toolkit, peak memory, the Lanczos top eigenvalue, its
agreement with eigvalsh, and the ratio full-spectrum time / Lanczos time. The issue's targets are
for this machine's 2 cores, so both ways use 2 threads by default. Timings on a shared machine vary
with its load, which is printed before and after, with CPU times beside wall times.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import time
from typing import Any

import torch

LANCZOS_TOL = 1e-6  # residual ≤ tol · |θ|; see lanczos()


def _data() -> tuple[torch.Tensor, torch.Tensor, str]:
    """The condensed whitened-MNIST set (computed in the parent, so children do not load MNIST)."""
    try:
        from throughway.study.shortcut import whitened_data

        data = whitened_data(linear=True)
        return data.x.clone(), data.y.clone(), data.description
    except Exception as exc:  # noqa: BLE001 - no MNIST cache: random data of the same shape
        g = torch.Generator().manual_seed(0)
        return (torch.randn(20, 10, generator=g, dtype=torch.float64), torch.randn(20, 10, generator=g, dtype=torch.float64),
                f"random 20×10 data (MNIST unavailable: {exc})")


def _setup(depth: int, threads: int, data: tuple[torch.Tensor, torch.Tensor, str]):
    torch.set_num_threads(threads)
    from throughway.analysis.hessian import exact_hessian, squared_error_loss
    from throughway.models import create_model

    x, y, source = data
    # torch.func builds its transforms on first use (tens of seconds on a loaded machine): warm up on
    # a tiny model so that neither way's timing includes this one-time cost.
    warm = create_model("shortcut_net", depth=2, shortcut_depth=0, width=10)
    exact_hessian(warm, squared_error_loss, x, y)
    torch.func.hessian(lambda v: (v ** 3).sum())(torch.ones(3, dtype=torch.float64))
    torch.manual_seed(0)
    model = create_model("shortcut_net", depth=depth, shortcut_depth=0, width=10, init="orthogonal")
    return model, squared_error_loss, x, y, source


def _toolkit(depth: int, threads: int, lanczos_too: bool, data: Any, queue: Any) -> None:
    from throughway.analysis.hessian import HessianOperator, exact_hessian, lanczos

    model, loss, x, y, source = _setup(depth, threads, data)
    cpu = time.process_time()
    start = time.perf_counter()
    h = exact_hessian(model, loss, x, y)
    formed = time.perf_counter() - start
    form_cpu = time.process_time() - cpu
    eig = torch.linalg.eigvalsh(h)
    total = time.perf_counter() - start
    out = {"source": source, "params": h.shape[0], "form_s": formed, "total_s": total, "top": float(eig[-1]),
           "cpu_s": time.process_time() - cpu, "form_cpu_s": form_cpu,
           "peak_rss_gib": _peak_gib()}
    if lanczos_too:
        del h
        cpu = time.process_time()
        start = time.perf_counter()
        # tol bounds the Ritz residual; the eigenvalue's own error is ~ residual² / gap, so 1e-6
        # gives the top eigenvalue to ~1e-12 relative: the agreement with eigvalsh is printed.
        result = lanczos(HessianOperator(model, loss, x, y), k=1, tol=LANCZOS_TOL)
        out.update({"lanczos_s": time.perf_counter() - start, "lanczos_cpu_s": time.process_time() - cpu,
                    "lanczos_top": float(result.eigenvalues[0]),
                    "lanczos_steps": result.steps, "lanczos_converged": result.all_converged})
    queue.put(out)


def _plain(depth: int, threads: int, limit_gb: float, data: Any, queue: Any) -> None:
    limit = int(limit_gb * 2 ** 30)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        model, loss, x, y, _ = _setup(depth, threads, data)
        names = [n for n, _ in model.named_parameters()]
        shapes = [p.shape for p in model.parameters()]
        flat = torch.cat([p.detach().double().reshape(-1) for p in model.parameters()])

        def f(v: torch.Tensor) -> torch.Tensor:
            params = {n: t.view(s) for n, t, s in zip(names, v.split([s.numel() for s in shapes]), shapes)}
            return loss(torch.func.functional_call(model, params, (x.double(),)), y.double())

        cpu = time.process_time()
        start = time.perf_counter()
        h = torch.func.hessian(f)(flat)
        formed = time.perf_counter() - start
        form_cpu = time.process_time() - cpu
        eig = torch.linalg.eigvalsh(h)
        queue.put({"form_s": formed, "total_s": time.perf_counter() - start, "top": float(eig[-1]),
                   "cpu_s": time.process_time() - cpu, "form_cpu_s": form_cpu,
                   "peak_rss_gib": _peak_gib()})
    except (MemoryError, RuntimeError) as exc:
        queue.put({"error": f"{type(exc).__name__}: {str(exc)[:200]}"})


def _peak_gib() -> float:
    """This process's peak resident memory (VmHWM; unlike ru_maxrss it is not inherited from the parent)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2 ** 20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20


def _child(target: Any, *args: Any) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=target, args=(*args, queue))
    process.start()
    process.join()
    if not queue.empty():
        return queue.get()
    return {"error": f"child process ended with exit code {process.exitcode} (killed: out of memory?)"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--depth", type=int, default=96)
    parser.add_argument("--plain-depth", type=int, default=48, help="depth of the fallback comparison")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1),
                        help="torch threads per way (default: 2, the cores the targets are set for)")
    parser.add_argument("--memory-limit-gb", type=float, default=12.0, help="address-space limit of the plain way")
    parser.add_argument("--skip-plain", action="store_true")
    args = parser.parse_args()
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()}, torch {torch.__version__}, "
          f"{args.threads} thread(s) per process")
    _compare(args)
    print(f"load average at the end: {os.getloadavg()} (above ~0.5 the wall times are inflated; compare CPU times)")


def _compare(args: argparse.Namespace) -> None:
    data = _data()
    ours = _child(_toolkit, args.depth, args.threads, True, data)
    if "error" in ours:
        raise SystemExit(f"toolkit way failed: {ours['error']}")
    print(f"data: {ours['source']}")
    print(f"toolkit, depth {args.depth} ({ours['params']} parameters): exact Hessian {ours['form_s']:.1f} s "
          f"(CPU {ours['form_cpu_s']:.1f} s) + eigvalsh {ours['total_s'] - ours['form_s']:.1f} s = "
          f"{ours['total_s']:.1f} s total (CPU time {ours['cpu_s']:.1f} s), peak memory {ours['peak_rss_gib']:.2f} GiB "
          f"(targets: ≤ 60 s {'met' if ours['total_s'] <= 60 else 'MISSED'}, "
          f"≤ 4 GiB {'met' if ours['peak_rss_gib'] <= 4 else 'MISSED'})")
    print(f"Lanczos top eigenvalue: {ours['lanczos_top']:.10g} in {ours['lanczos_s']:.2f} s ({ours['lanczos_steps']} steps, "
          f"converged {ours['lanczos_converged']}); eigvalsh top {ours['top']:.10g}; "
          f"relative difference {abs(ours['lanczos_top'] - ours['top']) / abs(ours['top']):.1e}")
    print(f"RATIO full spectrum / Lanczos top eigenvalue = {ours['total_s'] / ours['lanczos_s']:.1f}x wall, "
          f"{ours['cpu_s'] / ours['lanczos_cpu_s']:.1f}x CPU time (target ≥ 20x)")

    if args.skip_plain:
        return
    plain = _child(_plain, args.depth, args.threads, args.memory_limit_gb, data)
    if "error" not in plain:
        print(f"plain torch.func.hessian + eigvalsh, depth {args.depth}: {plain['total_s']:.1f} s (CPU {plain['cpu_s']:.1f} s) "
              f"(Hessian {plain['form_s']:.1f} s, CPU {plain['form_cpu_s']:.1f} s), peak memory {plain['peak_rss_gib']:.2f} GiB; "
              f"top eigenvalues agree to {abs(plain['top'] - ours['top']) / abs(ours['top']):.1e}")
        print(f"RATIO plain / toolkit time at depth {args.depth} = {plain['total_s'] / ours['total_s']:.2f}x; "
              f"Hessian formation only {plain['form_s'] / ours['form_s']:.2f}x")
        return
    print(f"plain torch.func.hessian at depth {args.depth} did not run within {args.memory_limit_gb:g} GiB: {plain['error']}")
    small_ours = _child(_toolkit, args.plain_depth, args.threads, False, data)
    small_plain = _child(_plain, args.plain_depth, args.threads, args.memory_limit_gb, data)
    if "error" in small_plain:
        print(f"plain way failed at depth {args.plain_depth} too: {small_plain['error']}")
        return
    print(f"depth {args.plain_depth} ({small_ours['params']} parameters): toolkit {small_ours['total_s']:.1f} s "
          f"(Hessian {small_ours['form_s']:.1f} s, {small_ours['peak_rss_gib']:.2f} GiB); plain {small_plain['total_s']:.1f} s "
          f"(Hessian {small_plain['form_s']:.1f} s, {small_plain['peak_rss_gib']:.2f} GiB)")
    print(f"RATIO plain / toolkit time at depth {args.plain_depth} (fallback: the plain way cannot run at depth "
          f"{args.depth}) = {small_plain['total_s'] / small_ours['total_s']:.2f}x; Hessian formation only "
          f"{small_plain['form_s'] / small_ours['form_s']:.2f}x")


if __name__ == "__main__":
    main()
