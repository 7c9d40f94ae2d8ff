"""What the experiments share: how an experiment declares its options (`options`), and the statistics
and run scheduling of studies as they move here (issue 15)."""

from .options import NO_QUICK, add_options, config_from_args, option, option_fields, quick_config

__all__ = ["option", "add_options", "config_from_args", "quick_config", "option_fields", "NO_QUICK"]
