"""Submit-time validation of a user query.

The query is analysed twice: once over a streaming `events` (so Spark's own streaming checks
run, e.g. an aggregation that is not event-time windowed cannot run in append mode) and once
over a small fixed sample of events, whose output reveals the window size and shape.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from contract.models import QuerySource
from contract.windows import common_boundary_ms, format_duration_ms
from execution_graph.errors import QueryRejected
from execution_graph.user_query import apply_query, first_line

# A cut waits for the next boundary shared by both window sizes; refuse sizes whose common
# boundary is further apart than this many of the larger window.
MAX_BOUNDARY_SPREAD = 10

# Columns of these types (other than the window) name a group; the rest are measures.
GROUP_TYPES = (T.StringType, T.BooleanType, T.IntegerType, T.ShortType, T.ByteType, T.DateType)

_SAMPLE_ORIGIN_MS = 1_699_999_200_000  # an hour boundary, so any sensible window aligns with it


@dataclass(frozen=True)
class QueryShape:
    """What validation learned about a query."""

    window_ms: int
    columns: tuple[str, ...]
    group_columns: tuple[str, ...]


def sample_events(spark: SparkSession) -> DataFrame:
    """Events spread over three hours: dense at first (sub-second windows), then sparse."""
    rows = []
    for i in range(240):
        ts = _SAMPLE_ORIGIN_MS + i * 500
        rows.append(("a" if i % 2 else "b", float(i % 7), ts))
    for i in range(1, 181):
        ts = _SAMPLE_ORIGIN_MS + 120_000 + i * 60_000
        rows.append(("a" if i % 2 else "b", float(i % 5), ts))
    df = spark.createDataFrame(rows, "key STRING, value DOUBLE, ts BIGINT")
    return df.selectExpr("key", "value", "ts", "timestamp_millis(ts) AS event_time")


def validate_query(
    spark: SparkSession,
    source: QuerySource,
    streaming_events: DataFrame,
    running_window_ms: int | None,
) -> QueryShape:
    """Raises QueryRejected with a one-line reason, or returns the query's shape."""
    streaming_output = apply_query(spark, streaming_events, source)
    _check_columns(source, streaming_output)
    _check_streaming(spark, source, streaming_output)
    shape = _window_shape(spark, source, streaming_output)
    if running_window_ms is not None:
        check_cuttable(running_window_ms, shape.window_ms)
    return shape


def check_cuttable(old_ms: int, new_ms: int) -> None:
    step = common_boundary_ms(old_ms, new_ms)
    if step > MAX_BOUNDARY_SPREAD * max(old_ms, new_ms):
        raise QueryRejected(
            f"window sizes {format_duration_ms(old_ms)} and {format_duration_ms(new_ms)} share a boundary only every "
            f"{format_duration_ms(step)}; choose a size that divides or is a multiple of the running one"
        )


def _check_columns(source: QuerySource, output: DataFrame) -> None:
    fields = {f.name: f.dataType for f in output.schema.fields}
    for column in ("window_start", "window_end"):
        if column not in fields:
            raise QueryRejected(
                f"query {source.name!r} output has no {column} column; "
                "select window.start AS window_start, window.end AS window_end"
            )
        if not isinstance(fields[column], T.TimestampType):
            raise QueryRejected(f"query {source.name!r} column {column} must be a timestamp, not {fields[column]}")


def _check_streaming(spark: SparkSession, source: QuerySource, output: DataFrame) -> None:
    """Spark's own check that the query can run in append mode on a stream."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    try:
        checker = jvm.org.apache.spark.sql.catalyst.analysis.UnsupportedOperationChecker
        mode = jvm.org.apache.spark.sql.streaming.OutputMode.Append()
        checker.checkForStreaming(output._jdf.queryExecution().analyzed(), mode)
    except (Py4JJavaError, PySparkException) as exc:
        message = first_line(exc)
        message = message.removeprefix("org.apache.spark.sql.AnalysisException: ")
        if "without watermark" in message or "aggregat" in message.lower():
            raise QueryRejected(
                f"query {source.name!r} aggregates without an event-time window "
                "(group by window(event_time, ...)); append mode cannot emit it"
            ) from exc
        raise QueryRejected(f"query {source.name!r} cannot run as a stream: {message}") from exc


def _window_shape(spark: SparkSession, source: QuerySource, streaming_output: DataFrame) -> QueryShape:
    try:
        output = apply_query(spark, sample_events(spark), source)
        rows = output.selectExpr("unix_millis(window_start) AS s", "unix_millis(window_end) AS e").distinct().collect()
    except PySparkException as exc:
        raise QueryRejected(f"query {source.name!r} failed on sample events: {first_line(exc)}") from exc
    except Py4JJavaError as exc:
        raise QueryRejected(f"query {source.name!r} failed on sample events: {first_line(exc)}") from exc
    if not rows:
        raise QueryRejected(f"query {source.name!r} produced no windows from sample events; is it windowed?")
    spans = sorted({int(r["s"]) for r in rows})
    sizes = {int(r["e"]) - int(r["s"]) for r in rows}
    if len(sizes) != 1:
        raise QueryRejected(
            f"query {source.name!r} produces windows of several sizes; only tumbling windows can be cut"
        )
    size = sizes.pop()
    if size <= 0:
        raise QueryRejected(f"query {source.name!r} produces empty windows")
    if any(b - a < size for a, b in itertools.pairwise(spans)):
        raise QueryRejected(
            f"query {source.name!r} uses overlapping (sliding) windows; only tumbling windows can be cut"
        )
    if any(start % size for start in spans):
        raise QueryRejected(
            f"query {source.name!r} windows are offset from the epoch; drop the window() startTime argument"
        )
    columns = tuple(f.name for f in streaming_output.schema.fields)
    groups = tuple(
        f.name
        for f in streaming_output.schema.fields
        if f.name not in ("window_start", "window_end", "query_id") and isinstance(f.dataType, GROUP_TYPES)
    )
    return QueryShape(window_ms=size, columns=columns, group_columns=groups)
