"""Issue 2: the steady-state pipeline on real Kafka, Redis and Spark."""

from __future__ import annotations

import json

import pytest
import redis
from kafka import KafkaProducer
from pyspark.sql import SparkSession

from hotswap.contract.settings import Settings
from hotswap.executor.operator.client import Client
from hotswap.executor.tools.generator import GeneratorSpec, produce
from hotswap.service_sink.audit import read_results
from tests.conftest import wait_until
from tests.integration.harness import REPO, committed_watermark, executor_running, final_graph, read_topic
from tests.integration.oracle import Version, assert_invariants, count_and_total, settle

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COUNT_QUERY = REPO / "examples" / "count_per_key.sql"
T0 = 1_700_000_000_000


def test_seeded_events_flow_through_and_every_closed_window_matches_a_recomputation(
    settings: Settings, spark: SparkSession, client: Client
) -> None:
    # 4000 events over 40 s of event time, up to 300 ms out of order (lateness is 2 s).
    spec = GeneratorSpec(rate=2000, keys=5, seed=11, count=4000, disorder_ms=300, time_scale=20, start_ts=T0)
    with executor_running(settings, spark, COUNT_QUERY):
        report = produce(settings.kafka, spec, settings.source_topic)
        assert report.sent == 4000
        # The watermark (max ts - 2 s, about T0 + 38 s) closes the windows that end by T0 + 30 s; the
        # last one, [T0 + 30 s, T0 + 40 s), closes only once the source has been idle for a minute.
        last_closed = T0 + 30_000
        wait_until(lambda: committed_watermark(client, "count_per_key") >= last_closed, 120, "windows to close")
        truth = settle(settings, final_graph(client, "count_per_key"))
        status = client.status()

    assert status.current is not None
    assert status.current.query_id == "count_per_key"
    partitions = status.service.partitions
    assert set(partitions) == {"0", "1"}
    assert all((p.window_end or 0) >= T0 + 30_000 for p in partitions.values())
    assert (status.service.watermark or 0) >= T0 + 35_000
    assert status.late_records == 0

    assert len(truth.events) == 4000
    assert not truth.late
    assert truth.closed_until >= last_closed
    results = read_results(settings.kafka, settings.sink_topic)
    assert {r.query_id for r in results} == {"count_per_key"}
    version = Version("count_per_key", 10_000, count_and_total)
    assert_invariants(results, truth.on_time, [version], [], truth.closed_until)
    assert len({r.window_start for r in results}) >= 3


def test_results_are_json_with_epoch_ms_and_a_key_of_window_and_group(settings: Settings, spark: SparkSession) -> None:
    spec = GeneratorSpec(rate=2000, keys=2, seed=3, count=600, time_scale=50, start_ts=T0)
    with executor_running(settings, spark, COUNT_QUERY):
        produce(settings.kafka, spec, settings.source_topic)
        records = wait_until(lambda: read_topic(settings, settings.sink_topic), 120, "the first results")
    body = json.loads(records[0].value)
    assert set(body) == {"window_start", "window_end", "key", "n", "total", "query_id"}
    assert body["window_end"] - body["window_start"] == 10_000
    assert body["query_id"] == "count_per_key"
    assert records[0].key is not None
    assert json.loads(records[0].key) == {"window_start": body["window_start"], "key": body["key"]}


def test_restart_on_the_same_namespace_resumes_without_duplicates(
    settings: Settings, spark: SparkSession, client: Client
) -> None:
    first = GeneratorSpec(rate=2000, keys=3, seed=5, count=1500, time_scale=20, start_ts=T0)
    second = GeneratorSpec(rate=2000, keys=3, seed=6, count=1500, time_scale=20, start_ts=T0 + 15_000)
    with executor_running(settings, spark, COUNT_QUERY):
        produce(settings.kafka, first, settings.source_topic)
        wait_until(lambda: committed_watermark(client, "count_per_key") >= T0 + 10_000, 120, "the first windows")
    # A restart with the same namespace: the running query resumes from its checkpoints.
    with executor_running(settings, spark, COUNT_QUERY):
        produce(settings.kafka, second, settings.source_topic)
        # [T0 + 10 s, T0 + 20 s) holds rows of both runs: closed, it shows the resumed graph counted each once.
        wait_until(lambda: committed_watermark(client, "count_per_key") >= T0 + 20_000, 120, "windows after restart")
        truth = settle(settings, final_graph(client, "count_per_key"))
    assert [s.to_query for s in client.status().swaps] == []
    version = Version("count_per_key", 10_000, count_and_total)
    assert_invariants(
        read_results(settings.kafka, settings.sink_topic), truth.on_time, [version], [], truth.closed_until
    )


MALFORMED = [
    (b"not json at all", "not valid JSON"),
    (b'{"value": 1.0, "ts": 1700000001000}', "missing or null field key"),
    (b'{"key": "a", "ts": 1700000001000}', "missing or null field value"),
    (b'{"key": "a", "value": "high", "ts": 1700000001000}', "field value: 'high' is not a DOUBLE"),
    (b'{"key": "a", "value": 1.0}', "missing or null event time field ts"),
    (b'{"key": "a", "value": 1.0, "ts": "noon"}', "field ts: 'noon' is not a BIGINT"),
    (b'{"key": "a", "value": 1.0, "ts": -5}', "field ts: -5 is out of range (1970 to 9899)"),
    (
        b'{"key": "a", "value": 1.0, "ts": 99999999999999999}',
        "field ts: 99999999999999999 is out of range (1970 to 9899)",
    ),
]


def test_malformed_events_go_to_the_dead_letter_topic_with_reason_and_original_bytes(
    settings: Settings, spark: SparkSession, client: Client, control: redis.Redis
) -> None:
    with executor_running(settings, spark, COUNT_QUERY):
        producer = KafkaProducer(**settings.kafka_python_config())
        for raw, _ in MALFORMED:
            producer.send(settings.source_topic, value=raw, partition=0)
        producer.send(settings.source_topic, value=b'{"key": "ok", "value": 2.0, "ts": 1700000001000}', partition=0)
        producer.flush()
        producer.close()
        wait_until(
            lambda: len(read_topic(settings, settings.names.dead_letter_topic)) >= len(MALFORMED),
            120,
            "malformed events in the dead-letter topic",
        )
        dead = read_topic(settings, settings.names.dead_letter_topic)
        wait_until(lambda: client.status().dead_letter_records == len(MALFORMED), 30, "the dead-letter count")
    by_value = {r.value: r.headers["hotswap.reason"].decode() for r in dead}
    assert by_value == {raw: reason for raw, reason in MALFORMED}
    # The pipeline kept running: the good event reached the execution graph's input.
    # Its bytes unchanged, with the route header saying it is data.
    routed = read_topic(settings, settings.names.graph_topic("count_per_key"))
    data = [r.value for r in routed if r.headers["hotswap.route"].startswith(b"data,")]
    assert data == [b'{"key": "ok", "value": 2.0, "ts": 1700000001000}']
