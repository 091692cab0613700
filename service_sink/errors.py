"""Errors raised by the service sink."""

from hotswap.contract.errors import HotswapError


class ServiceSinkError(HotswapError):
    """Results or progress could not be written, or read back."""


class TopicReadIncomplete(ServiceSinkError):
    """A topic could not be read to its end in time."""


class SinkUnavailable(ServiceSinkError):
    """The sink's database could not be reached or refused the write."""


class SinkSchemaConflict(ServiceSinkError):
    """A query's results do not fit the columns the sink's table already has."""
