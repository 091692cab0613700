"""Declared schemas, checked with Spark: the namespace's source when the executor starts, and each
query version's schema when its swap is validated.

A schema is Spark DDL for JSON records, or an Avro schema (.avsc) whose Spark schema Spark's own
converter derives. Resolving a source checks that its event time names a column of a type hotswap
can read (TIMESTAMP or DATE, or an integer counting `event_time_unit` since the epoch), that no
top-level column takes a name the `events` view adds, and records the canonical DDL and how the
event time is read.
"""

from __future__ import annotations

import json
from typing import Any

from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession
from pyspark.sql import types as T

from hotswap.contract.source import (
    ADDED_COLUMNS,
    EVENT_TIME_COLUMN,
    RESERVED_PREFIX,
    EventTimeKind,
    SourceFormat,
    SourceSpec,
)
from hotswap.execution_graph.errors import QueryRejected, SchemaRefused

_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)


def spark_schema(spark: SparkSession, spec: SourceSpec) -> T.StructType:
    """The Spark schema of a record as the version reads it (for Avro: its reader schema, if any)."""
    jvm = _jvm(spark)
    if spec.format is SourceFormat.AVRO:
        text = spec.avro_reader_schema or spec.avro_schema
        assert text is not None
        try:
            avro = jvm.org.apache.avro.Schema.Parser().parse(text)
            converted = jvm.org.apache.spark.sql.avro.SchemaConverters.toSqlType(avro).dataType()
        except (Py4JJavaError, PySparkException) as exc:
            raise SchemaRefused(f"the Avro schema does not parse: {_java_message(exc)}") from exc
        schema = T.StructType.fromJson(json.loads(converted.json()))
        if not isinstance(schema, T.StructType):
            raise SchemaRefused("the Avro schema is not a record")
        return schema
    try:
        parsed = jvm.org.apache.spark.sql.types.StructType.fromDDL(spec.schema_ddl)
    except (Py4JJavaError, PySparkException) as exc:
        raise SchemaRefused(f"the source schema {spec.schema_ddl!r} does not parse: {_java_message(exc)}") from exc
    return T.StructType.fromJson(json.loads(parsed.json()))


def ddl(spark: SparkSession, schema: T.StructType) -> str:
    """Canonical DDL, as Spark prints it: `order_id STRING,customer STRUCT<id: BIGINT>,...`."""
    return str(_jvm(spark).org.apache.spark.sql.types.DataType.fromJson(schema.json()).toDDL())


def type_name(data_type: T.DataType) -> str:
    """A type as one word for messages: BIGINT, TIMESTAMP, STRUCT, ARRAY."""
    if isinstance(data_type, T.StructType | T.ArrayType | T.MapType):
        return data_type.typeName().upper()
    return data_type.simpleString().upper()


def resolve(spark: SparkSession, spec: SourceSpec) -> SourceSpec:
    """The spec with its schema checked, its DDL canonical and its event-time kind known; raises
    SchemaRefused with one line naming what is wrong."""
    schema = spark_schema(spark, spec)
    names = [f.name for f in schema.fields]
    duplicated = sorted({n for n in names if names.count(n) > 1})
    if duplicated:
        raise SchemaRefused(f"the source schema names {', '.join(duplicated)} twice")
    for name in names:
        # Spark matches column names ignoring case, so `Event_Time` would meet `event_time` too.
        folded = name.lower()
        if folded in ADDED_COLUMNS and not (name == EVENT_TIME_COLUMN and spec.event_time == EVENT_TIME_COLUMN):
            raise SchemaRefused(
                f"the source schema has a column {name!r}, a name the events view gives its own column "
                f"({', '.join(ADDED_COLUMNS)}); read it under another name"
            )
        if folded.startswith(RESERVED_PREFIX):
            raise SchemaRefused(
                f"the source schema has a column {name!r}: names starting with {RESERVED_PREFIX!r} are hotswap's own "
                "(it reads a graph's rows with them); read it under another name"
            )
    return spec.changed(schema_ddl=ddl(spark, schema), event_time_kind=_event_time_kind(spec, schema))


def check_version(spark: SparkSession, current: SourceSpec, new: SourceSpec) -> SourceSpec:
    """A query version's schema, resolved and checked against the one it replaces: the event time
    reads the same way, and a field both read keeps its type (new fields read as null from older
    JSON records). For Avro, Avro's own resolution rules decide whether the reader schema reads
    what the namespace's writer schema wrote. Raises QueryRejected with one line."""
    try:
        resolved = resolve(spark, new)
    except SchemaRefused as exc:
        raise QueryRejected(str(exc)) from exc
    if resolved.event_time_kind != current.event_time_kind:
        raise QueryRejected(
            f"event time {new.event_time!r} is {resolved.event_time_kind} in the new schema but "
            f"{current.event_time_kind} in the running one; keep its type"
        )
    if new.format is SourceFormat.AVRO:
        _check_avro_reads(spark, new)
        return resolved
    before = spark_schema(spark, current)
    after = spark_schema(spark, resolved)
    changed = _retyped(before, after)
    if changed:
        path, old, now = changed
        raise QueryRejected(
            f"field {path} is {old} in the running query's schema and {now} in the new one; a swap may add "
            "fields or stop reading some, but a field both read keeps its type"
        )
    return resolved


def _event_time_kind(spec: SourceSpec, schema: T.StructType) -> EventTimeKind:
    if spec.uses_kafka_time:
        return EventTimeKind.KAFKA
    data_type: T.DataType = schema
    walked: list[str] = []
    for part in spec.event_time_path:
        if not isinstance(data_type, T.StructType) or part not in data_type.names:
            where = f"struct {'.'.join(walked)}" if walked else "the source schema"
            raise SchemaRefused(f"event time {spec.event_time!r}: {where} has no field {part!r}")
        data_type = data_type[part].dataType
        walked.append(part)
    if isinstance(data_type, T.TimestampType | T.TimestampNTZType | T.DateType):
        return EventTimeKind.TIMESTAMP
    if isinstance(data_type, _INTEGRAL):
        return EventTimeKind.EPOCH
    raise SchemaRefused(
        f"event time {spec.event_time!r} is {type_name(data_type)}; declare it TIMESTAMP "
        "(ISO-8601 text, or --timestamp-format) or an integer (epoch, --event-time-unit ms|s|us)"
    )


def _retyped(before: T.DataType, after: T.DataType, path: str = "") -> tuple[str, str, str] | None:
    """The first field both schemas have with different types: (path, old type, new type)."""
    if isinstance(before, T.StructType) and isinstance(after, T.StructType):
        new_fields = {f.name: f.dataType for f in after.fields}
        for field in before.fields:
            if field.name in new_fields:
                found = _retyped(field.dataType, new_fields[field.name], f"{path}.{field.name}".lstrip("."))
                if found:
                    return found
        return None
    if before.simpleString() != after.simpleString():
        return path, before.simpleString(), after.simpleString()
    return None


def _check_avro_reads(spark: SparkSession, spec: SourceSpec) -> None:
    if spec.avro_reader_schema is None:
        return
    jvm = _jvm(spark)
    parse = jvm.org.apache.avro.Schema.Parser
    try:
        reader = parse().parse(spec.avro_reader_schema)
        writer = parse().parse(spec.avro_schema)
        result = jvm.org.apache.avro.SchemaCompatibility.checkReaderWriterCompatibility(reader, writer)
    except (Py4JJavaError, PySparkException) as exc:
        raise QueryRejected(f"the query's Avro schema does not parse: {_java_message(exc)}") from exc
    if str(result.getType().toString()) != "COMPATIBLE":
        incompatibilities = result.getResult().getIncompatibilities()
        detail = str(incompatibilities.get(0).getMessage()) if incompatibilities.size() else "incompatible"
        raise QueryRejected(
            f"the query's Avro schema cannot read records written with the namespace's schema: {detail}"
        )


def _jvm(spark: SparkSession) -> Any:
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    return jvm


def _java_message(exc: Py4JJavaError | PySparkException) -> str:
    """The first meaningful line of a Java exception raised through py4j."""
    if isinstance(exc, Py4JJavaError):
        text = str(exc.java_exception.getMessage() or exc.java_exception.toString())
    else:
        text = str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__
