"""The one error every layer raises for a setting that cannot run."""


class ConfigError(ValueError):
    """A decoding config that cannot run; the message is meant for the user, on one line."""
