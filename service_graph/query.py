"""The service graph's Spark query.

One streaming query reads the source topic, in micro-batches of at most `max_offsets_per_trigger`
rows; `foreachBatch` routes each one:
1. take the cut, or start a shadow at S, if the active swap waits for that of the service graph's
   batch (the phase table's driver; recorded in the journal first);
2. write down the batch's routing plan, or reuse it if Spark is replaying the batch;
3. read each record's event time (reading.py), route it with Spark SQL expressions (no Python UDFs)
   and write its bytes to Kafka, in one Spark job that also yields the batch's statistics (frames.py),
   then check that the batch read every record Spark planned for it, or fail it so that Spark
   replays it (coverage.py);
4. record node positions, the service watermark and the counts of late, dead-letter, routed and
   expired rows;
5. write a watermark marker to every execution graph that receives rows, so each one closes its
   windows on the service watermark; once the watermark passes W, the old graph's marker drains it.

Between batches the executor calls `tick()`: a quiet source still gets its cut, its watermark
advances once every partition is idle, and the markers follow, without waiting for a new row.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Mapping

import redis
import structlog
from kafka.errors import KafkaError
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T
from pyspark.sql.streaming.query import StreamingQuery

from hotswap.contract import stages
from hotswap.contract.causes import is_checkpoint_conflict, root_cause
from hotswap.contract.faults import crash_point
from hotswap.contract.fence import Batch, Fence, fenced_write
from hotswap.contract.journal import Journal, SwapPhase, SwapRecord, active_swap
from hotswap.contract.lifecycle import BatchWatch, RestartBudget, stall_text, stop_between_batches
from hotswap.contract.models import GraphRecord, RoutingPlan, ServiceState, now_ms
from hotswap.contract.names import (
    DEAD_LETTER,
    DEAD_LETTER_RECORDS,
    EXPIRED_RECORDS,
    LATE_RECORDS,
    ROUTED,
    SKIPPED_READS,
    STALLED,
    Keys,
)
from hotswap.contract.outages import KAFKA, OUTAGES
from hotswap.contract.phases import Driver, Wait, driven_by
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.records import read_current, read_graphs_named, read_service_state
from hotswap.contract.rewrites import (
    Rewrite,
    queue_no_rewrite,
    queue_recording_begins,
    queue_rewrite,
    read_rewrites,
)
from hotswap.contract.settings import KafkaSettings, PipelineSettings, RecoverySettings, Timeouts
from hotswap.contract.source import SourceFormat, SourceSpec
from hotswap.contract.windows import Windowing, buffer_start, reached_cut
from hotswap.service_graph.coverage import OffsetLog, Seen, SkippedRead, Unread, unread
from hotswap.service_graph.errors import NoTargetGraph, ServiceGraphError
from hotswap.service_graph.frames import BatchStats, median_event_time, route_and_write
from hotswap.service_graph.kafka_io import MarkerTaken, MarkerWriter, SourceOffsets
from hotswap.service_graph.pacing import BatchPace
from hotswap.service_graph.reading import Reading
from hotswap.service_graph.routing import (
    IdleClock,
    PartitionBatchStats,
    advance_state,
    decide_cut,
    graph_markers,
    plan_batch,
    routing_swap,
    shadowing_swap,
    time_jump_limit,
)

log = structlog.get_logger(__name__)

PLANS_KEPT = 50  # older write-ahead plans are deleted; Spark never replays more than the last batch
TICK_ADVANCE_EVERY_S = 1.0  # an idle watermark moves markers at most this often
COVERAGE_CHECK_TIMEOUT_S = 10.0  # Kafka's answer on a range a batch did not see (coverage.py)

# How the service graph moves a swap on, before the batch routes a row: the swap as moved (recorded in
# the journal), or None if nothing was (another writer got there first).
Move = Callable[[SwapRecord, ServiceState, int], SwapRecord | None]


class ServiceGraph:
    """Owns the permanent routing query of one namespace."""

    def __init__(
        self,
        spark: SparkSession,
        client: redis.Redis,
        fence: Fence | None = None,
        *,
        pipeline: PipelineSettings,
        kafka: KafkaSettings,
        timeouts: Timeouts,
        recovery: RecoverySettings,
        on_markers: MarkerTaken | None = None,
    ) -> None:
        """`on_markers` is told, on the marker producer's thread, of each marker every partition of
        its topic took (the topic, the watermark, its offset in each partition): closing graphs wake
        on it and close through it without reading it first."""
        self._spark = spark
        self._pipeline = pipeline
        self._kafka = kafka
        self._timeouts = timeouts
        self._recovery = recovery
        self._redis = client
        self._keys = Keys(pipeline.names.namespace)
        self._fence = fence  # every routing decision and state write needs the executor's lease
        self._journal = Journal(client, self._keys, fence)
        self._markers = MarkerWriter(kafka, on_markers)
        self._source = SourceOffsets(kafka, pipeline.source_topic)
        self._offset_log = OffsetLog(spark, str(pipeline.names.service_checkpoint), pipeline.source_topic)
        self._empty_through: dict[int, int] = {}  # partition -> offsets below it Kafka said hold no record
        self._unplanned_said = False  # a batch without an offset log entry was said once
        self._lock = threading.Lock()
        # A live batch ends just after the next window can close (pacing.py); only on a trigger's grid.
        interval = pipeline.trigger_interval
        self._pace = (
            None if interval is None else BatchPace(interval.ms, pipeline.window.ms, pipeline.max_offsets_per_trigger)
        )
        self._stopping = threading.Event()  # cuts a pace short when the query stops
        self._idle = IdleClock(pipeline.idle_timeout.ms if pipeline.idle_timeout else None, time.monotonic())
        self._last_advance = 0.0
        self.query: StreamingQuery | None = None
        self._restarts = RestartBudget(recovery.query_restarts, recovery.query_restart_backoff.s)
        self._watch = BatchWatch(None)  # the batch in flight (batch_stall_timeout); set at each start
        self._stall: str | None = None  # why the running query was cancelled, if it stalled
        self._source_spec: SourceSpec | None = None  # the namespace's resolved source, from start()
        self._readings: dict[str | None, Reading] = {}  # by the schema records are checked against
        self._partitions = 0  # the source topic's partition count, as last read
        # What the service graph's batch (or tick) does for the active swap whose wait it moves on
        # (the phase table's driver), before the batch routes a row. The one other wait it moves on,
        # the watermark, ends after the rows are routed (`_after_routing`).
        self.moves: Mapping[Wait, Move] = {
            Wait.CUT: self._take_cut,
            Wait.SHADOW_START: self._start_shadow,
            Wait.PROMOTED_CUT: self._take_cut,
        }

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, source: SourceSpec | None = None) -> StreamingQuery:
        """Start (or restart) the routing query; `source` is the namespace's resolved source, given
        on the first start (execution_graph.schemas.resolve)."""
        if source is not None:
            self._source_spec = source
            self._readings.clear()
        if self._source_spec is None:
            raise ServiceGraphError("the service graph was started without its source; this is a bug in hotswap")
        pipeline = self._pipeline
        self._partitions = self._source.partition_count()
        self._begin_recording_rewrites()
        records = (
            self._spark.readStream.format("kafka")
            .options(**self._kafka.spark_kafka_options())
            .option("subscribe", pipeline.source_topic)
            # Only the very first start reads from the beginning; later starts use the checkpoint.
            .option("startingOffsets", "earliest")
            .option("maxOffsetsPerTrigger", str(pipeline.max_offsets_per_trigger))
            # Rows deleted by retention before they were read are counted as expired (coverage.py).
            .option("failOnDataLoss", "false")
            .load()
        )
        writer = (
            records.writeStream.queryName(pipeline.names.service_query)
            .option("checkpointLocation", str(pipeline.names.service_checkpoint))
            .foreachBatch(self.route_batch)
        )
        if pipeline.processing_time is not None:
            writer = writer.trigger(processingTime=pipeline.processing_time)
        limit = self._timeouts.batch_stall_timeout
        self._watch, self._stall = BatchWatch(None if limit is None else limit.s), None
        self._stopping.clear()
        self.query = writer.start()
        log.info("service graph started", query=pipeline.names.service_query, source=pipeline.source_topic)
        return self.query

    def supervise(self) -> None:
        """Restart the routing query from its checkpoint if it died, with doubling back-off; after
        the configured restarts, raise so the executor stops and says why."""
        query = self.query
        now = time.monotonic()
        if query is not None and query.isActive:
            self._watch_batch(query, now)
        if query is None or query.isActive:
            self._restarts.healthy(now)
            return
        failure = query.exception()
        reason = self._stall or (root_cause(failure) if failure is not None else "it stopped")
        if is_checkpoint_conflict(str(failure)) and self._restarts.forgives_conflict(
            now, self._timeouts.retry_deadline.s
        ):
            # A stalled predecessor's Spark still writes the checkpoint: retry, uncounted (see Graphs.supervise).
            if self._restarts.first_seen(now):
                log.warning("service graph's checkpoint is still written by another executor's Spark; retrying")
            if self._restarts.retry_due(now):
                self.start()
            return
        if self._restarts.exhausted:
            raise ServiceGraphError(
                f"the service graph failed {self._restarts.attempts + 1} times ({reason}); fix the cause and "
                "restart `hotswap run`: it resumes from its checkpoint and no routed row is lost"
            )
        if self._restarts.first_seen(now):
            log.warning("service graph failed; restarting from its checkpoint", error=reason)
        if self._restarts.restart_due(now):
            self.start()

    def _watch_batch(self, query: StreamingQuery, now: float) -> None:
        """A batch that runs longer than batch_stall_timeout is cancelled (the query stopped on a
        thread of its own: a hung batch may take long to stop), counted and said; `supervise` then
        restarts the query from its checkpoint like any failure, and the batch is replayed."""
        running = self._watch.look(query, now)
        if running is None:
            return
        self._stall = stall_text(running, self._timeouts.batch_stall_timeout)
        fenced_write(self._redis, self._fence, lambda batch: batch.hincrby(self._keys.counters, f"{STALLED}service", 1))
        log.warning(
            "service graph's batch stalled; restarting it from its checkpoint",
            reason=self._stall,
            reason_code=ReasonCode.BATCH_STALLED,
        )
        threading.Thread(target=query.stop, name="hotswap-cancel-service", daemon=True).start()

    def stop(self) -> None:
        self._stopping.set()
        if self.query is not None and self.query.isActive:
            stop_between_batches(self.query)
        self._markers.close()
        # A batch Spark did not stop in time may still be asking Kafka (coverage.py), with these
        # consumers: they are closed once it is done, or once it has had its time.
        locked = self._lock.acquire(timeout=COVERAGE_CHECK_TIMEOUT_S + 5)
        try:
            self._source.close()
        finally:
            if locked:
                self._lock.release()

    # -- one micro-batch -------------------------------------------------------------------
    def route_batch(self, batch: DataFrame, batch_id: int) -> None:
        entered_ms = now_ms()
        state, stats = self._route(batch, batch_id)
        if self._pace is not None:
            # When Spark planned the batch, from its offset log (read for the batch's coverage), and
            # how many offsets it planned (a record count falls short of the row cap where a
            # transaction's markers or compaction leave gaps). Outside the lock: a tick between
            # batches may take a cut meanwhile.
            planned = self._offset_log.last(batch_id)
            began_ms = (planned.planned_at_ms if planned is not None else None) or entered_ms
            read = planned.offsets if planned is not None else sum(s.rows for s in stats.partitions)
            pause = self._pace.pause_ms(
                began_ms=began_ms,
                now_ms=now_ms(),
                watermark=state.watermark,
                read=read,
                partitions=max(1, self._partitions),
            )
            if pause:
                with stages.timed(self._pipeline.names.service_query, "pace"):
                    self._stopping.wait(pause / 1000)

    def _route(self, batch: DataFrame, batch_id: int) -> tuple[ServiceState, BatchStats]:
        """Route one batch; returns the service state after it and what the batch read."""
        name = self._pipeline.names.service_query  # stage timings per query (contract.stages, `make bench`)
        with self._lock, stages.timed(name, "batch"):
            if self._fence is not None:
                # A stalled executor that lost its lease, or a flushed Redis, must not route a row.
                self._fence.verify(self._redis)
            with stages.timed(name, "state_read"):
                state = self._load_state()
            # Until the first watermark exists, a batch's median event time is computed before it is
            # routed (time_jump_limit): the source rows are cached for that, so Spark reads them once.
            first = state.watermark is None
            if first:
                batch = batch.persist()
            try:
                with stages.timed(name, "plan"):
                    plan, replayed = self._plan(batch_id, state, batch)
                if replayed:
                    # Its first attempt may have written rows: the closing graphs deduplicate them.
                    self._record_rewrite(batch_id, Rewrite(since_ms=plan.late_before))
                read = self._reading(plan).read(batch)
                if self._fence is not None:
                    self._fence.verify(self._redis)  # again, right before the first row is written
                with stages.timed(name, "route_and_write"):
                    stats = route_and_write(read, plan, self._pipeline, self._kafka, self._partitions)
                if replayed:
                    self._close_rewrite(batch_id, plan, stats)
            finally:
                if first:
                    batch.unpersist()
            crash_point("service:after-write")  # rows are out, state not yet recorded: a replay follows
            if stats.max_partition is not None and stats.max_partition >= self._partitions:
                self._partitions = self._source.partition_count()
            with stages.timed(name, "coverage"):
                expired_rows = self._account_for_reads(batch_id, state, stats)
            now = time.monotonic()
            self._idle.rows_seen((str(s.partition) for s in stats.partitions if s.max_event_time is not None), now)
            new_state = self._advance(state, batch_id, stats.partitions, now)
            with stages.timed(name, "state_write"):
                self._record(state, new_state, stats, expired_rows)
            with stages.timed(name, "markers"):
                self._after_routing(plan, new_state)
            return new_state, stats

    def _reading(self, plan: RoutingPlan) -> Reading:
        """How records are read for `plan`: the namespace's source, checked against the schema of the
        version rows after the cut go to (a JSON source), or the namespace's Avro schema."""
        assert self._source_spec is not None
        spec = self._source_spec
        schema_ddl = plan.checked_schema if spec.format is SourceFormat.JSON else None
        reading = self._readings.get(schema_ddl)
        if reading is None:
            checked = spec.for_version(schema_ddl=schema_ddl)
            reading = Reading(spec, self._spark_schema(checked))
            self._readings[schema_ddl] = reading
        return reading

    def _spark_schema(self, spec: SourceSpec) -> T.StructType:
        jvm = self._spark.sparkContext._jvm
        assert jvm is not None
        if spec.format is SourceFormat.AVRO:
            avro = jvm.org.apache.avro.Schema.Parser().parse(spec.avro_schema)
            converted = jvm.org.apache.spark.sql.avro.SchemaConverters.toSqlType(avro).dataType()
        else:
            converted = jvm.org.apache.spark.sql.types.StructType.fromDDL(spec.schema_ddl)
        schema = T.StructType.fromJson(json.loads(converted.json()))
        assert isinstance(schema, T.StructType)
        return schema

    def _plan(self, batch_id: int, state: ServiceState, batch: DataFrame) -> tuple[RoutingPlan, bool]:
        """The batch's routing plan, and whether it is replayed (its plan was written before)."""
        raw = self._redis.get(self._keys.routing_plan(batch_id))
        if raw is not None:
            plan = RoutingPlan.model_validate_json(raw)
            log.info("replaying routing plan", batch=batch_id, target=plan.target_query)
            return plan, True
        swaps = self._move_on(self._journal.open(), state, batch_id)
        plan = self._next_plan(batch_id, state, swaps)
        median = median_event_time(self._reading(plan).read(batch)) if state.watermark is None else None
        plan = plan.changed(ahead_after=time_jump_limit(state.watermark, median, self._pipeline.max_time_jump.ms))

        def queue(pipe: Batch) -> None:
            pipe.set(self._keys.routing_plan(batch_id), plan.model_dump_json())
            pipe.delete(self._keys.routing_plan(batch_id - PLANS_KEPT))

        fenced_write(self._redis, self._fence, queue)
        return plan, False

    def _begin_recording_rewrites(self) -> None:
        """Once per namespace, before its first batch on a build that records replays: rows an earlier
        build routed may hold a replay's duplicates no record names, so one record holds them all."""
        if self._redis.exists(self._keys.rewrites_recorded):
            return
        latest = [p.event_time for p in self._load_state().partitions.values() if p.event_time is not None]
        held = read_rewrites(self._redis, self._keys)
        routed = max(latest) if latest else None
        fenced_write(self._redis, self._fence, lambda pipe: queue_recording_begins(pipe, self._keys, routed, held))

    def _record_rewrite(self, batch_id: int, rewrite: Rewrite) -> None:
        """Record (or replace) batch `batch_id`'s rewrite, in one fenced write."""
        held = read_rewrites(self._redis, self._keys)
        fenced_write(self._redis, self._fence, lambda pipe: queue_rewrite(pipe, self._keys, batch_id, rewrite, held))

    def _close_rewrite(self, batch_id: int, plan: RoutingPlan, stats: BatchStats) -> None:
        """A replayed batch's rows are written: its rewrite ends at the latest event time it routed
        (both attempts read the same records), or is no rewrite if it routed no row to a graph."""
        latest = [s.max_event_time for s in stats.partitions if s.max_event_time is not None]
        if not latest:
            fenced_write(self._redis, self._fence, lambda pipe: queue_no_rewrite(pipe, self._keys, batch_id))
            return
        self._record_rewrite(batch_id, Rewrite(since_ms=plan.late_before, until_ms=max(latest)))
        log.info("replayed batch rewrote rows", batch=batch_id, since_ms=plan.late_before, until_ms=max(latest))

    # The swaps read per batch and per tick are the open ones (the journal's index), and the graphs
    # those name: what routing needs, and reads that do not grow with the namespace's history
    # (routing_swap explains why the ended ones are not needed).
    def _next_plan(
        self, batch_id: int, state: ServiceState, swaps: list[SwapRecord], ahead_after: int | None = None
    ) -> RoutingPlan:
        graphs, current = self._graphs(swaps)
        return plan_batch(
            batch_id, state, current, routing_swap(swaps), graphs, ahead_after=ahead_after, shadow=shadowing_swap(swaps)
        )

    def _move_on(self, swaps: list[SwapRecord], state: ServiceState, batch_id: int) -> list[SwapRecord]:
        """Move the active swap on if what it waits for is the service graph batch's to move on;
        returns the open swaps, read again if it moved."""
        swap = active_swap(swaps)
        wait = driven_by(swap, Driver.SERVICE_BATCH)
        move = self.moves.get(wait) if wait is not None else None
        if swap is not None and move is not None and move(swap, state, batch_id):
            return self._journal.open()
        return swaps

    def _take_cut(self, swap: SwapRecord, state: ServiceState, batch_id: int) -> SwapRecord | None:
        # A swap that rolls back on its own (never a rollback itself) keeps what its rollback needs.
        rolls_back = (swap.auto_rollback or self._recovery.auto_rollback) and swap.rollback_of is None
        boundary = decide_cut(state, swap, rolls_back)
        kept = _kept_for_rollback(swap, boundary) if rolls_back else None
        cut = self._journal.record_cut(swap.id, boundary, batch_id, buffer_from=kept)
        if cut is not None:
            crash_point("after:cut")
            log.info(
                "cut taken",
                swap_id=swap.id,
                cut_window_end=boundary,
                batch=batch_id,
                max_window_end=state.max_window_end,
            )
        return cut

    def _start_shadow(self, swap: SwapRecord, state: ServiceState, batch_id: int) -> SwapRecord | None:
        boundary = decide_cut(state, swap)  # S: the first instant a graph deployed now could take over
        started = self._journal.record_shadow_start(swap.id, boundary, batch_id)
        if started is not None:
            log.info("shadow started", swap_id=swap.id, shadow_since=boundary, max_window_end=state.max_window_end)
        return started

    # -- watermark -------------------------------------------------------------------------
    def _advance(
        self, state: ServiceState, batch_id: int, stats: list[PartitionBatchStats], now: float
    ) -> ServiceState:
        """The state after a batch (or, with no stats, after a tick), with idle partitions set aside."""
        partitions = set(state.partitions) | {str(s.partition) for s in stats}
        idle = self._idle.quiet(partitions, now)
        if idle:
            # A partition with rows waiting in Kafka is slow, not idle: it keeps holding the watermark.
            after = {p: n.offset for p, n in state.partitions.items()}
            after.update({str(s.partition): s.max_offset for s in stats})
            end = self._source.end()
            idle = frozenset(p for p in idle if end.get(p, 0) <= after.get(p, -1) + 1)
        return advance_state(
            state,
            batch_id,
            stats,
            now_ms=now_ms(),
            lateness_ms=self._pipeline.lateness.ms,
            idleness=self._idle.idleness(partitions, idle, now),
        )

    def tick(self) -> None:
        """Between batches: take a waiting cut, advance the watermark of an idle source, and keep
        every execution graph's markers up to date. Does nothing while a batch runs or is pending."""
        if self.query is None or not self.query.isActive or not self._lock.acquire(blocking=False):
            return
        try:
            state = self._load_state()
            next_batch = state.last_batch + 1
            if self._redis.exists(self._keys.routing_plan(next_batch)):
                return  # a batch was interrupted; Spark replays it first, with its recorded plan
            swaps = self._move_on(self._journal.open(), state, next_batch)
            now = time.monotonic()
            if now - self._last_advance >= TICK_ADVANCE_EVERY_S:
                self._last_advance = now
                advanced = self._advance(state, state.last_batch, [], now)
                if advanced != state:
                    fenced_write(
                        self._redis, self._fence, lambda pipe: pipe.set(self._keys.service, advanced.model_dump_json())
                    )
                    state = advanced
            try:
                plan = self._next_plan(next_batch, state, swaps)
            except NoTargetGraph:
                return
            self._after_routing(plan, state)
        finally:
            self._lock.release()

    # -- state in Redis --------------------------------------------------------------------
    def _load_state(self) -> ServiceState:
        return read_service_state(self._redis, self._keys)

    def _graphs(self, swaps: list[SwapRecord]) -> tuple[dict[str, GraphRecord], GraphRecord | None]:
        """The records of the graphs routing can name (the current one and those of the open swaps),
        and the current one: a read that does not grow with the retired graphs of past swaps."""
        current = read_current(self._redis, self._keys)
        named = [current.query_id] if current is not None else []
        for swap in swaps:
            named += [swap.to_query, *([swap.from_query] if swap.from_query else [])]
        graphs = read_graphs_named(self._redis, self._keys, named)
        return graphs, None if current is None else graphs.get(current.query_id)

    def _record(self, before: ServiceState, after: ServiceState, stats: BatchStats, expired_rows: int) -> None:
        counts: dict[str, int] = {}
        # A replayed batch was counted the first time it ran.
        if after.last_batch > before.last_batch:
            counts = {
                LATE_RECORDS: stats.late,
                DEAD_LETTER_RECORDS: stats.dead_letter,
                EXPIRED_RECORDS: expired_rows,
                **{f"{DEAD_LETTER}{code}": n for code, n in stats.dead_letter_by_reason.items()},
                **{f"{ROUTED}{query}": n for query, n in stats.routed_by_query.items()},
            }

        if counts.get(EXPIRED_RECORDS):
            log.warning(
                "source rows expired before they were read",
                topic=self._pipeline.source_topic,
                rows=counts[EXPIRED_RECORDS],
            )

        def queue(pipe: Batch) -> None:
            pipe.set(self._keys.service, after.model_dump_json())
            for name, count in counts.items():
                if count:
                    pipe.hincrby(self._keys.counters, name, count)

        fenced_write(self._redis, self._fence, queue)

    def _account_for_reads(self, batch_id: int, before: ServiceState, stats: BatchStats) -> int:
        """Account for every offset Spark planned for the batch (coverage.py): fail the batch, before
        its state or a marker is written, if its read skipped records Kafka still holds (Spark
        replays it and reads them); return the rows retention deleted before they were read."""
        planned = self._offset_log.batch(batch_id)
        if planned is None:
            if not self._unplanned_said:  # Spark writes the entry before it runs the batch
                self._unplanned_said = True
                log.warning(
                    "Spark's offset log has no entry for a service batch; reads are not checked",
                    batch=batch_id,
                    checkpoint=str(self._pipeline.names.service_checkpoint),
                )
            return 0
        # Offsets Kafka said hold no record count as seen: a partition whose last offsets are a
        # transaction's marker is asked about them once, not at every batch.
        seen = {p: end - 1 for p, end in self._empty_through.items()}
        for p, position in before.partitions.items():
            seen[int(p)] = max(seen.get(int(p), -1), position.offset)
        for s in stats.partitions:
            seen[s.partition] = max(seen.get(s.partition, -1), s.max_offset)
        gaps = unread(planned.ends, seen)
        if gaps:
            self._ask_kafka(batch_id, gaps)
        read = {
            s.partition: Seen(s.min_offset, s.max_offset, s.rows) for s in stats.partitions if s.min_offset is not None
        }
        if planned.fully_read(read):
            return 0
        log_start = {int(p): o for p, o in self._source.log_start().items()}
        return planned.expired(read, log_start)

    def _ask_kafka(self, batch_id: int, gaps: list[Unread]) -> None:
        """Raise SkippedRead (counted) if Kafka holds a record in offsets the batch did not see."""
        topic = self._pipeline.source_topic
        try:
            answer = self._source.first_records({g.partition: (g.first, g.end) for g in gaps}, COVERAGE_CHECK_TIMEOUT_S)
        except KafkaError as exc:
            OUTAGES.down(KAFKA, f"{type(exc).__name__}: {exc}", "the service batch, replayed from its checkpoint")
            raise SkippedRead(
                f"batch {batch_id} did not read {', '.join(map(str, gaps))} of {topic}, and Kafka did not say whether "
                f"records are there ({type(exc).__name__}); the batch is replayed: check the brokers"
            ) from exc
        for gap in gaps:
            found = answer.found.get(gap.partition)
            if found is not None:
                fenced_write(self._redis, self._fence, lambda pipe: pipe.hincrby(self._keys.counters, SKIPPED_READS, 1))
                log.warning(
                    "the service graph's read skipped source records Kafka holds; replaying the batch",
                    batch=batch_id,
                    unread=str(gap),
                    first_record=found,
                    reason_code=ReasonCode.SKIPPED_READ,
                )
                raise SkippedRead(
                    f"batch {batch_id} did not read {gap} of {topic}, where Kafka holds records (offset {found}); "
                    "the batch is replayed"
                )
        for gap in gaps:
            checked_to = answer.checked_to.get(gap.partition, gap.end)
            self._empty_through[gap.partition] = max(checked_to, self._empty_through.get(gap.partition, 0))
            if checked_to < gap.end:
                log.warning(
                    "the source's log ends before the batch's planned end: the brokers lost records "
                    "(an unclean leader election?)",
                    unread=str(gap),
                    log_end=checked_to,
                )

    # -- markers and drain -----------------------------------------------------------------
    def _after_routing(self, plan: RoutingPlan, state: ServiceState) -> None:
        """Bring every receiving graph's watermark to the service watermark. Once it has passed W,
        the old graph's marker drains it: `draining` is recorded first, `markers_written` after."""
        draining = plan.cut is not None and reached_cut(state.watermark, plan.cut.boundary)
        swap = self._record_draining(plan) if draining else None
        markers = graph_markers(plan, state.watermark)
        # A stranded swap still gets its markers: the old graph must finish.
        needs_note = swap is not None and (swap.state is SwapPhase.DRAINING or swap.state.is_stranded)
        first_end_of_window = swap is not None and needs_note and not swap.markers_written
        # The end-of-window marker is waited for once, so the journal's note is true; others are not.
        self._markers.write(markers, wait=first_end_of_window)
        if swap is not None and first_end_of_window:
            self._journal.update(swap.id, markers_written=True)
            log.info("end-of-window marker written", swap_id=swap.id, query_id=swap.from_query)

    def _record_draining(self, plan: RoutingPlan) -> SwapRecord:
        assert plan.cut is not None
        swap = self._journal.get(plan.cut.swap_id)
        if driven_by(swap, Driver.SERVICE_BATCH) is Wait.WATERMARK:
            advanced = self._journal.record_draining(swap.id)
            if advanced is not None:
                crash_point("after:draining")
                return advanced
            return self._journal.get(plan.cut.swap_id)
        return swap


def _kept_for_rollback(swap: SwapRecord, boundary: int) -> int | None:
    """Where a swap that rolls back on its own starts its new graph's buffer, when that is earlier
    than its own windows need (the old version slides); None otherwise."""
    if swap.old_window_ms is None or swap.new_window_ms is None:
        return None
    old = Windowing.of(swap.old_window_ms, swap.old_slide_ms)
    new = Windowing.of(swap.new_window_ms, swap.new_slide_ms)
    start = buffer_start(boundary, old, new, rolls_back=True)
    return start if start < boundary - new.reach_ms else None
