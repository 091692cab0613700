"""Shadow runs on the real stack (issue 22): a shadow beside the current query under load, its diff
(zero differences for identical logic; exactly the recomputed ones for a changed aggregate), an
abort that changes nothing the user sees, and a promotion checked against the recomputation."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from hotswap.contract.journal import SwapPhase
from hotswap.contract.models import ShadowDiff
from hotswap.contract.settings import Settings
from hotswap.executor.operator.client import Client
from hotswap.executor.tools.generator import GeneratorSpec
from hotswap.service_sink.audit import read_results
from tests.conftest import wait_until
from tests.integration.harness import committed_watermark, continuous_load, executor_running, final_graph
from tests.integration.oracle import SourceEvent, Version, assert_invariants, count_and_total, end_of_window, settle
from tests.integration.scenarios import COUNT_10S, T0

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SAME = COUNT_10S.read_text()
DOUBLED = SAME.replace("count(*)     AS n", "count(*) * 2 AS n")


def doubled_count(events: list[SourceEvent]) -> dict[str, float]:
    return {"n": 2 * len(events), "total": sum(e.value for e in events)}


def shadow_running(client: Client, query: Path) -> str:
    """Submit `query` as a shadow; return its id once it receives rows (`shadowing`, S recorded)."""
    swap = client.submit(query, shadow=True)
    client.wait_for(swap.id, lambda r: r.state is SwapPhase.SHADOWING, 120, "shadowing")
    return swap.id


def diffed_after(client: Client, swap_id: str, windows: int) -> ShadowDiff:
    """The diff once both versions have closed `windows` 10 s windows since S."""
    since = client.journal.get(swap_id).shadow_since
    assert since is not None
    query = client.journal.get(swap_id).to_query
    wait_until(
        lambda: (
            min(committed_watermark(client, "count_per_key"), committed_watermark(client, query))
            >= since + windows * 10_000
        ),
        120,
        f"{windows} windows closed by both versions",
    )
    return client.diff(swap_id)


def test_a_shadow_is_diffed_aborted_or_promoted_and_every_invariant_holds(
    settings: Settings, spark: SparkSession, client: Client, tmp_path: Path
) -> None:
    same, doubled = tmp_path / "count_again.sql", tmp_path / "count_doubled.sql"
    same.write_text(SAME)
    doubled.write_text(DOUBLED)
    spec = GeneratorSpec(rate=300, keys=3, seed=71, disorder_ms=300, time_scale=10, start_ts=T0)
    with executor_running(settings, spark, COUNT_10S), continuous_load(settings, spec) as load:
        wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 10_000, 120, "first windows")

        # Identical logic: not one difference, and the user's sink never sees the shadow.
        first = shadow_running(client, same)
        identical = diffed_after(client, first, 3)
        assert identical.windows_compared >= 3
        assert identical.groups_compared >= 3
        assert (identical.values_differ, identical.only_current, identical.only_shadow) == (0, 0, 0)
        assert identical.columns_compared == ("n", "total")
        assert client.status().swaps[-1].diff == identical
        client.abort(first)
        assert not [r for r in read_results(settings.kafka, settings.sink_topic) if r.query_id == "count_again"]

        # A changed aggregate: its differences, then its promotion.
        second = shadow_running(client, doubled)
        changed = diffed_after(client, second, 3)
        client.promote(second)
        done = client.wait_until_done(second, 180)
        wait_until(
            lambda: committed_watermark(client, "count_doubled") >= int(done.cut_window_end or 0) + 30_000,
            120,
            "windows after the promotion",
        )
        load.stop()
        truth = settle(settings, final_graph(client, "count_doubled"))

    assert [s.state for s in client.journal.all()] == [SwapPhase.ABORTED, SwapPhase.COMPLETED]
    assert done.shadow_since is not None
    assert done.cut_window_end is not None
    assert done.cut_window_end >= done.shadow_since
    # The differences are exactly the recomputed ones: every (window, key) both closed since S,
    # each differing in n (doubled) and in nothing else.
    expected = {
        (end_of_window(e.ts, 10_000), e.key)
        for e in truth.on_time
        if end_of_window(e.ts, 10_000) - 10_000 >= changed.since
        and end_of_window(e.ts, 10_000) <= changed.closed_through
    }
    assert changed.groups_compared == len(expected) > 0
    assert changed.values_differ == len(expected)
    assert (changed.only_current, changed.only_shadow) == (0, 0)
    assert {example.column for example in changed.examples} == {"n"}
    assert all(example.shadow == 2 * example.current for example in changed.examples)

    # Windows up to W are the current version's, after it the promoted shadow's: exactly once each.
    cuts = [truth.cut(done)]
    versions = [Version("count_per_key", 10_000, count_and_total), Version("count_doubled", 10_000, doubled_count)]
    assert_invariants(
        read_results(settings.kafka, settings.sink_topic), truth.on_time, versions, cuts, truth.closed_until
    )
