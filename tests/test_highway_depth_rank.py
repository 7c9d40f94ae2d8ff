"""Highway figure 1 as the paper ranks it (issue 23): trials ranked by the lowest training loss
reached during training (or the last epoch's), integer or continuous gate-bias sampling, and the
committed search re-ranked without retraining."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path

import pytest

from throughway.experiments import highway_depth as study

REPO = Path(__file__).resolve().parents[1]


def _run(folder: Path, name: str, losses: list[float], diverged: bool = False) -> None:
    run = folder / "runs" / name
    run.mkdir(parents=True)
    history = [{"epoch": i + 1, "train_loss": v} for i, v in enumerate(losses)]
    (run / "results.json").write_text(json.dumps({"history": history, "final": {"epochs_completed": len(losses)},
                                                  "diverged": diverged}))


def test_best_loss_ranks_by_the_lowest_epoch_and_last_loss_by_the_last(tmp_path):
    config = study.Config(layers=(10,), archs=("plain",), trials=3, epochs=3)
    _run(tmp_path, "plain-L10-t000", [1.0, 0.01, 0.5])     # lowest reached, but ends high
    _run(tmp_path, "plain-L10-t001", [1.0, 0.2, 0.1])      # best at the last epoch
    _run(tmp_path, "plain-L10-t002", [1.0, 0.001, 0.001], diverged=True)   # diverged: ranks last under both
    best = study.summarize(config, tmp_path)
    last = study.summarize(dataclasses.replace(config, rank="last-loss"), tmp_path)
    assert best["cells"][0]["top10"]["runs"] == ["plain-L10-t000", "plain-L10-t001"]
    assert last["cells"][0]["top10"]["runs"] == ["plain-L10-t001", "plain-L10-t000"]
    assert study.ranked_loss(best, best["cells"][0]["best"]) == 0.01
    assert study.ranked_loss(last, last["cells"][0]["best"]) == 0.1
    assert best["cells"][0]["top10"]["mean_best_train_loss"] == pytest.approx((0.01 + 0.1) / 2)
    assert "Lowest training loss reached" in study.table_markdown(best)
    assert "Final training loss" in study.table_markdown(last) and "rank last-loss" in study.table_markdown(last)
    # A summary written before the option existed was ranked by the last epoch, and reads so.
    old = {**last, "config": {k: v for k, v in last["config"].items() if k != "rank"}}
    assert study.ranked_loss(old, old["cells"][0]["best"]) == 0.1


def test_integer_gate_bias_is_an_integer_in_the_papers_range_and_changes_nothing_else():
    biases = set()
    for trial in range(200):
        continuous = study.sample_trial("highway", trial)
        integer = study.sample_trial("highway", trial, gate_bias="integer")
        assert {k: v for k, v in integer.items() if k != "gate_bias"} == \
            {k: v for k, v in continuous.items() if k != "gate_bias"}
        assert -10.0 <= continuous["gate_bias"] <= -1.0 and not continuous["gate_bias"].is_integer()
        biases.add(integer["gate_bias"])
    assert biases == {float(b) for b in range(-10, 0)}     # every integer in [−10, −1], both ends
    assert "gate_bias" not in study.sample_trial("plain", 0, gate_bias="integer")
    with pytest.raises(ValueError, match="accepted values"):
        study.sample_trial("highway", 0, gate_bias="normal")
    with pytest.raises(ValueError, match="accepted values"):
        study.Config(gate_bias="normal")
    spec = study.specs(study.Config(layers=(10,), archs=("highway",), trials=1, gate_bias="integer"))[0]
    assert spec.config.model_kwargs["gate_bias"] == study.sample_trial("highway", 0, gate_bias="integer")["gate_bias"]


def test_the_committed_search_reranks_without_retraining(tmp_path):
    committed = REPO / "results" / "highway-depth"
    summary = json.loads((committed / "results.json").read_text())
    assert summary["config"]["rank"] == "best-loss"
    config = study.Config(**{**{k: tuple(v) if isinstance(v, list) else v for k, v in summary["config"].items()},
                             "merge": True})
    # The committed summary is what its runs give under its ranking, cell by cell.
    again = study.summarize(config, committed)
    for ours, theirs in zip(again["cells"], summary["cells"]):
        assert ours["top10"]["runs"] == theirs["top10"]["runs"]
        assert ours["best"]["best_train_loss"] == theirs["best"]["best_train_loss"]
        assert math.isclose(ours["best"]["best_train_loss"], min(x for x in ours["best"]["train_loss"]))
    # A summary written before the rank and gate_bias options is merged into, not refused.
    out = tmp_path / "hd"
    (out / "runs").mkdir(parents=True)
    shutil.copytree(committed / "runs" / "plain-L10-t000", out / "runs" / "plain-L10-t000")
    small = dataclasses.replace(config, layers=(10,), archs=("plain",))
    old = {k: v for k, v in dataclasses.asdict(small).items() if k not in ("rank", "gate_bias")}
    (out / "results.json").write_text(json.dumps({**summary, "config": old}))
    result = study.run(small, out, progress=False)
    assert result["cells"][0]["best"]["run"] == "plain-L10-t000"
    with pytest.raises(ValueError, match="gate_bias"):          # a different search is refused
        study.run(dataclasses.replace(small, gate_bias="integer"), out, progress=False)


# -- the search's scale -----------------------------------------------------------------------------

def test_highway_search_default_is_figure_1s_scale():
    from throughway.experiments import highway_depth as study

    config = study.Config()
    # highway §3.1: "a random search of 100 runs for both plain and highway networks", depths 10-100;
    # figure 1: 400 epochs on its x-axis; all 60,000 training images, none held out.
    assert (config.trials, config.epochs, config.layers) == (100, study.FIGURE1_EPOCHS, (10, 20, 50, 100))
    assert study.FIGURE1_EPOCHS == 400 and config.train_on_full and config.limit is None
    assert {s.config.epochs for s in study.specs(dataclasses.replace(config, layers=(10,), trials=2))} == {400}
