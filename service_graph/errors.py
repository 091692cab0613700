"""Errors raised by the service graph."""

from hotswap.contract.errors import HotswapError


class ServiceGraphError(HotswapError):
    """The service graph could not route a batch."""


class NoTargetGraph(ServiceGraphError):
    """There is no execution graph to route rows to."""
