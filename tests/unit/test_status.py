"""The status document on fakeredis: its model, its JSON (`hotswap status --json`) and its
published schema. No Spark, no Kafka."""

from __future__ import annotations

import json
from pathlib import Path

import fakeredis
import pytest
from typer.testing import CliRunner

from hotswap.contract.journal import Journal, SwapPhase, SwapRecord
from hotswap.contract.models import (
    CurrentQuery,
    ExecutorPhase,
    ExecutorRecord,
    GraphProgress,
    GraphRecord,
    GraphState,
    NamespaceRecord,
    NodePosition,
    QueryKind,
    QuerySource,
    ServiceState,
    new_spark_query_id,
)
from hotswap.contract.names import Keys
from hotswap.contract.phases import diagram_markdown
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.settings import Settings
from hotswap.contract.status import Status, json_schema_text
from hotswap.executor.operator import cli, client
from tests.conftest import DEMO_SOURCE

REPO = Path(__file__).resolve().parents[2]
SCHEMA = REPO / "docs" / "status.schema.json"
DIAGRAM = REPO / "docs" / "swap-states.md"


def source(name: str) -> QuerySource:
    return QuerySource(name=name, kind=QueryKind.SQL, text=f"-- {name}")


@pytest.fixture
def server() -> fakeredis.FakeServer:
    """A namespace `blue` with an executor, two graphs and a swap past its cut."""
    server = fakeredis.FakeServer()
    r = fakeredis.FakeRedis(server=server)
    keys = Keys("blue")
    r.set(keys.lease, "host:1:abcd:space")
    r.set(keys.namespace_record, NamespaceRecord(created_by="host:1:abcd:space", source=DEMO_SOURCE).model_dump_json())
    r.set(
        keys.executor, ExecutorRecord(holder="host:1:abcd:space", phase=ExecutorPhase.RUNNING, at=7).model_dump_json()
    )
    r.set(keys.current, CurrentQuery(query_id="b", started_at=5).model_dump_json())
    for query_id, window_ms in (("a", 10_000), ("b", 30_000)):
        record = GraphRecord(
            query_id=query_id,
            source=source(query_id),
            window_ms=window_ms,
            slide_ms=window_ms,
            topic=f"t.{query_id}",
            state=GraphState.RUNNING,
            spark_query_id=new_spark_query_id(),
            reads=DEMO_SOURCE,
        )
        r.hset(keys.graphs, record.query_id, record.model_dump_json())
    r.set(
        keys.progress("a"), GraphProgress(query_id="a", committed_batch=3, committed_watermark=20_000).model_dump_json()
    )
    service = ServiceState(
        last_batch=9,
        watermark=25_000,
        partitions={"10": NodePosition(window_end=40_000, offset=5), "2": NodePosition(idle=True)},
    )
    r.set(keys.service, service.model_dump_json())
    r.hset(keys.counters, mapping={"late_records": 3})
    journal = Journal(r, keys)
    journal.create(SwapRecord(id="s1", to_query="b", source=source("b")))
    journal.advance("s1", SwapPhase.VALIDATED)
    journal.advance("s1", SwapPhase.DEPLOYING, from_query="a")
    journal.advance("s1", SwapPhase.DEPLOYED)
    journal.advance("s1", SwapPhase.CUT, cut_window_end=30_000, cut_batch=4)
    return server


def status_of(server: fakeredis.FakeServer, namespace: str = "blue") -> Status:
    settings = Settings(namespace=namespace)
    return client.Client(
        settings.control, settings.kafka, settings.pipeline, fakeredis.FakeRedis(server=server)
    ).status()


def test_status_is_a_typed_document(server: fakeredis.FakeServer) -> None:
    status = status_of(server)
    assert status.executor.phase is ExecutorPhase.RUNNING
    assert status.current is not None
    assert status.current.query_id == "b"
    assert list(status.service.partitions) == ["2", "10"]  # by partition number
    [swap] = status.swaps
    assert (swap.state, swap.cut_window_end, swap.from_query) == (SwapPhase.CUT, 30_000, "a")
    assert swap.waiting_for is not None
    assert swap.waiting_for.startswith("drain: service watermark")
    assert [(o.query_id, o.after, o.through, o.swap_id) for o in status.owners] == [
        ("a", None, 30_000, None),
        ("b", 30_000, None, "s1"),
    ]
    progress = status.graphs["a"].progress
    assert progress is not None
    assert progress.committed_watermark == 20_000
    assert status.graphs["b"].progress is None
    assert (status.late_records, status.dead_letter_records) == (3, 0)


def test_an_empty_namespace_has_a_stopped_executor_and_nothing_else(server: fakeredis.FakeServer) -> None:
    status = status_of(server, "green")
    assert (status.executor.holder, status.executor.phase, status.executor.since) == (None, "stopped", None)
    assert (status.current, status.swaps, status.owners, status.graphs) == (None, [], [], {})


def test_status_json_keeps_the_documented_field_names(
    server: fakeredis.FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client, "redis_client", lambda settings, retries=40: fakeredis.FakeRedis(server=server))
    monkeypatch.setattr(cli, "configure_logging", lambda *args, **kwargs: None)  # leave the test's logging alone
    result = CliRunner().invoke(cli.app, ["--namespace", "blue", "status", "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    # Fields may be added (after these), never renamed or removed.
    assert list(doc)[:10] == [
        "namespace",
        "executor",
        "current",
        "swaps",
        "owners",
        "service",
        "graphs",
        "late_records",
        "dead_letter_records",
        "expired_records",
    ]
    assert doc["executor"] == {"holder": "host:1:abcd:space", "phase": "running", "since": 7}
    assert doc["current"] == {"query_id": "b", "started_at": 5}
    assert set(doc["swaps"][0]) == {
        "id",
        "from_query",
        "to_query",
        "state",
        "cut_window_end",
        "cut_batch",
        "old_window_ms",
        "new_window_ms",
        "old_slide_ms",
        "new_slide_ms",
        "phases",
        "error",
        "reason_code",
        "waiting_for",
        "rollback_of",
        "recovers",
        "replaces",
        "auto_rollback",
        "cause",
        "shadow",
        "shadow_since",
        "promote",
        "diff",
        "note",
    }
    assert doc["swaps"][0]["phases"][0]["name"] == "submitted"
    # The version that answered before any cut has no swap_id, as before the document was a model.
    assert doc["owners"] == [
        {"query_id": "a", "after": None, "through": 30_000},
        {"query_id": "b", "after": 30_000, "through": None, "swap_id": "s1"},
    ]
    assert doc["service"]["partitions"]["10"] == {"window_end": 40_000, "event_time": None, "offset": 5, "idle": False}
    assert set(doc["graphs"]["a"]) >= {"state", "topic", "window_ms", "kind", "started_at", "retired_at", "progress"}
    # A tumbling graph slides by its size; each graph shows the schema its version reads.
    assert (doc["graphs"]["b"]["window_ms"], doc["graphs"]["b"]["slide_ms"]) == (30_000, 30_000)
    assert doc["graphs"]["b"]["source_schema"] == DEMO_SOURCE.schema_ddl
    assert doc["source"] == DEMO_SOURCE.describe()
    assert "dead_letters" in doc
    assert Status.model_validate(doc) == status_of(server)


def test_the_published_schema_is_current() -> None:
    assert SCHEMA.read_text(encoding="utf-8") == json_schema_text(), (
        "docs/status.schema.json is stale: regenerate it with `make schema`"
    )


def test_the_published_state_diagram_is_the_phase_table() -> None:
    assert DIAGRAM.read_text(encoding="utf-8") == diagram_markdown(), (
        "docs/swap-states.md is stale: regenerate it with `make schema` (or `make diagram`)"
    )


def test_a_failure_shows_its_reason_code_in_status(server: fakeredis.FakeServer) -> None:
    journal = Journal(fakeredis.FakeRedis(server=server), Keys("blue"))
    journal.create(SwapRecord(id="s2", to_query="c", source=source("c")))
    journal.advance("s2", SwapPhase.ABORTED, error="aborted by operator", reason_code=ReasonCode.ABORTED_BY_OPERATOR)
    swap = next(s for s in status_of(server).swaps if s.id == "s2")
    assert (swap.state, swap.reason_code, swap.waiting_for) == (SwapPhase.ABORTED, "aborted_by_operator", None)
