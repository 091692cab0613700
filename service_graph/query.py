"""The service graph's Spark query.

One streaming query reads the source topic; `foreachBatch` routes each micro-batch:
1. take the cut if a deployed swap waits for one (recorded in the journal first);
2. write down the batch's routing plan, or reuse it if Spark is replaying the batch;
3. route every row with Spark SQL expressions (no Python UDFs) and write it to Kafka;
4. record node positions and the service watermark;
5. once the watermark passes W, write the end-of-window marker to the old graph's topic.
"""

from __future__ import annotations

import json
import threading
import time

import redis
import structlog
from kafka import KafkaProducer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from contract.faults import crash_point
from contract.journal import Journal, SwapPhase, SwapRecord
from contract.keys import Keys
from contract.lifecycle import RestartBudget, stop_between_batches
from contract.models import GraphRecord, RoutingPlan, ServiceState, now_ms
from contract.records import read_current, read_graphs, read_service_state
from contract.settings import Settings
from service_graph.errors import ServiceGraphError
from service_graph.routing import (
    PartitionBatchStats,
    active_swap,
    advance_state,
    decide_cut,
    failed_after_cut,
    marker_event_time,
    plan_batch,
    routing_swap,
)

log = structlog.get_logger(__name__)

SOURCE_SCHEMA = "key STRING, value DOUBLE, ts BIGINT"
MAX_TS_MS = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
MARKER_KEY = b"__hotswap_marker__"
PLANS_KEPT = 50  # older write-ahead plans are deleted; Spark never replays more than the last batch


def query_name(namespace: str) -> str:
    return f"hotswap.{namespace}.service"


def _sql_str(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


class ServiceGraph:
    """Owns the permanent routing query of one namespace."""

    def __init__(self, spark: SparkSession, settings: Settings, client: redis.Redis) -> None:
        self._spark = spark
        self._settings = settings
        self._redis = client
        self._keys = Keys(settings.namespace)
        self._journal = Journal(client, self._keys)
        self._producer: KafkaProducer | None = None
        self._lock = threading.Lock()
        self.query: StreamingQuery | None = None
        self._restarts = RestartBudget(settings.query_restarts, settings.query_restart_backoff_s)

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> StreamingQuery:
        settings = self._settings
        source = (
            self._spark.readStream.format("kafka")
            .options(**settings.spark_kafka_options())
            .option("subscribe", settings.source_topic)
            # Only the very first start reads from the beginning; later starts use the checkpoint.
            .option("startingOffsets", "earliest")
            .option("failOnDataLoss", "false")
            .load()
        )
        self.query = (
            source.writeStream.queryName(query_name(settings.namespace))
            .option("checkpointLocation", str(settings.checkpoint_dir("service")))
            .foreachBatch(self.route_batch)
            .start()
        )
        log.info("service graph started", query=query_name(settings.namespace), source=settings.source_topic)
        return self.query

    def supervise(self) -> None:
        """Restart the routing query from its checkpoint if it died, with doubling back-off; after
        the configured restarts, raise so the executor stops and says why."""
        query = self.query
        now = time.monotonic()
        if query is None or query.isActive:
            self._restarts.healthy(now)
            return
        failure = query.exception()
        reason = str(failure).strip().splitlines()[0] if failure is not None else "it stopped"
        if self._restarts.exhausted:
            raise ServiceGraphError(
                f"the service graph failed {self._restarts.attempts + 1} times ({reason}); fix the cause and "
                "restart `hotswap run`: it resumes from its checkpoint and no routed row is lost"
            )
        if self._restarts.first_seen(now):
            log.warning("service graph failed; restarting from its checkpoint", error=reason)
        if self._restarts.restart_due(now):
            self.start()

    def stop(self) -> None:
        if self.query is not None and self.query.isActive:
            stop_between_batches(self.query)
        if self._producer is not None:
            self._producer.close(timeout=5)
            self._producer = None

    # -- one micro-batch -------------------------------------------------------------------
    def route_batch(self, batch: DataFrame, batch_id: int) -> None:
        with self._lock:
            state = self._load_state()
            plan = self._plan(batch_id, state)
            routed = self._classify(batch, plan).persist()
            try:
                stats = self._collect_stats(routed)
                (
                    routed.select("topic", "key", "value", "headers")
                    .write.format("kafka")
                    .options(**self._settings.spark_kafka_options())
                    .save()
                )
            finally:
                routed.unpersist()
            crash_point("service:after-write")  # rows are out, state not yet recorded: a replay follows
            new_state = advance_state(
                state,
                batch_id,
                stats,
                now_ms=now_ms(),
                lateness_ms=self._settings.lateness_ms,
                idle_timeout_ms=self._settings.idle_timeout_ms,
            )
            self._record(state, new_state, stats)
            if plan.cut is not None:
                self._drain_if_passed(plan, new_state)

    def _plan(self, batch_id: int, state: ServiceState) -> RoutingPlan:
        raw = self._redis.get(self._keys.routing_plan(batch_id))
        if raw is not None:
            plan = RoutingPlan.model_validate_json(raw)
            log.info("replaying routing plan", batch=batch_id, target=plan.target_query)
            return plan
        graphs = self._graphs()
        current = self._current(graphs)
        swaps = self._journal.all()
        swap = active_swap(swaps)
        if swap is not None and swap.state is SwapPhase.DEPLOYED and self._take_cut(swap, state, batch_id):
            swaps = self._journal.all()
        plan = plan_batch(batch_id, state, current, routing_swap(swaps), graphs)
        pipe = self._redis.pipeline(transaction=True)
        pipe.set(self._keys.routing_plan(batch_id), plan.model_dump_json())
        pipe.delete(self._keys.routing_plan(batch_id - PLANS_KEPT))
        pipe.execute()
        return plan

    def _take_cut(self, swap: SwapRecord, state: ServiceState, batch_id: int) -> SwapRecord | None:
        boundary = decide_cut(state, swap)
        cut = self._journal.advance(
            swap.id,
            SwapPhase.CUT,
            when=lambda record: record.state is SwapPhase.DEPLOYED,
            cut_window_end=boundary,
            cut_batch=batch_id,
        )
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

    def _classify(self, batch: DataFrame, plan: RoutingPlan) -> DataFrame:
        """Adds `topic`, `key`, `value`, `headers` for the Kafka sink, plus `route` for stats."""
        settings = self._settings
        size = settings.window_ms
        late = "false" if plan.late_before is None else f"e.ts < {plan.late_before}"
        old = "false" if plan.cut is None else f"e.ts < {plan.cut.boundary}"
        old_topic = _sql_str(plan.cut.old_topic) if plan.cut is not None else "NULL"
        parsed = batch.selectExpr(
            "partition",
            "offset",
            "key AS raw_key",
            "value AS raw_value",
            f"from_json(CAST(value AS STRING), '{SOURCE_SCHEMA}') AS e",
            "try_parse_json(CAST(value AS STRING)) AS j",
        )
        reasoned = parsed.selectExpr(
            "*",
            f"""CASE
                  WHEN raw_value IS NULL THEN 'empty record'
                  WHEN j IS NULL THEN 'not valid JSON'
                  WHEN e.key IS NULL THEN 'missing or non-string field key'
                  WHEN e.value IS NULL THEN 'missing or non-numeric field value'
                  WHEN e.ts IS NULL THEN 'missing or non-integer field ts'
                  WHEN e.ts < 0 OR e.ts > {MAX_TS_MS} THEN 'field ts out of range'
                END AS reason""",
        )
        routed = reasoned.selectExpr(
            "*",
            f"""CASE
                  WHEN reason IS NOT NULL THEN 'dead_letter'
                  WHEN {late} THEN 'late'
                  WHEN {old} THEN 'old'
                  ELSE 'target'
                END AS route""",
            f"CASE WHEN reason IS NULL THEN (e.ts DIV {size}) * {size} + {size} END AS window_end",
        )
        return routed.selectExpr(
            "route",
            "partition",
            "offset",
            "e.ts AS ts",
            "window_end",
            f"""CASE route
                  WHEN 'dead_letter' THEN {_sql_str(settings.dead_letter_topic)}
                  WHEN 'late' THEN {_sql_str(settings.late_topic)}
                  WHEN 'old' THEN {old_topic}
                  ELSE {_sql_str(plan.target_topic)}
                END AS topic""",
            "raw_key AS key",
            """CASE WHEN route = 'dead_letter' THEN raw_value
                  ELSE CAST(to_json(named_struct(
                      'kind', 'data', 'key', e.key, 'value', e.value, 'ts', e.ts,
                      'partition', partition, 'offset', offset, 'window_end', window_end)) AS BINARY)
                END AS value""",
            """CASE WHEN route = 'dead_letter' THEN array(
                      named_struct('key', 'hotswap.reason', 'value', CAST(reason AS BINARY)),
                      named_struct('key', 'hotswap.source',
                                   'value', CAST(concat_ws('/', CAST(partition AS STRING),
                                                           CAST(offset AS STRING)) AS BINARY)))
                  ELSE CAST(array() AS ARRAY<STRUCT<key: STRING, value: BINARY>>)
                END AS headers""",
        )

    @staticmethod
    def _collect_stats(routed: DataFrame) -> list[PartitionBatchStats]:
        rows = (
            routed.selectExpr(
                "partition",
                "offset",
                "CASE WHEN route IN ('old', 'target') THEN ts END AS routed_ts",
                "CASE WHEN route IN ('old', 'target') THEN window_end END AS routed_window_end",
                "CASE WHEN route = 'late' THEN 1 ELSE 0 END AS is_late",
                "CASE WHEN route = 'dead_letter' THEN 1 ELSE 0 END AS is_dead",
            )
            .groupBy("partition")
            .agg({"offset": "max", "routed_ts": "max", "routed_window_end": "max", "is_late": "sum", "is_dead": "sum"})
            .collect()
        )
        return [
            PartitionBatchStats(
                partition=int(row["partition"]),
                max_offset=int(row["max(offset)"]),
                max_event_time=row["max(routed_ts)"],
                max_window_end=row["max(routed_window_end)"],
                late=int(row["sum(is_late)"] or 0),
                dead_letter=int(row["sum(is_dead)"] or 0),
            )
            for row in rows
        ]

    # -- state in Redis --------------------------------------------------------------------
    def _load_state(self) -> ServiceState:
        return read_service_state(self._redis, self._keys)

    def _graphs(self) -> dict[str, GraphRecord]:
        return read_graphs(self._redis, self._keys)

    def _current(self, graphs: dict[str, GraphRecord]) -> GraphRecord | None:
        current = read_current(self._redis, self._keys)
        return None if current is None else graphs.get(current.query_id)

    def _record(self, before: ServiceState, after: ServiceState, stats: list[PartitionBatchStats]) -> None:
        pipe = self._redis.pipeline(transaction=True)
        pipe.set(self._keys.service, after.model_dump_json())
        # A replayed batch was counted the first time it ran.
        if after.last_batch > before.last_batch:
            late = sum(s.late for s in stats)
            dead = sum(s.dead_letter for s in stats)
            if late:
                pipe.hincrby(self._keys.counters, "late_records", late)
            if dead:
                pipe.hincrby(self._keys.counters, "dead_letter_records", dead)
        pipe.execute()

    # -- drain -----------------------------------------------------------------------------
    def _drain_if_passed(self, plan: RoutingPlan, state: ServiceState) -> None:
        assert plan.cut is not None
        if state.watermark is None or state.watermark < plan.cut.boundary:
            return
        swap = self._journal.get(plan.cut.swap_id)
        if swap.state is SwapPhase.CUT:
            advanced = self._journal.advance(swap.id, SwapPhase.DRAINING, when=lambda r: r.state is SwapPhase.CUT)
            if advanced is None:
                return
            crash_point("after:draining")
            swap = advanced
        # A swap that failed after its cut still gets its markers: the old graph must finish.
        if (swap.state is not SwapPhase.DRAINING and not failed_after_cut(swap)) or swap.markers_written:
            return
        old = self._graphs().get(plan.cut.old_query)
        if old is None:
            return
        self._write_markers(old, plan.cut.boundary, swap.id)
        self._journal.update(swap.id, markers_written=True)

    def _write_markers(self, old: GraphRecord, boundary: int, swap_id: str) -> None:
        if self._producer is None:
            self._producer = KafkaProducer(**self._settings.kafka_python_config(), acks="all")
        event_time = marker_event_time(boundary, old.watermark_delay_ms)
        payload = json.dumps({"kind": "marker", "ts": event_time, "swap_id": swap_id}).encode()
        partitions = self._producer.partitions_for(old.topic) or {0}
        for partition in sorted(partitions):
            self._producer.send(old.topic, key=MARKER_KEY, value=payload, partition=partition)
        self._producer.flush(timeout=30)
        log.info(
            "end-of-window markers written",
            swap_id=swap_id,
            query_id=old.query_id,
            partitions=len(partitions),
            marker_event_time=event_time,
        )
