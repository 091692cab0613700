"""Transient errors in the control loop: retried with bounded back-off until a deadline.

A broker that restarts, a partition leader that moves or a request that times out says nothing
about the swap; the same call a second later usually succeeds. Only when the deadline passes is
the operation given up, with a one-line reason the caller records (for example in the journal).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import structlog
from kafka.errors import KafkaError

from hotswap.contract.outages import KAFKA, OUTAGES
from hotswap.executor.errors import ExecutorError

log = structlog.get_logger(__name__)

T = TypeVar("T")

FIRST_BACKOFF_S = 0.2
MAX_BACKOFF_S = 5.0


class TransientErrorsPersisted(ExecutorError):
    """A call kept failing with transient errors until its deadline."""


def is_transient(exc: BaseException) -> bool:
    """Errors worth retrying: kafka-python marks them retriable (node not ready, leader moved,
    timeouts, connection errors)."""
    return isinstance(exc, KafkaError) and bool(exc.retriable)


def retry_transient(
    action: Callable[[], T],
    what: str,
    deadline_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """Run `action`, retrying transient Kafka errors with doubling back-off for up to `deadline_s`."""
    deadline = clock() + deadline_s
    backoff = FIRST_BACKOFF_S
    attempts = 0
    while True:
        try:
            result = action()
        except KafkaError as exc:
            attempts += 1
            if not is_transient(exc):
                raise
            if clock() + backoff > deadline:
                raise TransientErrorsPersisted(
                    f"{what} failed {attempts} times in {deadline_s:.0f}s with transient Kafka errors "
                    f"(last: {_one_line(exc)}); check the brokers, then retry"
                ) from exc
            OUTAGES.down(KAFKA, _one_line(exc), f"{what}, for up to {deadline_s:.0f}s (retry_deadline)")
            log.debug("transient Kafka error; retrying", what=what, error=type(exc).__name__, attempt=attempts)
            sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF_S)
        else:
            OUTAGES.up(KAFKA)
            return result


def _one_line(exc: KafkaError) -> str:
    """The error's class and, when it has one, its message (which may say what to do), on one line."""
    return " ".join(str(exc).split())[:300]
