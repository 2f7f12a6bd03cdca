"""Errors the whole core shares; a module of its own so any config dataclass can raise them
without importing `rhymerl.config.run` (which composes them)."""


class ConfigError(ValueError):
    """A configuration key or value is wrong; the message names the key and the fix.

    `key` is the dotted key at fault when one is ("rollout.n", "reward.functions[1]"; "" when the
    problem is not one key's), so a loader can say which config file set it.
    """

    def __init__(self, message: str, key: str = "") -> None:
        super().__init__(message)
        self.key = key
