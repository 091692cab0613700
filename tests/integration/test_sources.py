"""Issue 18: any topic, any schema, on the real stack.

Nested JSON orders with ISO-8601 times in four offsets over four partitions, swapped under load to a
query that reads a field added through `submit --source-schema`; the same orders as Confluent-framed
Avro, swapped under load; epoch seconds; the Kafka record's own timestamp; and every kind of
unreadable record, dead-lettered with its reason and counted. The oracle decodes the source topic
itself (json, datetime.fromisoformat, fastavro) and recomputes every window; it reads nothing of
hotswap's parsing or window code.
"""

from __future__ import annotations

import io
import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import fastavro
import pytest
from kafka import KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient
from pyspark.sql import DataFrame, SparkSession

from hotswap.contract.journal import SwapRecord
from hotswap.contract.settings import Settings
from hotswap.contract.status import Status
from hotswap.executor.control.topics import Topics
from hotswap.executor.operator.client import Client, redis_client
from hotswap.executor.tools.generator import Encoding, GeneratorSpec, Profile
from hotswap.service_graph import query as service_graph_query
from hotswap.service_graph.coverage import OffsetLog, PlannedRange
from hotswap.service_graph.frames import BatchStats, route_and_write
from hotswap.service_graph.kafka_io import SourceOffsets
from hotswap.service_sink.audit import read_results
from tests.conftest import wait_until
from tests.integration.conftest import Services
from tests.integration.harness import (
    REPO,
    Record,
    committed_watermark,
    continuous_load,
    executor_running,
    final_graph,
    namespace_settings,
    read_topic,
)
from tests.integration.oracle import SourceEvent, Truth, Version, assert_invariants, settle

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLES = REPO / "examples"
ORDERS_PER_COUNTRY = EXAMPLES / "orders_per_country.sql"
ORDERS_PER_CHANNEL = EXAMPLES / "orders_per_channel.sql"
ORDERS_DDL = (EXAMPLES / "orders.ddl").read_text().strip()
ORDERS_WITH_CHANNEL_DDL = (EXAMPLES / "orders_with_channel.ddl").read_text().strip()
ORDERS_AVSC = EXAMPLES / "orders.avsc"
ORDERS_SCHEMA = fastavro.parse_schema(json.loads(ORDERS_AVSC.read_text()))
T0 = 1_700_000_000_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# -- the oracle's own reading of the source topic ---------------------------------------------------
def epoch_ms(moment: datetime) -> int:
    return (moment - EPOCH) // timedelta(milliseconds=1)


def order_event(fields: dict[str, Any], created_at: datetime, record: Any) -> SourceEvent | None:
    ts = epoch_ms(created_at)
    if ts < 0:
        return None  # out of range on purpose: dead-lettered
    return SourceEvent(
        record.partition, record.offset, fields["order_id"], float(fields["amount"]), ts, int(record.timestamp), fields
    )


def json_order(record: Any) -> SourceEvent | None:
    fields = json.loads(record.value)
    return order_event(fields, datetime.fromisoformat(fields["created_at"]), record)


def avro_order(record: Any) -> SourceEvent | None:
    if record.value[:1] != b"\x00":
        return None
    try:
        fields = fastavro.schemaless_reader(io.BytesIO(record.value[5:]), ORDERS_SCHEMA)
    except (EOFError, ValueError):
        return None  # unreadable on purpose
    assert isinstance(fields, dict)
    return order_event(fields, fields["created_at"], record)


def orders_and_revenue(events: list[SourceEvent]) -> dict[str, float]:
    return {"orders": len(events), "revenue": sum(float(e.fields["amount"]) for e in events)}


PER_COUNTRY = Version(
    "orders_per_country",
    10_000,
    orders_and_revenue,
    group=lambda e: e.fields["customer"]["country"],
    group_column="country",
)
PER_CHANNEL = Version(
    "orders_per_channel",
    20_000,
    orders_and_revenue,
    group=lambda e: e.fields["channel"],
    group_column="channel",
    keep=lambda e: e.fields["status"] != "cancelled",
)


# -- running a namespace of orders ----------------------------------------------------------------
@dataclass(frozen=True)
class Run:
    settings: Settings
    truth: Truth
    swap: SwapRecord
    status: Status
    dead: list[Record]

    def reasons(self) -> dict[bytes, str]:
        return {r.value: r.headers["hotswap.reason"].decode() for r in self.dead}


def send(settings: Settings, values: list[bytes]) -> None:
    producer = KafkaProducer(**settings.kafka_python_config(), acks="all")
    for i, value in enumerate(values):
        producer.send(settings.source_topic, key=b"bad", value=value, partition=i % settings.source_partitions)
    producer.flush(timeout=30)
    producer.close(timeout=10)


def run_orders(
    settings: Settings, spark: SparkSession, encoding: Encoding, malformed: list[bytes], **submit: Any
) -> Run:
    """Serve ORDERS_PER_COUNTRY under a load of orders, send `malformed` records, swap to
    ORDERS_PER_CHANNEL (10 s to 20 s windows) under load, then stop the load and settle."""
    client = Client(settings.control, settings.kafka, settings.pipeline, redis_client(settings.control))
    # 300 orders/s over 50 customers, event time 10x the clock, up to 800 ms out of order (lateness 2 s).
    spec = GeneratorSpec(
        rate=300,
        keys=50,
        seed=18,
        disorder_ms=800,
        time_scale=10,
        start_ts=T0,
        profile=Profile.ORDERS,
        encoding=encoding,
    )
    decode = avro_order if encoding is Encoding.AVRO else json_order
    with executor_running(settings, spark, ORDERS_PER_COUNTRY), continuous_load(settings, spec) as load:
        wait_until(lambda: committed_watermark(client, "orders_per_country") > T0 + 20_000, 120, "first windows")
        send(settings, malformed)
        record = client.submit(ORDERS_PER_CHANNEL, **submit)
        done = client.wait_until_done(record.id, 180)
        cut = int(done.cut_window_end or 0)
        wait_until(lambda: committed_watermark(client, "orders_per_channel") >= cut + 40_000, 120, "new windows")
        load.stop()
        truth = settle(settings, final_graph(client, "orders_per_channel"), decode=decode)
        status = client.status()
    return Run(settings, truth, done, status, read_topic(settings, settings.names.dead_letter_topic))


def orders_settings(tmp_path_factory: pytest.TempPathFactory, services: Services, **source: Any) -> Settings:
    home = tmp_path_factory.mktemp("orders")
    return namespace_settings(
        home, services.bootstrap, services.redis_url, "o", source_partitions=4, event_time="created_at", **source
    )


def order(**changes: Any) -> bytes:
    base: dict[str, Any] = {
        "order_id": "bad-1",
        "customer": {"id": 1, "country": "FR"},
        "amount": 10.0,
        "status": "paid",
        "channel": "web",
        "created_at": "2023-11-14T22:14:00Z",
    }
    base.update(changes)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


# Each kind of unreadable JSON record, with the reason its dead letter must carry.
JSON_MALFORMED = {
    "not_json": [(b"{not json", "not valid JSON"), (b"[1, 2, 3]", "not a JSON object")],
    "missing_event_time": [
        (order(created_at=...), "missing or null event time field created_at"),
        (order(created_at=None), "missing or null event time field created_at"),
    ],
    "bad_event_time": [(order(created_at="yesterday"), "field created_at: 'yesterday' is not a timestamp")],
    "event_time_out_of_range": [
        (
            order(created_at="1960-01-01T00:00:00Z"),
            "field created_at: 1960-01-01 00:00:00 is out of range (1970 to 9899)",
        )
    ],
    "type_mismatch": [
        (order(amount="lots"), "field amount: 'lots' is not a DOUBLE"),
        (order(customer={"id": "c-7", "country": "FR"}), "field customer.id: 'c-7' is not a BIGINT"),
    ],
    "missing_field": [(order(order_id=None), "missing or null field order_id")],
}


@pytest.fixture(scope="module")
def json_orders(services: Services, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Run:
    settings = orders_settings(tmp_path_factory, services, source_schema=ORDERS_DDL)
    malformed = [value for cases in JSON_MALFORMED.values() for value, _ in cases]
    return run_orders(settings, spark, Encoding.JSON, malformed, source_schema=ORDERS_WITH_CHANNEL_DDL)


def test_nested_json_orders_swap_to_a_query_reading_an_added_field_keeps_every_invariant(json_orders: Run) -> None:
    run = json_orders
    cut = run.truth.cut(run.swap)
    assert cut % 20_000 == 0  # 10 s -> 20 s
    offsets = {e.fields["created_at"][-6:] if e.fields["created_at"][-1] != "Z" else "Z" for e in run.truth.events}
    assert offsets == {"Z", "+01:00", "-05:00", "+05:30"}
    assert {e.partition for e in run.truth.events} == {0, 1, 2, 3}
    results = read_results(run.settings.kafka, run.settings.sink_topic)
    assert_invariants(results, run.truth.on_time, [PER_COUNTRY, PER_CHANNEL], [cut], run.truth.closed_until)
    # One key per result: the window start and the group column, nothing else.
    for r in results:
        group = PER_COUNTRY.group_column if r.query_id == PER_COUNTRY.query_id else PER_CHANNEL.group_column
        assert json.loads(r.key) == {"window_start": r.window_start, group: r.row[group]}


def test_status_and_the_journal_show_each_versions_schema(json_orders: Run) -> None:
    graphs = json_orders.status.graphs
    assert "channel" not in graphs["orders_per_country"].source_schema
    assert "channel STRING" in graphs["orders_per_channel"].source_schema
    assert json_orders.swap.source is not None
    assert json_orders.swap.source.source_schema == ORDERS_WITH_CHANNEL_DDL


@pytest.mark.parametrize("code", list(JSON_MALFORMED))
def test_each_kind_of_unreadable_json_record_is_dead_lettered_with_its_reason_and_counted(
    json_orders: Run, code: str
) -> None:
    expected = dict(JSON_MALFORMED[code])
    found = {value: reason for value, reason in json_orders.reasons().items() if value in expected}
    assert found == expected
    codes = Counter(r.headers["hotswap.reason_code"].decode() for r in json_orders.dead)
    assert codes[code] == len(expected)
    assert json_orders.status.dead_letters.get(code) == len(expected)


def test_nothing_else_was_dead_lettered_and_the_counts_add_up(json_orders: Run) -> None:
    assert len(json_orders.dead) == sum(len(cases) for cases in JSON_MALFORMED.values())
    assert json_orders.status.dead_letter_records == len(json_orders.dead)


AVRO_MALFORMED = {
    "bad_magic_byte": [
        (
            b"\x01\x00\x00\x00\x01abc",
            "not in Confluent wire format: magic byte 0x01, expected 0x00 and a 4-byte schema id before the record",
        ),
        (
            b"\x00\x01",
            "not in Confluent wire format: magic byte 0x00, expected 0x00 and a 4-byte schema id before the record",
        ),
    ],
    # A string whose length is -1: no Avro decoder reads past it.
    "not_avro": [(b"\x00\x00\x00\x00\x01\x01", "does not decode as an Avro record of the namespace's schema")],
}


@pytest.fixture(scope="module")
def avro_orders(services: Services, spark: SparkSession, tmp_path_factory: pytest.TempPathFactory) -> Run:
    settings = orders_settings(tmp_path_factory, services, source_format="avro", avro_schema=ORDERS_AVSC)
    malformed = [value for cases in AVRO_MALFORMED.values() for value, _ in cases]
    return run_orders(settings, spark, Encoding.AVRO, malformed)


def test_confluent_avro_orders_swap_under_load_keeps_every_invariant(avro_orders: Run) -> None:
    run = avro_orders
    cut = run.truth.cut(run.swap)
    assert cut % 20_000 == 0
    results = read_results(run.settings.kafka, run.settings.sink_topic)
    assert_invariants(results, run.truth.on_time, [PER_COUNTRY, PER_CHANNEL], [cut], run.truth.closed_until)


@pytest.mark.parametrize("code", list(AVRO_MALFORMED))
def test_each_kind_of_unreadable_avro_record_is_dead_lettered_with_its_reason_and_counted(
    avro_orders: Run, code: str
) -> None:
    expected = dict(AVRO_MALFORMED[code])
    found = {value: reason for value, reason in avro_orders.reasons().items() if value in expected}
    assert found == expected
    assert avro_orders.status.dead_letters.get(code) == len(expected)
    assert len(avro_orders.dead) == sum(len(cases) for cases in AVRO_MALFORMED.values())


# -- other event-time forms -------------------------------------------------------------------------
def count_query(tmp_path: Path, key: str, value: str) -> Path:
    path = tmp_path / f"count_by_{key}.sql"
    path.write_text(
        f"SELECT window.start AS window_start, window.end AS window_end, {key}, count(*) AS n, sum({value}) AS total "
        f"FROM events GROUP BY window(event_time, '10 seconds'), {key}"
    )
    return path


def n_and_total(events: list[SourceEvent]) -> dict[str, float]:
    return {"n": len(events), "total": sum(e.value for e in events)}


def spread(count: int, partitions: int) -> Iterator[tuple[int, int]]:
    """(index, partition) for `count` records, round robin."""
    for i in range(count):
        yield i, i % partitions


def test_epoch_seconds_in_a_nested_field_are_the_event_time(
    services: Services, spark: SparkSession, tmp_path: Path
) -> None:
    settings = namespace_settings(
        tmp_path / "home",
        services.bootstrap,
        services.redis_url,
        "s",
        source_schema="k STRING, v DOUBLE, meta STRUCT<t: BIGINT>",
        event_time="meta.t",
        event_time_unit="s",
    )
    client = Client(settings.control, settings.kafka, settings.pipeline, redis_client(settings.control))
    query = count_query(tmp_path, "k", "v")
    t0_s = T0 // 1000
    # 20 records per second of event time over 60 s, in whole seconds, keys k0..k4.
    values = [
        json.dumps({"k": f"k{i % 5}", "v": float(i % 17), "meta": {"t": t0_s + i // 20}}).encode()
        for i, _ in spread(1200, 2)
    ]
    with executor_running(settings, spark, query):
        send_values(settings, values)
        truth = settle(settings, final_graph(client, query.stem), decode=epoch_seconds_event)
    version = Version(query.stem, 10_000, n_and_total, group_column="k")
    assert truth.closed_until >= T0 + 50_000
    assert_invariants(
        read_results(settings.kafka, settings.sink_topic), truth.on_time, [version], [], truth.closed_until
    )


def epoch_seconds_event(record: Any) -> SourceEvent | None:
    body = json.loads(record.value)
    return SourceEvent(
        record.partition,
        record.offset,
        body["k"],
        float(body["v"]),
        int(body["meta"]["t"]) * 1000,
        int(record.timestamp),
    )


def kafka_time_settings(services: Services, tmp_path: Path, prefix: str) -> Settings:
    return namespace_settings(
        tmp_path / "home",
        services.bootstrap,
        services.redis_url,
        prefix,
        source_schema="key STRING NOT NULL, value DOUBLE NOT NULL",
        event_time="kafka",
    )


def recent_t0() -> int:
    """An event time an hour ago, on a 10 s boundary. A record's own timestamp is what Kafka's
    retention (24 h on the test broker) goes by: a record stamped years ago is deleted at its next
    check, whenever that falls in the test."""
    return (time.time_ns() // 1_000_000 - 3_600_000) // 10_000 * 10_000


def send_stamped(settings: Settings, steps: range, t0: int, disorder_ms: int = 0) -> None:
    """Rows i of `steps`, round robin over two partitions, stamped t0 + 50 ms * i (less up to
    `disorder_ms`) by the producer."""
    producer = KafkaProducer(**settings.kafka_python_config(), acks="all")
    for i in steps:
        ts = t0 + i * 50 - ((i * 7919) % disorder_ms if disorder_ms else 0)
        value = json.dumps({"key": f"k{i % 4}", "value": float(i % 13)}).encode()
        producer.send(settings.source_topic, value=value, partition=i % 2, timestamp_ms=ts)
    producer.flush(timeout=30)
    producer.close(timeout=10)


def test_the_kafka_records_own_timestamp_is_the_event_time(
    services: Services, spark: SparkSession, tmp_path: Path
) -> None:
    settings = kafka_time_settings(services, tmp_path, "k")
    client = Client(settings.control, settings.kafka, settings.pipeline, redis_client(settings.control))
    query = count_query(tmp_path, "key", "value")
    t0 = recent_t0()
    with executor_running(settings, spark, query):
        # The record's timestamp, set by the producer, 50 ms apart with up to 400 ms of disorder.
        send_stamped(settings, range(1200), t0, disorder_ms=400)
        truth = settle(settings, final_graph(client, query.stem), decode=kafka_time_event)
    version = Version(query.stem, 10_000, n_and_total)
    assert truth.closed_until >= t0 + 50_000
    assert_invariants(
        read_results(settings.kafka, settings.sink_topic), truth.on_time, [version], [], truth.closed_until
    )


def test_a_batch_whose_read_skipped_a_partition_is_replayed_and_loses_no_row(
    services: Services, spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = kafka_time_settings(services, tmp_path, "r")
    client = Client(settings.control, settings.kafka, settings.pipeline, redis_client(settings.control))
    query = count_query(tmp_path, "key", "value")
    skipped: list[str] = []

    def skipping_partition_1(read: DataFrame, *args: Any) -> BatchStats:
        # Spark's Kafka reader, with failOnDataLoss=false, drops the rest of a range it cannot fetch
        # at that moment: here the first batch that holds rows of partition 1 loses all of them.
        if not skipped and read.where("partition = 1").limit(1).count():
            skipped.append("partition 1")
            return route_and_write(read.where("partition != 1"), *args)
        return route_and_write(read, *args)

    monkeypatch.setattr(service_graph_query, "route_and_write", skipping_partition_1)
    t0 = recent_t0()
    with executor_running(settings, spark, query):
        send_stamped(settings, range(1200), t0)
        truth = settle(settings, final_graph(client, query.stem), decode=kafka_time_event)
        status = client.status()
    assert skipped == ["partition 1"]
    assert (status.service.skipped_reads, status.expired_records) == (1, 0)
    assert truth.closed_until >= t0 + 50_000
    version = Version(query.stem, 10_000, n_and_total)
    assert_invariants(
        read_results(settings.kafka, settings.sink_topic), truth.on_time, [version], [], truth.closed_until
    )


def test_rows_retention_deleted_before_they_were_read_are_counted_as_expired(
    services: Services, spark: SparkSession, tmp_path: Path
) -> None:
    settings = kafka_time_settings(services, tmp_path, "x")
    client = Client(settings.control, settings.kafka, settings.pipeline, redis_client(settings.control))
    query = count_query(tmp_path, "key", "value")
    t0 = recent_t0()
    with executor_running(settings, spark, query):
        send_stamped(settings, range(600), t0)  # 300 rows in each partition, offsets 0-299
        wait_until(lambda: routed_through(client, {"0": 299, "1": 299}), 120, "the first rows to be routed")
    # While no executor runs: 300 more rows in each partition, then Kafka's log start moves past 100
    # of partition 0's and all 300 of partition 1's, as retention would.
    send_stamped(settings, range(600, 1200), t0)
    admin = KafkaAdminClient(**settings.kafka_python_config())
    try:
        topic = settings.source_topic
        admin.delete_records({TopicPartition(topic, 0): 400, TopicPartition(topic, 1): 600})
    finally:
        admin.close()
    with executor_running(settings, spark, query):
        send_stamped(settings, range(1200, 1400), t0)  # rows after the gap in both partitions
        truth = settle(settings, final_graph(client, query.stem), decode=kafka_time_event)
        status = client.status()
    assert (status.expired_records, status.service.skipped_reads) == (100 + 300, 0)
    version = Version(query.stem, 10_000, n_and_total)
    assert_invariants(
        read_results(settings.kafka, settings.sink_topic), truth.on_time, [version], [], truth.closed_until
    )


def routed_through(client: Client, offsets: dict[str, int]) -> bool:
    partitions = client.status().service.partitions
    return all(p in partitions and partitions[p].offset >= o for p, o in offsets.items())


def test_kafka_says_whether_offsets_a_batch_did_not_see_hold_records(services: Services, tmp_path: Path) -> None:
    settings = namespace_settings(tmp_path / "home", services.bootstrap, services.redis_url, "o")
    topics = Topics(settings.kafka, settings.pipeline, settings.timeouts)
    topics.ensure(settings.source_topic, 1)
    topics.close()
    plain = KafkaProducer(**settings.kafka_python_config(), acks="all")
    for i in range(3):  # offsets 0-2
        plain.send(settings.source_topic, value=b"%d" % i, partition=0)
    plain.flush(timeout=30)
    plain.close(timeout=10)
    transactional = KafkaProducer(**settings.kafka_python_config(), transactional_id=f"{settings.namespace}-tx")
    transactional.init_transactions()
    transactional.begin_transaction()
    for i in range(2):  # offsets 3-4, then the commit marker at 5
        transactional.send(settings.source_topic, value=b"t%d" % i, partition=0)
    transactional.commit_transaction()
    transactional.begin_transaction()
    transactional.send(settings.source_topic, value=b"aborted", partition=0)  # offset 6, the abort marker at 7
    transactional.flush(timeout=30)  # written, then aborted
    transactional.abort_transaction()
    transactional.close(timeout=10)
    source = SourceOffsets(settings.kafka, settings.source_topic)
    try:

        def first(first: int, end: int) -> int | None:
            return source.first_records({0: (first, end)}, 30).found.get(0)

        assert (first(0, 3), first(2, 8)) == (0, 2)
        assert first(5, 6) is None  # only the commit marker
        # An aborted transaction's records are read as Spark reads them (read_uncommitted).
        assert (first(6, 8), first(7, 8)) == (6, None)
        answer = source.first_records({0: (8, 20)}, 30)
        assert (answer.found, answer.checked_to) == ({}, {0: 8})  # past the log's end
    finally:
        source.close()


def test_an_offset_log_named_by_uri_is_read_through_hadoop(spark: SparkSession, tmp_path: Path) -> None:
    # What a checkpoint on an object store goes through (a file:// URI takes the same path).
    (tmp_path / "offsets").mkdir()
    (tmp_path / "offsets" / "4").write_text('v1\n{"batchWatermarkMs":0}\n{"ns.events":{"0":7}}', encoding="utf-8")
    (tmp_path / "offsets" / "5").write_text('v1\n{"batchWatermarkMs":0}\n{"ns.events":{"0":12}}', encoding="utf-8")
    log = OffsetLog(spark, tmp_path.as_uri(), "ns.events")
    assert log.batch(5) == PlannedRange({0: 7}, {0: 12})
    assert log.batch(6) is None


def kafka_time_event(record: Any) -> SourceEvent | None:
    body = json.loads(record.value)
    return SourceEvent(
        record.partition, record.offset, body["key"], float(body["value"]), int(record.timestamp), int(record.timestamp)
    )


def send_values(settings: Settings, values: list[bytes]) -> None:
    producer = KafkaProducer(**settings.kafka_python_config(), acks="all")
    for i, value in enumerate(values):
        producer.send(settings.source_topic, value=value, partition=i % 2)
    producer.flush(timeout=30)
    producer.close(timeout=10)
