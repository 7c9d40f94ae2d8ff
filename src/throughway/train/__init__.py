"""Training: recipes, the one update rule (optim), the loop (fit / evaluate) and its callbacks, checkpoints,
single runs, stacks of models, full-batch descent and causal language models (fit_lm); docs/design.md
draws how the modules fit together."""

from .callbacks import METRICS_FILE, EarlyStopping, MetricsCSV, ModelCheckpoint, ProgressPrinter, TensorBoardLogger, read_metrics_csv, write_metrics_csv
from .checkpoint import load_model, save_model
from .loop import evaluate, fit
from .state import Callback, History, TrainState
from .optim import FlatOptimizer, build_optimizer
from .recipes import (RECIPES, Recipe, get_recipe, learning_rate_at, learning_rate_at_step, list_recipes, param_groups,
                      parameter_groups)
from .lm import bits_per_character, causal_lm_loss, evaluate_lm, fit_lm
from .config import RunConfig, RunExistsError
from .run import RESULTS_FILE, read_results, run_training

__all__ = [
    "Callback",
    "EarlyStopping",
    "FlatOptimizer",
    "History",
    "METRICS_FILE",
    "MetricsCSV",
    "ModelCheckpoint",
    "ProgressPrinter",
    "RECIPES",
    "RESULTS_FILE",
    "Recipe",
    "RunConfig",
    "RunExistsError",
    "TensorBoardLogger",
    "TrainState",
    "bits_per_character",
    "build_optimizer",
    "causal_lm_loss",
    "evaluate",
    "evaluate_lm",
    "fit",
    "fit_lm",
    "get_recipe",
    "learning_rate_at",
    "learning_rate_at_step",
    "list_recipes",
    "load_model",
    "param_groups",
    "parameter_groups",
    "read_metrics_csv",
    "read_results",
    "run_training",
    "save_model",
    "write_metrics_csv",
]
