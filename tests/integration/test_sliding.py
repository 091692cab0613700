"""Issue 22, section 3: swaps to and from sliding windows on the real stack, under load, checked
against the offline recomputation (README, "Sliding windows")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from hotswap.contract.settings import Settings
from hotswap.executor.operator.client import Client, redis_client
from hotswap.executor.tools.generator import GeneratorSpec
from hotswap.service_sink.audit import read_results
from tests.conftest import wait_until
from tests.integration.conftest import Services
from tests.integration.harness import (
    REPO,
    committed_watermark,
    continuous_load,
    executor_running,
    final_graph,
    namespace_settings,
    read_topic,
)
from tests.integration.oracle import Version, assert_invariants, count_and_total, settle
from tests.integration.scenarios import COUNT_10S, T0, TOTAL_20S, cut_of, swap_and_wait

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SLIDING_30S_EVERY_10S = REPO / "examples" / "count_per_key_30s_every_10s.sql"


def route_times(settings: Settings, query_id: str) -> list[int]:
    """The event times of the data rows the service graph wrote to a graph's topic."""
    times = []
    for record in read_topic(settings, settings.names.graph_topic(query_id)):
        kind, _, _, event_time, _ = record.headers["hotswap.route"].decode().split(",")
        if kind == "data":
            times.append(int(event_time))
    return times


def test_tumbling_to_sliding_and_back_to_tumbling_under_load_keep_every_invariant(
    services: Services, spark: SparkSession, tmp_path: Path
) -> None:
    """10 s tumbling -> 30 s windows every 10 s -> 20 s tumbling. Rows from W1 - 20 s to W1 go to
    both graphs; the sliding version emits only the windows ending after W1 (not the partial ones
    it closes before), the old ones only those through W1; each window's value counts every event
    in it, whichever graph received it."""
    # Retired topics are kept, to see which rows each graph received.
    settings = namespace_settings(
        tmp_path / "home", services.bootstrap, services.redis_url, "t", keep_retired_topics=True
    )
    client = Client(settings.control, settings.kafka, settings.pipeline, redis_client(settings.control))
    # Event time runs 10x faster than the clock; events are up to 800 ms out of order (lateness 2 s).
    spec = GeneratorSpec(rate=300, keys=4, seed=31, disorder_ms=800, time_scale=10, start_ts=T0)
    with executor_running(settings, spark, COUNT_10S), continuous_load(settings, spec) as load:
        wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 20_000, 120, "first windows")
        before = max(p.window_end or 0 for p in client.status().service.partitions.values())
        to_sliding = swap_and_wait(client, SLIDING_30S_EVERY_10S)
        to_tumbling = swap_and_wait(client, TOTAL_20S)
        final = to_tumbling.to_query
        wait_until(
            lambda: committed_watermark(client, final) >= cut_of(to_tumbling) + 40_000, 120, "windows after the cuts"
        )
        load.stop()
        truth = settle(settings, final_graph(client, final))
        status = client.status()

    sliding = to_sliding.to_query
    # The slides are recorded at validation and shown in status.
    assert (to_sliding.old_window_ms, to_sliding.old_slide_ms) == (10_000, 10_000)
    assert (to_sliding.new_window_ms, to_sliding.new_slide_ms) == (30_000, 10_000)
    assert (to_tumbling.old_window_ms, to_tumbling.old_slide_ms) == (30_000, 10_000)
    assert (to_tumbling.new_window_ms, to_tumbling.new_slide_ms) == (20_000, 20_000)
    assert (status.graphs[sliding].window_ms, status.graphs[sliding].slide_ms) == (30_000, 10_000)

    # Each cut follows the rule (checked by the oracle, from the offset log and the source).
    w1, w2 = (truth.cut(client.journal.get(s.id)) for s in (to_sliding, to_tumbling))
    assert w1 % 10_000 == 0
    assert w2 % 20_000 == 0
    assert w1 >= before + 20_000  # the sliding version's first window after W1 starts 20 s before it
    assert w2 > w1

    # Which rows went where: the old graph had every row before W1 and none after; the sliding one
    # every row from W1 - 20 s (some of them before W1: the overlap) and none before.
    old_rows, sliding_rows = route_times(settings, "count_per_key"), route_times(settings, sliding)
    assert max(old_rows) < w1
    assert min(sliding_rows) >= w1 - 20_000
    overlap = [t for t in sliding_rows if t < w1]
    assert overlap, "no row of [W1 - 20 s, W1) went to the sliding graph"
    assert set(overlap) <= set(old_rows)
    final_rows = route_times(settings, final)
    assert min(final_rows) >= w2
    assert max(sliding_rows) < w2

    results = read_results(settings.kafka, settings.sink_topic)
    by_query = {r.query_id for r in results}
    assert by_query == {"count_per_key", sliding, final}
    # The sliding version answers windows ending after W1 only, 30 s long, every 10 s.
    mine = [r for r in results if r.query_id == sliding]
    assert min(r.window_end for r in mine) == w1 + 10_000
    assert max(r.window_end for r in mine) == w2
    assert {r.window_end - r.window_start for r in mine} == {30_000}
    # One key per result: a sliding result's key holds its window end beside its start.
    assert all(set(json.loads(r.key)) == {"window_start", "window_end", "key"} for r in mine)
    assert all(set(json.loads(r.key)) == {"window_start", "key"} for r in results if r.query_id != sliding)

    versions = [
        Version("count_per_key", 10_000, count_and_total),
        Version(sliding, 30_000, count_and_total, slide_ms=10_000),
        Version(final, 20_000, count_and_total),
    ]
    assert_invariants(results, truth.on_time, versions, [w1, w2], truth.closed_until)
