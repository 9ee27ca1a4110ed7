"""The project's user-facing errors: a leaf module, so every layer can raise it without
importing the config validation (which imports the method registry)."""

from typing import Any


class ConfigError(ValueError):
    """A config value (or a checkpoint it names) is not allowed; the message is meant for the
    user as is: the key, the bad value and what is allowed.

    Args:
        *args: The message (as for :class:`ValueError`).
    """


class CheckpointError(ConfigError):
    """A checkpoint (or run dir) cannot be used; the message is meant for the user as is."""


def fail(key: str, value: Any, allowed: str) -> None:
    """Raise the one-line :class:`ConfigError` ``key=value is not allowed: allowed``."""
    raise ConfigError(f"{key}={value!r} is not allowed: {allowed}")
