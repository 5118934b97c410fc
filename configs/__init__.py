"""Run configuration: the typed schema, YAML presets and `key=value` overrides."""

from configs.schema import ConfigError, RunConfig, load_config

__all__ = ["ConfigError", "RunConfig", "load_config"]
