"""Query lifecycle helpers shared by the service graph and the execution graphs: stopping a
streaming query politely, the restart budget of a failed one, and the watch on a batch that runs too
long."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol


class StreamingQueryLike(Protocol):
    """The part of pyspark's StreamingQuery used here (kept structural so contract needs no Spark)."""

    @property
    def isActive(self) -> bool: ...

    @property
    def status(self) -> dict[str, Any]: ...

    @property
    def lastProgress(self) -> Any: ...

    def stop(self) -> None: ...


@dataclass(frozen=True)
class StopTimes:
    """How long stopping a query took: waiting for its batch in flight, then stop() itself."""

    waited_s: float
    stop_s: float


_NOT_SEEN = object()


def stop_between_batches(query: StreamingQueryLike, timeout_s: float = 10.0) -> StopTimes:
    """Stop a query, preferably while no batch runs, and no later than the end of the batch in
    flight when asked: with a backlog the next batch starts at once, and a moment without one may
    never come. Then stop() cancels a batch that has just begun.

    stop() cancels a running batch; Spark replays it on restart, so waiting is about noise and
    wasted work, not correctness.
    """
    started = time.monotonic()
    deadline = started + timeout_s
    finished_before: object = _NOT_SEEN  # the last batch that had ended when the wait began
    while time.monotonic() < deadline and query.isActive and query.status.get("isTriggerActive"):
        last = _last_batch_id(query)
        if finished_before is _NOT_SEEN:
            finished_before = last
        elif last != finished_before:
            break  # the batch in flight ended
        time.sleep(0.05)
    waited = time.monotonic()
    query.stop()
    return StopTimes(waited_s=round(waited - started, 3), stop_s=round(time.monotonic() - waited, 3))


def _last_batch_id(query: StreamingQueryLike) -> int | None:
    progress = query.lastProgress
    return None if not progress else int(progress["batchId"])


LOOK_EVERY_S = 1.0  # how often the watch reads a query's status (two py4j calls)


@dataclass
class BatchWatch:
    """How long a query's batch in flight has run, from what Spark says at each look: whether a
    trigger is active, and the id of the last batch it finished. A batch that runs longer than
    `limit_s` (batch_stall_timeout) has stalled: a hung task, a cluster that lost its executors."""

    limit_s: float | None  # None: the watch is off
    since: float | None = None  # when the batch in flight was first seen
    after: int | None = None  # the last finished batch at that moment
    reported: bool = False  # this batch's stall was reported already
    looked: float = float("-inf")

    def look(self, query: StreamingQueryLike, now: float) -> float | None:
        """The seconds the query's batch in flight has run, the first time they pass the limit for
        that batch; None otherwise."""
        if self.limit_s is None or now - self.looked < LOOK_EVERY_S:
            return None
        self.looked = now
        active = bool(query.isActive and query.status.get("isTriggerActive"))
        last = query.lastProgress if active else None
        return self.seen(active, None if not last else int(last["batchId"]), now)

    def seen(self, active: bool, last_batch: int | None, now: float) -> float | None:
        """`look` without Spark: what the query said (tests drive it with a clock of their own)."""
        if not active:
            self.since, self.reported = None, False
            return None
        if self.since is None or last_batch != self.after:
            self.since, self.after, self.reported = now, last_batch, False
        running = now - self.since
        if self.limit_s is None or running <= self.limit_s or self.reported:
            return None
        self.reported = True
        return running


def stall_text(running_s: float, limit: object) -> str:
    """The one line a stalled batch is reported with."""
    return f"a batch ran {running_s:.0f}s, longer than batch_stall_timeout ({limit}); it was cancelled"


HEALTHY_RESET_S = 300.0  # a query that stays up this long after a restart gets its full budget back


@dataclass
class RestartBudget:
    """How often a failed query may be restarted, with doubling back-off between attempts."""

    limit: int
    backoff_s: float
    attempts: int = 0
    failed_at: float | None = None
    restarted_at: float = 0.0
    failures: list[float] = field(default_factory=list)  # when each failure was first seen (monotonic s)
    conflict_since: float | None = None  # when the checkpoint conflicts being forgiven began

    def healthy(self, now: float) -> None:
        if now - self.restarted_at > HEALTHY_RESET_S:
            self.attempts = 0
            self.conflict_since = None

    def forgives_conflict(self, now: float, deadline_s: float) -> bool:
        """A checkpoint conflict (another executor's Spark still writes the log) is retried without
        using up the budget, for `deadline_s` from the first one: the stalled writer's queries stop
        once it wakes and finds its lease lost, or its process ends."""
        if self.conflict_since is None:
            self.conflict_since = now
        return now - self.conflict_since <= deadline_s

    def retry_due(self, now: float) -> bool:
        """Like restart_due, for a forgiven failure: after one back-off, not counted."""
        if self.failed_at is None or now - self.failed_at < self.backoff_s:
            return False
        self.failed_at = None
        self.restarted_at = now
        return True

    @property
    def exhausted(self) -> bool:
        return self.attempts >= self.limit

    def first_seen(self, now: float) -> bool:
        """Records when the current failure was first seen; True the first time."""
        if self.failed_at is not None:
            return False
        self.failed_at = now
        self.failures.append(now)
        return True

    def failures_within(self, span_s: float, now: float) -> int:
        """How many failures were first seen in the last `span_s` seconds."""
        self.failures = [at for at in self.failures if now - at <= span_s]
        return len(self.failures)

    def restart_due(self, now: float) -> bool:
        """True once the back-off for this attempt has passed; the attempt is then counted."""
        if self.failed_at is None or now - self.failed_at < self.backoff_s * 2**self.attempts:
            return False
        self.attempts += 1
        self.failed_at = None
        self.restarted_at = now
        return True
