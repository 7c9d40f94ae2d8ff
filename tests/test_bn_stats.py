"""BatchNorm statistics re-estimated over a data set (analysis.batchnorm) and `throughway analyze bn-stats`."""

from __future__ import annotations

import json
import shutil
from typing import Any

import pytest
import torch
from torch import nn

from throughway.analysis.batchnorm import reestimate_bn_statistics
from throughway.cli import main
from throughway.models import create_model
from throughway.train import RunConfig, run_training, save_model

from conftest import edit_results, run_cli


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.BatchNorm1d(5, momentum=0.1), nn.ReLU(), nn.Linear(5, 3),
                         nn.BatchNorm1d(3, momentum=0.3))


def test_reestimated_statistics_are_the_exact_averages_over_the_batches():
    net = _net()
    x = torch.randn(256, 6) * 3 + 1
    weights = {k: v.clone() for k, v in net.state_dict().items() if "running" not in k and "num_batches" not in k}
    assert reestimate_bn_statistics(net, x, batch_size=64, generator=torch.Generator().manual_seed(1)) == 2
    first = net[1]
    h = net[0](x)
    # equal batches: the mean of the batch means is the mean over all of x
    torch.testing.assert_close(first.running_mean, h.mean(0), rtol=1e-5, atol=1e-5)
    # the variance is the mean of the batches' unbiased variances, in the batches' order
    order = torch.randperm(256, generator=torch.Generator().manual_seed(1))
    expected_var = torch.stack([h[order[i:i + 64]].var(0, unbiased=True) for i in range(0, 256, 64)]).mean(0)
    torch.testing.assert_close(first.running_var, expected_var, rtol=1e-5, atol=1e-5)
    assert (first.momentum, net[4].momentum) == (0.1, 0.3) and not net.training
    for key, value in weights.items():
        assert torch.equal(net.state_dict()[key], value), key


def test_reestimation_ignores_the_old_statistics_and_refuses_bad_batches():
    a, b = _net(), _net()
    x = torch.randn(100, 6)
    b[1].running_mean.fill_(50.0)
    b[1].running_var.fill_(9.0)
    for net in (a, b):
        reestimate_bn_statistics(net, x, batch_size=32, generator=torch.Generator().manual_seed(0))
    assert torch.equal(a[1].running_mean, b[1].running_mean) and torch.equal(a[4].running_var, b[4].running_var)
    with pytest.raises(ValueError, match="batch_size=1"):
        reestimate_bn_statistics(a, x, batch_size=1)
    with pytest.raises(ValueError, match="1 samples"):
        reestimate_bn_statistics(a, x[:1])
    assert reestimate_bn_statistics(nn.Sequential(nn.Linear(6, 2)), x) == 0


def _train(root, name: str, model: str, seed: int, **model_kwargs) -> str:
    out = root / name
    config = RunConfig(model=model, depth=2, dataset="mnist", epochs=1, seed=seed,
                       model_kwargs={"width": 8, **model_kwargs})
    run_training(config, out, progress=False)
    return str(out)


def test_analyze_bn_stats_groups_runs_by_model_and_depth(fake_mnist_root, tmp_path, capsys):
    runs = [_train(tmp_path, f"{arch}-s{seed}", model, seed)
            for arch, model in (("residual", "mlp_residual"), ("gated", "mlp_gated_residual")) for seed in (0, 1)]
    out = tmp_path / "bn"
    assert main(["analyze", "bn-stats", *runs, "--out", str(out), "--quiet"]) == 0
    result = json.loads((out / "bn_stats.json").read_text())
    assert [(g["model"], g["depth"], g["n"]) for g in result["groups"]] == [("mlp_gated_residual", 2, 2),
                                                                          ("mlp_residual", 2, 2)]
    for run in result["runs"]:  # evaluated with its own statistics, the run's recorded test error
        assert run["test_error_pct_running"] == pytest.approx(run["test_error_pct_recorded"])
        assert run["bn_layers"] == 2  # the linear stem has none; two layers of one residual block
    gated = result["groups"][0]
    mine = [r for r in result["runs"] if r["model"] == "mlp_gated_residual"]
    assert gated["reestimated"]["mean"] == pytest.approx(sum(r["test_error_pct_reestimated"] for r in mine) / 2)
    assert gated["test"]["n"] == 2 and gated["paper_test_error_pct"] == 2.17
    printed = capsys.readouterr().out
    assert "| mlp_gated_residual | 2 | 2 | 2.17 |" in printed and (out / "bn_stats.txt").read_text() in printed + "\n"


def test_analyze_bn_stats_refuses_bad_input_before_reading_data(fake_mnist_root, tmp_path, capsys, monkeypatch):
    run = _train(tmp_path, "r", "mlp_residual", 0)
    no_bn = _train(tmp_path, "plain-nobn", "mlp_plain", 0, norm="none")

    def refuse(*args, **kwargs):
        raise AssertionError("the data was read before the runs were checked")

    cases = [([run, run + "/"], "listed twice"), ([run, str(tmp_path / "missing")], "missing: run directory not found"),
             ([run, "--batch-size", "1"], "--batch-size 1")]
    import throughway.analyze_runs.run_files as analysis_runs

    original = analysis_runs.load_dataset
    monkeypatch.setattr(analysis_runs, "load_dataset", refuse)
    for argv, message in cases:
        assert main(["analyze", "bn-stats", *argv, "--out", str(tmp_path / "o")]) == 2
        assert message in capsys.readouterr().err
    monkeypatch.setattr(analysis_runs, "load_dataset", original)
    assert main(["analyze", "bn-stats", no_bn, "--out", str(tmp_path / "o")]) == 2
    assert "no BatchNorm layer" in capsys.readouterr().err
    assert not (tmp_path / "o" / "bn_stats.json").exists()


# -- only runs of one setting are pooled ---------------------------------------------------------------

@pytest.mark.parametrize("field, value", [("recipe", "highway-mnist"), ("epochs", 7), ("limit", 32)])
def test_bn_stats_refuses_to_pool_runs_of_other_settings(work, capsys, field, value):
    other = work / "other"
    shutil.copytree(work / "finished", other)
    edit_results(other, lambda r: r["config"].update({field: value}))
    code, err = run_cli(capsys, ["analyze", "bn-stats", str(work / "finished"), str(other), "--out", str(work / "bn")])
    assert code == 2
    assert f"fields config.{field} differ; a row pools seeds of one setting only" in err
    assert not (work / "bn").exists()


def test_bn_stats_refuses_to_pool_runs_of_other_widths(work, capsys):
    other = work / "other"
    shutil.copytree(work / "finished", other)
    save_model(other / "model.safetensors", create_model("mlp_gated_residual", depth=2, width=16))

    def widen(results: dict[str, Any]) -> None:
        results["model"]["config"]["width"] = results["config"]["model_kwargs"]["width"] = 16

    edit_results(other, widen)
    code, err = run_cli(capsys, ["analyze", "bn-stats", str(work / "finished"), str(other), "--out", str(work / "bn")])
    assert code == 2
    assert "fields model.config, config.model_kwargs differ" in err
    assert not (work / "bn").exists()
