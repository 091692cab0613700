"""Errors raised by the control plane."""

from hotswap.contract.errors import HotswapError


class ExecutorError(HotswapError):
    """The executor could not carry out an operation."""


class StackError(ExecutorError):
    """The embedded Kafka/Redis stack could not be fetched, started or reached."""


class LeaseHeld(ExecutorError):
    """Another executor already acts on this namespace."""


class SubmitRejected(ExecutorError):
    """A submitted query was refused; the message is the one-line reason."""


class SwapFailed(ExecutorError):
    """A swap ended in failed or aborted, or did not finish in time."""


class SparkConnectUnsupported(ExecutorError):
    """The Spark target is a Spark Connect server, which cannot host hotswap's driver-side state."""
