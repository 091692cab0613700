"""Errors raised by the service sink."""

from contract.errors import HotswapError


class ServiceSinkError(HotswapError):
    """Results or progress could not be written."""
