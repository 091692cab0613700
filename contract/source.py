"""The declared source: how the user's topic is read.

A namespace declares its source once (`hotswap run --source-format ... --source-schema ...
--event-time ...`): the records' format (JSON, or Avro in Confluent's wire format or plain), their
schema, and where the event time lives. The service graph reads only what it needs of a record (its
event time, and enough to dead-letter it with a reason) and forwards the record's bytes unchanged;
each execution graph parses the value once, with the schema of its own query version. So a swap may
change the schema a query reads (README, "Your own topic").

Pure data: the rooms that run Spark turn a `SourceSpec` into their own expressions.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import model_validator

from hotswap.contract.frozen import Record

# The generator's demo format, and the default. NOT NULL: a record missing one of them is
# dead-lettered (any DDL may say NOT NULL).
DEFAULT_SCHEMA = "key STRING NOT NULL, value DOUBLE NOT NULL, ts BIGINT NOT NULL"
DEFAULT_EVENT_TIME = "ts"
KAFKA_EVENT_TIME = "kafka"  # --event-time kafka: the Kafka record's own timestamp

# Columns hotswap adds to the `events` view, beside every top-level column of the schema. A schema
# whose own top-level columns take one of these names is refused (README, "Your own topic").
EVENT_TIME_COLUMN = "event_time"
KAFKA_KEY_COLUMN = "_kafka_key"
KAFKA_TIMESTAMP_COLUMN = "_kafka_timestamp"
ADDED_COLUMNS = (EVENT_TIME_COLUMN, KAFKA_KEY_COLUMN, KAFKA_TIMESTAMP_COLUMN)
# hotswap's own columns beside the schema's while a graph reads its rows (the source event, the
# parsed record): a schema's top-level column may not start with it either.
RESERVED_PREFIX = "_hotswap_"

CONFLUENT_MAGIC = 0
CONFLUENT_HEADER_BYTES = 5  # the magic byte and a 4-byte schema id, before the Avro record


class SourceFormat(StrEnum):
    JSON = "json"
    AVRO = "avro"


class AvroWire(StrEnum):
    CONFLUENT = "confluent"  # magic byte 0, a 4-byte schema id, then the record
    PLAIN = "plain"  # the Avro record alone


class EpochUnit(StrEnum):
    MS = "ms"
    S = "s"
    US = "us"


class EventTimeKind(StrEnum):
    """How the event time is read, once the declared column's type is known."""

    TIMESTAMP = "timestamp"  # a TIMESTAMP (or DATE) column: ISO-8601 text in JSON, a logical type in Avro
    EPOCH = "epoch"  # an integer column counting `event_time_unit` since the epoch
    KAFKA = "kafka"  # the Kafka record's timestamp


class SourceSpec(Record):
    """How a topic's records are read. The namespace's spec comes from its settings; a query version
    reads the same topic with the same format and event time, and may declare its own schema
    (`schema_ddl` for JSON, `avro_reader_schema` for Avro)."""

    format: SourceFormat = SourceFormat.JSON
    # The record's schema as Spark DDL: declared for JSON; for Avro, derived from the .avsc.
    schema_ddl: str = DEFAULT_SCHEMA
    # Avro: the writer's schema (the .avsc text), and a version's own reader schema, if it has one.
    avro_schema: str | None = None
    avro_reader_schema: str | None = None
    avro_wire: AvroWire = AvroWire.CONFLUENT
    # A top-level column, a dotted path into structs (`meta.ts`), or "kafka".
    event_time: str = DEFAULT_EVENT_TIME
    event_time_unit: EpochUnit = EpochUnit.MS
    # A Spark datetime pattern for TIMESTAMP text other than ISO-8601 (JSON only).
    timestamp_format: str | None = None
    # Known once the schema was resolved (execution_graph.schemas); None in a spec not resolved yet.
    event_time_kind: EventTimeKind | None = None

    @model_validator(mode="after")
    def _consistent(self) -> SourceSpec:
        problems = []
        if self.format is SourceFormat.AVRO and not self.avro_schema:
            problems.append("an Avro source needs its schema: --avro-schema FILE (an .avsc)")
        if self.format is SourceFormat.JSON and (self.avro_schema or self.avro_reader_schema):
            problems.append("--avro-schema applies to --source-format avro only")
        if self.format is SourceFormat.AVRO and self.timestamp_format:
            problems.append("--timestamp-format applies to JSON text; Avro carries timestamps as logical types")
        if not self.event_time.strip() or any(not part for part in self.event_time.split(".")):
            problems.append(f"--event-time {self.event_time!r} is not a column or a dotted path such as meta.ts")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def uses_kafka_time(self) -> bool:
        return self.event_time == KAFKA_EVENT_TIME

    @property
    def event_time_path(self) -> tuple[str, ...]:
        """The event time's column path in the record (empty for the Kafka timestamp)."""
        return () if self.uses_kafka_time else tuple(self.event_time.split("."))

    @property
    def json_options(self) -> dict[str, str]:
        """Options of Spark's from_json for this source (JSON only). PERMISSIVE keeps the fields it
        could read; the caller asks for the corrupt-record column if it wants to know about the rest."""
        options = {"mode": "PERMISSIVE"}
        if self.timestamp_format:
            options["timestampFormat"] = self.timestamp_format
        return options

    def describe(self) -> str:
        """One line for status, logs and errors."""
        where = "the Kafka record's timestamp" if self.uses_kafka_time else self.event_time
        unit = f" ({self.event_time_unit} since the epoch)" if self.event_time_kind is EventTimeKind.EPOCH else ""
        wire = f", {self.avro_wire} wire" if self.format is SourceFormat.AVRO else ""
        return f"{self.format}{wire}: {self.schema_ddl}; event time {where}{unit}"

    def for_version(self, schema_ddl: str | None = None, avro_reader_schema: str | None = None) -> SourceSpec:
        """This source as a query version reads it, with its own schema where it declares one."""
        changes: dict[str, object] = {}
        if schema_ddl is not None:
            changes["schema_ddl"] = schema_ddl
        if avro_reader_schema is not None:
            changes["avro_reader_schema"] = avro_reader_schema
        return self.changed(**changes) if changes else self

    def reading_identity(self) -> SourceSpec:
        """What must never change in a namespace that has routed rows: how the service graph finds
        a record's event time and dead-letters it (a replayed batch must route as it first did)."""
        return self.changed(schema_ddl="", avro_reader_schema=None, event_time_kind=None)
