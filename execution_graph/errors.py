"""Errors raised while loading, validating or running user queries."""

from hotswap.contract.errors import HotswapError


class ExecutionGraphError(HotswapError):
    """An execution graph could not be built or run."""


class QueryRejected(ExecutionGraphError):
    """A user query is not acceptable; the message is the one-line reason shown to the user."""


class GraphStartFailed(ExecutionGraphError):
    """An execution graph's Spark query did not reach the running state."""


class SchemaRefused(ExecutionGraphError):
    """A declared source schema cannot be read, or its event time is not a column hotswap can read."""
