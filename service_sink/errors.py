"""Errors raised by the service sink."""

from hotswap.contract.errors import HotswapError


class ServiceSinkError(HotswapError):
    """Results or progress could not be written, or read back."""


class TopicReadIncomplete(ServiceSinkError):
    """A topic could not be read to its end in time."""


class SinkUnavailable(ServiceSinkError):
    """The sink's database or store could not be reached: retried, uncounted, for retry_deadline
    (its message begins with contract.causes.SINK_OUTAGE)."""


class SinkWriteRefused(ServiceSinkError):
    """The sink's database refused a batch's rows (a value it cannot store): a failure of the batch."""


class SinkSchemaConflict(ServiceSinkError):
    """A query's results do not fit the columns the sink's table already has."""
