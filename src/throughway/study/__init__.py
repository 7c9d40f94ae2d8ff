"""What the experiments share: how an experiment declares its options (`options`),
running a study's runs and its resume checks (`runs`), a study computed piece by piece into one
results.json (`resumable`), grouping runs into stacks of models trained together (`stacking`), the
shortcut-network data and settings of the Demystifying studies (`shortcut`) and the papers' reported
numbers (`papers`). `experiments` holds one module per paper table or figure, built from these; the
`analyze` command lives in `throughway.analyze_runs`.
"""

from .options import NO_QUICK, add_options, config_from_args, option, option_fields, quick_config

__all__ = ["option", "add_options", "config_from_args", "quick_config", "option_fields", "NO_QUICK"]
