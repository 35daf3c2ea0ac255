"""The errors of engine builds, apart so that the store (app/backends/store.py) and the engines it builds
(app/backends/*/) can both raise them without importing each other."""


class EngineError(ValueError):
    """A spec or build id the store cannot use; the message is meant for the user."""


class BuildError(EngineError):
    """A build that failed; nothing was left at its final path."""
