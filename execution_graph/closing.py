"""The closing engine: an execution graph that computes each window once, when it closes.

The service graph writes a window's rows into the graph's topic, then, once its own watermark has
passed the window, an end-of-window marker into every partition of that topic. So the graph needs
no Spark watermark and no state store to know a window is complete: it notices the markers.

After each batch the graph knows, from the route headers of the rows the batch read (never their
values), per graph partition the highest marker read so far and where the rows of each open
event-time bucket begin (a bucket is one slide of the query's windows): the first row's offset, or
an offset before it for buckets past what a close job watched one by one (HeaderWatch). The graph may close
through the **minimum** over all its partitions of their highest markers (the "one watermark" rule,
kept here instead of by Spark's max-based watermark, so a skewed partition, an empty one or a row
cap never closes a window early); a marker the service graph's producer saw every partition take
counts too, once the batch reads past it. How far a batch closes, C, is decided before it runs and
written in its offset log. When C passes the closed point P, the windows ending in (P, C] are
complete: the batch computes them once, first, as a Spark batch job over exactly their rows, read
back from the topic by offset range, each source event counted once by a stateless deduplication
where rows may be there twice (a replayed service batch's rewrite reaches them: contract.rewrites).
Results go to the sink under the usual idempotent keys. The same job learns the route headers of
the rows it reads (HeaderWatch, observed metrics of the read); only when that cannot tell it all (a
row far ahead, a query that ran an action over part of the rows) does the batch read the headers
in a pass of their own.

Nothing per event is kept anywhere. What the graph keeps between batches is a few integers per
partition and per open bucket (`ClosingState`), written to its checkpoint (`closing/<batch id>`)
before the batch's commit, and derived only from the batch's own records, its C and the state of the
batch before. A batch replayed after a crash therefore reads the same offsets, closes the same
windows, writes the same results under the same keys and reaches the same state.
(docs/architecture.md, "Two graph engines".)
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import structlog
from py4j.protocol import Py4JError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, Observation, SparkSession
from pyspark.sql import functions as F

from hotswap.contract import stages
from hotswap.contract.batch_constants import batch_long, batch_timestamp
from hotswap.contract.faults import crash_point
from hotswap.contract.models import GraphRecord
from hotswap.contract.observed import observed_column, observed_values
from hotswap.contract.rewrites import Rewrite
from hotswap.contract.settings import KafkaSettings
from hotswap.contract.source import EVENT_TIME_COLUMN
from hotswap.contract.windows import GRAPH_WATERMARK_DELAY_MS, Windowing
from hotswap.execution_graph.checkpoint import GraphFiles
from hotswap.execution_graph.errors import GraphStateLost
from hotswap.execution_graph.events import (
    BOOKKEEPING,
    ROUTE,
    ROUTE_COLUMN,
    SOURCE_EVENT,
    not_skipped,
    parsed_events,
    record_fields,
    routed_rows,
)
from hotswap.execution_graph.task_slots import leave_a_slot, task_slots
from hotswap.execution_graph.user_query import QueryFunction

log = structlog.get_logger(__name__)

BatchWriter = Callable[[DataFrame, int], None]


@runtime_checkable
class WindowEmitter(Protocol):
    """A batch writer that can say, before a close job runs, whether it would write any result of the
    windows ending in (after, through] (the service sink's ResultWriter: the windows its graph owns)."""

    def emits_within(self, after: int | None, through: int) -> bool: ...


# State files kept in the checkpoint: Spark replays at most the last uncommitted batch, which needs
# the one before it; a few more are kept for whoever reads a checkpoint by hand.
STATE_FILES_KEPT = 10
STATE_DIR = "closing"
# Which rows the last batch that failed computed windows over, written when it fails: the rows a
# skipped poison batch dead-letters (`poison_batches`), read by GraphRunner.failing_rows.
FAILED_FILE = f"{STATE_DIR}/failed"
# How long the broker may hold a fetch of a closing graph's range reads (read_range).
RANGE_FETCH_MAX_WAIT_MS = 10
# How long a closing job's header metrics may take to arrive after its action returned.
OBSERVED_WAIT_S = 5.0


# -- the state, free of Spark ----------------------------------------------------------------------
@dataclass(frozen=True)
class PartitionRead:
    """What one batch read from one partition of the graph's topic."""

    partition: int
    marker: int | None = None  # the highest marker position read (a window ending at or before it is closed)
    # bucket start (ms) -> an offset at or before the bucket's first data row at or after `since`: the first
    # row's own offset, or, for buckets past what a closing job watched, the first of all those rows'
    first_offsets: Mapping[int, int] = field(default_factory=dict)
    since: int | None = None  # the read saw every row of the partition from this offset on (None: unknown)


@dataclass(frozen=True)
class ClosingState:
    """What a closing graph keeps between batches, after batch `batch_id`."""

    batch_id: int = -1
    closed_through: int | None = None  # every window ending at or before this has been emitted
    markers: Mapping[int, int] = field(default_factory=dict)  # partition -> highest marker position read
    # bucket start (ms) -> partition -> an offset at or before the first data row of that bucket (its own
    # offset unless the bucket lay past what a closing job watched: HeaderWatch), for open buckets
    first_offsets: Mapping[int, Mapping[int, int]] = field(default_factory=dict)
    # partition -> [from, to): rows whose headers no batch read yet: left by a batch that closed windows
    # for the next batch's headers pass, or (`deferred`) by batches that closed only windows another
    # version owns, for this graph's next close job of its own windows (which reads from their start)
    unread: Mapping[int, tuple[int, int]] = field(default_factory=dict)
    deferred: bool = False

    def to_json(self) -> str:
        return json.dumps(
            {
                "batch_id": self.batch_id,
                "closed_through": self.closed_through,
                "markers": {str(p): m for p, m in sorted(self.markers.items())},
                "first_offsets": {
                    str(b): {str(p): o for p, o in sorted(parts.items())}
                    for b, parts in sorted(self.first_offsets.items())
                },
                "unread": {str(p): list(r) for p, r in sorted(self.unread.items())},
                "deferred": self.deferred,
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> ClosingState:
        raw = json.loads(text)
        return cls(
            batch_id=int(raw["batch_id"]),
            closed_through=None if raw["closed_through"] is None else int(raw["closed_through"]),
            markers={int(p): int(m) for p, m in raw["markers"].items()},
            first_offsets={
                int(b): {int(p): int(o) for p, o in parts.items()} for b, parts in raw["first_offsets"].items()
            },
            unread={int(p): (int(r[0]), int(r[1])) for p, r in raw.get("unread", {}).items()},
            deferred=bool(raw.get("deferred", False)),
        )


@dataclass(frozen=True)
class Closing:
    """The windows one batch closes, ending in (after, through], and where their rows are: for
    each partition the offsets [from, to) to read, and the event times [rows_since, through) the
    windows hold."""

    after: int | None
    through: int
    offsets: Mapping[int, tuple[int, int]]
    rows_since: int | None


def closable(
    state: ClosingState, partitions: int, windowing: Windowing, known: Mapping[int, int] | None = None
) -> int | None:
    """How far the graph may close now, or None if no window closes: the minimum over all
    `partitions` of the highest marker each holds, read (`state.markers`) or known to be in the
    range the next batch reads (`known`: markers the producer saw every partition take), taken
    down to the last window end at or before it (windows end on the slide's grid: validation
    refuses offset windows). A partition with no marker closes nothing; the graph never closes
    backwards."""
    known = known or {}
    highest: list[int] = []
    for partition in range(partitions):
        held = [m for m in (state.markers.get(partition), known.get(partition)) if m is not None]
        if not held:
            return None
        highest.append(max(held))
    if not highest:
        return None
    reached = min(highest) - min(highest) % windowing.slide_ms
    return reached if state.closed_through is None or reached > state.closed_through else None


def closing_for(
    state: ClosingState, through: int, start: Mapping[int, int], end: Mapping[int, int], windowing: Windowing
) -> Closing:
    """The windows ending in (state.closed_through, through], and where their rows are: from the
    first offset of each bucket they need that earlier batches read, else from where the rows whose
    headers no batch has read begin (this batch's start, or a range an earlier batch left unread),
    to where this batch ends."""
    previous = state.closed_through
    offsets: dict[int, tuple[int, int]] = {}
    for partition, stop in end.items():
        firsts = [
            parts[partition]
            for bucket, parts in state.first_offsets.items()
            if partition in parts and _needed(bucket, previous, through, windowing)
        ]
        unread = [state.unread[partition][0]] if partition in state.unread else []
        begin = min([*firsts, *unread, start.get(partition, stop)])
        if begin < stop:
            offsets[partition] = (begin, stop)
    rows_since = None if previous is None else previous - windowing.size_ms + 1
    return Closing(after=previous, through=through, offsets=offsets, rows_since=rows_since)


def advance(
    state: ClosingState,
    batch_id: int,
    reads: Iterable[PartitionRead],
    through: int | None,
    windowing: Windowing,
    unread: Mapping[int, tuple[int, int]] | None = None,
    *,
    deferred: bool = False,
) -> ClosingState:
    """The state after a batch that read the headers `reads` (of its range and of any range the
    batch before left unread) and closed the windows ending up to `through` (None: it closed none),
    or that left its range `unread`. What the reads say can close more waits for the next batch,
    whose offset log records it before its results."""
    markers = dict(state.markers)
    first: dict[int, dict[int, int]] = {b: dict(parts) for b, parts in state.first_offsets.items()}
    for read in reads:
        if read.marker is not None:
            markers[read.partition] = max(read.marker, markers.get(read.partition, read.marker))
        for bucket, offset in read.first_offsets.items():
            parts = first.setdefault(bucket, {})
            known = parts.get(read.partition)
            parts[read.partition] = _first_offset(known, offset, read.since)
    closed = state.closed_through
    if through is not None and (closed is None or through > closed):
        closed = through
    if closed is not None:
        # A bucket no window ending after `closed` reads is done with (a replayed service batch's
        # duplicates may bring its rows again after the marker: they belong to closed windows).
        first = {b: parts for b, parts in first.items() if _needed(b, closed, None, windowing)}
    return ClosingState(batch_id, closed, markers, first, dict(unread or {}), deferred and bool(unread))


def _first_offset(known: int | None, read: int, since: int | None) -> int:
    """Where a bucket's rows begin in a partition, from what was `known` (at or before the bucket's
    first row: each offset's header is learnt once, in order) and what a read that saw every row from
    `since` on says (`read`: at or before the bucket's first row at or after `since`). A read that
    began at or before `known` began before every row of the bucket, so `read` is at or before its
    first row too, and the larger of the two is the closer bound (exact where the read's is).
    Otherwise the bucket may have begun before the read, and only `known` is sure."""
    if known is None:
        return read
    if since is not None and since <= known:
        return max(known, read)
    return min(known, read)


def _needed(bucket: int, after: int | None, through: int | None, windowing: Windowing) -> bool:
    """Whether rows in [bucket, bucket + slide) belong to a window ending in (after, through]. Windows
    lie on the slide's grid (validation refuses offset windows), so those rows' windows end on the
    grid from bucket + slide to bucket + size."""
    if through is not None and bucket + windowing.slide_ms > through:
        return False
    return after is None or bucket + windowing.size_ms > after


@dataclass(frozen=True)
class HeaderWatch:
    """What a closing job learns, as it reads its rows, of their route headers: per partition the
    highest marker, and the first offset of each bucket still open once the batch has closed
    through `through` (`buckets`: the first open one and those after it, up to two windows past
    `through`). So a batch that closes windows needs no headers pass of its own.

    Rows of buckets past the watched ones (a backlog's batch spans more windows than it closes) are
    watched together: their first offset and their last bucket. Every bucket on the grid up to that
    one takes that offset, at or before its own first row: a later job that closes it reads from
    there, and the first job whose range begins at or before it learns the bucket's own (advance).

    The job's metrics are trusted only if they saw every offset of its `ranges` (a user's query
    that ran an action of its own over part of the rows completes the observation early), and the
    rows ahead span at most MAX_AHEAD_BUCKETS buckets (not a jump far ahead): else the batch reads
    the headers as before (`reads` answers None)."""

    ranges: Mapping[int, tuple[int, int]]
    buckets: tuple[int, ...]
    slide_ms: int  # the buckets' width: the rows ahead fill the grid past the watched ones

    @classmethod
    def for_closing(cls, closing: Closing, windowing: Windowing) -> HeaderWatch | None:
        """The watch of a job that closes through `closing.through`; None if it would take more than
        MAX_WATCHED_AGGREGATES aggregates (many partitions, or a short slide in a long window)."""
        slide, through = windowing.slide_ms, closing.through
        # The first bucket a window ending after `through` reads: the first on the grid past through - size.
        below = through - windowing.size_ms
        first = below - below % slide + slide
        buckets = tuple(range(first, through + 2 * windowing.size_ms, slide))
        if len(closing.offsets) * (len(buckets) + 4) > MAX_WATCHED_AGGREGATES:
            return None
        return cls(dict(closing.offsets), buckets, slide)

    def columns(self) -> list[str]:
        """The watched buckets as columns (`_watched_<i>`), for the projection the aggregates read:
        batch constants (contract.batch_constants) are not deterministic to Spark, and observed
        metrics in one column (contract.observed) may hold them only through a column."""
        return [f"{batch_long(bucket)} AS _watched_{i}" for i, bucket in enumerate(self.buckets)]

    def aggregates(self) -> list[str]:
        """SQL aggregates over rows with `partition`, `offset`, `kind`, `_t`, `_bucket` (or null)
        and the `columns`."""
        exprs: list[str] = []
        data = "kind = 'data'"
        last = f"_watched_{len(self.buckets) - 1}"
        for partition in sorted(self.ranges):
            mine = f"partition = {int(partition)}"
            exprs.append(f"count(CASE WHEN {mine} THEN 1 END) AS rows_{partition}")
            exprs.append(
                f"max(CASE WHEN {mine} AND kind = 'marker' THEN _t - {GRAPH_WATERMARK_DELAY_MS} END) "
                f"AS marker_{partition}"
            )
            ahead = f"{mine} AND {data} AND _bucket > {last}"
            exprs.append(f"min(CASE WHEN {ahead} THEN offset END) AS ahead_first_{partition}")
            exprs.append(f"max(CASE WHEN {ahead} THEN _bucket END) AS ahead_last_{partition}")
            exprs += [
                f"min(CASE WHEN {mine} AND {data} AND _bucket = _watched_{i} THEN offset END) AS first_{partition}_{i}"
                for i in range(len(self.buckets))
            ]
        return exprs

    def reads(self, metrics: Mapping[str, Any], needed: Mapping[int, tuple[int, int]]) -> list[PartitionRead] | None:
        """The reads the metrics give, if the job saw every row of `needed` (partition -> [from, to):
        the rows whose headers the batch must learn) and the rows ahead of the watched buckets span
        at most MAX_AHEAD_BUCKETS slides."""
        for partition, (begin, end) in needed.items():
            if end <= begin:
                continue
            held = self.ranges.get(partition)
            if held is None or held[0] > begin or held[1] < end:
                return None
        reads: list[PartitionRead] = []
        for partition, (begin, end) in self.ranges.items():
            if metrics.get(f"rows_{partition}") != end - begin:
                return None
            marker = metrics.get(f"marker_{partition}")
            firsts = {
                bucket: int(metrics[f"first_{partition}_{i}"])
                for i, bucket in enumerate(self.buckets)
                if metrics.get(f"first_{partition}_{i}") is not None
            }
            ahead_first, ahead_last = metrics.get(f"ahead_first_{partition}"), metrics.get(f"ahead_last_{partition}")
            if ahead_first is not None and ahead_last is not None:
                ahead = range(self.buckets[-1] + self.slide_ms, int(ahead_last) + 1, self.slide_ms)
                if len(ahead) > MAX_AHEAD_BUCKETS:
                    return None
                firsts |= dict.fromkeys(ahead, int(ahead_first))
            reads.append(PartitionRead(partition, None if marker is None else int(marker), firsts, since=begin))
        return reads


# At most this many aggregates in a watch (four per partition read, and one per partition and
# watched bucket), each evaluated on every row the job reads; past it a headers pass costs less.
# (12 partitions of tumbling windows, 8 of windows two slides long.)
MAX_WATCHED_AGGREGATES = 72
# At most this many buckets past the watched ones take the rows ahead's first offset (a backlog's
# batch of 40,000 rows spans a few windows); rows further on, a jump ahead, make a headers pass.
MAX_AHEAD_BUCKETS = 256


# -- the Spark side --------------------------------------------------------------------------------
class WindowCloser:
    """One closing graph's batches (see the module's docstring), run by its ClosingQuery."""

    def __init__(
        self,
        kafka: KafkaSettings,
        record: GraphRecord,
        query: QueryFunction,
        writer: BatchWriter,
        checkpoint: GraphFiles,
        name: str | None = None,
        *,
        query_tasks: int = 2,
        rewrites: Callable[[], Iterable[Rewrite]] | None = None,
    ) -> None:
        self._kafka = kafka
        # The replayed service batches' rewrites (contract.rewrites); None: deduplicate every window.
        self._rewrites = rewrites
        self._query_tasks = query_tasks  # spark.sql.shuffle.partitions as configured (task_slots.py)
        self._name = name or record.query_id  # the graph's query name, for its stage timings
        self._record = record
        self._query = query
        self._writer = writer
        self._files = checkpoint
        self._windowing = record.windowing
        self._lock = threading.Lock()
        self._states: dict[int, ClosingState] = {}  # batch id -> state after it (this process's batches)
        self._watching = True  # whether closing jobs learn the headers (HeaderWatch)
        self._fields: tuple[str, ...] | None = None  # the record's fields `events` has (looked up once)
        # Whether the writer would write a result of the windows a batch closes (every window, if it
        # cannot say). Ownership of a window is fixed before a graph can close it (contract.ownership).
        self._emits = writer.emits_within if isinstance(writer, WindowEmitter) else _every_window

    def closable(self, state: ClosingState, known: Mapping[int, int] | None = None) -> int | None:
        """How far a batch after `state` may close (`closable`), None: no window closes."""
        return closable(state, self._record.partitions, self._windowing, known)

    def state(self, batch_id: int) -> ClosingState | None:
        """The state after `batch_id` (from this process's memory, else the checkpoint); the empty
        state before batch 0; None if the checkpoint lacks it."""
        if batch_id < 0:
            return ClosingState()
        with self._lock:
            if batch_id in self._states:
                return self._states[batch_id]
        state = closing_state(self._files, batch_id)
        if state is not None:
            with self._lock:
                self._states[batch_id] = state
        return state

    def closed_through(self, batch_id: int) -> int | None:
        """Closed through after `batch_id`."""
        state = self.state(batch_id)
        return None if state is None else state.closed_through

    def run(
        self, spark: SparkSession, batch_id: int, start: Mapping[int, int], end: Mapping[int, int], through: int | None
    ) -> ClosingState:
        """Batch `batch_id`: compute the windows ending up to `through` (decided before the batch and
        recorded in its offset log, so a replay closes the same ones), then read the route headers
        of [start, end), and of a range the batch before left unread, for what later batches close;
        a batch that closed windows leaves its own to the next batch when none wait so. The results
        come first: they are what a user, and a swap's drain, waits for."""
        with stages.timed(self._name, "batch"):
            with stages.timed(self._name, "state_read"):
                previous = self.state(batch_id - 1)
            if previous is None:
                raise GraphStateLost(
                    f"execution graph {self._record.query_id}: its checkpoint has no {STATE_DIR}/{batch_id - 1}, the "
                    "state of its last committed batch; the checkpoint was damaged or written by another engine"
                )
            offsets = {p: (start[p], e) for p, e in end.items() if p in start and e > start[p]}
            watched: list[PartitionRead] | None = None
            unowned = False
            if through is not None and (previous.closed_through is None or through > previous.closed_through):
                closing = closing_for(previous, through, start, end, self._windowing)
                # Windows another version owns (a swap's new graph is sent markers for the windows up
                # to its cut as they close) are closed without a job: it would write nothing, and
                # while the swap drains it would take the cores the old graph's last job needs.
                unowned = not self._emits(closing.after, closing.through)
                if not unowned:
                    with stages.timed(self._name, "close"):
                        watched = self._close(spark, closing, batch_id, _spanning(previous.unread, offsets))
            else:
                through = None
            reads: list[PartitionRead] = []
            unread: dict[int, tuple[int, int]] = {}
            deferred = False
            if watched is not None:
                reads = watched  # the closing job read every header the batch needs
            elif unowned and (previous.deferred or not previous.unread):
                # The rows wait for this graph's first close job of its own windows, which reads them
                # anyway (a new graph's rows all belong to windows after its cut): no pass of their own.
                unread, deferred = _spanning(previous.unread, offsets), True
            elif through is not None and not previous.unread:
                # The headers wait for the next batch: this one is done once its results are out
                # (the drain of a swap waits for no more). At most one batch's range waits so.
                unread = offsets
            else:
                for partition, (begin, _) in previous.unread.items():
                    if partition in end and begin < end[partition]:
                        offsets[partition] = (min(begin, offsets.get(partition, (begin, 0))[0]), end[partition])
                if offsets:
                    with stages.timed(self._name, "headers"):
                        raw = read_range(spark, self._kafka.spark_kafka_options(), self._record.topic, offsets)
                        reads = self._reads(raw, offsets)
            state = advance(previous, batch_id, reads, through, self._windowing, unread, deferred=deferred)
            # A replay of this batch closes the same windows from the same state before it, the same
            # rows and the same `through`; what it learnt of the headers may differ in form (watched,
            # read, or left unread), so the file already there is kept and taken as the state.
            with stages.timed(self._name, "state_write"):
                if not self._files.write_once(f"{STATE_DIR}/{batch_id}", state.to_json()):
                    state = closing_state(self._files, batch_id) or state
            with self._lock:
                self._states[batch_id] = state
                for old in [b for b in self._states if b < batch_id - STATE_FILES_KEPT]:
                    del self._states[old]
            return state

    def tidy(self, batch_id: int) -> None:
        """Remove the state file batch `batch_id` no longer needs (Spark replays at most the last
        batch): once the batch is committed and reported, off the path a swap's drain waits on."""
        self._files.delete(f"{STATE_DIR}/{batch_id - STATE_FILES_KEPT}")

    def _may_hold_twice(self, since: int | None, through: int) -> bool:
        """Whether rows of event times in [since, through) may hold a source event twice: where a
        replayed service batch's rewrite reaches them (read after the batch's range was taken, so a
        rewrite whose rows the range holds is recorded by then), and always where Spark may retry a
        task of the service graph's write (`rewrites` None)."""
        if self._rewrites is None:
            return True
        return any(rewrite.reaches(since, through) for rewrite in self._rewrites())

    def _reads(self, batch: DataFrame, offsets: Mapping[int, tuple[int, int]]) -> list[PartitionRead]:
        """Per graph partition: the highest marker and each bucket's first offset, in one small
        aggregation over the route headers of every row of `offsets` (the values are never decoded)."""
        slide = self._windowing.slide_ms
        rows = (
            batch.selectExpr(
                "partition", "offset", f"{ROUTE} AS route", "route[0] AS kind", "try_cast(route[3] AS BIGINT) AS t"
            )
            .groupBy(
                "partition",
                F.expr(f"CASE WHEN kind = 'data' THEN t - pmod(t, {slide}) END").alias("bucket"),
            )
            .agg(
                F.min("offset").alias("first"),
                F.max(F.expr(f"CASE WHEN kind = 'marker' THEN t - {GRAPH_WATERMARK_DELAY_MS} END")).alias("marker"),
            )
            .collect()
        )
        by_partition: dict[int, PartitionRead] = {}
        for row in rows:
            partition = int(row["partition"])
            read = by_partition.get(partition) or PartitionRead(partition=partition, since=offsets[partition][0])
            if row["marker"] is not None:
                marker = int(row["marker"])
                read = replace(read, marker=marker if read.marker is None else max(marker, read.marker))
            if row["bucket"] is not None:
                read = replace(read, first_offsets={**read.first_offsets, int(row["bucket"]): int(row["first"])})
            by_partition[partition] = read
        return list(by_partition.values())

    def _close(
        self, spark: SparkSession, closing: Closing, batch_id: int, needed: Mapping[int, tuple[int, int]]
    ) -> list[PartitionRead] | None:
        """Compute the windows ending in (after, through] over their rows, and write the results.
        Returns what the job learnt of the headers of the rows `needed` (HeaderWatch), or None if
        the batch must read them itself."""
        record = self._record
        if not closing.offsets or (record.start_after is not None and closing.through <= record.start_after):
            # No rows, or only windows a failed graph emitted before this one took over its topic.
            log.debug("windows closed with nothing to emit", query_id=record.query_id, through=closing.through)
            return None
        began = time.perf_counter()  # the job's stages (`make bench`): its plan's steps, the query's, the write
        # Looked up for each job: a cluster's executors come and go (task_slots.py).
        slots = task_slots(spark)
        leave_a_slot(spark, self._query_tasks, slots)
        raw = read_range(spark, self._kafka.spark_kafka_options(), record.topic, closing.offsets)
        watch = HeaderWatch.for_closing(closing, self._windowing) if self._watching else None
        # The route header split once, with the graph topic's own partition and offset beside it and
        # the event time as a number, for the watch and the skipped rows (Spark prunes what neither
        # reads): one projection, since each step costs the driver an analysis of the whole plan.
        extra = ["partition", "offset", f"try_cast({ROUTE_COLUMN}[3] AS BIGINT) AS _t"]
        if watch is not None:
            extra += [f"_t - pmod(_t, {self._windowing.slide_ms}) AS _bucket", *watch.columns()]
        rows = routed_rows(raw, *extra)
        observation: Observation | None = None
        if watch is not None:
            # Before any filter: the watch counts every row of the range, markers and skipped rows too.
            observation = Observation(f"hotswap_headers_{uuid.uuid4().hex}")
            rows = rows.observe(observation, F.expr(observed_column(watch.aggregates())))
        since = closing.rows_since
        if record.reads_from is not None:
            since = record.reads_from if since is None else max(since, record.reads_from)
        # Each number through batch_constants, so each close job reuses the code the first compiled.
        keep = ["kind = 'data'", f"{EVENT_TIME_COLUMN} < {batch_timestamp(closing.through)}"]
        if since is not None:
            keep.append(f"{EVENT_TIME_COLUMN} >= {batch_timestamp(since)}")
        kept = not_skipped(record.skipped, kind="kind", event_time="_t")
        if kept is not None:
            keep.append(kept)
        data = rows.where(" AND ".join(keep))
        if self._fields is None:
            self._fields = record_fields(spark, record.reads)
        events = parsed_events(spark, data, record.reads, self._fields)
        deduplicated = self._may_hold_twice(since, closing.through)
        if deduplicated:
            # Some rows may be there twice: each source event is counted once. (A sort of every row:
            # Spark aggregates the other columns with first(), which its hash aggregation cannot hold.)
            events = events.dropDuplicates(list(SOURCE_EVENT))
        elif 0 < slots - 1 < len(closing.offsets):
            # No shuffle before the query's code, so it runs in the read's stage: that stage must still
            # leave the service graph and the other graphs a task slot (task_slots.py).
            events = events.coalesce(slots - 1)
        events = events.drop(*BOOKKEEPING)
        stages.record(self._name, "build", time.perf_counter() - began)
        try:
            with stages.timed(self._name, "query"):
                output = self._query(events)
                after = "" if closing.after is None else f"window_end > {batch_timestamp(closing.after)} AND "
                closed = output.where(f"{after}window_end <= {batch_timestamp(closing.through)}")
            with stages.timed(self._name, "write"):
                self._writer(closed, batch_id)
        except Exception:
            # Said before the batch fails: the rows a skipped poison batch dead-letters.
            offsets = {str(p): list(r) for p, r in closing.offsets.items()}
            # Only rows no emitted window holds: from the end of the last closed window on (the job
            # also reads the rows before it, for sliding windows still open, which keep them).
            bounds = [b for b in (closing.after, record.reads_from) if b is not None]
            skip_since = max(bounds) if bounds else None
            failed = {"batch_id": batch_id, "offsets": offsets, "since_ms": skip_since, "until_ms": closing.through}
            self._files.replace(FAILED_FILE, json.dumps(failed))
            raise
        crash_point("graph:after-results")  # results out, the batch not committed: Spark replays it
        log.debug(
            "windows closed",
            query_id=record.query_id,
            after=closing.after,
            through=closing.through,
            deduplicated=deduplicated,
            offsets={p: list(r) for p, r in closing.offsets.items()},
        )
        if watch is None or observation is None:
            return None
        with stages.timed(self._name, "watch"):
            metrics = _observed(observation)
        if metrics is None:
            if not _completed(observation):
                # No action of the query's plan read `events` (a .py query that built its output from
                # something else): none will, so this graph reads its headers itself from now on.
                self._watching = False
                log.info("closing graph reads its headers in a pass of their own", query_id=record.query_id)
            return None
        return watch.reads(metrics, needed)


def _every_window(after: int | None, through: int) -> bool:
    return True


def _completed(observation: Observation) -> bool:
    """Whether an action completed the observation (PySpark's `get` would block until one does)."""
    jvm_observation = observation._jo
    return jvm_observation is not None and bool(jvm_observation.future().isCompleted())


def _spanning(*ranges: Mapping[int, tuple[int, int]]) -> dict[int, tuple[int, int]]:
    """Per partition, the range from the lowest start to the highest end of `ranges`."""
    spans: dict[int, tuple[int, int]] = {}
    for each in ranges:
        for partition, (begin, end) in each.items():
            held = spans.get(partition)
            spans[partition] = (begin, end) if held is None else (min(held[0], begin), max(held[1], end))
    return spans


def _observed(observation: Observation) -> dict[str, Any] | None:
    """The observation's metrics, or None: when no action ran its plan within OBSERVED_WAIT_S (Spark
    completes it as the first action that holds it ends, so it is done when the write returns), or
    when that action held no metrics (Spark pruned the rows away, as for `WHERE false`) or failed."""
    deadline = time.monotonic() + OBSERVED_WAIT_S
    pause = threading.Event()
    while not _completed(observation):
        if time.monotonic() >= deadline:
            return None
        pause.wait(0.005)
    try:
        return observed_values(observation.get)
    except (Py4JError, PySparkException) as exc:
        log.debug("a closing job's header metrics could not be read", error=str(exc).splitlines()[0][:200])
        return None


def range_group(topic: str) -> str:
    """The Kafka consumer group id of a closing graph's range reads of `topic`."""
    return f"hotswap-range-{topic}"


def read_range(
    spark: SparkSession, options: Mapping[str, str], topic: str, offsets: Mapping[int, tuple[int, int]]
) -> DataFrame:
    """The raw records (headers included) of `topic` in [from, to) of each partition, as a Spark batch."""
    partitions = sorted(offsets)
    return (
        spark.read.format("kafka")
        .options(**options)
        .option("assign", json.dumps({topic: partitions}))
        .option("startingOffsets", json.dumps({topic: {str(p): offsets[p][0] for p in partitions}}))
        .option("endingOffsets", json.dumps({topic: {str(p): offsets[p][1] for p in partitions}}))
        .option("failOnDataLoss", "true")  # the topic is the buffer: a row gone is an error, never skipped
        .option("includeHeaders", "true")
        # One group id per topic instead of Spark's new one per read: the executors' pool keeps Kafka
        # consumers by group id and partition, so each close job reuses the last one's consumer (and
        # its connection) instead of building one per task. Nothing joins or commits to the group:
        # the read assigns its partitions and seeks to its offsets.
        .option("kafka.group.id", range_group(topic))
        # Every offset of the range is already written, so a fetch never needs to wait for data. With
        # the client's default (500 ms) each task of a range ending near the topic's end idled about
        # half a second before it finished, under a live load (docs/performance.md, run O).
        .option("kafka.fetch.max.wait.ms", str(RANGE_FETCH_MAX_WAIT_MS))
        .load()
    )


def closing_state(files: GraphFiles, batch_id: int) -> ClosingState | None:
    """A closing graph's state after `batch_id`, from its checkpoint (None: no such file, or not a
    closing graph's checkpoint)."""
    text = files.read_text(f"{STATE_DIR}/{batch_id}")
    return None if text is None else ClosingState.from_json(text)
