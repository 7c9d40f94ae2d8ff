"""The one epoch loop that `fit` (one model) and `train_batched` (many stacked models) both run.

`run_loop(engine, members, ...)` drives training epoch by epoch; what differs between one model
and a stack of them is only how an epoch of steps is computed, evaluated and rolled back, and that
is the `Engine`'s job:

* `loop._ModuleEngine`: one `nn.Module`, any data form, callbacks at every step (`fit`);
* `batched._StackEngine`: N models of one shape as one `StackedModels` (`train_batched`).

Everything else is written once, here: the learning-rate schedule per member, the hooks
(`on_fit_start`, `on_epoch_start`, `on_step_end` inside the engine, `on_epoch_end`, `on_fit_end`),
divergence handling (the member's history is kept, its weights go back to the end of its last
finished epoch, it leaves the loop and its `on_fit_end` runs), the epoch record (`History`), the
evaluation, and stopping. So a fix to resume, divergence or records is made once for both paths
(tests/test_one_loop.py interrupts and resumes both the same way and compares their files).

A member is one model with its own `TrainState` and callbacks (its run directory's files are
callbacks, see runner). All active members are always at the same epoch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from .loop_state import TrainState, call

__all__ = ["Engine", "EpochStats", "Member", "run_loop", "epoch_record", "epoch_starts"]


def epoch_starts(n: int, batch_size: int, world: int = 1) -> list[int]:
    """The first index of each mini-batch of an epoch over n samples, for every path (fit's in-memory
    data, train_batched's stacks): consecutive batches of `batch_size`, except that a final batch of
    fewer than two samples per rank (`world` data-parallel processes) is folded away, since it would
    break BatchNorm's training statistics."""
    return [s for s in range(0, n, batch_size) if n - s > 2 * world - 1 or s == 0]


@dataclass
class EpochStats:
    """What one epoch of training measured, per active member (positions as in the engine).

    `loss_sum[i]`: the sum over the epoch's batches of member i's batch-mean loss × batch size;
    `wrong[i]`: its misclassified training samples, or None when the outputs are not class scores;
    `seen`: samples per member; `steps`: optimiser steps taken; `diverged`: position → {"step",
    "loss"} for members whose loss stopped being finite (at that step of the epoch, 0-based);
    `extra`: per member, further numbers of the epoch for its record (e.g. the full-batch studies'
    gradient norm), or None.
    """

    loss_sum: list[float]
    wrong: list[int | None]
    seen: int
    steps: int
    diverged: dict[int, dict[str, Any]] = field(default_factory=dict)
    extra: list[dict[str, Any]] | None = None


class Engine(Protocol):
    """How the loop's members are trained, evaluated and rolled back (see the module docstring).

    Positions are indices into the engine's active members, in the order `run_loop` keeps them."""

    def begin(self) -> None:
        """Called once after every member's `on_fit_start` (which may have restored a checkpoint)."""

    def set_learning_rates(self, epoch: int) -> list[float]:
        """Set and return each active member's learning rate for `epoch` (0-based)."""

    def train_epoch(self, epoch: int, states: Sequence[TrainState], callbacks: Sequence[Sequence[Any]]) -> EpochStats:
        """One epoch of steps for every active member (the engine calls `on_step_end` where it can)."""

    def evaluate(self, which: str) -> list[tuple[float | None, float | None]] | None:
        """(loss, error %) of each active member on split `which` ("val" or "test"), or None without it."""

    def gate_values(self) -> list[list[float]]:
        """Each active member's scalar-gate k values in block order ([] for a member without gates)."""

    def end_epoch(self) -> None:
        """The epoch is finished: remember the weights a diverged member goes back to."""

    def roll_back(self, position: int, state: TrainState) -> None:
        """Put member `position`'s weights back to the end of its last finished epoch, into `state.model`."""

    def sync(self, position: int, state: TrainState) -> None:
        """Make `state.model` hold member `position`'s current weights (a no-op when it trains them)."""

    def keep(self, positions: Sequence[int]) -> None:
        """Keep only the members at `positions`, in that order (members that ended leave the engine)."""


@dataclass
class Member:
    """One model of the loop: its state, its callbacks, and whether it has ended."""

    state: TrainState
    callbacks: list[Any]
    ended: bool = False


def epoch_record(epoch: int, lr: float, loss_sum: float, wrong: int | None, seen: int,
                 val: tuple[float | None, float | None] | None, test: tuple[float | None, float | None] | None,
                 ks: list[float], epoch_time: float, elapsed: float) -> dict[str, Any]:
    """One `History` record (its keys are documented there), written the same for every path."""
    record: dict[str, Any] = {"epoch": epoch + 1, "lr": lr, "train_loss": loss_sum / seen,
                              "train_error_pct": None if wrong is None else 100.0 * wrong / seen}
    # Evaluation: recorded, never used to choose anything.
    record["val_loss"], record["val_error_pct"] = val if val is not None else (None, None)
    record["test_loss"], record["test_error_pct"] = test if test is not None else (None, None)
    if ks:
        record["k"] = ks
        record["k_mean"] = sum(ks) / len(ks)
    record["epoch_time_s"] = epoch_time
    record["elapsed_s"] = elapsed
    return record


def _end(member: Member) -> None:
    member.ended = True
    call(member.callbacks, "on_fit_end", member.state)


def run_loop(engine: Engine, members: Sequence[Member], epochs: int, *,
             after_epoch: Callable[[Sequence[Member]], None] | None = None) -> None:
    """Train `members` with `engine` until each has `epochs` finished epochs, diverged or stopped.

    Every member's `on_fit_start` runs first (it may restore its state, e.g. a checkpoint); members
    already ended (`Member.ended`) are skipped throughout. Per epoch, in order: the learning rates,
    `on_epoch_start`, the engine's epoch of steps, divergence (per member: history marked, weights
    rolled back, `on_fit_end`, out of the loop), evaluation on val and test, the record appended to
    each member's history, `after_epoch(active members)` (e.g. a batch checkpoint), `on_epoch_end`;
    then members whose callbacks set `state.stop` end. `on_fit_end` runs once per member.
    """
    for m in members:
        if not m.ended:
            call(m.callbacks, "on_fit_start", m.state)
    active = [m for m in members if not m.ended]
    if len({m.state.epoch for m in active}) > 1:
        raise ValueError(f"members resume from different epochs {sorted({m.state.epoch for m in active})}; "
                         f"a loop's members are always at one epoch")
    engine.begin()
    while active and active[0].state.epoch < epochs:
        epoch = active[0].state.epoch
        lrs = engine.set_learning_rates(epoch)
        for m in active:
            call(m.callbacks, "on_epoch_start", m.state)
        started = time.perf_counter()
        stats = engine.train_epoch(epoch, [m.state for m in active], [m.callbacks for m in active])
        epoch_time = time.perf_counter() - started
        for pos, where in sorted(stats.diverged.items()):
            m = active[pos]
            m.state.history.diverged = True
            m.state.history.diverged_at = {"epoch": epoch + 1, **where}
            engine.roll_back(pos, m.state)
            _end(m)
        if stats.diverged:
            keep = [p for p in range(len(active)) if p not in stats.diverged]
            engine.keep(keep)
            active, lrs = [active[p] for p in keep], [lrs[p] for p in keep]
            stats.loss_sum = [stats.loss_sum[p] for p in keep]
            stats.wrong = [stats.wrong[p] for p in keep]
            if stats.extra is not None:
                stats.extra = [stats.extra[p] for p in keep]
        if not active:
            break
        if stats.seen == 0:
            raise ValueError("data: the DataLoader yielded no batches in an epoch")
        val, test, ks = engine.evaluate("val"), engine.evaluate("test"), engine.gate_values()
        for pos, m in enumerate(active):
            m.state.elapsed_s += epoch_time
            record = epoch_record(epoch, lrs[pos], stats.loss_sum[pos], stats.wrong[pos], stats.seen,
                                  val[pos] if val else None, test[pos] if test else None, ks[pos],
                                  epoch_time, m.state.elapsed_s)
            if stats.extra is not None:
                record.update(stats.extra[pos])
            steps_per_epoch = m.state.steps_per_epoch
            if m.state.stop and steps_per_epoch is not None and stats.steps < steps_per_epoch:
                record["stopped_at_step"] = stats.steps
            m.state.history.epochs.append(record)
            m.state.epoch = epoch + 1
        engine.end_epoch()
        if after_epoch is not None:
            after_epoch(active)
        for pos, m in enumerate(active):
            engine.sync(pos, m.state)
            call(m.callbacks, "on_epoch_end", m.state, m.state.history.epochs[-1])
        stopped = [p for p, m in enumerate(active) if m.state.stop]
        for p in stopped:
            _end(active[p])
        if stopped:
            keep = [p for p in range(len(active)) if p not in stopped]
            engine.keep(keep)
            active = [active[p] for p in keep]
    for m in active:
        _end(m)
