"""The table sinks on the real thing: `--sink postgres:TABLE` on a PostgreSQL server and `--sink
delta:PATH` on Delta Lake. One row per (version, window, group), through replays and a SIGKILL of
the executor between a batch's commit in the table and Spark's commit. The Delta table is read back
with delta-rs (the `deltalake` package), not with the Spark that wrote it."""

from __future__ import annotations

import json
import re
import signal
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from deltalake import DeltaTable, QueryBuilder
from pyspark.sql import SparkSession

from hotswap.contract.journal import SwapRecord
from hotswap.contract.names import Keys
from hotswap.contract.ownership import OwnedWindows
from hotswap.contract.settings import Settings
from hotswap.executor.operator.client import Client
from hotswap.executor.tools.generator import GeneratorSpec
from hotswap.service_sink.audit import Result
from hotswap.service_sink.errors import SinkSchemaConflict
from hotswap.service_sink.postgres import PostgresTable
from hotswap.service_sink.results import ResultWriter, _owned_condition
from tests.conftest import wait_until
from tests.integration.harness import REPO, ExecutorProcess, changed, committed_watermark, continuous_load, final_graph
from tests.integration.oracle import Truth, Version, assert_invariants, count_and_total, peak_and_low, settle
from tests.integration.postgres import PostgresServer

pytestmark = [pytest.mark.integration]

COUNT_10S = REPO / "examples" / "count_per_key.sql"
MAX_30S = REPO / "examples" / "max_per_key_30s.sql"
T0 = 1_700_000_000_000
VERSIONS = [Version("count_per_key", 10_000, count_and_total), Version("max_per_key_30s", 30_000, peak_and_low)]


def table_rows(url: str, table: str) -> list[dict[str, Any]]:
    with psycopg.connect(url) as connection, connection.cursor(row_factory=psycopg.rows.dict_row) as cursor:
        return list(cursor.execute(f"SELECT * FROM {table} ORDER BY query_id, window_start, group_key").fetchall())


def delta_rows(path: Path) -> list[dict[str, Any]]:
    table = QueryBuilder().register("results", DeltaTable(str(path))).execute("SELECT * FROM results").read_all()
    columns = {name: table.column(name).to_pylist() for name in table.column_names}
    return [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]


def as_results(rows: list[dict[str, Any]]) -> list[Result]:
    """The table's rows as the oracle reads results: epoch milliseconds, and the row's primary key as
    its key (the table cannot hold two rows under one)."""
    out = []
    for row in rows:
        start = int(row["window_start"].timestamp() * 1000)
        end = int(row["window_end"].timestamp() * 1000)
        values = dict(row)
        values.update(window_start=start, window_end=end)
        key = json.dumps([row["query_id"], start, end, row.get("group_key", row.get("key"))])
        out.append(Result(key=key, query_id=row["query_id"], window_start=start, window_end=end, row=values))
    return out


def test_a_replayed_batch_a_new_column_and_a_conflicting_type_in_the_postgres_table(
    settings: Settings, spark: SparkSession, postgres: PostgresServer
) -> None:
    table = f"{settings.namespace}_results"
    sink = changed(settings, sink=f"postgres:{table}", sink_url=postgres.url)
    assert sink.sink_url is not None
    writer = PostgresTable(sink.pipeline.sink, sink.sink_url)

    def results(version: str, rows: list[tuple[Any, ...]], schema: str) -> None:
        frame = spark.createDataFrame(rows, schema)
        ResultWriter(sink.kafka, sink.sink_topic, version, ("key",), table=writer)(frame, 0)

    w0, w1 = datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC)
    first = [(w0, w1, "a", 3, 1.5), (w0, w1, None, 1, 2.0)]
    schema = "window_start TIMESTAMP, window_end TIMESTAMP, key STRING, n BIGINT, total DOUBLE"
    results("v1", first, schema)
    results("v1", first, schema)  # Spark replays the batch: the same keys, overwritten with themselves
    results("v2", [(w0, w1, "a", 7)], "window_start TIMESTAMP, window_end TIMESTAMP, key STRING, peak BIGINT")

    rows = table_rows(postgres.url, table)
    assert [(r["query_id"], r["group_key"], r["n"], r["total"], r["peak"]) for r in rows] == [
        ("v1", '{"key":"a"}', 3, 1.5, None),
        ("v1", '{"key":null}', 1, 2.0, None),
        ("v2", '{"key":"a"}', None, None, 7),
    ]
    assert rows[0]["window_start"] == w0
    assert rows[0]["window_end"] == w1

    with pytest.raises(SinkSchemaConflict, match=r"writes column 'n' as text, but postgres:.* has it as bigint"):
        results("v3", [(w0, w1, "a", "x")], "window_start TIMESTAMP, window_end TIMESTAMP, key STRING, n STRING")
    assert len(table_rows(postgres.url, table)) == 3  # the refused batch wrote nothing
    writer.close()


def swap_with_a_kill_after_a_commit(
    settings: Settings, client: Client, control: redis.Redis, tmp_path: Path, seed: int
) -> tuple[SwapRecord, Truth]:
    """count_per_key -> max_per_key_30s under load, the executor SIGKILLed right after the new version's
    first commit of rows to the table and before Spark records the batch (so it is replayed, and writes
    those rows again), then restarted."""
    keys = Keys(settings.namespace)
    spec = GeneratorSpec(rate=300, keys=3, seed=seed, disorder_ms=500, time_scale=10, start_ts=T0)
    with continuous_load(settings, spec) as load:
        first = ExecutorProcess(settings, COUNT_10S, tmp_path, crash_at="sink:after-commit:max_per_key_30s")
        first.wait_serving(control, keys)
        wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 10_000, 120, "first windows")
        swap = client.submit(MAX_30S)
        assert first.wait_exit(180) == -signal.SIGKILL, f"no crash; see {first.log_path}"
        last = ExecutorProcess(settings, COUNT_10S, tmp_path)
        try:
            last.wait_serving(control, keys)
            done = client.wait_until_done(swap.id, 180)
            cut = int(done.cut_window_end or 0)
            wait_until(lambda: committed_watermark(client, "max_per_key_30s") >= cut + 60_000, 120, "new windows")
            load.stop()
            truth = settle(settings, final_graph(client, "max_per_key_30s"))
        finally:
            last.stop()
    return done, truth


def test_a_swap_into_postgres_with_the_executor_killed_after_a_commit_writes_each_result_once(
    settings: Settings, client: Client, control: redis.Redis, postgres: PostgresServer, tmp_path: Path
) -> None:
    table = f"{settings.namespace}_results"
    settings = changed(settings, sink=f"postgres:{table}", sink_url=postgres.url)
    done, truth = swap_with_a_kill_after_a_commit(settings, client, control, tmp_path, seed=37)
    rows = table_rows(postgres.url, table)
    assert {r["query_id"] for r in rows} == {"count_per_key", "max_per_key_30s"}
    assert_invariants(as_results(rows), truth.on_time, VERSIONS, [truth.cut(done)], truth.closed_until)


def test_a_swap_into_delta_lake_with_the_executor_killed_after_a_commit_writes_each_result_once(
    settings: Settings, client: Client, control: redis.Redis, tmp_path: Path
) -> None:
    table = tmp_path / "results"
    settings = changed(settings, sink=f"delta:{table}")
    done, truth = swap_with_a_kill_after_a_commit(settings, client, control, tmp_path, seed=38)
    rows = delta_rows(table)
    assert {r["query_id"] for r in rows} == {"count_per_key", "max_per_key_30s"}
    # One schema for both versions: each version's columns, null in the other's rows.
    assert {"n", "total", "peak", "low"} <= set(rows[0])
    # No duplicate (version, window, group): the oracle refuses a second row under one identity.
    assert_invariants(as_results(rows), truth.on_time, VERSIONS, [truth.cut(done)], truth.closed_until)


def test_a_graph_keeps_the_windows_it_owns_and_a_cut_moves_only_the_numbers_in_its_plan(spark: SparkSession) -> None:
    """The results writer keeps the windows a graph owns by window end: (after, through], either side
    open. A cut turns the old graph's (after, None] into (after, W]; the filter's text then differs only
    in its numbers, which is what lets Spark serve the code it compiled (contract/batch_constants.py)
    in the old graph's drain."""
    ends = [T0 + 10_000 * i for i in range(1, 9)]
    frame = spark.createDataFrame(
        [(datetime.fromtimestamp((end - 10_000) / 1000, UTC), datetime.fromtimestamp(end / 1000, UTC)) for end in ends],
        "window_start TIMESTAMP, window_end TIMESTAMP",
    )
    after, cut = ends[1], ends[5]

    def kept(*ranges: tuple[int | None, int | None]) -> list[int]:
        rows = frame.where(_owned_condition(OwnedWindows(ranges))).collect()
        return sorted(int(row["window_end"].timestamp() * 1000) for row in rows)

    assert kept((None, None)) == ends
    assert kept((after, None)) == ends[2:]
    assert kept((after, cut)) == ends[2:6]
    assert kept((cut, None)) == ends[6:]
    assert kept((None, after), (cut, None)) == ends[:2] + ends[6:]
    assert kept() == []

    def text(after_ms: int | None, through_ms: int | None) -> str:
        return re.sub(r"\d{4,}", "N", str(_owned_condition(OwnedWindows(((after_ms, through_ms),)))))

    assert text(after, None) == text(after, cut) == text(cut, None)
    assert text(None, None) == text(None, cut)  # the first graph's cut
