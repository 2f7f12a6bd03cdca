"""Errors the whole core shares; a module of its own so any config dataclass can raise them
without importing `rhymerl.config.run` (which composes them)."""


class ConfigError(ValueError):
    """A configuration key or value is wrong; the message names the key and the fix."""
