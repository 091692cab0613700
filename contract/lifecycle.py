"""Stopping a streaming query politely, shared by the service graph and the execution graphs."""

from __future__ import annotations

import time
from typing import Any, Protocol


class StreamingQueryLike(Protocol):
    """The part of pyspark's StreamingQuery used here (kept structural so contract needs no Spark)."""

    @property
    def isActive(self) -> bool: ...

    @property
    def status(self) -> dict[str, Any]: ...

    def stop(self) -> None: ...


def stop_between_batches(query: StreamingQueryLike, timeout_s: float = 10.0) -> None:
    """Stop a query, preferably while no batch runs.

    stop() cancels a running batch; Spark replays it on restart, so waiting is about noise and
    wasted work, not correctness.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and query.isActive and query.status.get("isTriggerActive"):
        time.sleep(0.05)
    query.stop()
