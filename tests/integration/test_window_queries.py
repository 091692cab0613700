"""Per-window queries that only the closing engine runs: a distinct count, an exact percentile and a
top-N ranking (examples/distinct_keys_per_window.sql, p90_per_key.sql, top3_keys_per_window.sql),
each swapped in live under load and checked against the offline recomputation (oracle.py).

A closing graph computes each window once, as a batch over exactly that window's rows, when every
partition of its topic has read a marker past it (docs/architecture.md, "Two graph engines"). The
stateful engine refuses these queries; test_validation.py checks that side.
"""

from __future__ import annotations

import pytest
import redis
from pyspark.sql import SparkSession

from hotswap.contract import stages
from hotswap.contract.models import GraphEngine
from hotswap.contract.names import Keys
from hotswap.contract.records import read_graphs
from hotswap.contract.settings import Settings
from hotswap.executor.operator.client import Client
from hotswap.executor.tools.generator import GeneratorSpec
from hotswap.service_sink.audit import read_results
from tests.conftest import wait_until
from tests.integration.harness import REPO, changed, committed_watermark, continuous_load, executor_running, final_graph
from tests.integration.oracle import (
    TopN,
    Version,
    assert_invariants,
    count_and_total,
    distinct_keys_and_n,
    exact_total,
    p90_and_n,
    settle,
    whole_window,
)
from tests.integration.scenarios import COUNT_10S, T0, cut_of, swap_and_wait

pytestmark = [pytest.mark.integration, pytest.mark.slow]

EXAMPLES = REPO / "examples"
DISTINCT_KEYS = EXAMPLES / "distinct_keys_per_window.sql"
P90 = EXAMPLES / "p90_per_key.sql"
TOP3 = EXAMPLES / "top3_keys_per_window.sql"

# The versions in the order they serve, as the oracle recomputes them.
VERSIONS = [
    Version("count_per_key", 10_000, count_and_total),
    Version("distinct_keys_per_window", 10_000, distinct_keys_and_n, group=whole_window, group_column=""),
    Version("p90_per_key", 10_000, p90_and_n),
    Version("top3_keys_per_window", 10_000, exact_total, top=TopN(3, "total")),
]


def test_a_distinct_count_a_percentile_and_a_top_n_swap_in_under_load_on_the_closing_engine(
    settings: Settings, spark: SparkSession, control: redis.Redis
) -> None:
    """count per key -> distinct keys per window -> p90 per key -> top 3 keys per window, each a swap
    under load with every graph on the closing engine: every cut follows the rule, and every closed
    window has exactly its owner's results, each valued as the source says."""
    closing = changed(settings, graph_engine="closing")
    client = Client(closing.control, closing.kafka, closing.pipeline, control)
    # 100 keys at 300 events a second, event time 10x faster than the clock: about 300 events per
    # 10 s window, from about 95 of the keys, 3 events each. So a window's distinct keys vary, a
    # percentile interpolates, and a ranking leaves most keys out. Up to 800 ms out of order
    # (lateness 2 s).
    spec = GeneratorSpec(rate=300, keys=100, seed=17, disorder_ms=800, time_scale=10, start_ts=T0)
    with executor_running(closing, spark, COUNT_10S), continuous_load(closing, spec) as load:
        wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 20_000, 120, "first windows")
        swaps = [swap_and_wait(client, query) for query in (DISTINCT_KEYS, P90, TOP3)]
        final, last_cut = swaps[-1].to_query, cut_of(swaps[-1])
        wait_until(lambda: committed_watermark(client, final) >= last_cut + 40_000, 120, "windows after the last cut")
        load.stop()
        truth = settle(closing, final_graph(client, final), closes_on_ms=10_000)
        status = client.status()

    assert [s.to_query for s in swaps] == [v.query_id for v in VERSIONS[1:]]
    assert status.current is not None
    assert status.current.query_id == final
    # Every graph ran on the closing engine, its topic with as many partitions as the source's.
    graphs = read_graphs(control, Keys(closing.namespace))
    assert {v.query_id: (graphs[v.query_id].engine, graphs[v.query_id].partitions) for v in VERSIONS} == {
        v.query_id: (GraphEngine.CLOSING, closing.source_partitions) for v in VERSIONS
    }
    # Each closing batch learnt the route headers of its rows as it read them (closing.HeaderWatch):
    # a headers pass of its own ran only at a graph's start, not once or twice per window.
    timings = stages.snapshot()
    for version in VERSIONS:
        ran = timings.get(closing.names.graph_query(version.query_id), {})
        closes, passes = len(ran.get("close", [])), len(ran.get("headers", []))
        assert closes >= 2, (version.query_id, closes)
        assert passes <= 2, (version.query_id, closes, passes)
    cuts = [truth.cut(client.journal.get(s.id)) for s in swaps]
    assert cuts == sorted(cuts)
    assert all(cut % 10_000 == 0 for cut in cuts)

    results = read_results(closing.kafka, closing.sink_topic)
    assert_invariants(results, truth.on_time, VERSIONS, cuts, truth.closed_until)
    # Not vacuous: each version answered windows of its own.
    answered = {v.query_id: {r.window_end for r in results if r.query_id == v.query_id} for v in VERSIONS}
    assert all(len(ends) >= 2 for ends in answered.values()), {q: len(ends) for q, ends in answered.items()}
