"""Watching a swap, on fakeredis: history, the live view, the dashboard, the metrics exposition (parsed
as Prometheus parses it), the HTTP endpoint and the dry run's request and plan. No Spark, no Kafka."""

from __future__ import annotations

import dataclasses
import http.client
import json
import threading
import urllib.request
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from typer.testing import CliRunner

from hotswap.contract.journal import PhaseEntry, SwapPhase, SwapRecord
from hotswap.contract.models import (
    CurrentQuery,
    ExecutorPhase,
    ExecutorRecord,
    GraphProgress,
    GraphRecord,
    GraphState,
    NodePosition,
    QueryKind,
    QuerySource,
    ServiceState,
    new_spark_query_id,
)
from hotswap.contract.names import Keys
from hotswap.contract.plans import DryRunRequest
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.settings import KafkaSettings, Settings
from hotswap.contract.source import SourceSpec
from hotswap.contract.windows import Windowing
from hotswap.executor.control import dry_run
from hotswap.executor.control.admission import Basis, basis_for
from hotswap.executor.control.dry_run import DryRuns
from hotswap.executor.operator import cli, client
from hotswap.executor.operator.client import Client
from hotswap.executor.operator.dashboard import page
from hotswap.executor.operator.history import history
from hotswap.executor.operator.metrics import BatchDurations, metrics_registry
from hotswap.executor.operator.observe import Rates, RateWindow, Snapshot, rates, take_snapshot
from hotswap.executor.operator.render import render_history
from hotswap.executor.operator.watch import WatchMemory, render_watch
from hotswap.executor.operator.web import MonitorServer
from tests.conftest import COMPLETED_SWAP_PHASES, DEMO_SOURCE

NS = "blue"
SETTINGS = Settings(namespace=NS)
PHASES = COMPLETED_SWAP_PHASES
T = 1_700_000_000_000  # wall clock of the first phase


def source(name: str, text: str = "SELECT 1") -> QuerySource:
    return QuerySource(name=name, kind=QueryKind.SQL, text=text)


def phases(names: list[str], start: int, step_ms: int = 2_000) -> tuple[PhaseEntry, ...]:
    return tuple(PhaseEntry(name=SwapPhase(n), at=start + i * step_ms) for i, n in enumerate(names))


@pytest.fixture
def server() -> fakeredis.FakeServer:
    """Namespace `blue`: a completed swap a -> b (W 30 s), and a swap b -> c draining (W 60 s)."""
    server = fakeredis.FakeServer()
    r = fakeredis.FakeRedis(server=server)
    keys = Keys(NS)
    r.set(keys.lease, "host:1:abcd:space")
    r.set(keys.executor, ExecutorRecord(holder="host:1:abcd:space", phase=ExecutorPhase.RUNNING).model_dump_json())
    r.set(keys.current, CurrentQuery(query_id="b", started_at=T).model_dump_json())
    for query_id, window, state in (("a", 10_000, GraphState.RETIRED), ("b", 30_000, GraphState.RUNNING)):
        record = GraphRecord(
            query_id=query_id,
            source=source(query_id, "SELECT <b>1</b> FROM events"),
            window_ms=window,
            slide_ms=window,
            topic=f"t.{query_id}",
            group_columns=("key",),
            state=state,
            started_at=T,
            spark_query_id=new_spark_query_id(),
            reads=DEMO_SOURCE,
        )
        r.hset(keys.graphs, query_id, record.model_dump_json())
    r.hset(
        keys.graphs,
        "c",
        GraphRecord(
            query_id="c",
            source=source("c"),
            window_ms=10_000,
            slide_ms=10_000,
            topic="t.c",
            state=GraphState.RUNNING,
            spark_query_id=new_spark_query_id(),
            reads=DEMO_SOURCE,
        ).model_dump_json(),
    )
    r.set(
        keys.progress("b"), GraphProgress(query_id="b", committed_batch=7, committed_watermark=50_000).model_dump_json()
    )
    service = ServiceState(
        last_batch=9,
        watermark=62_000,
        partitions={
            "0": NodePosition(window_end=70_000, event_time=64_000, offset=99),
            "1": NodePosition(idle=True, offset=9),
        },
    )
    r.set(keys.service, service.model_dump_json())
    r.hset(
        keys.counters,
        mapping={
            "late_records": 3,
            "dead_letter_records": 5,
            "expired_records": 1,
            "dead_letter:not_json": 2,
            "dead_letter:too_far_ahead": 3,
            "routed:b": 400,
            "routed:c": 25,
        },
    )
    done = SwapRecord(
        id="s1",
        to_query="b",
        from_query="a",
        source=source("b"),
        state=SwapPhase.COMPLETED,
        phases=phases(PHASES, T),
        cut_window_end=30_000,
        old_window_ms=10_000,
        old_slide_ms=10_000,
        new_window_ms=30_000,
        new_slide_ms=30_000,
    )
    running = SwapRecord(
        id="s2",
        to_query="c",
        from_query="b",
        source=source("c"),
        state=SwapPhase.DRAINING,
        phases=phases(PHASES[:6], T + 58_000),
        cut_window_end=60_000,
        old_window_ms=30_000,
        old_slide_ms=30_000,
        new_window_ms=10_000,
        new_slide_ms=10_000,
    )
    for swap in (done, running):
        r.set(keys.swap(swap.id), swap.model_dump_json())
        r.rpush(keys.swaps, swap.id)
    return server


@pytest.fixture
def api(server: fakeredis.FakeServer) -> Client:
    return Client(SETTINGS.control, SETTINGS.kafka, SETTINGS.pipeline, fakeredis.FakeRedis(server=server))


def snapshot(api: Client, at_ms: int = T + 70_000) -> Snapshot:
    snap = take_snapshot(api)
    return Snapshot(snap.status, snap.counters, snap.graphs, at_ms, snap.taken_s, {"c": 120}, 52)


# -- history ----------------------------------------------------------------------------------------
def test_history_lists_swaps_newest_first_with_each_phases_duration(api: Client) -> None:
    entries = history(api.status(), now_ms=T + 70_000)
    assert [e.id for e in entries] == ["s2", "s1"]
    done = entries[1]
    assert (done.state, done.ended, done.cut_window_end, done.seconds) == ("completed", True, 30_000, 18.0)
    assert [p.name for p in done.phases] == PHASES
    assert [p.seconds for p in done.phases] == [2.0] * 9 + [None]
    running = entries[0]
    assert (running.ended, running.ended_at) == (False, None)
    assert running.phases[-1].seconds == 2.0  # in `draining` since T + 68 s
    assert [e.id for e in history(api.status(), T + 70_000, limit=1)] == ["s2"]


def test_history_json_is_the_documented_list(server: fakeredis.FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client, "redis_client", lambda settings, retries=40: fakeredis.FakeRedis(server=server))
    monkeypatch.setattr(cli, "configure_logging", lambda *args, **kwargs: None)
    result = CliRunner().invoke(cli.app, ["--namespace", NS, "history", "--json", "--limit", "2"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert [e["id"] for e in doc] == ["s2", "s1"]
    assert set(doc[1]) == {
        "id",
        "from_query",
        "to_query",
        "state",
        "ended",
        "submitted_at",
        "ended_at",
        "seconds",
        "cut_window_end",
        "phases",
        "error",
        "reason_code",
        "rollback_of",
    }
    assert doc[1]["phases"][0] == {"name": "submitted", "at": T, "seconds": 2.0}
    table = CliRunner().invoke(cli.app, ["--namespace", NS, "history"])
    assert table.exit_code == 0
    assert "s1" in table.stdout


def test_every_command_documents_its_exit_codes() -> None:
    for command in ("status", "history", "submit", "run", "abort", "rollback", "generate", "demo", "stack"):
        result = CliRunner().invoke(cli.app, [command, "--help"], env={"COLUMNS": "200"})
        assert "Exit codes" in result.stdout, command


# -- the live view ----------------------------------------------------------------------------------
def test_the_live_view_shows_the_swap_in_progress_with_progress_bars(api: Client) -> None:
    before = snapshot(api)
    memory = WatchMemory()
    out = Console(record=True, width=160, color_system=None)
    out.print(
        render_watch(
            snapshot(api), Rates(routed={"c": 50.0}, results=4.0), memory, SETTINGS.pipeline, SETTINGS.timeouts
        )
    )
    text = out.export_text()
    for phase in PHASES[:6]:
        assert phase in text
    assert "swap s2 in progress: b -> c" in text
    assert "W = 00:01:00.000" in text
    assert "waiting for: b to emit its windows through W" in text
    assert "b emitted -> W" in text  # the old graph's committed watermark against W
    assert "120 rows waiting in its topic" in text
    assert "routed 50/s" in text
    assert "late records 3   dead-letter records 5   expired records 1" in text
    assert "not_json 2, too_far_ahead 3" in text
    assert "idle" in text
    assert rates(before, before) == Rates()


def test_rates_are_taken_over_a_window_of_snapshots(api: Client) -> None:
    first = snapshot(api)
    window = RateWindow(span_s=5.0)
    assert window.add(first) == Rates()

    def later(seconds: float, read: int, written: int) -> Snapshot:
        return dataclasses.replace(
            first,
            taken_s=first.taken_s + seconds,
            results_written=written,
            counters={**first.counters, "routed:c": first.counters["routed:c"] + read},
        )

    assert window.add(later(1.0, 100, 52)).results == 0.0
    rate = window.add(later(2.0, 400, 152))
    assert (rate.results, rate.routed["c"]) == (50.0, 200.0)  # over the 2 s since the first snapshot
    assert window.add(later(8.0, 1000, 452)).results == 50.0  # from the 2 s one: the first dropped out


def test_the_live_view_shows_the_deploy_against_its_timeout(server: fakeredis.FakeServer, api: Client) -> None:
    r = fakeredis.FakeRedis(server=server)
    deploying = SwapRecord(
        id="s2", to_query="c", source=source("c"), state=SwapPhase.DEPLOYING, phases=phases(PHASES[:3], T + 60_000)
    )
    r.set(Keys(NS).swap("s2"), deploying.model_dump_json())
    out = Console(record=True, width=160, color_system=None)
    # In `deploying` since T + 64 s: the deploy is measured from there.
    out.print(
        render_watch(
            snapshot(api, at_ms=T + 64_000 + 30_000), Rates(), WatchMemory(), SETTINGS.pipeline, SETTINGS.timeouts
        )
    )
    text = out.export_text()
    assert "deploy" in text
    assert "30.0 s of 120 s allowed" in text


def stranded(server: fakeredis.FakeServer) -> None:
    """Swap s2 (b -> c) stranded: c failed for good after the cut."""
    r = fakeredis.FakeRedis(server=server)
    swap = SwapRecord(
        id="s2",
        to_query="c",
        from_query="b",
        source=source("c"),
        state=SwapPhase.STRANDED,
        phases=phases([*PHASES[:5], "stranded"], T + 58_000),
        cut_window_end=60_000,
        old_window_ms=30_000,
        old_slide_ms=30_000,
        new_window_ms=10_000,
        new_slide_ms=10_000,
        error="query c kept failing after 3 restarts (poison row)",
        reason_code=ReasonCode.QUERY_FAILED_AFTER_CUT,
    )
    r.set(Keys(NS).swap("s2"), swap.model_dump_json())


def test_a_stranded_swap_shows_in_every_view_with_its_reason_code_and_the_way_out(
    server: fakeredis.FakeServer, api: Client
) -> None:
    stranded(server)
    snap = snapshot(api)
    out = Console(record=True, width=200, color_system=None)
    out.print(render_watch(snap, Rates(), WatchMemory(), SETTINGS.pipeline, SETTINGS.timeouts))
    text = out.export_text()
    assert "swap s2 in progress: b -> c" in text  # nothing runs, but it waits for an operator
    assert "stranded" in text
    assert "error: query c kept failing after 3 restarts (poison row) [query_failed_after_cut]" in text
    assert "`hotswap rollback s2` or `hotswap submit FILE --fix s2` to take over its input" in text
    entry = history(api.status(), now_ms=T + 70_000)[0]
    assert (entry.state, entry.ended, entry.reason_code) == ("stranded", False, "query_failed_after_cut")
    lines = Console(record=True, width=200, color_system=None)
    render_history([entry], lines)
    listed = lines.export_text()
    assert "s2 b -> c: stranded (waits for a rollback or a fix)" in listed
    assert "  query c kept failing after 3 restarts (poison row) [query_failed_after_cut]" in listed
    assert ">stranded<" in page(snap, Rates())
    assert "[query_failed_after_cut]" in page(snap, Rates())
    m = exposition(api)
    assert m['hotswap_swaps_total{outcome="stranded"}'] == 1
    assert m['hotswap_swap_phase{phase="stranded"}'] == 1
    assert m['hotswap_swap_in_progress{from_query="b",swap_id="s2",to_query="c"}'] == 1


def test_the_swap_in_progress_is_the_one_the_executor_drives(server: fakeredis.FakeServer, api: Client) -> None:
    """A stranded swap's rollback (a recovery) is in progress, not the stranded swap before it."""
    stranded(server)
    r = fakeredis.FakeRedis(server=server)
    back = SwapRecord(
        id="s3",
        to_query="b-2",
        from_query="c",
        source=source("b"),
        state=SwapPhase.DEPLOYING,
        phases=phases(PHASES[:3], T + 66_000),
        rollback_of="s2",
        recovers="s2",
    )
    r.set(Keys(NS).swap("s3"), back.model_dump_json())
    r.rpush(Keys(NS).swaps, "s3")
    active = snapshot(api).active_swap
    assert active is not None
    assert (active.id, active.recovers, active.is_recovery) == ("s3", "s2", True)


# -- the dashboard ----------------------------------------------------------------------------------
def test_the_dashboard_shows_the_query_the_timeline_with_w_and_the_owners(api: Client) -> None:
    html = page(snapshot(api), Rates())
    for phase in PHASES:  # every phase of the table a swap went through, deploying and retiring too
        assert f">{phase}<" in html, phase
    assert "W = 00:00:30.000" in html
    assert "W = 00:01:00.000" in html
    assert "SELECT &lt;b&gt;1&lt;/b&gt; FROM events" in html  # the query text, escaped
    assert "key STRING NOT NULL, value DOUBLE NOT NULL" in html  # the schema it reads (DEMO_SOURCE)
    assert "windows ending after" in html
    assert "dead letters by reason: not_json 2, too_far_ahead 3" in html
    assert "setInterval(refresh, 1000)" in html


# -- metrics ----------------------------------------------------------------------------------------
class Lease:
    renewals = 7
    renewal_failures = 1


def exposition(api: Client) -> dict[str, float]:
    registry, _ = metrics_registry(lambda: snapshot(api), Lease())
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def test_the_metrics_follow_prometheus_naming_and_read_the_journal(api: Client) -> None:
    m = exposition(api)
    assert all(name.startswith("hotswap_") for name in m)
    assert m['hotswap_swaps_total{outcome="completed"}'] == 1
    assert m['hotswap_swaps_total{outcome="failed"}'] == 0
    assert m['hotswap_swap_phase_transitions_total{phase="cut"}'] == 2
    assert m['hotswap_swap_phase_transitions_total{phase="completed"}'] == 1
    assert m['hotswap_swap_phase_duration_seconds_count{phase="drained"}'] == 1
    assert m['hotswap_swap_phase_duration_seconds_sum{phase="cut"}'] == 4.0
    assert m['hotswap_swap_phase_duration_seconds_bucket{le="2.5",phase="validated"}'] == 2
    assert m["hotswap_swap_duration_seconds_count"] == 1
    assert m['hotswap_swap_phase{phase="draining"}'] == 1
    assert m['hotswap_swap_phase{phase="cut"}'] == 0
    assert m["hotswap_swap_phase_elapsed_seconds"] == 2.0
    assert m['hotswap_swap_in_progress{from_query="b",swap_id="s2",to_query="c"}'] == 1
    assert m['hotswap_routed_records_total{query_id="b"}'] == 400
    assert m["hotswap_results_written_total"] == 52
    assert m['hotswap_dead_letter_records_total{reason="not_json"}'] == 2
    assert m['hotswap_dead_letter_records_total{reason="too_far_ahead"}'] == 3
    assert m["hotswap_late_records_total"] == 3
    assert m["hotswap_expired_records_total"] == 1
    assert m["hotswap_service_watermark_seconds"] == 62.0
    assert m["hotswap_service_watermark_lag_seconds"] == (T + 70_000 - 62_000) / 1000
    assert m['hotswap_partition_idle{partition="1"}'] == 1
    assert m['hotswap_graph_committed_watermark_seconds{query_id="b"}'] == 50.0
    assert m["hotswap_lease_renewals_total"] == 7
    assert m["hotswap_lease_renewal_failures_total"] == 1
    assert m['hotswap_executor_phase{phase="running"}'] == 1


class Query:
    def __init__(self, name: str, reports: list[dict[str, Any]]) -> None:
        self.name = name
        self.recentProgress = reports
        self.lastProgress = reports[-1] if reports else None


def report(batch: int, ms: int) -> dict[str, Any]:
    return {"batchId": batch, "durationMs": {"triggerExecution": ms}}


def test_micro_batch_durations_are_observed_once_per_batch_and_per_query() -> None:
    registry = CollectorRegistry()
    queries = [Query("hotswap.blue.service", [report(0, 1500)]), Query("hotswap.green.service", [report(0, 9)])]
    durations = BatchDurations(registry, "hotswap.blue.", lambda: queries)
    durations.poll()
    durations.poll()  # the same batch again: not observed twice
    queries[0] = Query("hotswap.blue.service", [report(0, 1500), report(1, 500), report(2, 700)])
    queries.append(Query("hotswap.blue.graph.count_per_key", [report(4, 2000)]))
    durations.poll()

    def value(name: str, **labels: str) -> float | None:
        return registry.get_sample_value(name, labels)

    assert value("hotswap_microbatch_duration_seconds_count", query="service") == 3
    assert value("hotswap_microbatch_duration_seconds_sum", query="service") == pytest.approx(2.7)
    assert value("hotswap_microbatch_duration_seconds_count", query="count_per_key") == 1
    assert value("hotswap_microbatch_duration_seconds_count", query="hotswap.green.service") is None


# -- the endpoint -----------------------------------------------------------------------------------
@pytest.fixture
def endpoint(api: Client) -> Iterator[str]:
    settings = Settings(namespace=NS, metrics_port=0)
    monitor = MonitorServer(settings.operator, settings.names, api, lease=Lease()).start()
    try:
        yield monitor.url
    finally:
        monitor.stop()


def fetch(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - a local test server
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, "", ""


def test_the_endpoint_serves_metrics_the_dashboard_and_json(endpoint: str) -> None:
    code, kind, body = fetch(f"{endpoint}metrics")
    assert (code, kind.split(";")[0]) == (200, "text/plain")
    assert 'hotswap_swaps_total{outcome="completed"} 1.0' in body
    code, kind, body = fetch(endpoint)
    assert (code, kind.split(";")[0]) == (200, "text/html")
    assert "<script>" in body
    code, _, body = fetch(f"{endpoint}fragment")
    assert code == 200
    assert ">draining<" in body
    assert "<script>" not in body
    code, _, body = fetch(f"{endpoint}api/status")
    assert [h["id"] for h in json.loads(body)["history"]] == ["s2", "s1"]
    assert fetch(f"{endpoint}nope")[0] == 404


def test_the_endpoint_binds_loopback_unless_told(endpoint: str) -> None:
    assert endpoint.startswith("http://127.0.0.1:")
    assert Settings().metrics_host == "127.0.0.1"


def get(port: int, path: str, **headers: str) -> tuple[int, dict[str, str]]:
    """A GET with exactly these headers (urllib would set Host itself)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.putrequest("GET", path, skip_host="Host" in headers)
        for name, value in headers.items():
            connection.putheader(name, value)
        connection.endheaders()
        response = connection.getresponse()
        response.read()
        return response.status, dict(response.getheaders())
    finally:
        connection.close()


def test_the_endpoint_answers_only_to_its_own_address(endpoint: str) -> None:
    port = int(endpoint.rstrip("/").rsplit(":", 1)[1])
    assert get(port, "/api/status", Host=f"127.0.0.1:{port}")[0] == 200
    assert get(port, "/api/status", Host=f"localhost:{port}")[0] == 200
    # A page of another origin whose name was rebound to 127.0.0.1 sends its own name.
    assert get(port, "/api/status", Host=f"attacker.example:{port}")[0] == 421
    assert get(port, "/", Host="127.0.0.1:1")[0] == 421
    assert get(port, "/metrics", Host=f"attacker.example:{port}")[0] == 421


def test_beyond_loopback_the_dashboard_wants_its_token_and_metrics_stay_open(api: Client) -> None:
    settings = Settings(namespace=NS, metrics_port=0, metrics_host="0.0.0.0", metrics_token="t0ken-for-tests")  # noqa: S104
    monitor = MonitorServer(settings.operator, settings.names, api, lease=Lease()).start()
    try:
        port = monitor.port
        assert get(port, "/")[0] == 401
        assert get(port, "/api/status")[0] == 401
        assert get(port, "/api/status?token=wrong")[0] == 401
        assert get(port, "/metrics")[0] == 200
        assert get(port, "/healthz")[0] == 200
        assert get(port, "/api/status", Authorization="Bearer t0ken-for-tests")[0] == 200
        code, headers = get(port, "/?token=t0ken-for-tests")
        assert code == 200
        cookie = headers["Set-Cookie"].split(";")[0]
        assert get(port, "/fragment", Cookie=cookie)[0] == 200
    finally:
        monitor.stop()
    anywhere = Settings(namespace=NS, metrics_port=0, metrics_host="0.0.0.0")  # noqa: S104
    generated = MonitorServer(anywhere.operator, anywhere.names, api).start()
    try:
        assert generated.gate.token is not None
        assert len(generated.gate.token) >= 24
        assert get(generated.port, "/", Authorization=f"Bearer {generated.gate.token}")[0] == 200
    finally:
        generated.stop()


# -- the dry run ------------------------------------------------------------------------------------
class Shape:
    window_ms = 30_000
    columns = ("window_start", "window_end", "key", "peak")
    group_columns = ("key",)
    windowing = Windowing(30_000, 30_000)


class Stream:
    schema = None  # schema_ddl is replaced below


class Validating:
    """The graphs a dry run validates with: reads the namespace's source, validates with `validate`."""

    namespace_source = DEMO_SOURCE

    def __init__(self, validate: Any) -> None:
        self.validate = validate

    def version_reads(self, source: Any, predecessor: SourceSpec) -> SourceSpec:
        return predecessor


def answer_with(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(dry_run, "events_stream", lambda *args, **kwargs: Stream())
    monkeypatch.setattr(dry_run, "schema_ddl", lambda schema: "key STRING, event_time TIMESTAMP")


def test_a_dry_run_plans_the_cut_and_changes_nothing(
    server: fakeredis.FakeServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    answer_with(monkeypatch)
    r = fakeredis.FakeRedis(server=server)
    before = {key: r.dump(key) for key in r.keys("*")}
    graphs = Validating(lambda source, running, reads: Shape())
    settings = Settings(namespace=NS, lateness="2s")
    executor = DryRuns(
        None,  # type: ignore[arg-type]
        r,
        graphs,  # type: ignore[arg-type]
        pipeline=settings.pipeline,
        kafka=settings.kafka,
        timeouts=settings.timeouts,
    )
    query = tmp_path / "max_30s.sql"
    query.write_text("SELECT 1")
    api = Client(SETTINGS.control, SETTINGS.kafka, SETTINGS.pipeline, fakeredis.FakeRedis(server=server))
    answered = threading.Event()

    def executor_loop() -> None:
        while not answered.wait(0.05):
            executor.answer_pending()

    answering = threading.Thread(target=executor_loop)
    answering.start()
    try:
        plan = api.dry_run(query, timeout_s=10)
    finally:
        answered.set()
        answering.join()
    assert plan.valid
    # It would replace c (the target of the swap in flight), whose windows are 10 s, so W is the
    # next 30 s boundary at or after the largest routed window end (70 s): 90 s.
    assert (plan.replaces, plan.replaces_window_ms, plan.window_ms) == ("c", 10_000, 30_000)
    assert (plan.cut_window_end, plan.floor, plan.ahead) == (90_000, 92_000, ("s2",))
    assert plan.group_columns == ("key",)
    assert plan.schema_ddl == "key STRING, event_time TIMESTAMP"
    assert {key: r.dump(key) for key in r.keys("*")} == before


def test_a_rejected_dry_run_says_why(server: fakeredis.FakeServer, monkeypatch: pytest.MonkeyPatch) -> None:
    from hotswap.execution_graph.errors import QueryRejected

    def reject(*args: Any) -> Any:
        raise QueryRejected("query 'x' has no window(event_time, ...) in its plan; is it windowed?")

    answer_with(monkeypatch)
    settings = Settings(namespace=NS)
    plan = DryRuns(
        None,  # type: ignore[arg-type]
        fakeredis.FakeRedis(server=server),
        Validating(reject),  # type: ignore[arg-type]
        pipeline=settings.pipeline,
        kafka=settings.kafka,
        timeouts=settings.timeouts,
    ).plan(DryRunRequest(id="r1", source=source("x")))
    assert not plan.valid
    assert plan.reason == "query 'x' has no window(event_time, ...) in its plan; is it windowed?"
    assert plan.cut_window_end is None


def test_the_query_a_submit_would_replace_is_the_last_one_in_flight() -> None:
    """Admission's basis, which a dry run reads too (executor/control/admission.py, basis_for)."""
    a = GraphRecord(
        query_id="a",
        source=source("a"),
        window_ms=10_000,
        slide_ms=10_000,
        topic="t",
        spark_query_id=new_spark_query_id(),
        reads=DEMO_SOURCE,
    )
    queued = SwapRecord(id="q", to_query="z", state=SwapPhase.VALIDATED, new_window_ms=20_000, new_slide_ms=20_000)
    graphs = {"a": a}
    namespace = DEMO_SOURCE.changed(timestamp_format="yyyy-MM-dd HH:mm:ss")  # not the one a reads
    assert basis_for([], "a", graphs.get, namespace) == Basis("a", Windowing(10_000, 10_000), DEMO_SOURCE)
    # z is recorded with `validated`; its windows are the swap's as validated all the same.
    assert basis_for([queued], "a", graphs.get, namespace) == Basis("z", Windowing(20_000, 20_000), namespace)
    assert basis_for([], None, graphs.get, namespace) == Basis(None, None, namespace)  # the namespace's first query


def test_a_rejected_dry_run_exits_1_with_the_plan_on_stdout(
    server: fakeredis.FakeServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    from hotswap.contract.plans import DryRunPlan

    monkeypatch.setattr(client, "redis_client", lambda settings, retries=40: fakeredis.FakeRedis(server=server))
    monkeypatch.setattr(cli, "configure_logging", lambda *args, **kwargs: None)
    rejected = DryRunPlan(request_id="r", query="x", valid=False, reason="query 'x' has no window")
    monkeypatch.setattr(Client, "dry_run", lambda self, path, name=None, timeout_s=120.0, **declared: rejected)
    query = tmp_path / "x.sql"
    query.write_text("SELECT 1")
    result = CliRunner().invoke(cli.app, ["--namespace", NS, "submit", str(query), "--dry-run", "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["reason"] == "query 'x' has no window"
    assert result.stderr.strip() == "hotswap: rejected: query 'x' has no window"


@pytest.mark.parametrize("terminal", [True, False])
def test_the_watch_redraws_until_ctrl_c_and_ends_cleanly(
    api: Client, monkeypatch: pytest.MonkeyPatch, terminal: bool
) -> None:
    from hotswap.executor.operator import watch as live

    sleeps: list[float] = []

    class CtrlC(threading.Event):
        """Pressed during the third wait (the CLI's SIGINT handler sets the event)."""

        def wait(self, timeout: float | None = None) -> bool:
            sleeps.append(timeout or 0.0)
            if len(sleeps) == 3:
                self.set()
            return self.is_set()

    class NoKafka:
        def __init__(self, kafka: KafkaSettings, sink_topic: str) -> None: ...

        def read(self, client: Client, graphs: Any) -> Any:
            raise OSError("no broker in a unit test")

        def close(self) -> None: ...

    monkeypatch.setattr(live, "KafkaPositions", NoKafka)
    out = Console(record=True, width=160, color_system=None, force_terminal=terminal)
    live.watch(
        api, SETTINGS.pipeline, SETTINGS.kafka, SETTINGS.timeouts, out, interval_s=0.5, stop=CtrlC()
    )  # returns: Ctrl-C is the way out
    text = out.export_text()
    assert sleeps == [0.5, 0.5, 0.5]
    assert "swap s2 in progress: b -> c" in text
    assert "Traceback" not in text
