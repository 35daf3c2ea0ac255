"""The one error every layer raises for a setting that cannot run."""


class ConfigError(ValueError):
    """A decoding config that cannot run; the message is meant for the user, on one line: what the user gave in it
    reads escaped, so a newline sent in a value or a key cannot break the line it is shown on."""

    def __init__(self, message: str) -> None:
        super().__init__(one_line(message, None))


def one_line(value: object, limit: int | None = 40) -> str:
    """What the user gave, as a one-line message quotes it: control characters escaped (a newline reads \\n, not a
    line break), cut at `limit` characters (then …; None: whole)."""
    text = str(value)
    cut = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return cut + ("…" if limit is not None and len(text) > limit else "")
