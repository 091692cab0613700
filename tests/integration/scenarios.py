"""Scenarios that run the same way whatever hosts the executor: in the test process on local Spark
(test_swap.py) or as its own process on a Spark cluster (test_cluster.py)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hotswap.contract.models import GraphState
from hotswap.contract.settings import Settings
from hotswap.contract.status import Status, SwapStatus
from hotswap.executor.operator.client import Client
from hotswap.executor.tools.generator import GeneratorSpec
from hotswap.service_sink.audit import read_results
from tests.conftest import COMPLETED_SWAP_PHASES, wait_until
from tests.integration.harness import QUERIES, REPO, committed_watermark, continuous_load, final_graph
from tests.integration.oracle import (
    Truth,
    Version,
    assert_invariants,
    count_and_total,
    mean_and_n,
    peak_and_low,
    settle,
)

COUNT_10S = REPO / "examples" / "count_per_key.sql"
MAX_30S = REPO / "examples" / "max_per_key_30s.sql"
AVERAGE_10S = REPO / "examples" / "average_per_key.py"
TOTAL_20S = QUERIES / "total_per_key_20s.sql"
T0 = 1_700_000_000_000
PHASES = COMPLETED_SWAP_PHASES


def swap_and_wait(client: Client, query: Path) -> SwapStatus:
    record = client.submit(query)
    done = client.wait_until_done(record.id, 180)
    assert [p.name for p in done.phases] == PHASES
    return next(s for s in client.status().swaps if s.id == done.id)


def cut_of(swap: SwapStatus) -> int:
    assert swap.cut_window_end is not None, f"swap {swap.id} has no cut"
    return swap.cut_window_end


@dataclass(frozen=True)
class ThreeSwaps:
    swaps: list[SwapStatus]
    truth: Truth
    status: Status


def three_swaps_under_load(settings: Settings, client: Client) -> ThreeSwaps:
    """With an executor serving COUNT_10S: swap to a 30 s, a 10 s Python and a 20 s query under load,
    then stop the load and settle. Call it while the executor runs."""
    # Event time runs 10x faster than the clock; events are up to 800 ms out of order (lateness 2 s).
    spec = GeneratorSpec(rate=300, keys=4, seed=21, disorder_ms=800, time_scale=10, start_ts=T0)
    with continuous_load(settings, spec) as load:
        wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 20_000, 120, "first windows")
        swaps = [swap_and_wait(client, query) for query in (MAX_30S, AVERAGE_10S, TOTAL_20S)]
        final = swaps[-1].to_query
        last_cut = cut_of(swaps[-1])
        wait_until(lambda: committed_watermark(client, final) >= last_cut + 40_000, 120, "windows after the last cut")
        load.stop()
        truth = settle(settings, final_graph(client, final))
        return ThreeSwaps(swaps, truth, client.status())


def assert_three_swaps_keep_every_invariant(settings: Settings, client: Client, run: ThreeSwaps) -> None:
    """Every cut follows the rule, one graph serves at the end, and the results topic holds exactly
    what an offline recomputation from the source gives, window by window and version by version."""
    swaps, truth, status = run.swaps, run.truth, run.status
    cuts = [truth.cut(client.journal.get(s.id)) for s in swaps]
    assert cuts == sorted(cuts)
    assert cuts[0] % 30_000 == 0  # 10 s -> 30 s
    assert cuts[1] % 30_000 == 0  # 30 s -> 10 s
    assert cuts[2] % 20_000 == 0  # 10 s -> 20 s
    assert status.current is not None
    assert status.current.query_id == swaps[-1].to_query
    assert [g.state for g in status.graphs.values()].count(GraphState.RUNNING) == 1

    versions = [
        Version("count_per_key", 10_000, count_and_total),
        Version("max_per_key_30s", 30_000, peak_and_low),
        Version("average_per_key", 10_000, mean_and_n),
        Version("total_per_key_20s", 20_000, count_and_total),
    ]
    assert [s.to_query for s in swaps] == [v.query_id for v in versions[1:]]
    assert_invariants(
        read_results(settings.kafka, settings.sink_topic), truth.on_time, versions, cuts, truth.closed_until
    )
