"""The service sink's progress reports: a graph counts as drained through its committed watermark only."""

from __future__ import annotations

import json
from typing import Any, cast

import fakeredis
from pyspark.sql.streaming.listener import StreamingQueryProgress
from pyspark.sql.streaming.query import StreamingQuery

from hotswap.contract.names import Keys
from hotswap.contract.records import read_progress
from hotswap.service_sink.progress import ProgressReporter

KEYS = Keys("unit")


class FakeQuery:
    """A graph's query as the reporter sees it: its last progress, or none yet."""

    def __init__(self) -> None:
        self.lastProgress: StreamingQueryProgress | None = None

    def ran(self, batch_id: int, watermark: str, rows: int = 1) -> None:
        self.lastProgress = StreamingQueryProgress.fromJson(progress_json(batch_id, watermark, rows))


def progress_json(batch_id: int, watermark: str, rows: int) -> dict[str, Any]:
    return {
        "id": "00000000-0000-0000-0000-000000000001",
        "runId": "00000000-0000-0000-0000-000000000002",
        "name": "hotswap.unit.graph.a",
        "timestamp": "2026-11-23T10:00:00.000Z",
        "batchId": batch_id,
        "batchDuration": 10,
        "durationMs": {},
        "eventTime": {"watermark": watermark},
        "stateOperators": [],
        "sources": [
            {
                "description": "KafkaV2[Subscribe[t.a]]",
                "startOffset": None,
                "endOffset": json.dumps({"t.a": {"0": 40 + batch_id}}),
                "latestOffset": None,
                "numInputRows": rows,
                "inputRowsPerSecond": 0.0,
                "processedRowsPerSecond": 0.0,
            }
        ],
        "sink": {"description": "ForeachBatchSink", "numOutputRows": -1},
        "numInputRows": rows,
        "inputRowsPerSecond": 0.0,
        "processedRowsPerSecond": 0.0,
    }


def test_a_batch_is_reported_at_once_and_its_watermark_counts_only_once_committed() -> None:
    client = fakeredis.FakeRedis()
    committed: set[int] = set()
    reporter = ProgressReporter(client, KEYS, lambda query_id, batch: batch in committed)
    query = FakeQuery()
    queries = {"a": cast(StreamingQuery, query)}

    reporter.report(queries)  # no batch yet: nothing to report
    assert read_progress(client, KEYS, "a") is None

    query.ran(3, "2023-11-14T22:13:30.000Z")
    reporter.report(queries)
    seen = read_progress(client, KEYS, "a")
    assert seen is not None
    assert (seen.batch_id, seen.watermark, seen.input_offsets) == (3, 1_700_000_010_000, {"t.a": {"0": 43}})
    assert seen.committed_watermark is None  # Spark reports a batch before it commits it

    committed.add(3)
    reporter.report(queries)
    confirmed = read_progress(client, KEYS, "a")
    assert confirmed is not None
    assert (confirmed.committed_batch, confirmed.committed_watermark) == (3, 1_700_000_010_000)


def test_a_batch_missed_between_polls_is_covered_by_the_next_committed_one() -> None:
    client = fakeredis.FakeRedis()
    reporter = ProgressReporter(client, KEYS, lambda query_id, batch: True)
    query = FakeQuery()
    query.ran(7, "2023-11-14T22:14:00.000Z")  # batches 0..6 ran between two polls
    reporter.report({"a": cast(StreamingQuery, query)})
    confirmed = read_progress(client, KEYS, "a")
    assert confirmed is not None
    assert (confirmed.committed_batch, confirmed.committed_watermark) == (7, 1_700_000_040_000)


def test_a_reporter_after_a_restart_continues_from_the_stored_report() -> None:
    client = fakeredis.FakeRedis()
    first = ProgressReporter(client, KEYS, lambda query_id, batch: True)
    query = FakeQuery()
    query.ran(5, "2023-11-14T22:13:40.000Z")
    first.report({"a": cast(StreamingQuery, query)})

    restarted = ProgressReporter(client, KEYS, lambda query_id, batch: False)
    query.ran(6, "2023-11-14T22:13:50.000Z")  # reported, not yet committed
    restarted.report({"a": cast(StreamingQuery, query)})
    stored = read_progress(client, KEYS, "a")
    assert stored is not None
    assert (stored.batch_id, stored.committed_batch, stored.committed_watermark) == (6, 5, 1_700_000_020_000)
