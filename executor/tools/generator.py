"""The generator source: seeded, reproducible events for demos and tests.

Event i has event time start_ts + i * time_scale * 1000 / rate, minus a bounded random disorder;
a fraction of events is made late on purpose. The sequence depends only on the spec (same seed,
same events); the wall clock only paces sending at `rate` events per second.

Two profiles, each as JSON or as Avro (Confluent's wire format: magic byte 0, a 4-byte schema id,
then the record):
- `events`: the demo's flat `{key, value, ts}`, keyed by `key`, `ts` in epoch milliseconds;
- `orders`: nested order events, keyed by `order_id`: a customer struct, an amount, a status, a
  channel and `created_at`, as ISO-8601 text with mixed UTC offsets in JSON, and as a
  `timestamp-millis` in Avro (the schema is examples/orders.avsc).
"""

from __future__ import annotations

import io
import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from enum import StrEnum
from typing import Any

from kafka import KafkaProducer

from hotswap.contract.errors import ConfigError
from hotswap.contract.models import now_ms
from hotswap.contract.settings import KafkaSettings


class Profile(StrEnum):
    EVENTS = "events"
    ORDERS = "orders"


class Encoding(StrEnum):
    JSON = "json"
    AVRO = "avro"


KEY_PREFIX = "k"  # the events profile's keys: k0, k1, ...
COUNTRIES = ("FR", "DE", "US", "IN", "JP", "BR")
STATUSES = ("created", "paid", "shipped", "cancelled")
CHANNELS = ("web", "app", "store")
# UTC offsets of created_at in the orders profile, in minutes: Z, +01:00, -05:00, +05:30.
OFFSETS_MIN = (0, 60, -300, 330)

# The Avro schemas the generator writes; examples/events.avsc and examples/orders.avsc hold the same
# (a unit test keeps them equal).
EVENTS_AVRO: dict[str, Any] = {
    "type": "record",
    "name": "Event",
    "namespace": "dev.hotswap",
    "fields": [
        {"name": "key", "type": "string"},
        {"name": "value", "type": "double"},
        {"name": "ts", "type": "long"},
    ],
}
ORDERS_AVRO: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "dev.hotswap",
    "fields": [
        {"name": "order_id", "type": "string"},
        {
            "name": "customer",
            "type": {
                "type": "record",
                "name": "Customer",
                "fields": [{"name": "id", "type": "long"}, {"name": "country", "type": "string"}],
            },
        },
        {"name": "amount", "type": "double"},
        {"name": "status", "type": "string"},
        {"name": "channel", "type": "string"},
        {"name": "created_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    ],
}


@dataclass(frozen=True)
class GeneratorSpec:
    rate: float = 200.0
    keys: int = 10
    seed: int = 42
    count: int | None = None
    duration_s: float | None = None
    disorder_ms: int = 0
    late_fraction: float = 0.0
    late_by_ms: int = 300_000
    start_ts: int | None = None
    time_scale: float = 1.0
    profile: Profile = Profile.EVENTS
    encoding: Encoding = Encoding.JSON
    schema_id: int = 1  # the schema id written in Confluent's framing (Avro)

    def __post_init__(self) -> None:
        if self.rate <= 0:
            raise ConfigError("--rate must be positive")
        if self.keys < 1:
            raise ConfigError("--keys must be at least 1")
        if not 0.0 <= self.late_fraction <= 1.0:
            raise ConfigError("--late-fraction must be between 0 and 1")
        if self.disorder_ms < 0 or self.late_by_ms < 0:
            raise ConfigError("--disorder-ms and --late-by-ms cannot be negative")
        if self.time_scale <= 0:
            raise ConfigError("--time-scale must be positive")
        if not 0 <= self.schema_id < 2**31:
            raise ConfigError("--schema-id must fit in 4 bytes")

    @property
    def limit(self) -> int | None:
        """How many events to send: --count, or --duration worth at --rate, or no limit."""
        if self.count is not None:
            return self.count
        if self.duration_s is not None:
            return int(self.duration_s * self.rate)
        return None

    @property
    def avro_schema(self) -> dict[str, Any]:
        return ORDERS_AVRO if self.profile is Profile.ORDERS else EVENTS_AVRO


@dataclass(frozen=True)
class Event:
    """One event of the `events` profile."""

    key: str
    value: float
    ts: int

    def to_json(self) -> bytes:
        return json.dumps({"key": self.key, "value": self.value, "ts": self.ts}).encode()


@dataclass(frozen=True)
class Generated:
    """One record as sent: its Kafka key and value, the event time it stands for (epoch ms), and
    the fields it was made from."""

    key: bytes
    value: bytes
    ts: int
    fields: dict[str, Any]
    # The events profile's key number: key k<i> goes to the i-th partition (mod the topic's count),
    # where Kafka's hash put k0, k1 and k2 all in one partition of two. None: Kafka's partitioner.
    key_number: int | None = None


def event_times(spec: GeneratorSpec, start_ts: int, rng: random.Random) -> Iterator[int]:
    step_ms = spec.time_scale * 1000.0 / spec.rate
    i = 0
    while spec.limit is None or i < spec.limit:
        ts = start_ts + int(i * step_ms)
        if spec.disorder_ms:
            ts -= rng.randint(0, spec.disorder_ms)
        if spec.late_fraction and rng.random() < spec.late_fraction:
            ts -= spec.late_by_ms
        yield ts
        i += 1


def events(spec: GeneratorSpec, start_ts: int) -> Iterator[Event]:
    """The `events` profile's events."""
    rng = random.Random(spec.seed)
    for ts in event_times(spec, start_ts, rng):
        yield Event(key=f"{KEY_PREFIX}{rng.randrange(spec.keys)}", value=round(rng.uniform(0, 100), 3), ts=ts)


def orders(spec: GeneratorSpec, start_ts: int) -> Iterator[dict[str, Any]]:
    """The `orders` profile's orders, with `created_at` as epoch ms (each encoding writes it its way)."""
    rng = random.Random(spec.seed)
    for i, ts in enumerate(event_times(spec, start_ts, rng)):
        yield {
            "order_id": f"o{spec.seed}-{i}",
            "customer": {"id": rng.randrange(spec.keys), "country": rng.choice(COUNTRIES)},
            "amount": round(rng.uniform(1, 500), 2),
            "status": rng.choice(STATUSES),
            "channel": rng.choice(CHANNELS),
            "created_at": ts,
            "offset_min": rng.choice(OFFSETS_MIN),
        }


def iso_time(ts_ms: int, offset_min: int) -> str:
    """ISO-8601 text of an instant, in a UTC offset: `2026-11-24T10:00:00.000Z`, `...+05:30`."""
    zone = UTC if offset_min == 0 else timezone(timedelta(minutes=offset_min))
    text = datetime.fromtimestamp(ts_ms / 1000, zone).isoformat(timespec="milliseconds")
    return text.replace("+00:00", "Z")


def generate(spec: GeneratorSpec, start_ts: int) -> Iterator[Generated]:
    """The spec's records, encoded as they are sent."""
    encode = _avro_encoder(spec) if spec.encoding is Encoding.AVRO else None
    if spec.profile is Profile.ORDERS:
        for order in orders(spec, start_ts):
            offset_min = order.pop("offset_min")
            ts = order["created_at"]
            if encode is None:
                value = json.dumps({**order, "created_at": iso_time(ts, offset_min)}).encode()
            else:
                value = encode(order)
            yield Generated(key=order["order_id"].encode(), value=value, ts=ts, fields=order)
        return
    for event in events(spec, start_ts):
        fields = {"key": event.key, "value": event.value, "ts": event.ts}
        value = event.to_json() if encode is None else encode(fields)
        number = int(event.key.removeprefix(KEY_PREFIX))
        yield Generated(key=event.key.encode(), value=value, ts=event.ts, fields=fields, key_number=number)


def record_partition(producer: KafkaProducer, topic: str, record: Generated) -> int | None:
    """Where a record goes: an events-profile key's own partition, so that a few keys still fill
    every partition; None (Kafka's partitioner) for the others. The topic's partitions come from the
    producer's metadata, which a partition added to the topic joins as it does for Kafka's."""
    if record.key_number is None:
        return None
    partitions = sorted(producer.partitions_for(topic) or ())
    return partitions[record.key_number % len(partitions)] if partitions else None


def _avro_encoder(spec: GeneratorSpec) -> Callable[[dict[str, Any]], bytes]:
    import fastavro  # only the Avro encoding needs it

    schema = fastavro.parse_schema(spec.avro_schema)
    framing = b"\x00" + spec.schema_id.to_bytes(4, "big")

    def encode(record: dict[str, Any]) -> bytes:
        out = io.BytesIO()
        out.write(framing)
        fastavro.schemaless_writer(out, schema, record)
        return out.getvalue()

    return encode


@dataclass(frozen=True)
class GeneratorReport:
    sent: int
    first_ts: int | None
    last_ts: int | None
    elapsed_s: float


def produce(
    kafka: KafkaSettings,
    spec: GeneratorSpec,
    topic: str,
    stop: threading.Event | None = None,
    on_progress: Callable[[GeneratorReport], None] | None = None,
    progress_every_s: float = 5.0,
) -> GeneratorReport:
    """Send events to `topic`, paced at spec.rate; returns what was sent (stops early on `stop`)."""
    start_ts = spec.start_ts if spec.start_ts is not None else now_ms()
    producer = KafkaProducer(**kafka.kafka_python_config(), acks="all", linger_ms=5)
    began = time.monotonic()
    next_report = began + progress_every_s
    sent = 0
    first_ts: int | None = None
    last_ts: int | None = None
    try:
        for record in generate(spec, start_ts):
            if stop is not None and stop.is_set():
                break
            first_ts = record.ts if first_ts is None else first_ts
            last_ts = record.ts
            partition = record_partition(producer, topic, record)
            producer.send(topic, key=record.key, value=record.value, partition=partition)
            sent += 1
            due = began + sent / spec.rate
            now = time.monotonic()
            if due > now:
                if stop is not None:
                    stop.wait(due - now)
                else:
                    time.sleep(due - now)
            if on_progress is not None and now >= next_report:
                next_report = now + progress_every_s
                on_progress(GeneratorReport(sent, first_ts, last_ts, now - began))
    finally:
        producer.flush(timeout=30)
        producer.close(timeout=10)
    return GeneratorReport(sent, first_ts, last_ts, time.monotonic() - began)
