"""What the experiments share: how an experiment declares its options, those every study shares
included (`options`: `option`, `StudyOptions`, a config as JSON), a study's runs (`spec`), the command
its results record (`command`), its folder as untrusted input (`folders`), its summary kept current and
its report remade (`summary`), training runs one per worker process (`workers`) or as stacks of models
trained together (`stacking`), a study split into shards (`shards`), the one runner of a study of run
folders (`runner`), a study computed piece by piece into one results.json (`resumable`), the
shortcut-network data and settings of the Demystifying studies (`shortcut`) and the papers' reported
numbers (`papers`). `experiments` holds one module per paper table or figure, built from these; the
`analyze` command lives in `throughway.analyze_runs`.
"""

from .options import NO_QUICK, add_options, config_from_args, option, option_fields, quick_config

__all__ = ["option", "add_options", "config_from_args", "quick_config", "option_fields", "NO_QUICK"]
