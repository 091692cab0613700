"""Errors raised by the control plane."""

from hotswap.contract.errors import HotswapError, TimeoutExpired
from hotswap.contract.reasons import ReasonCode


class ExecutorError(HotswapError):
    """The executor could not carry out an operation."""


class StackError(ExecutorError):
    """The embedded Kafka/Redis stack could not be fetched, started or reached."""


class LeaseHeld(ExecutorError):
    """Another executor already acts on this namespace."""


class SubmitRejected(ExecutorError):
    """A submitted query was refused; the message is the one-line reason, with its reason code."""

    def __init__(self, message: str, reason_code: ReasonCode | None = None) -> None:
        super().__init__(message)
        self.reason_code = reason_code


class Interrupted(ExecutorError):
    """The operator pressed Ctrl-C while a command waited; the message says what was left behind."""


class SwapFailed(ExecutorError):
    """A swap ended other than completed (failed, aborted) or was stranded."""

    def __init__(self, message: str, reason_code: ReasonCode | None = None) -> None:
        super().__init__(message)
        self.reason_code = reason_code


class SparkConnectUnsupported(ExecutorError):
    """The Spark target is a Spark Connect server, which cannot host hotswap's driver-side state."""


class RequestNotTaken(TimeoutExpired):
    """The executor did not take an operator request in time; the request is withdrawn, nothing changed."""
