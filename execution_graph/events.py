"""The `events` a user query sees, read from its graph's topic.

The service graph writes each routed record's key and value unchanged into the graph's topic, with
its routing metadata in the one `hotswap.route` header (contract/envelope.py); watermark markers are
empty records with only that header. Every reader of a graph topic goes through here: the stateful
graph's stream, the closing graph's per-window batch job, and validation.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import types as T

from hotswap.contract.models import SkippedRows
from hotswap.contract.settings import KafkaSettings, PipelineSettings
from hotswap.contract.source import (
    EVENT_TIME_COLUMN,
    KAFKA_KEY_COLUMN,
    KAFKA_TIMESTAMP_COLUMN,
    AvroWire,
    SourceFormat,
    SourceSpec,
)
from hotswap.contract.windows import GRAPH_WATERMARK_DELAY_MS
from hotswap.execution_graph.schemas import spark_schema

# The columns of a record read by Spark's Kafka source with its headers.
KAFKA_RECORD = T.StructType(
    [
        T.StructField("key", T.BinaryType()),
        T.StructField("value", T.BinaryType()),
        T.StructField("topic", T.StringType()),
        T.StructField("partition", T.IntegerType()),
        T.StructField("offset", T.LongType()),
        T.StructField("timestamp", T.TimestampType()),
        T.StructField("timestampType", T.IntegerType()),
        T.StructField(
            "headers",
            T.ArrayType(T.StructType([T.StructField("key", T.StringType()), T.StructField("value", T.BinaryType())])),
        ),
    ]
)


# The route header's five fields, as an array of strings (contract/envelope.py): the only header a
# graph row carries, so the first.
ROUTE = "split(CAST(try_element_at(headers, 1).value AS STRING), ',')"
# Columns of hotswap's own beside the ones a query sees: the route header, split; the source event
# (partition, offset) the deduplication keys on; the record as parsed. Never in `events`.
ROUTE_COLUMN = "_hotswap_route"
PARTITION_COLUMN = "_hotswap_partition"
OFFSET_COLUMN = "_hotswap_offset"
RECORD_COLUMN = "_hotswap_record"
SOURCE_EVENT = (PARTITION_COLUMN, OFFSET_COLUMN)
BOOKKEEPING = (*SOURCE_EVENT, RECORD_COLUMN)


def batch_events(spark: SparkSession, reads: SourceSpec) -> DataFrame:
    """An empty batch `events`, as a closing graph's query sees it: what its queries are validated on."""
    rows = routed_rows(spark.createDataFrame([], KAFKA_RECORD))
    return parsed_events(spark, rows.where("kind = 'data'"), reads).drop(*BOOKKEEPING)


def graph_topic_stream(spark: SparkSession, pipeline: PipelineSettings, kafka: KafkaSettings, topic: str) -> DataFrame:
    """The graph's input topic as a stream of raw Kafka records (headers included), from its
    first offset, at most `graph_batch_cap` records a batch."""
    return (
        spark.readStream.format("kafka")
        .options(**kafka.spark_kafka_options())
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(graph_batch_cap(pipeline)))
        # The topic is deleted only after the graph retires; its rows are the buffer and must not vanish.
        .option("failOnDataLoss", "true")
        .option("includeHeaders", "true")
        .load()
    )


def without_skipped(raw: DataFrame, skipped: Sequence[SkippedRows]) -> DataFrame:
    """Raw graph-topic records less the data rows of the batches the graph skipped (their rows were
    dead-lettered, `poison_batches`). Markers stay: the graph's watermark still moves past them."""
    kept = not_skipped(skipped, kind=f"{ROUTE}[0]", event_time=f"try_cast({ROUTE}[3] AS BIGINT)")
    return raw if kept is None else raw.where(kept)


def not_skipped(skipped: Sequence[SkippedRows], kind: str, event_time: str) -> str | None:
    """SQL that holds for every row but the data rows of the skipped batches, over rows with the
    graph topic's `partition` and `offset` and the given route kind and event time (epoch ms)
    expressions; None when no batch was skipped."""
    if not skipped:
        return None

    def held(r: SkippedRows) -> str:
        terms = [f"partition = {int(r.partition)}", f"offset >= {int(r.start)}", f"offset < {int(r.end)}"]
        if r.since_ms is not None:
            terms.append(f"{event_time} >= {int(r.since_ms)}")
        if r.until_ms is not None:
            terms.append(f"{event_time} < {int(r.until_ms)}")
        return "(" + " AND ".join(terms) + ")"

    ranges = " OR ".join(held(r) for r in skipped)
    return f"(coalesce({kind} <> 'data', false) OR NOT coalesce({ranges}, false))"


def routed_rows(raw: DataFrame, *extra: str) -> DataFrame:
    """Graph-topic records with the service graph's route header (contract/envelope.py) spread into
    columns: kind, source partition and offset, event time, source record timestamp; and the
    record's own key and value. The route header is the only header a graph row carries. `extra`:
    more SQL columns of the same projection, which may read ROUTE_COLUMN (the header, split)."""
    # One projection, whose columns name the header split before them (a lateral alias): each
    # DataFrame step costs the driver an analysis of the whole plan, at every closing job.
    return raw.selectExpr(
        f"{ROUTE} AS {ROUTE_COLUMN}",
        f"{ROUTE_COLUMN}[0] AS kind",
        f"try_cast({ROUTE_COLUMN}[1] AS INT) AS {PARTITION_COLUMN}",
        f"try_cast({ROUTE_COLUMN}[2] AS BIGINT) AS {OFFSET_COLUMN}",
        f"timestamp_millis(try_cast({ROUTE_COLUMN}[3] AS BIGINT)) AS {EVENT_TIME_COLUMN}",
        f"timestamp_millis(try_cast({ROUTE_COLUMN}[4] AS BIGINT)) AS {KAFKA_TIMESTAMP_COLUMN}",
        "key",
        "value",
        *extra,
    )


def record_fields(spark: SparkSession, reads: SourceSpec) -> tuple[str, ...]:
    """The top-level fields of the schema a version reads, as `events` has them (for parsed_events;
    a closing graph looks them up once, not at every job: a dozen py4j round trips)."""
    # The record's own event_time (the event time itself) gives way to hotswap's.
    return tuple(name for name in spark_schema(spark, reads).names if name != EVENT_TIME_COLUMN)


def parsed_events(
    spark: SparkSession, data: DataFrame, reads: SourceSpec, fields: Sequence[str] | None = None
) -> DataFrame:
    """Data rows (from `routed_rows`) as the `events` a user query sees: every top-level column of
    the schema its version reads (`fields`, from record_fields), `event_time`, and the source
    record's Kafka key and timestamp, with the source partition and offset kept for the
    deduplication (and the parsed record): drop BOOKKEEPING once the duplicates are gone."""
    # Parsed once, here, with the version's own schema, and spread into the view's columns before
    # the duplicates are dropped: Spark then prunes the fields the query never reads before the
    # shuffle the deduplication needs, instead of shuffling whole records. One projection, its
    # fields read from the record parsed before them (a lateral alias), as in routed_rows.
    names = record_fields(spark, reads) if fields is None else fields
    columns = [f"{RECORD_COLUMN}.`{_escaped(name)}` AS `{_escaped(name)}`" for name in names]
    return data.selectExpr(
        f"{_decode(reads)} AS {RECORD_COLUMN}",
        *columns,
        PARTITION_COLUMN,
        OFFSET_COLUMN,
        EVENT_TIME_COLUMN,
        f"CAST(key AS STRING) AS {KAFKA_KEY_COLUMN}",
        KAFKA_TIMESTAMP_COLUMN,
    )


def events_stream(
    spark: SparkSession,
    pipeline: PipelineSettings,
    kafka: KafkaSettings,
    topic: str,
    reads: SourceSpec,
    start_after: int | None = None,
    skipped: Sequence[SkippedRows] = (),
) -> DataFrame:
    """The `events` a stateful graph's query sees, from the data rows of the graph's input topic,
    watermarked; from event time `start_after` on when the graph took over a failed graph's topic.
    `reads` is the version's resolved source (execution_graph.schemas.resolve)."""
    rows = routed_rows(without_skipped(graph_topic_stream(spark, pipeline, kafka, topic), skipped))
    watermarked = rows.withWatermark(EVENT_TIME_COLUMN, f"{GRAPH_WATERMARK_DELAY_MS} milliseconds")
    # Keeps data rows and drops markers, but only after the watermark node has seen them.
    keep = "true" if start_after is None else f"{EVENT_TIME_COLUMN} >= timestamp_millis({int(start_after)})"
    data = watermarked.where(f"CASE WHEN kind = 'data' THEN {keep} ELSE {EVENT_TIME_COLUMN} IS NULL END")
    # A service-graph batch that Spark replays after a crash writes its rows again; each source
    # event (partition, offset) is counted once. With the event time in the key, Spark evicts an
    # entry once the service watermark passes it, so this state stays bounded.
    unique = parsed_events(spark, data, reads).dropDuplicates([*SOURCE_EVENT, EVENT_TIME_COLUMN])
    return unique.drop(*BOOKKEEPING)


def graph_batch_cap(pipeline: PipelineSettings) -> int:
    """Most rows one execution-graph batch reads. A service batch writes at most
    `max_offsets_per_trigger` rows to a graph, then its marker: twice that, plus room for the markers
    of ticks, lets a graph read a whole service batch and its marker in one batch (so the marker does
    not land a batch late, and neither does a drain) and catch up when it falls behind, while memory
    stays bounded."""
    return 2 * pipeline.max_offsets_per_trigger + 64


def _decode(reads: SourceSpec) -> str:
    """The record's value as the version reads it: JSON with its DDL, or Avro with the namespace's
    writer schema resolved to the version's reader schema (Avro's resolution rules)."""
    if reads.format is SourceFormat.AVRO:
        assert reads.avro_schema is not None
        options = {"mode": "PERMISSIVE"}
        if reads.avro_reader_schema:
            options["avroSchema"] = reads.avro_reader_schema
        payload = "substr(value, 6)" if reads.avro_wire is AvroWire.CONFLUENT else "value"
        return f"from_avro({payload}, {_sql_str(reads.avro_schema)}, {_map(options)})"
    return f"from_json(CAST(value AS STRING), {_sql_str(reads.schema_ddl)}, {_map(reads.json_options)})"


def _sql_str(value: str) -> str:
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _map(options: dict[str, str]) -> str:
    return "map(" + ", ".join(f"{_sql_str(k)}, {_sql_str(v)}" for k, v in options.items()) + ")"


def _escaped(name: str) -> str:
    return name.replace("`", "``")
