"""The Spark side of one service-graph batch: route every read record and write it to Kafka, in one
Spark job that also yields the batch's statistics.

Each record goes, with its bytes unchanged, to the dead-letter topic (it cannot be read), the late
topic (its event time is behind the service watermark), or the topics of every graph whose event
time range holds it (usually one; two around a cut to a sliding window, or beside a shadow). The
statistics the routing state is built from (per source partition: offsets, largest routed event time
and window end; counts by route and by dead-letter reason) are aggregated by Spark's `observe()` on
the very rows being written, so a batch is one job, with nothing persisted. Kafka is written through
Spark's DataSource V2 writer, which delivers observed metrics (the V1 writer does not): the session
takes Kafka off `spark.sql.sources.useV1SourceList` (executor/control/spark_session.py).

The batch's own numbers (the watermark rows are late behind, the time-jump limit, each destination's
event-time range) are columns made by `contract.batch_constants.batch_long`, never plain literals,
so that Spark compiles the batch's code once and serves it from its cache ever after.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pyspark.sql import Column, DataFrame, Observation
from pyspark.sql import functions as F

from hotswap.contract.batch_constants import HIGHEST, LOWEST, batch_long
from hotswap.contract.envelope import REASON_CODE_HEADER, REASON_HEADER, ROUTE_HEADER, SOURCE_HEADER, DeadLetterReason
from hotswap.contract.models import Destination, RoutingPlan
from hotswap.contract.observed import OBSERVED, observed_column, observed_values
from hotswap.contract.settings import KafkaSettings, PipelineSettings
from hotswap.contract.windows import format_duration_ms
from hotswap.service_graph.errors import ServiceGraphError
from hotswap.service_graph.reading import sql_str
from hotswap.service_graph.routing import PartitionBatchStats

OBSERVATION = "hotswap_service_batch"


@dataclass(frozen=True)
class BatchStats:
    """What one batch did, from the observed metrics of its write."""

    partitions: list[PartitionBatchStats]
    dead_letter_by_reason: dict[str, int] = field(default_factory=dict)
    routed_by_query: dict[str, int] = field(default_factory=dict)
    # The largest source partition in the batch: a partition above the known ones (added to the
    # topic while running) is not in `partitions`, and the caller must look again.
    max_partition: int | None = None

    @property
    def late(self) -> int:
        return sum(s.late for s in self.partitions)

    @property
    def dead_letter(self) -> int:
        return sum(s.dead_letter for s in self.partitions)


def median_event_time(read: DataFrame) -> int | None:
    """The median event time of a batch's readable records (one extra job, for the first batch only)."""
    row = read.where("reason IS NULL").selectExpr("percentile_approx(ts, 0.5) AS median").first()
    return None if row is None or row["median"] is None else int(row["median"])


def route_and_write(
    read: DataFrame, plan: RoutingPlan, pipeline: PipelineSettings, kafka: KafkaSettings, partitions: int
) -> BatchStats:
    """Route the batch's records (from reading.Reading.read) by `plan`, write them, and return
    the batch's statistics. `partitions`: how many partitions the source topic has."""
    topics = [d.topic for d in plan.destinations]
    if len(set(topics)) != len(topics):
        # A row would reach one topic twice, and only replays' rewrites are deduplicated (contract.rewrites).
        raise ServiceGraphError(
            f"batch {plan.batch_id}: two destinations share a topic ({topics}); this is a bug in hotswap"
        )
    routed = _classified(read, plan, pipeline)
    observation = Observation(OBSERVATION)
    observed = routed.observe(observation, _statistics(plan.destinations, partitions))
    (
        _for_kafka(observed, plan, pipeline)
        .write.format("kafka")
        .options(**kafka.spark_kafka_sink_options())
        .mode("append")
        .save()
    )
    stats = _stats(observation.get, plan.destinations, partitions)
    if stats.max_partition is not None and stats.max_partition >= partitions:
        # A partition added to the topic since the query started: count again, with it (a second job,
        # once). Spark reads the batch's offsets again; the rows are already written.
        row = routed.agg(_statistics(plan.destinations, stats.max_partition + 1)).first()
        assert row is not None
        stats = _stats(row.asDict(), plan.destinations, stats.max_partition + 1)
    return stats


def _constants(plan: RoutingPlan) -> list[str]:
    """The plan's numbers as columns (`_late_before`, `_ahead_after`, `_since_i`, `_until_i`; an open
    bound is LOWEST or HIGHEST), written so that each batch reuses the code the first compiled."""
    values = [_bound(plan.late_before, LOWEST), _bound(plan.ahead_after, HIGHEST)]
    names = ["_late_before", "_ahead_after"]
    for i, destination in enumerate(plan.destinations):
        values += [_bound(destination.since, LOWEST), _bound(destination.until, HIGHEST)]
        names += [f"_since_{i}", f"_until_{i}"]
    return [f"{batch_long(value)} AS {name}" for name, value in zip(names, values, strict=True)]


def _bound(value: int | None, unbounded: int) -> int:
    return unbounded if value is None else value


def _classified(read: DataFrame, plan: RoutingPlan, pipeline: PipelineSettings) -> DataFrame:
    """Adds `route` (dead_letter, late or data) and the routed row's `window_end`; a record too far
    ahead of the watermark gets its reason here. Keeps the plan's bounds as columns for what follows."""
    jump = sql_str(f"event time more than {format_duration_ms(pipeline.max_time_jump.ms)} ahead of the watermark")
    size = pipeline.window.ms
    # One projection, its later columns reading the constants before them (lateral aliases): each
    # DataFrame step costs the driver an analysis of the whole plan, at every batch. `reason` below
    # is still the record's own (a column of `read` wins over an alias), so `route` asks both.
    ahead = "reason IS NULL AND ts > _ahead_after"
    return read.selectExpr(
        "partition",
        "offset",
        "key",
        "value",
        "timestamp",
        "ts",
        *_constants(plan),
        f"CASE WHEN {ahead} THEN {jump} ELSE reason END AS reason",
        f"CASE WHEN {ahead} THEN {sql_str(DeadLetterReason.TOO_FAR_AHEAD)} ELSE reason_code END AS reason_code",
        "CASE WHEN reason IS NOT NULL OR ts > _ahead_after THEN 'dead_letter' WHEN ts < _late_before THEN 'late' "
        "ELSE 'data' END AS route",
        f"CASE WHEN route = 'data' THEN (ts DIV {size}) * {size} + {size} END AS window_end",
    )


def _holds(i: int) -> str:
    """Whether destination i's event-time range holds the row (its bounds are columns: see _constants)."""
    return f"ts >= _since_{i} AND ts < _until_{i}"


def _for_kafka(routed: DataFrame, plan: RoutingPlan, pipeline: PipelineSettings) -> DataFrame:
    """`topic`, `key`, `value`, `headers` for Spark's Kafka sink: the record's own key and value,
    and hotswap's metadata in headers (contract/envelope.py)."""
    names = pipeline.names
    route_header = (
        f"array(named_struct('key', {sql_str(ROUTE_HEADER)}, 'value', CAST(concat_ws(',', route, "
        "CAST(partition AS STRING), CAST(offset AS STRING), CAST(ts AS STRING), "
        "CAST(unix_millis(timestamp) AS STRING)) AS BINARY)))"
    )
    dead_headers = (
        f"array(named_struct('key', {sql_str(REASON_HEADER)}, 'value', CAST(reason AS BINARY)), "
        f"named_struct('key', {sql_str(REASON_CODE_HEADER)}, 'value', CAST(reason_code AS BINARY)), "
        f"named_struct('key', {sql_str(SOURCE_HEADER)}, 'value', "
        "CAST(concat_ws('/', CAST(partition AS STRING), CAST(offset AS STRING)) AS BINARY)))"
    )
    headers = f"CASE WHEN route = 'dead_letter' THEN {dead_headers} ELSE {route_header} END AS headers"
    receivers = plan.destinations
    if len(receivers) == 1:
        topic = (
            f"CASE route WHEN 'dead_letter' THEN {sql_str(names.dead_letter_topic)} "
            f"WHEN 'late' THEN {sql_str(names.late_topic)} ELSE {sql_str(receivers[0].topic)} END AS topic"
        )
        return routed.selectExpr(topic, f"{_graph_partition(receivers[0])} AS partition", "key", "value", headers)
    # A row for several graphs is written once per graph.
    each = ", ".join(
        f"CASE WHEN {_holds(i)} THEN named_struct('topic', {sql_str(d.topic)}, 'partition', {_graph_partition(d)}) END"
        for i, d in enumerate(receivers)
    )
    other = "named_struct('topic', {}, 'partition', CAST(NULL AS INT))"
    targets = (
        f"CASE route WHEN 'dead_letter' THEN array({other.format(sql_str(names.dead_letter_topic))}) "
        f"WHEN 'late' THEN array({other.format(sql_str(names.late_topic))}) "
        f"ELSE filter(array({each}), t -> t IS NOT NULL) END"
    )
    return routed.selectExpr(f"explode({targets}) AS target", "key", "value", headers).selectExpr(
        "target.topic AS topic", "target.partition AS partition", "key", "value", "headers"
    )


def _graph_partition(destination: Destination) -> str:
    """The partition of a graph's topic a data row goes to: its source partition's, modulo the topic's
    partitions, so that each source partition's rows stay in order in one graph partition (the
    markers that follow them go to every partition). Late and dead-letter rows: Kafka's choice (null)."""
    return f"CASE WHEN route = 'data' THEN CAST(pmod(partition, {int(destination.partitions)}) AS INT) END"


def _statistics(receivers: tuple[Destination, ...], partitions: int) -> Column:
    """The observed aggregates, as one column (contract.observed): conditional ones per source
    partition, per dead-letter reason and per destination, so that one pass over the written rows
    yields all of them."""
    data = "route = 'data'"
    exprs = ["max(partition) AS max_partition"]
    for p in range(partitions):
        mine = f"partition = {p}"
        exprs += [
            f"max(CASE WHEN {mine} THEN offset END) AS max_offset_{p}",
            f"min(CASE WHEN {mine} THEN offset END) AS min_offset_{p}",
            f"sum(CASE WHEN {mine} THEN 1 ELSE 0 END) AS rows_{p}",
            f"max(CASE WHEN {mine} AND {data} THEN ts END) AS max_ts_{p}",
            f"max(CASE WHEN {mine} AND {data} THEN window_end END) AS max_window_end_{p}",
            f"sum(CASE WHEN {mine} AND route = 'late' THEN 1 ELSE 0 END) AS late_{p}",
            f"sum(CASE WHEN {mine} AND route = 'dead_letter' THEN 1 ELSE 0 END) AS dead_{p}",
        ]
    exprs += [
        f"sum(CASE WHEN reason_code = {sql_str(code)} THEN 1 ELSE 0 END) AS `dead:{code}`" for code in DeadLetterReason
    ]
    exprs += [f"sum(CASE WHEN {data} AND {_holds(i)} THEN 1 ELSE 0 END) AS `routed:{i}`" for i in range(len(receivers))]
    return F.expr(observed_column(exprs))


def _stats(answer: Mapping[str, Any], receivers: tuple[Destination, ...], partitions: int) -> BatchStats:
    metrics = observed_values(answer)
    if metrics is None:
        raise ServiceGraphError(f"a batch's observed statistics came without {OBSERVED!r}; this is a bug in hotswap")
    found = []
    for p in range(partitions):
        max_offset = metrics.get(f"max_offset_{p}")
        if max_offset is None:
            continue  # no record of this partition in the batch
        found.append(
            PartitionBatchStats(
                partition=p,
                max_offset=int(max_offset),
                min_offset=int(metrics[f"min_offset_{p}"]),
                rows=int(metrics.get(f"rows_{p}") or 0),
                max_event_time=_int(metrics.get(f"max_ts_{p}")),
                max_window_end=_int(metrics.get(f"max_window_end_{p}")),
                late=int(metrics.get(f"late_{p}") or 0),
                dead_letter=int(metrics.get(f"dead_{p}") or 0),
            )
        )
    dead = {code.value: int(metrics.get(f"dead:{code}") or 0) for code in DeadLetterReason}
    routed: dict[str, int] = {}
    for i, destination in enumerate(receivers):
        routed[destination.query_id] = routed.get(destination.query_id, 0) + int(metrics.get(f"routed:{i}") or 0)
    return BatchStats(
        partitions=found,
        dead_letter_by_reason={code: n for code, n in dead.items() if n},
        routed_by_query={query: n for query, n in routed.items() if n},
        max_partition=_int(metrics.get("max_partition")),
    )


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
