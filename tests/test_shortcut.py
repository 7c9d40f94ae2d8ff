"""n-shortcut networks (Demystifying ResNet §3), whitened data helpers and the batched GD trainer."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from throughway.data.whiten import second_moment_dataset, whiten
from throughway.study.shortcut import network_kwargs
from throughway.train.full_batch import StackedGD
from throughway.layers.shortcut import ShortcutUnit
from throughway.models import create_model


def test_linear_two_shortcut_net_is_product_of_identity_plus_pairs():
    torch.manual_seed(0)
    model = create_model("shortcut_net", depth=6, shortcut_depth=2, width=4, init="xavier")
    x = torch.randn(5, 4)
    expected = x.T
    for block in model.blocks:
        w1, w2 = block.weights()
        expected = (torch.eye(4) + w2 @ w1) @ expected
    torch.testing.assert_close(model(x), expected.T, rtol=1e-5, atol=1e-5)
    assert len(model.blocks) == 3
    assert all(isinstance(b.shortcut, torch.nn.Identity) and isinstance(b.gate, torch.nn.Identity) for b in model.blocks)
    assert all(b.branch[0].bias is None for b in model.blocks)  # the paper's networks have no biases


def test_plain_network_is_product_and_has_no_shortcut():
    torch.manual_seed(1)
    model = create_model("shortcut_net", depth=4, shortcut_depth=0, width=3, init="orthogonal")
    x = torch.randn(2, 3)
    product = torch.eye(3)
    for w in model.weight_matrices():
        product = w @ product
        torch.testing.assert_close(w @ w.T, torch.eye(3), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model(x), x @ product.T, rtol=1e-5, atol=1e-5)
    assert all(b.shortcut is None for b in model.blocks)
    assert torch.equal(model.forward_head(x), x)


def test_activation_positions():
    unit = ShortcutUnit(3, 3, "relu", ("pre", "mid", "post"))
    kinds = [type(m).__name__ for m in unit.branch]
    assert kinds == ["ReLU", "Linear", "ReLU", "Linear", "ReLU", "Linear", "ReLU"]
    mid = ShortcutUnit(3, 2, "relu", ("mid",))
    assert [type(m).__name__ for m in mid.branch] == ["Linear", "ReLU", "Linear"]
    assert [type(m).__name__ for m in ShortcutUnit(3, 2, None).branch] == ["Linear", "Linear"]


def test_zero_init_is_small_multiple_of_xavier():
    torch.manual_seed(0)
    xavier = create_model("shortcut_net", depth=2, shortcut_depth=2, width=10, init="xavier")
    torch.manual_seed(0)
    zero = create_model("shortcut_net", depth=2, shortcut_depth=2, width=10, init="zero", zero_scale=1e-4)
    for a, b in zip(xavier.weight_matrices(), zero.weight_matrices()):
        torch.testing.assert_close(b, 1e-4 * a)
    exact = create_model("shortcut_net", depth=2, shortcut_depth=2, width=10, init="zero", zero_scale=0.0)
    assert all(float(w.detach().abs().max()) == 0.0 for w in exact.weight_matrices())


@pytest.mark.parametrize("kwargs, field", [
    ({"depth": 5, "shortcut_depth": 2}, "depth=5"),
    ({"depth": 4, "init": "he"}, "init='he'"),
    ({"depth": 4, "activation_position": "side"}, "activation_position"),
    ({"depth": 0}, "depth=0"),
])
def test_bad_arguments_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field.replace("(", r"\(")):
        create_model("shortcut_net", **kwargs)


@pytest.mark.parametrize("network, activation", [("shortcut2-zero", None), ("xavier", "relu"), ("shortcut1-zero", None),
                                                 ("orthogonal", "relu")])
def test_batched_trainer_matches_the_real_model(network, activation):
    kwargs = network_kwargs(network, 4, activation=activation, zero_scale=0.3, width=5)
    gd = StackedGD(kwargs, [0, 1], [0.01, 0.02])
    x, y = torch.randn(7, 5, dtype=torch.float64), torch.randn(7, 5, dtype=torch.float64)
    out = gd.forward(x)
    for r in range(2):
        model = gd.model_at(r)
        torch.testing.assert_close(out[r], model(x))
    torch.manual_seed(1)
    ref = create_model("shortcut_net", **kwargs)
    torch.testing.assert_close(gd.weights[1, 0].float(), ref.weight_matrices()[0].detach())
    before = gd.losses(x, y).detach()
    for _ in range(3):
        gd.step(x, y)
    assert bool((gd.losses(x, y) < before).all())


def test_second_moment_dataset_preserves_linear_losses():
    torch.manual_seed(0)
    x, y = torch.randn(500, 6, dtype=torch.float64), torch.randn(500, 4, dtype=torch.float64)
    xs, ys = second_moment_dataset(x, y)
    assert len(xs) <= 10
    for _ in range(3):
        a = torch.randn(4, 6, dtype=torch.float64)
        full = ((x @ a.T - y) ** 2).sum(1).mean()
        small = ((xs @ a.T - ys) ** 2).sum(1).mean()
        torch.testing.assert_close(full, small)


def test_whiten_gives_identity_covariance_on_training_set():
    rng = np.random.default_rng(0)
    train = rng.normal(size=(400, 20)) @ rng.normal(size=(20, 20))
    test = rng.normal(size=(50, 20))
    w_train, w_test, info = whiten(train, test, components=5)
    assert w_train.shape == (400, 5) and w_test.shape == (50, 5)
    np.testing.assert_allclose(w_train.T @ w_train / 400, np.eye(5), atol=1e-10)
    np.testing.assert_allclose(w_train.mean(axis=0), 0.0, atol=1e-10)
    assert 0 < info["explained_variance_ratio"] <= 1


def test_hessian_init_reproduction_runs_and_resumes(fake_mnist_root, tmp_path):
    # `throughway reproduce hessian-init` (figure 4 + Theorem 2) at toy size on a fake MNIST.
    from throughway.experiments import hessian_init

    out = tmp_path / "fig4"
    config = hessian_init.Config(depths=(2, 4), networks=("orthogonal", "shortcut2-zero"), runs=2,
                                 theorem2_depths=(6,), data_dir=str(fake_mnist_root))
    summary = hessian_init.run(config, out, progress=False)
    assert {p["runs"] for p in summary["points"]} == {2}
    by_n = {r["shortcut_depth"]: r for r in summary["theorem2"]}
    assert by_n[3]["spectrum_zero"] and by_n[3]["gradient_norm"] == 0.0  # Theorem 2, n = 3
    assert by_n[2]["outside_unit_blocks_max_abs"] == 0.0
    assert by_n[2]["eigenvalues_vs_pm_singular_values_max_difference"] < 1e-10
    shortcut = [p["condition"]["mean"] for p in summary["points"] if p["network"] == "shortcut2-zero"]
    assert abs(shortcut[0] - shortcut[1]) < 1e-3 * shortcut[0]  # depth-invariant near zero
    assert (out / "figure4_condition_vs_depth.png").is_file() and "undefined (zero Hessian)" in (out / "table.md").read_text()
    before = (out / "results.json").read_text()
    hessian_init.run(config, out, resume=True, progress=False)  # nothing left to compute: same cells
    assert json.loads((out / "results.json").read_text())["cells"] == json.loads(before)["cells"]


def test_training_reproductions_run_on_tiny_settings(fake_mnist_root, tmp_path):
    # figures 5-6, 7 and 3 at toy size: each writes results.json, table.md and its figures.
    from throughway.experiments import hessian_dynamics, shortcut_lr, weight_norms

    root = str(fake_mnist_root)
    dyn = hessian_dynamics.run(hessian_dynamics.Config(depth=2, networks=("orthogonal", "shortcut2-zero"), seeds=(0,),
                                                       epochs=4, hessian_points=3, data_dir=root),
                               tmp_path / "fig56", progress=False)
    assert all(t["hessian"][0]["epoch"] == 0 and t["hessian"][-1]["epoch"] == 4 for t in dyn["traces"])
    lr = shortcut_lr.run(shortcut_lr.Config(depths=(2,), networks=("xavier", "shortcut2-zero"), lr_exponents=(-2.0, -1.0),
                                            epochs=3, data_dir=root), tmp_path / "fig7", progress=False)
    assert all(p["best_loss"] is not None for p in lr["points"])
    norms = weight_norms.run(weight_norms.Config(depths=(2,), epochs=3, relu_epochs=2, relu_subset=50, data_dir=root),
                             tmp_path / "fig3", progress=False)
    assert set(norms["curves"]) == {"linear-L2", "relu-L2"}
    with pytest.raises(ValueError, match="lr_exponents"):  # another grid must not be mixed into these cells
        shortcut_lr.run(shortcut_lr.Config(depths=(2,), lr_exponents=(-1.0,), epochs=3, data_dir=root),
                        tmp_path / "fig7", resume=True, progress=False)
    for folder, png in (("fig56", "figure5_spectrum_vs_loss.png"), ("fig7", "figure7_lr_study_linear.png"),
                        ("fig3", "figure3_weight_norms.png")):
        assert (tmp_path / folder / png).is_file() and (tmp_path / folder / "table.md").is_file()
