"""Errors raised while loading, validating or running user queries."""

from hotswap.contract.errors import HotswapError
from hotswap.contract.reasons import ReasonCode


class ExecutionGraphError(HotswapError):
    """An execution graph could not be built or run."""


class QueryRejected(ExecutionGraphError):
    """A user query is not acceptable; the message is the one-line reason shown to the user, and
    `reason_code` the word a program matches."""

    def __init__(self, message: str, reason_code: ReasonCode = ReasonCode.QUERY_INVALID) -> None:
        super().__init__(message)
        self.reason_code = reason_code


class GraphStartFailed(ExecutionGraphError):
    """An execution graph's Spark query did not reach the running state."""


class SchemaRefused(ExecutionGraphError):
    """A declared source schema cannot be read, or its event time is not a column hotswap can read."""


class GraphStateLost(ExecutionGraphError):
    """A closing graph's checkpoint lacks the state of its last committed batch."""


class CheckpointsUnreachable(ExecutionGraphError):
    """The checkpoint root cannot be listed or written (an S3 endpoint down, wrong keys, no bucket)."""


class ClosingGraphFailed(ExecutionGraphError):
    """A closing graph's loop stopped on a failure (its cause chained), as a streaming query terminates
    with one: the message carries the cause's whole text, for its root cause to be read from it."""
