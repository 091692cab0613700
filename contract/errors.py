"""The root of every error hotswap raises on purpose.

Each room has its own `errors` module with subclasses; the CLI catches `HotswapError` and prints
its message as one line, so messages say what happened and what the operator can do about it.
"""


class HotswapError(Exception):
    """Base class of all hotswap errors."""


class ConfigError(HotswapError):
    """A setting is missing or has a value hotswap cannot use."""


class TimeoutExpired(HotswapError):
    """A bounded wait ran out; the message names what was waited for."""


class LeaseLost(HotswapError):
    """This process no longer holds the namespace's lease; it must stop without writing."""


class ControlStateLost(HotswapError):
    """The namespace's control state vanished from Redis (flushed, or an empty Redis took its place)."""
