"""Reading a source record: its event time, and the reason it cannot be read, if it cannot.

The service graph forwards every record's bytes unchanged (contract/envelope.py); it reads only its
event time, and checks that the record is what the namespace declared, so a record no query could
read goes to the dead-letter topic with a reason that names the field, instead of reaching a query:

- JSON: parsed once with the schema of the version rows are routed to (`RoutingPlan.checked_schema`),
  in Spark's PERMISSIVE mode, which keeps every field it could read and flags the record when one
  contradicts its type. Only then, for that record alone, the reason is worked out field by field.
- Avro: the Confluent framing (magic byte 0, a 4-byte schema id) is checked and stripped, and the
  record decoded with the namespace's schema.

Everything is Spark SQL over the batch (no Python UDFs). ANSI mode is on in Spark 4, so nothing here
casts or multiplies a user's value with an operation that could raise: a bad value becomes a reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import types as T

from hotswap.contract.envelope import DeadLetterReason
from hotswap.contract.source import (
    CONFLUENT_HEADER_BYTES,
    EpochUnit,
    EventTimeKind,
    SourceFormat,
    SourceSpec,
)
from hotswap.contract.windows import MAX_EVENT_TIME_MS

CORRUPT = "_hotswap_corrupt"  # the corrupt-record column asked of from_json; never seen by a query
QUOTED_CHARS = 60  # how much of a bad value a reason quotes
# The record as text, for the reason of a record Spark flagged. Cast where a reason needs it, not
# carried as a column: a column would copy every record's bytes once more between Spark's stages.
RAW = "CAST(value AS STRING)"
EVENT_MS = "_event_ms"  # the event time as read, before a record that cannot be read loses it


def sql_str(value: str) -> str:
    """A Spark SQL string literal."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _column(path: tuple[str, ...]) -> str:
    return ".".join(["e", *(f"`{p.replace('`', '``')}`" for p in path)])


def _json_path(path: tuple[str, ...]) -> str:
    return "$" + "".join("['" + p.replace("\\", "\\\\").replace("'", "\\'") + "']" for p in path)


def _quote_value(text_sql: str) -> str:
    """SQL for `'<the value>'`, cut to QUOTED_CHARS."""
    return (
        f"concat('''', substr({text_sql}, 1, {QUOTED_CHARS}), "
        f"CASE WHEN length({text_sql}) > {QUOTED_CHARS} THEN '...' ELSE '' END, '''')"
    )


def _type_name(data_type: T.DataType) -> str:
    if isinstance(data_type, T.StructType | T.ArrayType | T.MapType):
        return data_type.typeName().upper()
    return data_type.simpleString().upper()


@dataclass(frozen=True)
class Reading:
    """How one batch's records are read: the namespace's source, and the Spark schema records are
    checked against."""

    spec: SourceSpec
    schema: T.StructType  # JSON: the checked version's schema; Avro: the namespace's writer schema

    def read(self, batch: DataFrame) -> DataFrame:
        """The batch's records as `partition, offset, key, value, timestamp` (as Kafka gave them),
        `ts` (event time, epoch ms; null when the record cannot be read), `reason` and `reason_code`
        (null when the record is fine)."""
        # One projection, each column reading those before it (lateral aliases): every DataFrame step
        # costs the driver an analysis of the whole plan, at every batch. `e`, `_event_ms` and `why`
        # stay as columns; nothing after reads them, and Spark prunes them.
        return batch.selectExpr(
            "partition",
            "offset",
            "key",
            "value",
            "timestamp",
            f"{self._decode()} AS e",
            f"{self._event_time_ms()} AS {EVENT_MS}",
            f"{self._reason()} AS why",
            f"CASE WHEN why IS NULL THEN {EVENT_MS} END AS ts",
            "why.reason AS reason",
            "why.code AS reason_code",
        )

    # -- decoding -------------------------------------------------------------------------------
    def _decode(self) -> str:
        if self.spec.format is SourceFormat.AVRO:
            assert self.spec.avro_schema is not None
            payload = "substr(value, 6)" if self.spec.avro_wire == "confluent" else "value"
            return f"from_avro({payload}, {sql_str(self.spec.avro_schema)}, map('mode', 'PERMISSIVE'))"
        # A new StructType: add() would change the checked schema in place.
        fields = T.StructType([*self.schema.fields, T.StructField(CORRUPT, T.StringType())])
        options = {**self.spec.json_options, "columnNameOfCorruptRecord": CORRUPT}
        option_sql = ", ".join(f"{sql_str(k)}, {sql_str(v)}" for k, v in options.items())
        # The schema as JSON, which from_json takes as well as DDL and which quotes any field name.
        return f"from_json(CAST(value AS STRING), {sql_str(fields.json())}, map({option_sql}))"

    # -- the event time ------------------------------------------------------------------------
    def _event_time_raw(self) -> str:
        if self.spec.event_time_kind is EventTimeKind.KAFKA:
            return "timestamp"
        return _column(self.spec.event_time_path)

    def _event_time_ms(self) -> str:
        raw = self._event_time_raw()
        kind = self.spec.event_time_kind
        if kind in (EventTimeKind.KAFKA, EventTimeKind.TIMESTAMP):
            return f"unix_millis(CAST({raw} AS TIMESTAMP))"
        unit = self.spec.event_time_unit
        if unit is EpochUnit.S:
            return f"try_multiply(CAST({raw} AS BIGINT), 1000)"
        if unit is EpochUnit.US:
            return f"CAST({raw} AS BIGINT) DIV 1000"
        return f"CAST({raw} AS BIGINT)"

    # -- reasons -------------------------------------------------------------------------------
    def _reason(self) -> str:
        """A struct<reason, code> naming why the record cannot be read, or null. Checked in order;
        the costly field-by-field search runs only for a record Spark flagged."""
        branches = [("value IS NULL", _why("'empty record (no value)'", DeadLetterReason.EMPTY_RECORD))]
        branches += self._format_branches()
        branches += self._required_branches()
        if self.spec.event_time_kind is not EventTimeKind.KAFKA:
            missing = sql_str(f"missing or null event time field {self.spec.event_time}")
            branches.append((f"{self._event_time_raw()} IS NULL", _why(missing, DeadLetterReason.MISSING_EVENT_TIME)))
        where = "the Kafka record's timestamp" if self.spec.uses_kafka_time else f"field {self.spec.event_time}"
        out_of_range = (
            f"concat({sql_str(where + ': ')}, CAST({self._event_time_raw()} AS STRING), "
            "' is out of range (1970 to 9899)')"
        )
        branches.append(
            (
                f"{EVENT_MS} IS NULL OR {EVENT_MS} < 0 OR {EVENT_MS} > {MAX_EVENT_TIME_MS}",
                _why(out_of_range, DeadLetterReason.EVENT_TIME_OUT_OF_RANGE),
            )
        )
        return "CASE " + " ".join(f"WHEN {condition} THEN {why}" for condition, why in branches) + " END"

    def _required_branches(self) -> list[tuple[str, str]]:
        """Fields declared NOT NULL (in a struct that is there) that are absent or null."""
        if self.spec.format is SourceFormat.AVRO:
            return []  # Avro cannot leave a non-nullable field out: such a record does not decode
        branches = []
        for path in _required_paths(self.schema):
            if path == self.spec.event_time_path:
                continue  # the event time has a reason of its own
            present = [f"{_column(path[:i])} IS NOT NULL" for i in range(1, len(path))]
            condition = " AND ".join([*present, f"{_column(path)} IS NULL"])
            missing = sql_str(f"missing or null field {'.'.join(path)}")
            branches.append((condition, _why(missing, DeadLetterReason.MISSING_FIELD)))
        return branches

    def _format_branches(self) -> list[tuple[str, str]]:
        if self.spec.format is SourceFormat.AVRO:
            return self._avro_branches()
        return [(f"e.{CORRUPT} IS NOT NULL", self._json_reason())]

    def _avro_branches(self) -> list[tuple[str, str]]:
        branches: list[tuple[str, str]] = []
        if self.spec.avro_wire == "confluent":
            framing = (
                "concat('not in Confluent wire format: magic byte 0x', hex(substr(value, 1, 1)), "
                "', expected 0x00 and a 4-byte schema id before the record')"
            )
            branches.append(
                (
                    f"octet_length(value) < {CONFLUENT_HEADER_BYTES} OR substr(value, 1, 1) != X'00'",
                    _why(framing, DeadLetterReason.BAD_MAGIC_BYTE),
                )
            )
        required = [f for f in self.schema.fields if not f.nullable]
        checked = required or list(self.schema.fields)
        joiner = " OR " if required else " AND "
        undecoded = joiner.join(f"{_column((f.name,))} IS NULL" for f in checked)
        not_avro = sql_str("does not decode as an Avro record of the namespace's schema")
        branches.append((f"e IS NULL OR ({undecoded})", _why(not_avro, DeadLetterReason.NOT_AVRO)))
        return branches

    def _json_reason(self) -> str:
        """For a record Spark flagged: not JSON, not an object, or the first field (event time first,
        then the deepest fields first) whose value contradicts its declared type."""
        cases = [
            (f"try_parse_json({RAW}) IS NULL", _why("'not valid JSON'", DeadLetterReason.NOT_JSON)),
            (f"NOT startswith(ltrim({RAW}), '{{')", _why("'not a JSON object'", DeadLetterReason.NOT_JSON)),
        ]
        fields = _leaves_first(self.schema)
        time_path = self.spec.event_time_path
        if time_path in fields:
            fields.remove(time_path)
            fields.insert(0, time_path)
        for path in fields:
            data_type = _type_at(self.schema, path)
            text = f"get_json_object({RAW}, {sql_str(_json_path(path))})"
            is_time = path == time_path
            expected = (
                "a timestamp" if isinstance(data_type, T.TimestampType | T.DateType) else (f"a {_type_name(data_type)}")
            )
            reason = (
                f"concat({sql_str('field ' + '.'.join(path) + ': ')}, {_quote_value(text)}, "
                f"{sql_str(' is not ' + expected)})"
            )
            code = DeadLetterReason.BAD_EVENT_TIME if is_time else DeadLetterReason.TYPE_MISMATCH
            cases.append((f"{text} IS NOT NULL AND {_column(path)} IS NULL", _why(reason, code)))
        whens = " ".join(f"WHEN {condition} THEN {why}" for condition, why in cases)
        fallback = _why("'does not match the declared schema'", DeadLetterReason.TYPE_MISMATCH)
        return f"CASE {whens} ELSE {fallback} END"


def _why(reason_sql: str, code: DeadLetterReason) -> str:
    return f"named_struct('reason', {reason_sql}, 'code', {sql_str(code)})"


def _required_paths(schema: T.StructType, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Paths of fields declared NOT NULL, parents before their fields."""
    out: list[tuple[str, ...]] = []
    for field in schema.fields:
        path = (*prefix, field.name)
        if not field.nullable:
            out.append(path)
        if isinstance(field.dataType, T.StructType):
            out += _required_paths(field.dataType, path)
    return out


def _leaves_first(schema: T.StructType, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every field path, the fields inside a struct before the struct itself."""
    out: list[tuple[str, ...]] = []
    for field in schema.fields:
        path = (*prefix, field.name)
        if isinstance(field.dataType, T.StructType):
            out += _leaves_first(field.dataType, path)
        out.append(path)
    return out


def _type_at(schema: T.StructType, path: tuple[str, ...]) -> T.DataType:
    data_type: T.DataType = schema
    for part in path:
        assert isinstance(data_type, T.StructType)
        data_type = data_type[part].dataType
    return data_type
