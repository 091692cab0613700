"""A closing graph's query: its micro-batches run when a window may close, not on a timer.

A closing graph has nothing to do until the service graph's watermark passes one of its windows
(execution_graph.closing). A Spark streaming query would still run a batch for every few rows that
reach its topic, each with its offset log, its commit, its headers aggregation and its state file,
on the same cores as the service graph. So a closing graph runs its own loop instead, on a thread
of its own, with the same checkpoint discipline as Spark's micro-batch engine:

1. it wakes when the service graph's marker producer says a marker that crosses a window boundary
   is in the graph's topic (`notify`), when a batch left rows behind (the row cap), and every
   IDLE_POLL_S in any case (a marker whose notice was lost, a restart), and at once when a batch
   read markers that close more than it did;
2. it takes the topic's end offsets, caps the range at `graph_batch_cap` rows (split over the
   partitions in proportion to their rows, no partition starved, as Spark's Kafka source does),
   decides how far the batch closes (from the markers earlier batches read and those the producer
   saw taken below the range's end), and writes both to `offsets/<batch id>` before reading a row.
   A batch that would close nothing runs only when the row cap left rows behind, no batch ran
   for HEADERS_DUE_S, or rows an earlier batch left unread wait (not those it deferred to the next
   close job of the graph's own windows, for up to HEADERS_DUE_S): otherwise its rows wait for the
   batch that closes their window;
3. it runs the batch (WindowCloser: the windows that close, then the headers and the state) over
   exactly that range, read as Spark batch jobs, and writes `commits/<batch id>` once it is done.
   The job that closes windows learns the headers of the rows it reads (closing.HeaderWatch), so
   in the steady state each row is read once.

A restart replays a batch whose offsets are written and whose commit is not, over the same range and
to the same closed point, as Spark would: the closer writes the same results under the same keys and
reaches the same state.
The object answers what the executor asks of a streaming query (active, status, progress, failure,
stop), so the rest of hotswap watches, reports and stops it like any other graph.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import structlog
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError
from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import StreamingQueryProgress

from hotswap.contract.offset_log import first_offsets
from hotswap.contract.outages import KAFKA, OUTAGES
from hotswap.execution_graph.checkpoint import GraphFiles
from hotswap.execution_graph.closing import STATE_FILES_KEPT, ClosingState, WindowCloser, closing_state
from hotswap.execution_graph.errors import ClosingGraphFailed, GraphStateLost

log = structlog.get_logger(__name__)

IDLE_POLL_S = 5.0  # the loop looks at the topic at least this often, whatever the notices say
HEADERS_DUE_S = 30.0  # a batch at least this often while rows wait, whatever the markers say
PROGRESS_KEPT = 100  # as many progress reports as Spark keeps for a streaming query
OFFSETS_TIMEOUT_MS = 15_000  # how long one read of the topic's end offsets may wait for a broker
NOTICES_KEPT = 64  # marker notices kept for the next batch's plan (a few seconds of service batches)
STOP_JOIN_S = 30.0  # how long stop() waits for the loop after cancelling its batch
COMMIT_TEXT = 'v1\n{"nextBatchWatermarkMs":0}'  # Spark's commit log entry, so any reader of it understands

Offsets = Mapping[int, int]
EndOffsets = Callable[[], dict[int, int]]


@dataclass(frozen=True)
class BatchRange:
    """One batch: the offsets [start, end) it reads of each partition, and how far it closes
    windows (None: it closes none), decided before it runs."""

    batch_id: int
    start: Offsets
    end: Offsets
    through: int | None = None

    @property
    def rows(self) -> int:
        return sum(max(0, e - self.start.get(p, e)) for p, e in self.end.items())

    def log_text(self, topic: str) -> str:
        """The offset log entry: Spark's layout (a version line, the batch's metadata, one line per
        source with its end offsets), the start offsets and `through` in the metadata line."""
        start = {topic: {str(p): o for p, o in sorted(self.start.items())}}
        end = {topic: {str(p): o for p, o in sorted(self.end.items())}}
        meta = {"batchWatermarkMs": 0, "start": start, "closeThrough": self.through}
        return "\n".join(["v1", json.dumps(meta), json.dumps(end)])


def capped_end(start: Offsets, ends: Offsets, cap: int | None) -> dict[int, int]:
    """Where the next batch ends in each partition: all that waits, or, above `cap` rows in all,
    each partition's share of the cap in proportion to its waiting rows (a share below one row is
    rounded up, so a small partition, such as one that holds only markers, is never starved)."""
    waiting = {p: max(0, e - start.get(p, e)) for p, e in ends.items()}
    total = sum(waiting.values())
    if cap is None or total <= cap:
        return {p: max(e, start.get(p, e)) for p, e in ends.items()}
    out: dict[int, int] = {}
    for p, rows in waiting.items():
        share = cap * rows / total
        taken = int(share) if share >= 1 else (1 if rows else 0)
        out[p] = start.get(p, ends[p]) + min(rows, taken)
    return out


@dataclass(frozen=True)
class PlannedBatch:
    """An offset log entry: the batch, and what its writer recorded. One Spark wrote has no start
    offsets (its start is the end of the batch before); one that an earlier version of the loop or
    Spark's engine wrote has no `closeThrough` (its batch decided what closes from the headers it
    read, and wrote that in its state file before its results)."""

    batch: BatchRange
    start_recorded: bool
    through_recorded: bool


def parse_offset_log(batch_id: int, text: str) -> PlannedBatch:
    """An offset log entry as the batch it planned."""
    lines = text.splitlines()
    meta: object = {}
    if len(lines) > 1:
        try:
            meta = json.loads(lines[1])
        except ValueError:
            meta = {}
    if not isinstance(meta, dict):
        meta = {}
    start_recorded = isinstance(meta.get("start"), dict)
    through_recorded = "closeThrough" in meta
    start = {int(p): int(o) for parts in meta["start"].values() for p, o in parts.items()} if start_recorded else {}
    through = int(meta["closeThrough"]) if isinstance(meta.get("closeThrough"), int) else None
    end: dict[int, int] = {}
    for line in lines[2:]:
        source = json.loads(line)
        if isinstance(source, dict):
            end.update(
                {int(p): int(o) for parts in source.values() if isinstance(parts, dict) for p, o in parts.items()}
            )
    return PlannedBatch(BatchRange(batch_id, start, end, through), start_recorded, through_recorded)


class TopicEnds:
    """Kafka's end (and beginning) offsets of a graph's topic, read outside Spark."""

    def __init__(self, config: dict[str, Any], topic: str, partitions: int) -> None:
        self._config = config
        self._parts = [TopicPartition(topic, p) for p in range(partitions)]
        self._consumer: KafkaConsumer | None = None

    def _client(self) -> KafkaConsumer:
        if self._consumer is None:
            # A broker that does not answer fails the look in seconds (kafka-python waits 305 s by default).
            self._consumer = KafkaConsumer(
                **self._config, enable_auto_commit=False, request_timeout_ms=OFFSETS_TIMEOUT_MS
            )
        return self._consumer

    def end(self) -> dict[int, int]:
        return {tp.partition: int(o) for tp, o in self._client().end_offsets(self._parts).items()}

    def beginning(self) -> dict[int, int]:
        return {tp.partition: int(o) for tp, o in self._client().beginning_offsets(self._parts).items()}

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


class _Stopped(Exception):
    """The loop was stopped before a batch began."""


class ClosingQuery:
    """The running query of one closing graph (see the module's docstring)."""

    def __init__(
        self,
        session: SparkSession,
        *,
        name: str,
        query_id: str,
        topic: str,
        closer: WindowCloser,
        files: GraphFiles,
        ends: TopicEnds,
        cap: int | None,
        slide_ms: int,
        retry_deadline_s: float,
        on_commit: Callable[[], None] | None = None,
    ) -> None:
        self._session = session
        self._name = name
        self._id = query_id
        self._run_id = str(uuid.uuid4())
        self._topic = topic
        self._closer = closer
        self._files = files
        self._ends = ends
        self._cap = cap
        self._slide_ms = slide_ms
        self._retry_deadline_s = retry_deadline_s  # how long Kafka may not answer the loop's look
        self._on_commit = on_commit  # told once each batch is committed and reported
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._slot: int | None = None  # the slide of the last marker that woke the loop
        self._last_batch = float("-inf")  # monotonic time the last batch ended (none yet: headers are due)
        self._deferred_since: float | None = None  # since when rows wait for the next close job (`_defers`)
        # Markers the producer saw every partition take: (watermark, partition -> offset), newest last.
        self._notified: deque[tuple[int, dict[int, int]]] = deque(maxlen=NOTICES_KEPT)
        self._failure: BaseException | None = None
        self._trigger_active = False
        self._message = "Initializing sources"
        self._progress: list[StreamingQueryProgress] = []
        self._thread = threading.Thread(target=self._loop, name=f"hotswap-{name}", daemon=True)

    # -- what the executor asks of a query ---------------------------------------------------------
    @property
    def id(self) -> str:
        return self._id

    @property
    def runId(self) -> str:
        return self._run_id

    @property
    def name(self) -> str:
        return self._name

    @property
    def topic(self) -> str:
        return self._topic

    @property
    def isActive(self) -> bool:
        return self._thread.is_alive()

    @property
    def status(self) -> dict[str, Any]:
        with self._lock:
            return {
                "message": self._message,
                "isDataAvailable": self._trigger_active,
                "isTriggerActive": self._trigger_active,
            }

    @property
    def lastProgress(self) -> StreamingQueryProgress | None:
        with self._lock:
            return self._progress[-1] if self._progress else None

    @property
    def recentProgress(self) -> list[StreamingQueryProgress]:
        with self._lock:
            return list(self._progress)

    def exception(self) -> BaseException | None:
        return self._failure

    def start(self) -> ClosingQuery:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop the loop; a batch in flight is cancelled, with every job it would start after (its
        commit is not written: a restart replays it), as Spark's stop() does."""
        with self._lock:
            self._stopping.set()
            running = self._trigger_active
        self._wake.set()
        if running:
            jsc = self._session.sparkContext._jsc
            assert jsc is not None
            jsc.sc().cancelJobGroupAndFutureJobs(self._run_id)
        if threading.current_thread() is not self._thread:
            self._thread.join(STOP_JOIN_S)
            if self._thread.is_alive():
                log.warning("closing graph's loop still runs after its stop", query=self._name, waited_s=STOP_JOIN_S)

    def notify(self, watermark: int, offsets: Mapping[int, int]) -> None:
        """A marker at `watermark` is in every partition of the graph's topic, at `offsets`: wake the
        loop if it starts a new slide (a window may close). The next batch that reads past it closes
        through it without waiting to read it. Called on the marker producer's thread."""
        with self._lock:
            self._notified.append((watermark, dict(offsets)))
        slot = watermark // self._slide_ms
        if slot != self._slot:
            self._slot = slot
            self._wake.set()

    def _known(self, end: Offsets) -> dict[int, int]:
        """Per partition, the highest marker the producer saw taken below `end`."""
        with self._lock:
            notified = list(self._notified)
        known: dict[int, int] = {}
        for watermark, offsets in notified:
            for partition, offset in offsets.items():
                if offset < end.get(partition, 0) and watermark > known.get(partition, watermark - 1):
                    known[partition] = watermark
        return known

    # -- the loop ----------------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            # Every job of this thread is in the query's group: stop() cancels it, and a profile finds it.
            self._session.sparkContext.setJobGroup(
                self._run_id, f"hotswap closing graph {self._name}", interruptOnCancel=True
            )
            next_id, start = self._resume()
            self._set_message("Waiting for data to arrive")
            self._wake.set()  # a first look at once
            unanswered: float | None = None  # since when Kafka has not answered the loop's look
            while not self._stopping.is_set():
                self._wake.wait(IDLE_POLL_S)
                self._wake.clear()
                if self._stopping.is_set():
                    break
                asked = time.monotonic()
                try:
                    ends = self._ends.end()
                    if not start:
                        start = self._ends.beginning()
                    unanswered = None
                except KafkaError as exc:
                    # Planned again at the next look, for as long as the retry deadline allows.
                    unanswered = unanswered or time.monotonic()
                    if not exc.retriable or time.monotonic() - unanswered > self._retry_deadline_s:
                        raise
                    # A look waits up to OFFSETS_TIMEOUT_MS: one asked while Kafka was away may fail after it is back.
                    OUTAGES.down(KAFKA, f"{type(exc).__name__}: {exc}", "a closing graph's next batch", began=asked)
                    continue
                end = capped_end(start, ends, self._cap)
                state = self._closer.state(next_id - 1)
                through = None if state is None else self._closer.closable(state, self._known(end))
                batch = BatchRange(next_id, dict(start), end, through)
                # Rows an earlier batch left unread are read now, even with no row after them: the
                # markers there may be all that closes the next window (unless they may wait for the
                # graph's next close job of its own windows: `_defers`).
                waiting = state is not None and bool(state.unread) and not self._defers(state)
                if self._waits(batch, waiting, ends):
                    continue
                if not self._files.write_once(f"offsets/{next_id}", batch.log_text(self._topic)):  # written ahead
                    # Another writer of this checkpoint (a stalled executor's Spark) planned the batch.
                    raise ClosingGraphFailed(
                        f"[CONCURRENT_STREAM_LOG_UPDATE] closing graph {self._name}: offsets/{next_id} was "
                        "written by another writer of its checkpoint"
                    )
                after = self._run(batch)
                self._last_batch = time.monotonic()
                next_id, start = next_id + 1, end
                if any(end.get(p, 0) < e for p, e in ends.items()) or self._closer.closable(after) is not None:
                    self._wake.set()  # the cap left rows behind, or the batch read markers that close more
        except BaseException as exc:  # noqa: BLE001 - the user's query may raise anything: exception() reports it
            if not self._stopping.is_set():
                # As Spark's StreamingQueryException: a wrapper whose text holds the cause's.
                failure = ClosingGraphFailed(
                    f"[STREAM_FAILED] closing graph {self._name} terminated with exception: {exc}"
                )
                failure.__cause__ = exc
                self._failure = failure
                log.debug("closing graph's loop failed", query=self._name, error=str(exc))
        finally:
            with self._lock:
                self._trigger_active = False
                self._message = "Stopped"
            self._ends.close()

    def _defers(self, state: ClosingState) -> bool:
        """Whether the rows an earlier batch left unread because it closed only windows another version
        owns (`state.deferred`) may go on waiting for this graph's next close job of its own windows:
        while this loop has heard a marker's notice (so `_known` holds the markers those rows hold:
        none has come yet after a restart) and for at most HEADERS_DUE_S (a graph that owns nothing
        for long, a shadow writing to a table, reads them in a pass that often, not all at once later)."""
        if not state.deferred:
            self._deferred_since = None
            return False
        now = time.monotonic()
        if self._deferred_since is None:
            self._deferred_since = now
        with self._lock:
            noticed = bool(self._notified)
        return noticed and now - self._deferred_since < HEADERS_DUE_S

    def _waits(self, batch: BatchRange, waiting: bool, ends: Offsets) -> bool:
        """Whether no batch runs now: it would close nothing, no range an earlier batch left unread
        waits (rows deferred to the next close job of the graph's own windows do not: `_defers`), and
        it would read no row or its rows' headers are not due yet."""
        if batch.through is not None or waiting:
            return False
        if batch.rows == 0:
            if self._last_batch == float("-inf"):
                # The topic was empty at this loop's first look (a graph a swap just deployed): every
                # marker from now on comes with its notice, so no headers pass is due before
                # HEADERS_DUE_S. One would read the new graph's first rows during the old graph's
                # drain, on the cores its last close job needs.
                self._last_batch = time.monotonic()
            return True
        return not self._headers_due(batch.end, ends)

    def _headers_due(self, end: Offsets, ends: Offsets) -> bool:
        """Whether a batch that closes nothing should run now, to read the headers of the rows that
        wait: when the row cap leaves rows behind (the markers that close them may lie further on),
        or when no batch ran for HEADERS_DUE_S (markers whose notice was lost, as after a restart).
        Otherwise the rows wait for the batch that closes their window, which learns their headers
        as it reads them (closing.HeaderWatch), so each row is read once."""
        capped = any(end.get(p, 0) < e for p, e in ends.items())
        return capped or time.monotonic() - self._last_batch >= HEADERS_DUE_S

    def _resume(self) -> tuple[int, dict[int, int]]:
        """The next batch and where it starts; a batch planned and not committed is replayed first."""
        logged = self._files.batch_ids("offsets")
        if not logged:
            return 0, {}
        last = max(logged)
        planned = self._planned(last)
        batch = planned.batch
        if last in self._files.batch_ids("commits"):
            return last + 1, dict(batch.end)
        if not planned.start_recorded:
            start = dict(self._planned(last - 1).batch.end) if last > 0 else self._initial_offsets()
            batch = replace(batch, start=start)
        if not planned.through_recorded:
            # Written by an earlier version, which decided what closes from the batch's headers and
            # wrote that state before its results: if it got that far, its results may be partly
            # out, so the replay closes as far as it said.
            written = closing_state(self._files, last)
            if written is not None:
                batch = replace(batch, through=written.closed_through)
        log.info("replaying a closing graph's batch", query=self._name, batch=last)
        self._run(batch)
        return last + 1, dict(batch.end)

    def _initial_offsets(self) -> dict[int, int]:
        """Where batch 0 started: Spark's streaming engine recorded it in `sources/0/0` (a version
        line, then the topic's offsets); else the topic's first offsets."""
        text = self._files.read_text("sources/0/0")
        recorded = None if text is None else first_offsets(text, self._topic)
        return recorded if recorded is not None else self._ends.beginning()

    def _planned(self, batch_id: int) -> PlannedBatch:
        text = self._files.read_text(f"offsets/{batch_id}")
        if text is None:
            raise GraphStateLost(
                f"execution graph {self._id}: its checkpoint has no offsets/{batch_id}; the checkpoint was damaged"
            )
        return parse_offset_log(batch_id, text)

    def _run(self, batch: BatchRange) -> ClosingState:
        began_wall, began = datetime.now(UTC), time.monotonic()
        with self._lock:
            if self._stopping.is_set():
                raise _Stopped
            self._trigger_active = True
            self._message = "Processing new data"
        try:
            ran = time.monotonic()
            state = self._closer.run(self._session, batch.batch_id, batch.start, batch.end, batch.through)
            added = time.monotonic()
            self._files.write_once(f"commits/{batch.batch_id}", COMMIT_TEXT)
        finally:
            with self._lock:
                self._trigger_active = False
                self._message = "Waiting for data to arrive"
        done = time.monotonic()
        self._report(
            batch,
            began_wall,
            {
                "latestOffset": round((ran - began) * 1000),
                "addBatch": round((added - ran) * 1000),
                "commitOffsets": round((done - added) * 1000),
                "triggerExecution": round((done - began) * 1000),
            },
        )
        if self._on_commit is not None:
            self._on_commit()
        # Housekeeping after the report, which a swap's drain waits for: each delete is a round trip
        # to the checkpoint's file system.
        old = batch.batch_id - STATE_FILES_KEPT
        self._files.delete(f"offsets/{old}")
        self._files.delete(f"commits/{old}")
        self._closer.tidy(batch.batch_id)
        return state

    def _report(self, batch: BatchRange, began: datetime, durations: dict[str, int]) -> None:
        seconds = max(durations["triggerExecution"], 1) / 1000
        topic = self._topic
        source = {
            "description": f"hotswap closing graph reading {topic}",
            "startOffset": {topic: {str(p): o for p, o in sorted(batch.start.items())}},
            "endOffset": {topic: {str(p): o for p, o in sorted(batch.end.items())}},
            "latestOffset": {topic: {str(p): o for p, o in sorted(batch.end.items())}},
            "numInputRows": batch.rows,
            "inputRowsPerSecond": 0.0,
            "processedRowsPerSecond": batch.rows / seconds,
        }
        progress = StreamingQueryProgress.fromJson(
            {
                "id": self._id,
                "runId": self._run_id,
                "name": self._name,
                "timestamp": began.strftime("%Y-%m-%dT%H:%M:%S.") + f"{began.microsecond // 1000:03d}Z",
                "batchId": batch.batch_id,
                "batchDuration": durations["triggerExecution"],
                "durationMs": durations,
                "eventTime": {},
                "stateOperators": [],
                "sources": [source],
                "sink": {"description": "hotswap result writer", "numOutputRows": -1},
                "numInputRows": batch.rows,
                "inputRowsPerSecond": 0.0,
                "processedRowsPerSecond": batch.rows / seconds,
            }
        )
        with self._lock:
            self._progress.append(progress)
            del self._progress[:-PROGRESS_KEPT]

    def _set_message(self, message: str) -> None:
        with self._lock:
            self._message = message
