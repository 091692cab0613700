"""Shared test helpers: polling with a deadline (never bare sleeps), the phases a completed swap went through, and
the source the tests' graphs read."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from hotswap.contract.source import EventTimeKind, SourceSpec

T = TypeVar("T")

# The generator's demo format (every field of SourceSpec left at its default), resolved: its event time
# `ts` counts milliseconds since the epoch. What a test's graph reads unless the test declares its own.
DEMO_SOURCE = SourceSpec(event_time_kind=EventTimeKind.EPOCH)

# Every phase of a swap that completes, in order: written out here, not read from the product's phase
# table (contract/phases.py), so a test notices when that table changes.
COMPLETED_SWAP_PHASES = [
    "submitted",
    "validated",
    "deploying",
    "deployed",
    "cut",
    "draining",
    "drained",
    "retiring",
    "retired",
    "completed",
]


def wait_until(condition: Callable[[], T], timeout_s: float, what: str, interval_s: float = 0.5) -> T:
    """Poll `condition` until it returns something truthy; fail naming `what` after the deadline."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)
