"""What one training run is, checked once: RunConfig, the recipe it resolves to, the model it builds.

`check_config(config)` is the one check of a run's config (device, dataset, depth, seed, recipe and
overrides, the model and its arguments, built on the meta device): `run.run_training` and
`stack.train_stacked` call it first, before the lock and the data, and pass the recipe it returns on.
`build_model` builds the config's model as every run does (seeded, the data's input size and classes);
`check_resumable` says whether a run directory's recorded config is this one's (a resume continues
only the same run).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

from ..data import DATASET_SHAPES, TEXT_DATASETS, DataSplits, TextSplits
from ..models import LEGACY_STEM, MLP_FAMILIES, create_model, model_entry
from .checkpoint import MAX_MODEL_PARAMETERS
from .recipes import Recipe, get_recipe

__all__ = ["RunConfig", "RunExistsError", "MAX_DEPTH", "check_config", "resolve_recipe", "check_device",
           "model_kwargs_for", "build_model", "check_resumable", "config_differences"]

# The deepest network `check_config` accepts (the papers' deepest is ResNet-1202); building a model,
# even on the meta device, takes time in proportion to its depth, so a larger number is refused at once.
MAX_DEPTH = 10_000
# Fields that may differ between an interrupted run and its resumption.
_RESUMABLE_DIFFERENCES = {"device", "data_dir", "amp", "channels_last", "compile", "eval_batch_size"}


class RunExistsError(RuntimeError):
    """The output directory already holds a run and --resume was not given."""


@dataclass(frozen=True)
class RunConfig:
    """Everything that defines one training run (written to results.json as `config`)."""

    model: str
    depth: int
    dataset: str = "mnist"
    recipe: str = "gresnet-mnist"
    epochs: int | None = None
    seed: int = 0
    train_on_full: bool = False
    device: str = "cpu"
    limit: int | None = None
    data_dir: str | None = None
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    recipe_overrides: dict[str, Any] = field(default_factory=dict)
    # Execution options (see loop.fit): bf16 autocast, NHWC memory format, torch.compile.
    amp: bool = False
    channels_last: bool = False
    compile: bool = False
    # Images per evaluation forward (None: loop.DEFAULT_EVAL_BATCH); wide conv nets need fewer on a GPU.
    # On a text data set: blocks per evaluation forward (None: lm.DEFAULT_LM_EVAL_BATCH).
    eval_batch_size: int | None = None
    # Text data sets only: the evaluation blocks of each of val and test, evenly spaced over the split
    # (None: every non-overlapping block; data.text.evaluation_blocks).
    eval_blocks: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The config as a JSON-able dict (results.json's `config`)."""
        return dataclasses.asdict(self)


def check_config(config: RunConfig) -> Recipe:
    """Check everything about `config` that needs no data, before any download or decoding: the device,
    the dataset, the recipe and its overrides, and the model with its arguments (built on the meta
    device, so no memory is allocated); return the recipe the run trains with (`resolve_recipe`).
    Raises ValueError / KeyError / TypeError naming the field. A run checks its config once, here:
    `run_training` and `train_stacked` call it first and pass the recipe on."""
    check_device(config.device)
    if config.dataset not in DATASET_SHAPES and config.dataset not in TEXT_DATASETS:
        raise ValueError(f"dataset={config.dataset!r} is not known; accepted values: "
                         f"{sorted(DATASET_SHAPES) + sorted(TEXT_DATASETS)}")
    if isinstance(config.depth, bool) or not isinstance(config.depth, int) or not 1 <= config.depth <= MAX_DEPTH:
        raise ValueError(f"depth={config.depth!r} (--depth): accepted: an integer from 1 to {MAX_DEPTH} (MAX_DEPTH)")
    if isinstance(config.seed, bool) or not isinstance(config.seed, int) or not -2 ** 63 <= config.seed < 2 ** 64:
        raise ValueError(f"seed={config.seed!r} (--seed): accepted: an integer from -2**63 to 2**64 - 1 (torch's seeds)")
    if config.limit is not None and (not isinstance(config.limit, int) or config.limit < 2):
        raise ValueError(f"limit={config.limit!r}: must be at least 2 (BatchNorm needs two samples)")
    _finite("model_kwargs", config.model_kwargs)
    # What the config names: the recipe with its overrides, and the model's arguments; then the rules that
    # join them to the data set (a text data set trains a language model, in steps).
    recipe = resolve_recipe(config)
    language_model = "vocab_size" in model_entry(config.model).parameters()
    _check_text_rules(config, recipe, language_model)
    shape, classes = DATASET_SHAPES[config.dataset] if config.dataset in DATASET_SHAPES else ((), TEXT_DATASETS[config.dataset])
    kwargs = model_kwargs_for(config, shape, classes)
    with torch.device("meta"):
        skeleton = create_model(config.model, **kwargs)
    # A training batch of one has no variance for BatchNorm: torch fails only after the data is read
    # and leaves results files behind.
    if recipe.batch_size < 2 and any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in skeleton.modules()):
        raise ValueError(f"recipe_overrides.batch_size={recipe.batch_size} (--batch-size): model {config.model!r} has "
                         f"BatchNorm layers, which need at least 2 samples per batch; accepted: 2 or more")
    count = sum(p.numel() for p in skeleton.parameters())
    if count > MAX_MODEL_PARAMETERS:
        raise ValueError(f"model {config.model!r} with depth={config.depth} and model_kwargs={config.model_kwargs} "
                         f"(--depth, --width, --model-arg) has {count:,} parameters; accepted: at most "
                         f"{MAX_MODEL_PARAMETERS:,} (MAX_MODEL_PARAMETERS)")
    return recipe


def _check_text_rules(config: RunConfig, recipe: Recipe, language_model: bool) -> None:
    """What differs between a text data set's run (train.lm: a causal language model, trained in steps) and
    an image data set's: ValueError naming the field and the accepted values. `language_model`: whether the
    config's model takes token ids (its factory has a `vocab_size`)."""
    if config.dataset in TEXT_DATASETS:
        if not language_model:
            raise ValueError(f"model={config.model!r} with dataset={config.dataset!r}: a text data set trains a causal "
                             f"language model; accepted: a model that takes token ids (gpt, hf_gpt2)")
        if config.train_on_full:
            raise ValueError(f"train_on_full=True with dataset={config.dataset!r}: its splits are fixed sets of whole "
                             f"works; accepted: False")
        for option in ("augment", "normalize"):
            if getattr(recipe, option) != "none":
                raise ValueError(f"recipe {recipe.name!r}: {option}={getattr(recipe, option)!r} applies to images; "
                                 f"accepted with dataset={config.dataset!r}: 'none'")
        if config.eval_blocks is not None and (isinstance(config.eval_blocks, bool)
                                               or not isinstance(config.eval_blocks, int) or config.eval_blocks < 1):
            raise ValueError(f"eval_blocks={config.eval_blocks!r}: accepted: an integer ≥ 1, or None (every block)")
        if config.channels_last:
            raise ValueError(f"channels_last=True with dataset={config.dataset!r}: applies to conv nets on images; "
                             f"accepted: False")
        return
    if language_model:
        raise ValueError(f"model={config.model!r} is a causal language model; accepted datasets: {sorted(TEXT_DATASETS)}")
    # A per-step schedule (STEP_SCHEDULES) is followed by fit too; these settings are the language model's only.
    per_step = {"grad_clip": recipe.grad_clip > 0, "steps_per_epoch": recipe.steps_per_epoch is not None,
                "eval_blocks": config.eval_blocks is not None}
    for option, given in per_step.items():
        if given:
            raise ValueError(f"recipe {recipe.name!r} / config: {option} is a setting of the language-model path "
                             f"(train.lm, text data sets {sorted(TEXT_DATASETS)}); image data sets train per epoch "
                             f"without it")


def resolve_recipe(config: RunConfig) -> Recipe:
    """The recipe `run_training` trains `config` with: the named recipe, its overrides, then `epochs`.

    Raises ValueError for an override the recipe would ignore (momentum without SGD, lr_decay without
    the exponential schedule) and for non-finite numbers, naming both."""
    base = get_recipe(config.recipe)
    overrides = config.recipe_overrides
    _finite("recipe_overrides", overrides)
    # The one check of these rules: `throughway train` passes its options here unchecked, so that a rule
    # is written once and a Python caller gets the same check.
    if "momentum" in overrides and base.optimizer != "sgd":
        raise ValueError(f"recipe_overrides.momentum (--momentum) with recipe {base.name!r} (--recipe {base.name}): "
                         f"it trains with {base.optimizer}, which has no momentum option; momentum applies to SGD "
                         f"recipes (e.g. highway-mnist)")
    if "lr_decay" in overrides and base.schedule != "exponential":
        raise ValueError(f"recipe_overrides.lr_decay (--lr-decay) with recipe {base.name!r} (--recipe {base.name}): "
                         f"its schedule is {base.schedule!r}; lr_decay applies to recipes with the exponential "
                         f"schedule (e.g. highway-mnist)")
    recipe = get_recipe(config.recipe, **overrides)
    if config.epochs is not None:
        recipe = recipe.replace(epochs=config.epochs)
    return recipe


def check_device(device: str) -> torch.device:
    """`device` as a torch.device after checking this machine has it; ValueError naming --device and the
    accepted values otherwise (e.g. "cuda" on a CPU-only torch). Cheap: allocates nothing."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ValueError(f"--device {device!r}: not a torch device ({exc}); accepted: cpu, cuda, cuda:N") from exc
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"--device {device!r}: this torch ({torch.__version__}) sees no CUDA device; "
                             f"accepted here: cpu")
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            raise ValueError(f"--device {device!r}: there are {torch.cuda.device_count()} CUDA devices; accepted: "
                             f"cpu, cuda, cuda:0..cuda:{torch.cuda.device_count() - 1}")
    elif parsed.type == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError(f"--device {device!r}: MPS is not available here; accepted here: cpu")
    elif parsed.type != "cpu":
        raise ValueError(f"--device {device!r}: accepted: cpu, cuda, cuda:N, mps")
    return parsed


# Training runs in float32: a larger number (an lr of 1e308, say) overflows when it becomes a tensor.
_FLOAT32_MAX = float(torch.finfo(torch.float32).max)


def _finite(where: str, values: dict[str, Any]) -> None:
    for key, value in values.items():
        if isinstance(value, float) and not (math.isfinite(value) and abs(value) <= _FLOAT32_MAX):
            raise ValueError(f"{where}.{key}={value!r}: must be a finite number within float32's range "
                             f"(|x| ≤ {_FLOAT32_MAX:.3g})")


def model_kwargs_for(config: RunConfig, input_shape: Sequence[int], num_classes: int) -> dict[str, Any]:
    """The create_model arguments of `config` for data of one-input shape `input_shape` (C, H, W) and
    `num_classes` classes (a language model's `vocab_size`; its input shape is ()): the config's
    model_kwargs plus depth and what the data decides.

    Raises ValueError when model_kwargs repeats `depth` or contradicts the data (num_classes,
    in_features, in_channels, image_size), naming both sides."""
    accepted = model_entry(config.model).parameters()
    kwargs = dict(config.model_kwargs)
    if "depth" in kwargs:
        raise ValueError(f"model_kwargs.depth={kwargs['depth']!r} beside depth={config.depth}: give the depth once "
                         f"(--depth, not --model-arg depth=...)")
    kwargs["depth"] = config.depth
    from_data = {"num_classes": num_classes}
    if "vocab_size" in accepted:  # a language model: the classes of next-token prediction are its vocabulary
        from_data = {"vocab_size": num_classes}
    if "in_features" in accepted:
        from_data["in_features"] = int(math.prod(input_shape))
    # Conv nets take the image's channels and side from the data.
    if len(input_shape) == 3:
        from_data.update({"in_channels": int(input_shape[0]), "image_size": int(input_shape[-1])})
    for key, value in from_data.items():
        if key not in accepted:
            continue
        if key in kwargs and kwargs[key] != value:
            raise ValueError(f"model_kwargs.{key}={kwargs[key]!r} does not match dataset {config.dataset!r} "
                             f"({key} {value}); leave it out, it is taken from the data")
        kwargs[key] = value
    return kwargs


def build_model(config: RunConfig, data: DataSplits | TextSplits) -> torch.nn.Module:
    """The model of `config`, initialised as every run does: torch.manual_seed(config.seed), then
    create_model with the data's input size and classes (a text data set: its vocabulary size), on
    config.device (shared with the stack trainer). Raises ValueError when config.model_kwargs
    contradicts the data (see `model_kwargs_for`)."""
    shape = () if isinstance(data, TextSplits) else data.input_shape
    kwargs = model_kwargs_for(config, shape, data.num_classes)
    torch.manual_seed(config.seed)  # the initialisation is a function of the seed
    return create_model(config.model, **kwargs).to(config.device)


def config_differences(existing: dict[str, Any], config: RunConfig, source: Any) -> dict[str, tuple[Any, Any]]:
    """{field: (recorded, now)} for every field in which the run config that `existing` (a results.json,
    read from `source`) records differs from `config`, the fields a resumed run may change
    (`_RESUMABLE_DIFFERENCES`: device, data folder, execution options) aside.

    A field that an older results.json lacks counts as its default value, and an MLP's first layer is
    compared as built (`stem`), so runs written before a field was added to RunConfig still match.
    ValueError naming `source` when 'config' or 'model.config' is not an object."""
    defaults = RunConfig(model=config.model, depth=config.depth).to_dict()
    recorded = existing.get("config", {})
    if not isinstance(recorded, dict) or not isinstance(existing.get("model") or {}, dict) \
            or not isinstance((existing.get("model") or {}).get("config") or {}, dict):
        raise ValueError(f"{source}: the recorded field 'config' or 'model.config' is not an object; the run's "
                         f"files were edited or damaged")
    old = {**defaults, **recorded}
    new = config.to_dict()
    if config.model in MLP_FAMILIES and isinstance(old.get("model_kwargs"), dict):
        # The first layer an MLP was built with: recorded in the model's config since the MLP families took
        # a `stem` argument, else the dense stem of every earlier run; compared as built, not as spelled.
        built = (existing.get("model") or {}).get("config") or {}
        old["model_kwargs"] = {"stem": built.get("stem", LEGACY_STEM), **old["model_kwargs"]}
        new["model_kwargs"] = {"stem": model_entry(config.model).parameters()["stem"], **new["model_kwargs"]}
    built_config = (existing.get("model") or {}).get("config") or {}
    if isinstance(old.get("model_kwargs"), dict) and isinstance(new.get("model_kwargs"), dict):
        # An argument the run left to the model's default (LayerScale's ε) matches a spec that spells out the
        # value the model was built with (model.config records the resolved arguments).
        for key, value in new["model_kwargs"].items():
            if key not in old["model_kwargs"] and key in built_config and built_config[key] == value:
                old["model_kwargs"] = {**old["model_kwargs"], key: value}
    return {k: (old.get(k), new.get(k)) for k in sorted(set(old) | set(new))
            if k not in _RESUMABLE_DIFFERENCES and old.get(k) != new.get(k)}


def check_resumable(existing: dict[str, Any], config: RunConfig, out_dir: Path) -> None:
    """Raise RunExistsError when `existing` (a results.json) holds a run of another config than `config`
    (`config_differences`: a field an older results.json lacks counts as its default value, so runs
    written before a field was added to RunConfig still resume)."""
    differing = config_differences(existing, config, out_dir)
    if differing:
        details = ", ".join(f"{k}: {old!r} → {new!r}" for k, (old, new) in differing.items())
        raise RunExistsError(f"{out_dir} holds a run with a different config ({details}); "
                             f"choose another --out or repeat the original arguments")
