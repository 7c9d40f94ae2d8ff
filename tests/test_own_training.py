"""A researcher's own schedule, data and callbacks in `fit` (issue 22, items 3 to 5 and the callbacks)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from throughway.train import fit, get_recipe


def _data(n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return torch.randn(n, 6, generator=generator), torch.randint(0, 3, (n,), generator=generator)


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


RECIPE = get_recipe("gresnet-mnist", epochs=3, batch_size=16)  # NAdam, constant lr 0.002


def test_a_scheduler_given_to_fit_sets_the_recorded_lr():
    history = fit(_model(), _data(), RECIPE, progress=False,
                  scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5))
    assert [r["lr"] for r in history.epochs] == pytest.approx([0.002, 0.001, 0.0005])


def test_a_scheduler_a_callback_attaches_wins_over_the_recipes_schedule():
    class HalveEachEpoch:
        def on_fit_start(self, state):
            self.scheduler = torch.optim.lr_scheduler.StepLR(state.optimizer, 1, gamma=0.5)

        def on_epoch_end(self, state, record):
            self.scheduler.step()

    history = fit(_model(), _data(), RECIPE, [HalveEachEpoch()], progress=False)
    assert [r["lr"] for r in history.epochs] == pytest.approx([0.002, 0.001, 0.0005])


def test_the_recipes_schedule_applies_without_a_users_scheduler():
    recipe = get_recipe("highway-mnist", epochs=3, batch_size=16, lr=0.1, lr_decay=0.5)
    history = fit(_model(), _data(), recipe, progress=False)
    assert [r["lr"] for r in history.epochs] == pytest.approx([0.1, 0.05, 0.025])


def test_a_scheduler_that_is_not_callable_is_refused_naming_the_argument():
    with pytest.raises(TypeError, match="scheduler"):
        fit(_model(), _data(), RECIPE, progress=False, scheduler="step")  # type: ignore[arg-type]


def test_the_training_api_imports_where_there_is_no_fcntl():
    # Windows has no fcntl: the run directory's lock comes from filelock, imported everywhere.
    import subprocess
    import sys

    code = ("import sys; sys.modules['fcntl'] = None\n"
            "from throughway.train import fit, run_training\n"
            "import throughway.train.rundir, throughway.train.batched\n"
            "print('imported')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "imported" in done.stdout, done.stderr
