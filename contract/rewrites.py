"""Rewrites: the event times at which a replayed service batch may have written rows to the graphs'
topics a second time.

Spark replays a service batch whose offsets it logged and whose commit it did not (a crash, a failed
batch, a restart). The replay reads the same records and routes them by the batch's write-ahead
plan, so rows its first attempt wrote reach a graph's topic twice. A closing graph counts each
source event once by deduplicating a window's rows, and that costs a sort of every row it reads
(execution_graph.closing). So before a replayed batch writes a row, the service graph records here
from which event time its rows can be (the plan's late bound) and, once they are written, up to
which (the latest event time it routed). A closing graph deduplicates the rows of the windows it
closes only where a rewrite reaches them.

Where Spark may run a task twice itself (execution_graph.task_slots.runs_tasks_twice names where: a
cluster, `local[N,F]`, speculation, the web UI's kill link), a task may write its rows twice within
one batch and no replay is recorded: there a closing graph always deduplicates.

The records are a Redis hash (`Keys.rewrites`), service batch id -> Rewrite. At most REWRITES_KEPT
are kept: the two oldest are merged into one that spans both, so a record is never lost, only made
wider (a window it wrongly reaches is deduplicated, which changes no result). A namespace whose rows
an earlier build of hotswap routed, before replays were recorded, gets one record for all of them
(under EARLIER_BUILD) the first time its service graph starts (`Keys.rewrites_recorded` says so).
"""

from __future__ import annotations

import redis

from hotswap.contract.fence import Batch
from hotswap.contract.models import Record
from hotswap.contract.names import Keys

REWRITES_KEPT = 32
EARLIER_BUILD = -1  # the record of the rows routed before replays were recorded


class Rewrite(Record):
    """A replayed batch's rows lie at event times in [since_ms, until_ms] (None: unbounded; an
    open `until_ms` until the replay's rows are written)."""

    since_ms: int | None
    until_ms: int | None = None

    def reaches(self, since_ms: int | None, before_ms: int) -> bool:
        """Whether rows with event times in [since_ms, before_ms) may include this rewrite's."""
        above = self.until_ms is None or since_ms is None or self.until_ms >= since_ms
        below = self.since_ms is None or self.since_ms < before_ms
        return above and below

    def spanning(self, other: Rewrite) -> Rewrite:
        """One rewrite that holds both."""
        since = None if self.since_ms is None or other.since_ms is None else min(self.since_ms, other.since_ms)
        until = None if self.until_ms is None or other.until_ms is None else max(self.until_ms, other.until_ms)
        return Rewrite(since_ms=since, until_ms=until)


def read_rewrites(client: redis.Redis, keys: Keys) -> dict[int, Rewrite]:
    """Every recorded rewrite, by service batch id."""
    raw = client.hgetall(keys.rewrites)
    return {int(batch_id): Rewrite.model_validate_json(value) for batch_id, value in raw.items()}


def queue_rewrite(pipe: Batch, keys: Keys, batch_id: int, rewrite: Rewrite, held: dict[int, Rewrite]) -> None:
    """Queue the record of batch `batch_id`'s rewrite, given those `held` now; past REWRITES_KEPT
    the two oldest become one."""
    records = {**held, batch_id: rewrite}
    while len(records) > REWRITES_KEPT:
        oldest, second = sorted(records)[:2]
        records[second] = records.pop(oldest).spanning(records[second])
    # Written whole (a few dozen small fields, once per replay): what is held is exactly `records`.
    pipe.delete(keys.rewrites)
    for batch, kept in sorted(records.items()):
        pipe.hset(keys.rewrites, str(batch), kept.model_dump_json())


def queue_recording_begins(pipe: Batch, keys: Keys, latest_routed_ms: int | None, held: dict[int, Rewrite]) -> None:
    """Queue what the first start of a build that records replays writes: a record holding every row
    routed so far (any of them a replay of an earlier build may have written twice), if any was."""
    if latest_routed_ms is not None:
        queue_rewrite(pipe, keys, EARLIER_BUILD, Rewrite(since_ms=None, until_ms=latest_routed_ms), held)
    pipe.set(keys.rewrites_recorded, "1")


def queue_no_rewrite(pipe: Batch, keys: Keys, batch_id: int) -> None:
    """Queue the removal of batch `batch_id`'s record: its replay routed no row to a graph."""
    pipe.hdel(keys.rewrites, str(batch_id))
