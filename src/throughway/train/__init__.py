"""Training: recipes, the loop (fit / evaluate), checkpoints and single runs."""

from .checkpoint import load_model, save_model
from .flat import FlatOptimizer
from .loop import History, TrainState, evaluate, fit
from .recipes import RECIPES, Recipe, build_optimizer, get_recipe, learning_rate_at, list_recipes, parameter_groups
from .runner import RESULTS_FILE, RunConfig, RunExistsError, read_results, run_training

__all__ = [
    "FlatOptimizer",
    "History",
    "RECIPES",
    "RESULTS_FILE",
    "Recipe",
    "RunConfig",
    "RunExistsError",
    "TrainState",
    "build_optimizer",
    "evaluate",
    "fit",
    "get_recipe",
    "learning_rate_at",
    "list_recipes",
    "load_model",
    "parameter_groups",
    "read_results",
    "run_training",
    "save_model",
]
