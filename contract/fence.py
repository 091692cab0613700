"""The lease as a fence on every control write.

An executor writes the namespace's control state (swap phases, routing plans, the service state,
graph records, progress reports) only while it holds the lease and the namespace record exists.
Both are checked inside the write's own transaction: the keys are WATCHed, read and compared, and
the write is queued after MULTI, so a lease taken over or a Redis flushed between the check and
EXEC aborts the transaction instead of letting the write through. An executor that stalled past
its lease (a GC pause, SIGSTOP, a network partition) therefore cannot write when it wakes up, and
an executor whose Redis lost its data cannot rebuild the namespace from nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import redis
from redis.client import Pipeline

from hotswap.contract.errors import ControlStateLost, LeaseLost
from hotswap.contract.names import Keys

T = TypeVar("T")

OUTAGE_S = 60.0  # how long a control write waits for Redis to come back


class Fence:
    def __init__(self, keys: Keys, token: str) -> None:
        self.keys = keys
        self.token = token

    @property
    def watched(self) -> tuple[str, str]:
        return self.keys.lease, self.keys.namespace_record

    def verify(self, reader: redis.Redis | Pipeline) -> None:
        """Raise unless this writer holds the lease and the namespace record exists."""
        holder, record = reader.mget(list(self.watched))
        if record is None:
            raise ControlStateLost(
                f"the control state of namespace {self.keys.namespace!r} vanished from Redis (flushed, or an empty "
                "Redis took its place); stopping without writing. Nothing is lost in Kafka: see README, "
                "'Lost control state', to start the namespace over with `hotswap run --reset-namespace`"
            )
        if _text(holder) != self.token:
            raise LeaseLost(
                f"this executor lost its lease on namespace {self.keys.namespace!r} to {_text(holder) or 'nobody'} "
                "(it stalled longer than the lease TTL); stopping without writing"
            )


def _text(value: Any) -> str | None:
    return value.decode() if isinstance(value, bytes) else value


def fenced(
    client: redis.Redis,
    fence: Fence | None,
    write: Callable[[Pipeline], T],
    *,
    watch: tuple[str, ...] = (),
) -> T:
    """Run `write` (which reads through the pipe in immediate mode, then calls `pipe.multi()` and
    queues its commands) in one transaction that also checks the fence. Retries when a watched key
    changed meanwhile (the lease's own renewal does that). Without a fence (an operator's client),
    only `watch` is watched."""
    deadline = time.monotonic() + OUTAGE_S
    pause = 0.1
    while True:
        with client.pipeline(transaction=True) as pipe:
            try:
                keys = (*(fence.watched if fence else ()), *watch)
                if keys:
                    pipe.watch(*keys)  # type: ignore[no-untyped-call]  # redis-py leaves watch() unannotated
                if fence is not None:
                    fence.verify(pipe)
                result = write(pipe)
                pipe.execute()
                return result
            except redis.WatchError:
                continue
            except (redis.ConnectionError, redis.TimeoutError):
                # redis-py does not retry a connection that was WATCHing; a restarting Redis is
                # waited for here, as the client's own retries wait for plain commands.
                if time.monotonic() >= deadline:
                    raise
                time.sleep(pause)
                pause = min(pause * 2, 2.0)


def fenced_write(client: redis.Redis, fence: Fence | None, queue: Callable[[Pipeline], object]) -> None:
    """Execute the commands `queue` adds to the pipe as one fenced transaction."""

    def write(pipe: Pipeline) -> None:
        pipe.multi()
        queue(pipe)

    fenced(client, fence, write)
