"""Stage timings: where a batch's time goes, recorded in-process and read by the benchmark.

The product wraps each step of a batch (a Redis round trip, a Spark action, a marker send) in
`timed(query, stage)`; `make bench` reads `medians()` and prints the largest. Each (query, stage)
keeps only its last `SAMPLES_KEPT` durations, so a permanent query recording every batch stays
bounded. Every call is thread-safe: Spark runs foreachBatch functions of several queries at once.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

import structlog

log = structlog.get_logger(__name__)

SAMPLES_KEPT = 1_000  # per (query, stage): enough for a stable median, bounded for a permanent query

_lock = threading.Lock()
_samples: dict[tuple[str, str], deque[float]] = {}


def record(query: str, stage: str, seconds: float) -> None:
    """One duration of `stage` in `query` (a Spark query name, or any name that groups stages)."""
    with _lock:
        kept = _samples.get((query, stage))
        if kept is None:
            kept = _samples[(query, stage)] = deque(maxlen=SAMPLES_KEPT)
        kept.append(seconds)


@contextmanager
def timed(query: str, stage: str) -> Iterator[None]:
    """Record how long the block took, also when it raised (a failed step still spent the time)."""
    began = time.perf_counter()
    try:
        yield
    finally:
        seconds = time.perf_counter() - began
        record(query, stage, seconds)
        log.debug("stage timed", query=query, stage=stage, seconds=round(seconds, 6))


def snapshot() -> dict[str, dict[str, list[float]]]:
    """A copy of every kept duration: query -> stage -> seconds, oldest first."""
    with _lock:
        items = [(key, list(kept)) for key, kept in _samples.items()]
    out: dict[str, dict[str, list[float]]] = {}
    for (query, stage), values in items:
        out.setdefault(query, {})[stage] = values
    return out


def medians() -> dict[str, dict[str, float]]:
    """The median of the kept durations: query -> stage -> seconds."""
    return {
        query: {stage: statistics.median(values) for stage, values in stages.items() if values}
        for query, stages in snapshot().items()
    }


def reset() -> None:
    """Forget every duration (the benchmark resets before each measured period)."""
    with _lock:
        _samples.clear()
