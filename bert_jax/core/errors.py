"""The errors every layer raises about a run's settings."""


class ConfigError(ValueError):
  """A config value that cannot work."""
