"""The former names of the stack trainer, kept in this one place for code written against them.

"Batch" named a stack of models trained together before the word was kept for a mini-batch; this module
was `train.stack`'s name. Every name below is the object its new name gives, without a warning, so that a
script written for an earlier version (docs/guide.md showed `from throughway.train.batched import
train_batched`) still runs. The toolkit's own modules use the new names. Two former names also stay where
they lived, each a one-line alias there: `full_batch.BatchedGD` (`StackedGD`) and study.stacking's
`run_batched` (`run_stacked`).

New name (module)                     former name
`train_stacked`, `stack_key` (stack)  `train_batched`, `batch_key`
`StackedStep` (stacked)               `BatchedStep`
`StackedOptimizer` (stacked)          `BatchedOptimizer`
`stack_family` (stacked)              `batch_family`
`StackedGD` (full_batch)              `BatchedGD`
"""

from .full_batch import StackedGD as BatchedGD
from .stack import (INIT_ONLY_KWARGS, PER_MODEL_RECIPE_FIELDS, SHARED_RECIPE_FIELDS, order_generator, stack_key,
                    train_stacked)
from .stack_checkpoint import STATE_JSON, config_hash
from .stacked import StackedOptimizer as BatchedOptimizer
from .stacked import StackedStep as BatchedStep
from .stacked import stack_family as batch_family

train_batched = train_stacked
batch_key = stack_key

__all__ = ["train_batched", "batch_key", "BatchedStep", "BatchedOptimizer", "batch_family", "BatchedGD",
           # the module's former contents under their new names
           "train_stacked", "stack_key", "INIT_ONLY_KWARGS", "PER_MODEL_RECIPE_FIELDS", "SHARED_RECIPE_FIELDS",
           "STATE_JSON", "config_hash", "order_generator"]
