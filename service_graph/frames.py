"""The Spark side of one service-graph batch: parsing source rows, routing them with SQL
expressions (no Python UDFs), and the per-partition statistics the routing state is built from."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from hotswap.contract.models import RoutingPlan
from hotswap.contract.settings import Settings
from hotswap.contract.windows import MAX_EVENT_TIME_MS, format_duration_ms
from hotswap.service_graph.routing import PartitionBatchStats

SOURCE_SCHEMA = "key STRING, value DOUBLE, ts BIGINT"


def _sql_str(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def parse(batch: DataFrame) -> DataFrame:
    """The source rows with their parsed event `e` and, for malformed ones, the `reason`."""
    parsed = batch.selectExpr(
        "partition",
        "offset",
        "key AS raw_key",
        "value AS raw_value",
        f"from_json(CAST(value AS STRING), '{SOURCE_SCHEMA}') AS e",
    )
    # CASE evaluates its branches in order, so a well-formed row (nearly all of them) is parsed
    # once; only a row missing a field is parsed again to tell invalid JSON from a missing field.
    return parsed.selectExpr(
        "partition",
        "offset",
        "raw_key",
        "raw_value",
        "e",
        f"""CASE
              WHEN raw_value IS NULL THEN 'empty record'
              WHEN e.key IS NOT NULL AND e.value IS NOT NULL AND e.ts IS NOT NULL THEN
                CASE WHEN e.ts < 0 OR e.ts > {MAX_EVENT_TIME_MS} THEN 'field ts out of range' END
              WHEN try_parse_json(CAST(raw_value AS STRING)) IS NULL THEN 'not valid JSON'
              WHEN e.key IS NULL THEN 'missing or non-string field key'
              WHEN e.value IS NULL THEN 'missing or non-numeric field value'
              ELSE 'missing or non-integer field ts'
            END AS reason""",
    )


def median_event_time(parsed: DataFrame) -> int | None:
    row = parsed.where("reason IS NULL").selectExpr("percentile_approx(e.ts, 0.5) AS median").first()
    return None if row is None or row["median"] is None else int(row["median"])


def route(parsed: DataFrame, plan: RoutingPlan, settings: Settings) -> DataFrame:
    """Adds `topic`, `key`, `value`, `headers` for the Kafka sink, plus `route` for stats."""
    size = settings.window.ms
    late = "false" if plan.late_before is None else f"e.ts < {plan.late_before}"
    ahead = "false" if plan.ahead_after is None else f"e.ts > {plan.ahead_after}"
    jump = _sql_str(f"event time more than {format_duration_ms(settings.max_time_jump.ms)} ahead of the watermark")
    old = "false" if plan.cut is None else f"e.ts < {plan.cut.boundary}"
    old_topic = _sql_str(plan.cut.old_topic) if plan.cut is not None else "NULL"
    reasoned = parsed.selectExpr(
        "partition",
        "offset",
        "raw_key",
        "raw_value",
        "e",
        f"CASE WHEN reason IS NULL AND {ahead} THEN {jump} ELSE reason END AS reason",
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
              WHEN 'dead_letter' THEN {_sql_str(settings.names.dead_letter_topic)}
              WHEN 'late' THEN {_sql_str(settings.names.late_topic)}
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


def collect_stats(routed: DataFrame) -> list[PartitionBatchStats]:
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
        .agg(
            F.max("offset").alias("max_offset"),
            F.min("offset").alias("min_offset"),
            F.max("routed_ts").alias("max_event_time"),
            F.max("routed_window_end").alias("max_window_end"),
            F.sum("is_late").alias("late"),
            F.sum("is_dead").alias("dead_letter"),
        )
        .collect()
    )
    return [
        PartitionBatchStats(
            partition=int(row["partition"]),
            max_offset=int(row["max_offset"]),
            max_event_time=row["max_event_time"],
            max_window_end=row["max_window_end"],
            late=int(row["late"] or 0),
            dead_letter=int(row["dead_letter"] or 0),
            min_offset=int(row["min_offset"]),
        )
        for row in rows
    ]
