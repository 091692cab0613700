"""The closing engine on the real stack: a graph topic of four partitions, one skewed and one empty,
read under a row cap, closes no window early; and a crash between a closing batch's results and its
commit leaves every result produced exactly once."""

from __future__ import annotations

import json
import signal
from collections import Counter
from pathlib import Path

import pytest
import redis
from kafka import KafkaAdminClient, KafkaProducer
from kafka.admin import NewTopic
from pyspark.sql import SparkSession

from hotswap.contract.models import GraphEngine, GraphRecord, QueryKind, QuerySource, new_spark_query_id
from hotswap.contract.names import Keys
from hotswap.contract.settings import Settings
from hotswap.contract.windows import GRAPH_WATERMARK_DELAY_MS
from hotswap.execution_graph.graph import GraphRunner
from hotswap.executor.operator.client import Client
from hotswap.executor.tools.generator import GeneratorSpec
from hotswap.service_sink.audit import read_results
from hotswap.service_sink.results import ResultWriter
from tests.conftest import DEMO_SOURCE, wait_until
from tests.integration.harness import REPO, ExecutorProcess, changed, committed_watermark, continuous_load, final_graph
from tests.integration.oracle import Version, assert_invariants, count_and_total, settle

pytestmark = [pytest.mark.integration, pytest.mark.slow]

T0 = 1_700_000_000_000  # on a 10 s boundary
COUNT_SQL = """
SELECT window.start AS window_start, window.end AS window_end, key, count(*) AS n
FROM events GROUP BY window(event_time, '10 seconds'), key
"""
COUNT_10S = REPO / "examples" / "count_per_key.sql"


def _route(kind: str, partition: str = "", offset: str = "", event_time: int | None = None) -> bytes:
    """A route header as the service graph writes it: kind, source partition, source offset, event
    time (a marker's carries the graph watermark delay), source timestamp."""
    time = "" if event_time is None else str(event_time)
    return f"{kind},{partition},{offset},{time},{T0}".encode()


def test_four_partitions_one_skewed_one_empty_under_a_row_cap_close_no_window_early(
    settings: Settings, spark: SparkSession
) -> None:
    settings = changed(settings, graph_engine="closing", max_offsets_per_trigger=100)
    topic = settings.names.graph_topic("skewed")
    admin = KafkaAdminClient(**settings.kafka_python_config())
    try:
        admin.create_topics([NewTopic(topic, 4, 1)])
    finally:
        admin.close()
    # Source partition p's rows go to graph partition p: 0 is skewed (2,400 rows), 1 light, 2 medium,
    # 3 empty (markers only). Event times cover [T0, T0 + 30 s): three windows per key.
    rows = {0: 2_400, 1: 60, 2: 300, 3: 0}
    expected: Counter[tuple[int, str]] = Counter()
    producer = KafkaProducer(**settings.kafka_python_config(), acks="all")
    try:
        for partition, count in rows.items():
            sent = []
            for offset in range(count):
                event_time = T0 + (offset * 7_919 + partition * 13) % 30_000
                key = f"k{offset % 3}"
                value = json.dumps({"key": key, "value": 1.0, "ts": event_time}).encode()
                header = _route("data", str(partition), str(offset), event_time)
                sent.append((value, header))
                expected[(event_time - event_time % 10_000, key)] += 1
            if partition == 1:
                sent += sent[:20]  # a replayed service batch wrote these rows again: counted once
            for value, header in sent:
                producer.send(topic, value=value, partition=partition, headers=[("hotswap.route", header)])
        for partition in rows:  # the end-of-window marker, after every row, in every partition
            marker = _route("marker", event_time=T0 + 30_000 + GRAPH_WATERMARK_DELAY_MS)
            producer.send(
                topic, value=b"", key=b"__hotswap_marker__", partition=partition, headers=[("hotswap.route", marker)]
            )
        producer.flush(30)
    finally:
        producer.close()

    record = GraphRecord(
        query_id="skewed",
        source=QuerySource(name="skewed", kind=QueryKind.SQL, text=COUNT_SQL),
        window_ms=10_000,
        slide_ms=10_000,
        topic=topic,
        group_columns=("key",),
        spark_query_id=new_spark_query_id(),
        reads=DEMO_SOURCE,
        engine=GraphEngine.CLOSING,
        partitions=4,
    )
    runner = GraphRunner(spark, settings.pipeline, settings.kafka, settings.queries, settings.timeouts)
    query = runner.start(
        record, ResultWriter(settings.kafka, settings.sink_topic, record.query_id, record.group_columns)
    )
    try:
        wait_until(lambda: runner.last_commit_watermark("skewed") == T0 + 30_000, 180, "the graph to close its windows")
        first = json.loads(query.recentProgress[0].sources[0].endOffset)[topic]
    finally:
        runner.stop("skewed")
    # The premise: the row cap split the topic, and the first batch read the empty partition's marker
    # long before the skewed partition's rows (a graph closing on the largest marker closes there).
    assert first["3"] == 1
    assert first["0"] < rows[0]

    results = read_results(settings.kafka, settings.sink_topic)
    found = Counter({(r.window_start, json.loads(r.key)["key"]): int(r.row["n"]) for r in results})
    assert sum(found.values()) == sum(rows.values()), "rows missing from the results"
    assert found == expected
    assert len(results) == len({r.key for r in results}), "a window was emitted twice"


def test_executor_killed_between_a_closing_batch_results_and_its_commit_emits_each_result_once(
    settings: Settings, client: Client, control: redis.Redis, tmp_path: Path
) -> None:
    settings = changed(settings, graph_engine="closing")
    client = Client(settings.control, settings.kafka, settings.pipeline, control)
    keys = Keys(settings.namespace)
    spec = GeneratorSpec(rate=300, keys=3, seed=33, disorder_ms=300, time_scale=10, start_ts=T0)
    with continuous_load(settings, spec) as load:
        # Killed (SIGKILL) right after the first closing batch wrote its results, before Spark committed it.
        crashing = ExecutorProcess(settings, COUNT_10S, tmp_path, crash_at="graph:after-results")
        assert crashing.wait_exit(240) == -signal.SIGKILL, f"no crash; see {crashing.log_path}"
        after_crash = read_results(settings.kafka, settings.sink_topic)
        assert after_crash, "the crashed batch should have written results"
        last = ExecutorProcess(settings, COUNT_10S, tmp_path)
        try:
            last.wait_serving(control, keys)
            reached = committed_watermark(client, "count_per_key") + 40_000
            wait_until(lambda: committed_watermark(client, "count_per_key") >= reached, 120, "windows after the crash")
            load.stop()
            truth = settle(settings, final_graph(client, "count_per_key"), closes_on_ms=10_000)
        finally:
            last.stop()
    results = read_results(settings.kafka, settings.sink_topic)
    # The replayed batch wrote the same results again, under the same keys and with the same values.
    replayed = {r.key: r.row for r in after_crash}
    assert all(r.row == replayed[r.key] for r in results if r.key in replayed)
    assert_invariants(
        results,
        truth.on_time,
        [Version("count_per_key", 10_000, count_and_total)],
        [],
        truth.closed_until,
        allow_redelivery=True,
    )
