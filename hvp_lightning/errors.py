"""The project's user-facing error: a leaf module, so every layer can raise it without
importing the config validation (which imports the method registry)."""


class ConfigError(ValueError):
    """A config value (or a checkpoint it names) is not allowed; the message is meant for the
    user as is: the key, the bad value and what is allowed."""
