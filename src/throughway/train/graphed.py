"""A stack's epoch without host synchronisation: `GraphedStep`, the CUDA path of `train_stacked`.

On a GPU the MNIST studies' tiny models (width 50) are bound by kernel launches, not arithmetic: a
depth-100 stack launches thousands of small kernels per step. `GraphedStep` runs one epoch of a
`StackedModels` as replays of one captured step, everything the step touches held in static buffers:

* the epoch's data orders (k, n) (drawn by `torch.randperm` on the stack's device) and the
  resident training inputs; the step gathers its own batch from a device-side start offset, so a
  replay needs no argument from the host;
* forward, per-model cross-entropy, backward into the flat gradient, and the optimiser's update with
  the step-dependent scalars (bias corrections, NAdam's momentum product) computed on the device
  (`optim.update_rows_on_device`: `optim.update_rows`'s rule and kernels; on the CPU the same numbers
  bit for bit, tests/test_cuda_path.py);
* the epoch's totals (loss sums, errors, the first non-finite step and its loss) accumulated on the
  device with `stacked.train_epoch`'s arithmetic, read once at the epoch's end, where the loop
  applies its one divergence rule (train.loop.run_loop).

On a CUDA device (`capture=True`, the default there) each batch size of the epoch (at most two: the
full batch and the last one) is captured once as a `torch.cuda.CUDAGraph` after warm-up steps on a
side stream; the warm-up's effects on weights, statistics and optimiser state are undone, so the
captured epoch trains exactly the steps `train_epoch` would. A capture is redone when the stack
changes (a diverged member leaves it) or the data does. Elsewhere (`capture=False`) the same body runs
eagerly each step, which is how the CPU tests check it.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from .loop import epoch_starts
from .optim import update_rows_on_device
from .stacked import EpochTotals, StackedModels, StackedOptimizer, backward, compiled_forward

__all__ = ["GraphedStep"]

_WARMUP_STEPS = 3  # torch's advice for a whole-network capture: warm up on a side stream first


class GraphedStep:
    """Every step of an epoch of `stack` (trained by `optimizer`) from static buffers, captured as CUDA
    graphs on a CUDA device (module docstring). `epoch(train_x, train_y, orders, batch_size)` is
    `stacked.train_epoch(StackedStep(stack, optimizer), ...)` with the same totals and semantics.

    `capture`: None (default) captures on a CUDA device and runs eagerly elsewhere; True demands a CUDA
    device. `compile=True` passes the forward and loss through torch.compile before the capture;
    `compile="blocks"` compiles one MLP block and reuses it for every block (`stacked.compiled_forward`)."""

    def __init__(self, stack: StackedModels, optimizer: StackedOptimizer, *, capture: bool | None = None,
                 compile: bool | str = False, warmup: int = _WARMUP_STEPS) -> None:
        cuda = stack.device.type == "cuda"
        if capture and not cuda:
            raise ValueError(f"capture=True: CUDA graphs need a CUDA device; the stack is on {stack.device}")
        self.stack, self.optimizer = stack, optimizer
        self.capture = cuda if capture is None else capture
        self.warmup = warmup
        self._forward_loss: Callable[..., tuple[torch.Tensor, torch.Tensor]] = compiled_forward(
            stack, stack.training_loss, compile)
        self._key: tuple[Any, ...] | None = None
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.captures = 0  # how many graphs were captured (tests and benchmarks read it)

    # -- the step's body, from static buffers ------------------------------------------------------
    def _body(self, size: int) -> None:
        """One step on the batch of `size` samples at the device-side offset `self.start`."""
        columns = self.start + self.columns[size]                      # (B,)
        index = self.orders.index_select(1, columns)                   # (k, B)
        x, y = self.train_x[index], self.train_y[index]                # (k, B, features), (k, B)
        losses, wrong = self._forward_loss(x, y)
        self.stack.grad.zero_()
        backward(losses.sum())  # each model's loss depends on its own parameters only
        group = self.optimizer.param_groups[0]
        with torch.no_grad():
            update_rows_on_device(self.optimizer.kind, self.stack.flat, self.stack.grad, self.opt_state, lr=self.lr,
                                  momentum=group["momentum"], weight_decay=group["weight_decay"],
                                  betas=tuple(group["betas"]), eps=float(group["eps"]),
                                  momentum_decay=float(group["momentum_decay"]), nesterov=bool(group["nesterov"]),
                                  kernels=self.optimizer.kernels)
            self.totals.add(losses.detach(), wrong, self.index, size)  # stacked.train_epoch's totals, on the device
            self.index.add_(1)
            self.start.add_(size)

    # -- static buffers and capture ----------------------------------------------------------------
    def _tensors(self) -> list[torch.Tensor]:
        """Every tensor the step reads or writes in place that the trainer may replace between epochs."""
        group = self.optimizer.param_groups[0]
        state = self.optimizer.state[group["params"][0]]
        optimizer = [state[k] for k in ("momentum_buffer", "exp_avg", "exp_avg_sq") if k in state]
        rates = [t for t in (group["momentum"], group["weight_decay"]) if isinstance(t, torch.Tensor)]
        return [self.stack.flat, self.stack.grad, *self.stack.running.values(), *optimizer, *rates]

    def _build(self, train_x: torch.Tensor, train_y: torch.Tensor, orders: torch.Tensor, sizes: set[int]) -> None:
        device = self.stack.device
        k, n = orders.shape
        self.train_x, self.train_y = train_x, train_y
        self.orders = torch.empty((k, n), dtype=torch.long, device=device)
        self.columns = {s: torch.arange(s, device=device) for s in sizes}
        self.start = torch.zeros((), dtype=torch.long, device=device)
        self.index = torch.zeros((), dtype=torch.long, device=device)
        self.totals = EpochTotals.zeros(k, device)
        self.lr = torch.zeros((k, 1), dtype=self.stack.flat.dtype, device=device)
        group = self.optimizer.param_groups[0]
        state = self.optimizer.state[group["params"][0]]
        self.opt_state = {key: value for key, value in state.items() if key not in ("step", "mu_product")}
        self.opt_state["step"] = torch.zeros((), dtype=torch.float32, device=device)
        if self.optimizer.kind == "nadam":
            self.opt_state["mu_product"] = torch.ones((), dtype=torch.float32, device=device)
        self._graphs = {}

    def _reset(self, orders: torch.Tensor) -> None:
        """The epoch's orders, offsets, totals, learning rates and optimiser scalars into the buffers."""
        group = self.optimizer.param_groups[0]
        state = self.optimizer.state[group["params"][0]]
        self.orders.copy_(orders)
        self.start.zero_()
        self.index.zero_()
        self.totals.loss_sum.zero_()
        self.totals.wrong.zero_()
        self.totals.bad_step.fill_(-1)
        self.totals.bad_loss.zero_()
        self.lr.copy_(group["lr"])
        for key in ("step", "mu_product"):
            if key in self.opt_state:
                self.opt_state[key].copy_(state[key])

    def _capture(self, size: int) -> torch.cuda.CUDAGraph:
        """Capture the step for batches of `size` (after warm-up steps whose effects are undone)."""
        saved = self.stack.snapshot()
        saved_optimizer = {k: v.clone() for k, v in self.opt_state.items()}
        stream = torch.cuda.Stream(device=self.stack.device)
        stream.wait_stream(torch.cuda.current_stream(self.stack.device))
        with torch.cuda.stream(stream):
            for _ in range(self.warmup):
                self.start.zero_()
                self._body(size)
        torch.cuda.current_stream(self.stack.device).wait_stream(stream)
        self.start.zero_()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._body(size)
        with torch.no_grad():
            self.stack.flat.copy_(saved["flat"])
            for name, value in self.stack.running.items():
                value.copy_(saved[f"running.{name}"])
            for key, value in self.opt_state.items():
                value.copy_(saved_optimizer[key])
        self.stack.steps.copy_(saved["steps"])  # the warm-up's and the capture's forward passes counted none
        self.captures += 1
        return graph

    # -- the epoch ---------------------------------------------------------------------------------
    def epoch(self, train_x: torch.Tensor, train_y: torch.Tensor, orders: torch.Tensor, batch_size: int) -> EpochTotals:
        """One epoch of every model of the stack, as `stacked.train_epoch` defines it: model i visits
        `train_x` (n, features) / `train_y` (n,) in the order `orders[i]` in mini-batches of
        `batch_size` (`loop.epoch_starts`); the totals are read from the device once, by the caller."""
        k, n = orders.shape
        sizes = [min(batch_size, n - s) for s in epoch_starts(n, batch_size)]
        key = (k, n, train_x.data_ptr(), train_y.data_ptr(), tuple(sizes),
               tuple(t.data_ptr() for t in self._tensors()))
        if key != self._key:
            self._build(train_x, train_y, orders, set(sizes))
            self._key = key
        self._reset(orders)  # the warm-up of a capture reads the epoch's real first batches
        if self.capture:
            for size in dict.fromkeys(sizes):
                if size not in self._graphs:
                    self._graphs[size] = self._capture(size)
            self._reset(orders)
            for size in sizes:
                self._graphs[size].replay()
            if self.stack.bn_names:
                self.stack.steps += len(sizes)  # what the forward passes count when run eagerly
        else:
            for size in sizes:
                self._body(size)
        state = self.optimizer.state[self.optimizer.param_groups[0]["params"][0]]
        state["step"] += len(sizes)  # the host's copy of the step count, without reading the device
        if "mu_product" in self.opt_state:
            state["mu_product"] = self.opt_state["mu_product"].detach().to("cpu", copy=True)
        totals = self.totals
        return EpochTotals(totals.loss_sum.clone(), totals.wrong.clone(), totals.bad_step.clone(),
                           totals.bad_loss.clone(), sum(sizes))
