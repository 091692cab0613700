"""Issue 8: the promise holds where a real topic takes it. Skewed partitions and a backlog, a
source that goes quiet, a swap aborted ahead of a queued one, and an event from the far future,
each checked against a recomputation from the source topic."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from kafka import KafkaProducer
from pyspark.sql import SparkSession

from hotswap.contract.journal import SwapPhase, SwapRecord
from hotswap.contract.models import GraphState
from hotswap.contract.settings import Settings
from hotswap.executor.control.topics import Topics
from hotswap.executor.operator.client import Client
from hotswap.executor.tools.generator import GeneratorSpec
from hotswap.service_sink.audit import read_results
from tests.conftest import wait_until
from tests.integration.harness import (
    REPO,
    changed,
    committed_watermark,
    continuous_load,
    executor_running,
    final_graph,
    read_topic,
    slow_to_deploy,
)
from tests.integration.oracle import (
    Truth,
    Version,
    assert_invariants,
    count_and_total,
    peak_and_low,
    settle,
    source_events,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COUNT_10S = REPO / "examples" / "count_per_key.sql"
MAX_30S = REPO / "examples" / "max_per_key_30s.sql"
VERSIONS = [Version("count_per_key", 10_000, count_and_total), Version("max_per_key_30s", 30_000, peak_and_low)]
T0 = 1_700_000_000_000
YEAR_2100_MS = 4_102_444_800_000


def check_two_versions(truth: Truth, client: Client, swap_id: str, closed_until: int | None = None) -> None:
    cut = truth.cut(client.journal.get(swap_id))
    closed = truth.closed_until if closed_until is None else closed_until
    assert_invariants(
        read_results(truth.settings.kafka, truth.settings.sink_topic), truth.on_time, VERSIONS, [cut], closed
    )


def phase_at(record: SwapRecord, phase: SwapPhase) -> float:
    """When the swap entered `phase`, in seconds since the epoch."""
    return next(p.at for p in record.phases if p.name is phase) / 1000


# -- skew and backlog ------------------------------------------------------------------------------
PARTITIONS = 4
STEP_MS = 200  # event time per step; a step writes one row to every partition
LAG_MS = 20_000  # the last partition runs this far behind the others


def skewed_rows(steps: range, seed: int) -> Iterator[tuple[int, bytes]]:
    """(partition, event) for each step: partitions 0-2 in step, partition 3 LAG_MS behind."""
    rng = random.Random(seed)
    for step in steps:
        for partition in range(PARTITIONS):
            ts = T0 + LAG_MS + step * STEP_MS - (LAG_MS if partition == PARTITIONS - 1 else 0) + rng.randint(0, 300)
            body = {"key": f"k{rng.randint(0, 2)}", "value": round(rng.uniform(0, 100), 3), "ts": ts}
            yield partition, json.dumps(body).encode()


def write_skewed(settings: Settings, steps: range, pace_s: float, stop: threading.Event | None = None) -> None:
    producer = KafkaProducer(**settings.kafka_python_config(), acks="all", linger_ms=5)
    try:
        for i, (partition, value) in enumerate(skewed_rows(steps, seed=steps.start)):
            if stop is not None and stop.is_set():
                break
            producer.send(settings.source_topic, value=value, partition=partition)
            if pace_s and i % PARTITIONS == PARTITIONS - 1:
                time.sleep(pace_s)
    finally:
        producer.flush(timeout=30)
        producer.close(timeout=10)


def input_rows(progress: Any) -> int:
    return int(progress["numInputRows"] if isinstance(progress, dict) else progress.numInputRows)


def test_skewed_partitions_and_a_backlog_lose_no_row_and_catch_up_in_bounded_batches(
    settings: Settings, spark: SparkSession, client: Client
) -> None:
    bound = 200
    skewed = changed(settings, lateness="5s", max_offsets_per_trigger=bound)
    topics = Topics(skewed.kafka, skewed.pipeline, skewed.timeouts)
    topics.ensure(skewed.source_topic, PARTITIONS)
    topics.close()
    backlog = 300  # steps: 60 s of event time, 1,200 rows, six times the batch bound
    write_skewed(skewed, range(backlog), pace_s=0)
    stop = threading.Event()
    # Then 10 s of event time per second of clock, 200 rows/s.
    load = threading.Thread(target=write_skewed, args=(skewed, range(backlog, 100_000), 0.02, stop), daemon=True)
    with executor_running(skewed, spark, COUNT_10S) as running:
        load.start()
        try:
            wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 30_000, 180, "first windows")
            record = client.submit(MAX_30S)
            done = client.wait_until_done(record.id, 240)
            cut = int(done.cut_window_end or 0)
            wait_until(lambda: committed_watermark(client, "max_per_key_30s") >= cut + 30_000, 180, "new windows")
        finally:
            stop.set()
            load.join(timeout=30)
        truth = settle(skewed, final_graph(client, "max_per_key_30s"))
        service = running.executor.service.query
        assert service is not None
        sizes = [input_rows(p) for p in service.recentProgress]
    assert max(sizes) <= bound, f"a batch read {max(sizes)} rows, above the bound of {bound}"
    assert sum(1 for n in sizes if n >= bound * 3 // 4) >= 5, f"the backlog was not read in bounded batches: {sizes}"
    assert client.status().late_records == 0
    assert truth.late == set()
    check_two_versions(truth, client, record.id)


# -- a quiet source --------------------------------------------------------------------------------
def test_a_source_that_goes_quiet_right_after_a_submit_completes_the_swap_and_closes_every_window(
    settings: Settings, spark: SparkSession, client: Client
) -> None:
    quiet = changed(settings, idle_timeout="3s")
    spec = GeneratorSpec(rate=300, keys=3, seed=41, disorder_ms=300, time_scale=10, start_ts=T0)
    with executor_running(quiet, spark, COUNT_10S):
        with continuous_load(quiet, spec):
            wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 10_000, 120, "first windows")
            record = client.submit(MAX_30S)
        quiet_since = time.time()  # the load thread has ended: nothing is written from here on
        done = client.wait_until_done(record.id, 180)
        last_window_end = max((e.ts // 30_000) * 30_000 + 30_000 for e in source_events(quiet))
        wait_until(lambda: committed_watermark(client, "max_per_key_30s") >= last_window_end, 120, "the last window")
        truth = settle(quiet, final_graph(client, "max_per_key_30s"))
    deploy_s = phase_at(done, SwapPhase.DEPLOYED) - phase_at(done, SwapPhase.VALIDATED)
    budget_s = deploy_s + 3 + 2 + 30 + 10  # deploy + idle_timeout + lateness + the larger window + 10 s
    took_s = phase_at(done, SwapPhase.COMPLETED) - quiet_since
    assert took_s <= budget_s, f"the swap took {took_s:.1f}s after the source went quiet (budget {budget_s:.1f}s)"
    # Every window is closed, the last one included: each must have its result.
    check_two_versions(truth, client, done.id, max(last_window_end, truth.closed_until))


# -- a swap aborted ahead of a queued one ---------------------------------------------------------
def test_submit_b_submit_c_abort_b_and_c_replaces_a(
    settings: Settings, spark: SparkSession, client: Client, tmp_path: Path
) -> None:
    spec = GeneratorSpec(rate=300, keys=3, seed=42, disorder_ms=300, time_scale=10, start_ts=T0)
    with executor_running(settings, spark, COUNT_10S), continuous_load(settings, spec) as load:
        wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 10_000, 120, "first windows")
        b = client.submit(slow_to_deploy(tmp_path, 10))  # returns validated; its deploy takes 10 s
        with ThreadPoolExecutor(max_workers=1) as pool:
            c_submitted = pool.submit(client.submit, MAX_30S)
            wait_until(lambda: len(client.journal.all()) == 2, 30, "the second submit")
            client.abort(b.id)
            c = c_submitted.result(timeout=120)
        done = client.wait_until_done(c.id, 180)
        cut = int(done.cut_window_end or 0)
        wait_until(lambda: committed_watermark(client, "max_per_key_30s") >= cut + 30_000, 120, "new windows")
        load.stop()
        truth = settle(settings, final_graph(client, "max_per_key_30s"))
        status = client.status()
    assert client.journal.get(b.id).state is SwapPhase.ABORTED
    assert status.graphs[b.to_query].state is GraphState.DISCARDED  # it never served
    assert done.from_query == "count_per_key"
    check_two_versions(truth, client, c.id)


# -- an event from the far future ------------------------------------------------------------------
def test_an_event_from_the_year_2100_is_dead_lettered_and_moves_no_window_and_no_cut(
    settings: Settings, spark: SparkSession, client: Client
) -> None:
    spec = GeneratorSpec(rate=300, keys=3, seed=43, disorder_ms=300, time_scale=10, start_ts=T0)
    with executor_running(settings, spark, COUNT_10S), continuous_load(settings, spec) as load:
        wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 10_000, 120, "first windows")
        producer = KafkaProducer(**settings.kafka_python_config(), acks="all")
        event = {"key": "k0", "value": 1.0, "ts": YEAR_2100_MS}
        producer.send(settings.source_topic, key=b"k0", value=json.dumps(event).encode()).get(timeout=30)
        producer.close(timeout=10)
        after = committed_watermark(client, "count_per_key")
        # Windows keep closing on the live events, 40 s of event time and more.
        wait_until(lambda: committed_watermark(client, "count_per_key") >= after + 40_000, 120, "later windows")
        done = client.wait_until_done(client.submit(MAX_30S).id, 180)
        cut = int(done.cut_window_end or 0)
        wait_until(lambda: committed_watermark(client, "max_per_key_30s") >= cut + 30_000, 120, "new windows")
        load.stop()
        truth = settle(settings, final_graph(client, "max_per_key_30s"))
        status = client.status()
    assert cut % 30_000 == 0
    assert cut < T0 + 3_600_000, f"the cut {cut} was taken from the far-future event"
    dead = read_topic(settings, settings.names.dead_letter_topic)
    assert [json.loads(r.value)["ts"] for r in dead] == [YEAR_2100_MS]
    assert dead[0].headers["hotswap.reason"] == b"event time more than 1h ahead of the watermark"
    assert status.dead_letter_records == 1
    assert len(truth.dead) == 1
    check_two_versions(truth, client, done.id)
