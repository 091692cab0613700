"""What the service graph writes beside a record's bytes, and what each reader finds there.

A routed record keeps the source record's key and value, byte for byte; its routing metadata travels
in one Kafka header, `hotswap.route`, whose value is ASCII text of five comma-separated fields:

    kind,source partition,source offset,event time (epoch ms),source record timestamp (epoch ms)

`kind` is `data` (a row for a graph), `late` (a row in the late topic) or `marker` (a watermark
marker: only the event time is set, and the value is empty). The execution graph reads the header
(execution_graph.graph) and parses the value with its own query version's schema.

A dead letter keeps the record's key and value too, with headers `hotswap.reason` (one line naming
the field, e.g. "field created_at: 'yesterday' is not a timestamp"), `hotswap.reason_code` (one of
`DeadLetterReason`) and `hotswap.source` (`partition/offset`). A row of a poison batch (the serving
query failed on it for good) also keeps its `hotswap.route` header and names the query in
`hotswap.query`.
"""

from __future__ import annotations

from enum import StrEnum

ROUTE_HEADER = "hotswap.route"
REASON_HEADER = "hotswap.reason"
REASON_CODE_HEADER = "hotswap.reason_code"
SOURCE_HEADER = "hotswap.source"
QUERY_HEADER = "hotswap.query"


class RowKind(StrEnum):
    DATA = "data"
    LATE = "late"
    MARKER = "marker"


class DeadLetterReason(StrEnum):
    """Why a source record was dead-lettered; counted per code (`dead_letter:<code>` counters)."""

    EMPTY_RECORD = "empty_record"  # no value at all (a tombstone)
    NOT_JSON = "not_json"  # not JSON text, or not a JSON object
    NOT_AVRO = "not_avro"  # does not decode with the namespace's Avro schema
    BAD_MAGIC_BYTE = "bad_magic_byte"  # Confluent wire format expected: magic byte 0 and a schema id
    TYPE_MISMATCH = "type_mismatch"  # a field whose value contradicts its declared type
    MISSING_FIELD = "missing_field"  # a field declared NOT NULL is absent or null
    MISSING_EVENT_TIME = "missing_event_time"  # the event-time field is absent or null
    BAD_EVENT_TIME = "bad_event_time"  # the event time does not parse as a timestamp
    EVENT_TIME_OUT_OF_RANGE = "event_time_out_of_range"  # before 1970 or after 9999 less 100 years
    TOO_FAR_AHEAD = "too_far_ahead"  # more than max_time_jump ahead of the service watermark
    POISON_BATCH = "poison_batch"  # in a batch the serving query failed on for good (poison_batches = dead_letter)


def marker_route(event_time_ms: int) -> bytes:
    """The route header of a watermark marker whose event time is `event_time_ms`."""
    return f"{RowKind.MARKER},,,{event_time_ms},".encode()


def parse_route(value: bytes) -> tuple[str, int | None, int | None, int | None, int | None]:
    """The five fields of a route header: kind, source partition, source offset, event time, source
    timestamp (None where empty). For tools and tests that read graph, late or marker rows."""
    kind, partition, offset, event_time, timestamp = value.decode().split(",")

    def number(text: str) -> int | None:
        return int(text) if text else None

    return kind, number(partition), number(offset), number(event_time), number(timestamp)
