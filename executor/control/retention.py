"""Retention: what a namespace keeps of the versions it retired.

Every swap leaves a record in the journal, and its old graph a record, a progress key, a
checkpoint and a topic. Kept forever, they grow Redis, the brokers and the disk with every swap,
and every batch's ownership read grows with the journal. So once a minute the executor sweeps:

- The journal keeps the newest `journal_retention` ended swaps. Older ended swaps are forgotten,
  oldest first, as long as none of their queries still serves, is still owed windows (`failed`), or
  belongs to an open swap; and none is named by a swap that stays.
- A retired or discarded graph that no kept swap names is forgotten: its topics, its checkpoint, its
  record.
- A topic of a graph that no longer serves is deleted again if it came back: a broker with
  `auto.create.topics.enable` recreates a deleted topic when a producer that wrote there refreshes
  its metadata (a watermark marker sent just before the delete, or Spark's producer for up to
  `metadata.max.idle.ms`).

Forgetting changes no ownership that matters: the cuts it removes are the oldest, and they bound only
graphs that are retired (contract.ownership).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable

import redis
import structlog

from hotswap.contract.journal import Journal, SwapRecord
from hotswap.contract.models import CurrentQuery, GraphRecord
from hotswap.contract.settings import PipelineSettings
from hotswap.executor.control.graphs import Graphs
from hotswap.executor.control.topics import Topics
from hotswap.executor.control.transient import TransientErrorsPersisted

log = structlog.get_logger(__name__)

SWEEP_EVERY_S = 60.0
MOST_PER_SWEEP = 20  # swaps forgotten in one write: a long backlog is worked off over a few sweeps


def serving(record: GraphRecord) -> bool:
    """Whether a graph still serves or is owed windows: starting, running or failed; not retired or discarded."""
    return not record.state.is_ended


def live_queries(
    swaps: Iterable[SwapRecord], records: dict[str, GraphRecord], current: CurrentQuery | None
) -> set[str]:
    """Queries nothing may forget: the current one, every graph that serves, and those of open swaps."""
    live = {q for q, record in records.items() if serving(record)}
    if current is not None:
        live.add(current.query_id)
    for swap in swaps:
        if not swap.state.is_terminal:
            live.update(q for q in (swap.from_query, swap.to_query, swap.replaces) if q is not None)
    return live


def named_queries(swap: SwapRecord) -> set[str]:
    return {q for q in (swap.from_query, swap.to_query, swap.replaces) if q is not None}


def forgettable_swaps(swaps: list[SwapRecord], live: set[str], keep: int) -> list[SwapRecord]:
    """The oldest ended swaps beyond the newest `keep`, in journal order, up to the first that must
    stay: open, naming a live query, or named by a swap that stays as the one it undoes or recovers
    (a rollback and the swap it undid are forgotten together, or not at all)."""
    ended = [s for s in swaps if s.state.is_terminal]
    beyond = {s.id for s in ended[: max(0, len(ended) - keep)]}
    chosen: list[SwapRecord] = []
    for swap in swaps:
        if swap.id not in beyond or named_queries(swap) & live:
            break
        chosen.append(swap)
    while True:
        staying = swaps[len(chosen) :]
        named = {ref for s in staying for ref in (s.rollback_of, s.recovers) if ref is not None}
        first_named = next((i for i, s in enumerate(chosen) if s.id in named), None)
        if first_named is None:
            return chosen[:MOST_PER_SWEEP]
        chosen = chosen[:first_named]


class Retention:
    """The executor's sweep: forgets old swaps and ended graphs, and deletes topics that came back.

    It runs on a thread of its own, at most one at a time: deleting topics and checkpoints talks to
    Kafka and the file system, which may be slow or away, and the executor's loop never waits for it.
    Everything it touches is retired or guarded by the journal's compare-and-set writes."""

    def __init__(
        self,
        pipeline: PipelineSettings,
        journal: Journal,
        graphs: Graphs,
        topics: Topics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._pipeline = pipeline
        self._journal = journal
        self._graphs = graphs
        self._topics = topics  # its own admin client: the loop's is not shared across threads
        self._clock = clock
        self._last: float | None = None
        self._running: threading.Thread | None = None

    def sweep_due(self) -> None:
        """Start a sweep once every SWEEP_EVERY_S (the first a full period after the executor starts:
        it has its queries to resume first), unless the last one still runs."""
        now = self._clock()
        if self._last is None:
            self._last = now
            return
        if now - self._last < SWEEP_EVERY_S or (self._running is not None and self._running.is_alive()):
            return
        self._last = now
        self._running = threading.Thread(target=self._sweep_logged, name="hotswap-retention", daemon=True)
        self._running.start()

    def _sweep_logged(self) -> None:
        try:
            self.sweep()
        except (redis.RedisError, TransientErrorsPersisted) as exc:
            # Redis or Kafka is away: the executor's loop says so once (contract.outages).
            log.debug("retention sweep skipped during an outage", error=f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # noqa: BLE001 - a sweep that fails is tried again at the next one
            log.warning("retention sweep failed; tried again in a minute", error=f"{type(exc).__name__}: {exc}")

    def sweep(self) -> None:
        prefix = self._pipeline.names.owned_topic_prefix
        # Topics are listed before records are read: a graph's record is written before its topic is
        # created, so every topic listed here has its record in what is read next.
        existing = self._topics.names(f"{prefix}graph.") + self._topics.names(f"{prefix}shadow.")
        swaps = self._journal.all()
        records = self._graphs.records()
        live = live_queries(swaps, records, self._graphs.current())
        forgotten = forgettable_swaps(swaps, live, self._pipeline.journal_retention)
        if forgotten and self._journal.forget(forgotten):
            log.info("ended swaps forgotten (journal_retention)", swaps=[s.id for s in forgotten])
            gone = {s.id for s in forgotten}
            swaps = [s for s in swaps if s.id not in gone]
        named = {q for s in swaps for q in named_queries(s)}
        for query_id, record in sorted(records.items()):
            if query_id not in live and query_id not in named and record.state.is_ended:
                self._graphs.forget(record)
                log.info("ended graph forgotten: its record and checkpoint", query_id=query_id, state=record.state)
        if not self._pipeline.keep_retired_topics:
            self._delete_unneeded_topics(existing, records, live, named)

    def close(self) -> None:
        self._topics.close()

    def _delete_unneeded_topics(
        self, existing: list[str], records: dict[str, GraphRecord], live: set[str], named: set[str]
    ) -> None:
        """A graph topic is needed while its graph serves (it is the buffer); a shadow's results
        topic while its swap is kept (`hotswap diff` reads it after the shadow ended)."""
        names = self._pipeline.names
        needed: set[str] = set()
        for query_id in live | named:
            needed.add(names.shadow_results_topic(query_id))
            record = records.get(query_id)
            if record is not None and record.shadow_results_topic is not None:
                needed.add(record.shadow_results_topic)
        for query_id in live:
            needed.add(names.graph_topic(query_id))
            record = records.get(query_id)
            if record is not None:
                needed.add(record.topic)
        for topic in existing:
            if topic not in needed:
                self._topics.delete(topic)  # logged there
