"""Control-state cost per batch against the namespace's history (issue 21, section 2).

Two namespaces on the bench's Redis: one whose journal holds a single completed swap, one whose
journal holds 200, every swap written through the journal's own API with the graph records and the
current query its transitions carry, as the executor writes them. Against each, the same code a
batch runs times a batch's control state, many times over:
- the service graph: its state read, its plan (the open swaps, the graphs they name, the current
  query, and the plan's fenced write) and its state write, the calls `route_batch` makes;
- each execution graph's result writer: its read of the windows it owns.
The target: the median with 200 swaps within 10 % of the median with one.
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import redis
from pyspark.sql import SparkSession

from benchmarks.common import settings_for
from hotswap.contract.fence import fenced_write
from hotswap.contract.journal import Also, Journal, SwapPhase, SwapRecord
from hotswap.contract.models import (
    CurrentQuery,
    GraphRecord,
    GraphState,
    QueryKind,
    QuerySource,
    ServiceState,
    new_spark_query_id,
    now_ms,
)
from hotswap.contract.names import Keys
from hotswap.contract.ownership import OwnershipReader
from hotswap.contract.settings import Settings
from hotswap.contract.source import EventTimeKind, SourceSpec
from hotswap.service_graph.frames import BatchStats
from hotswap.service_graph.query import ServiceGraph

WINDOW_MS = 10_000
READS = SourceSpec(event_time_kind=EventTimeKind.EPOCH)  # the demo format the bench's load is written in
# The legal path of a swap that completed (contract/phases.py), after `submitted`.
_COMPLETED_PATH = (
    SwapPhase.VALIDATED,
    SwapPhase.DEPLOYING,
    SwapPhase.DEPLOYED,
    SwapPhase.CUT,
    SwapPhase.DRAINING,
    SwapPhase.DRAINED,
    SwapPhase.RETIRING,
    SwapPhase.RETIRED,
    SwapPhase.COMPLETED,
)


def _graph(query_id: str, number: int) -> GraphRecord:
    source = QuerySource(name=f"q{number}.sql", kind=QueryKind.SQL, text="SELECT 1")
    return GraphRecord(
        query_id=query_id,
        source=source,
        window_ms=WINDOW_MS,
        slide_ms=WINDOW_MS,
        topic=f"bench.{query_id}",
        state=GraphState.RUNNING,
        spark_query_id=new_spark_query_id(),
        reads=READS,
    )


def seed(client: redis.Redis, settings: Settings, swaps: int) -> tuple[Keys, GraphRecord]:
    """A namespace whose journal holds `swaps` completed swaps, q0 -> q1 -> ... -> q<swaps>; returns
    its keys and the current graph."""
    keys = Keys(settings.namespace)
    journal = Journal(client, keys)
    first = _graph("q0", 0)
    fenced_write(client, None, lambda batch: batch.hset(keys.graphs, first.query_id, first.model_dump_json()))
    start = now_ms() - now_ms() % WINDOW_MS - swaps * WINDOW_MS
    current = first
    for n in range(1, swaps + 1):
        new = _graph(f"q{n}", n)
        swap = journal.create(SwapRecord(id=f"s{n}", to_query=new.query_id, from_query=current.query_id))
        for phase in _COMPLETED_PATH:
            also = Also()
            changes: dict[str, Any] = {}
            if phase is SwapPhase.VALIDATED:
                also = Also(graphs=(new,))
            elif phase is SwapPhase.CUT:
                changes = {"cut_window_end": start + n * WINDOW_MS, "cut_batch": n}
            elif phase is SwapPhase.RETIRED:
                also = Also(graphs=(current.moved(GraphState.RETIRED),))
            elif phase is SwapPhase.COMPLETED:
                also = Also(current=CurrentQuery(query_id=new.query_id, started_at=now_ms()))
            advanced = journal.advance(swap, phase, also=also, **changes)
            assert advanced is not None
            swap = advanced
        current = new
    state = ServiceState(last_batch=0, watermark=start + swaps * WINDOW_MS)
    fenced_write(client, None, lambda batch: batch.set(keys.service, state.model_dump_json()))
    return keys, current


def time_batches(spark: SparkSession, client: redis.Redis, settings: Settings, batches: int) -> dict[str, float]:
    """The median time, in ms, of a batch's control state in this namespace, by part."""
    keys = Keys(settings.namespace)
    graph = ServiceGraph(
        spark,
        client,
        pipeline=settings.pipeline,
        kafka=settings.kafka,
        timeouts=settings.timeouts,
        recovery=settings.recovery,
    )
    current = CurrentQuery.model_validate_json(client.get(keys.current) or b"")
    record = GraphRecord.model_validate_json(client.hget(keys.graphs, current.query_id) or b"")
    owned = OwnershipReader(client, keys, record)
    owned()  # a writer reads the whole journal once, at its first batch
    service: list[float] = []
    writer: list[float] = []
    try:
        for _ in range(batches):
            began = time.perf_counter()
            # The control-state calls of ServiceGraph.route_batch, in its order (no rows: no Spark job).
            state = graph._load_state()
            batch_id = state.last_batch + 1
            graph._plan(batch_id, state, batch=None)  # type: ignore[arg-type]  # watermark set: rows unread
            graph._record(state, state.changed(last_batch=batch_id), BatchStats(partitions=[]), 0)
            service.append((time.perf_counter() - began) * 1000)
            began = time.perf_counter()
            owned()
            writer.append((time.perf_counter() - began) * 1000)
    finally:
        graph.stop()
    return {"service_batch_ms": statistics.median(service), "result_writer_ms": statistics.median(writer)}


def run_control_state(
    spark: SparkSession, client: redis.Redis, history: int = 200, batches: int = 300
) -> dict[str, Any]:
    """Both namespaces, measured in alternation (so drift on the machine hits both alike)."""
    one, many = settings_for("state-1"), settings_for(f"state-{history}")
    seed(client, one, 1)
    seeded = time.perf_counter()
    seed(client, many, history)
    seed_s = time.perf_counter() - seeded
    runs: dict[str, list[dict[str, float]]] = {"1": [], str(history): []}
    for _ in range(3):
        runs["1"].append(time_batches(spark, client, one, batches))
        runs[str(history)].append(time_batches(spark, client, many, batches))
    medians = {
        size: {part: round(statistics.median(r[part] for r in rounds), 3) for part in rounds[0]}
        for size, rounds in runs.items()
    }

    def total(size: str) -> float:
        return medians[size]["service_batch_ms"] + medians[size]["result_writer_ms"]

    ratio = round(total(str(history)) / total("1"), 3)
    return {
        "history_swaps": history,
        "batches_per_round": batches,
        "rounds": 3,
        "seed_s": round(seed_s, 1),
        "median_ms": medians,
        "ratio": ratio,
        "flat": ratio <= 1.10,
    }
