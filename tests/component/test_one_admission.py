"""One admission: a submit, a dry run and the namespace's first query are analysed by the same
`Analyser.analyse(source, basis)` against the same basis, refused with the same reason, and a
valid query's graph record is built in one place (executor/control/admission.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import cast

import pytest

from hotswap.contract.journal import SwapPhase
from hotswap.contract.plans import DryRunPlan, DryRunRequest
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.settings import Settings
from hotswap.execution_graph.errors import QueryRejected
from hotswap.executor.control import dry_run
from hotswap.executor.control.admission import Analyser
from hotswap.executor.control.controller import Executor
from hotswap.executor.control.dry_run import DryRuns
from tests.component.fakes import NO_SPARK, World, at_once, query

pytestmark = pytest.mark.component


class Stream:
    schema = None  # schema_ddl is replaced below


@pytest.fixture(autouse=True)
def no_spark_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The dry run's `events` schema needs Spark: faked, as the rest of Spark is here."""
    monkeypatch.setattr(dry_run, "events_stream", lambda *args, **kwargs: Stream())
    monkeypatch.setattr(dry_run, "schema_ddl", lambda schema: "key STRING, event_time TIMESTAMP")


def dry_run_of(world: World, name: str, window_ms: int) -> DryRunPlan:
    dry_runs = DryRuns(
        NO_SPARK,
        world.client,
        world.graphs,
        at_once,
        pipeline=world.settings.pipeline,
        kafka=world.settings.kafka,
        timeouts=world.settings.timeouts,
    )
    return dry_runs.plan(DryRunRequest(id=f"d-{name}", source=query(name, window_ms)))


def first_query(settings: Settings, world: World, name: str, window_ms: int) -> None:
    """What `hotswap run --query` does with the namespace's first query (Executor._deploy_initial)."""
    executor = SimpleNamespace(
        settings=settings, graphs=world.graphs, _analyser=Analyser(settings.pipeline, world.graphs)
    )
    Executor._deploy_initial(cast(Executor, executor), query(name, window_ms), None)


@pytest.mark.parametrize(
    ("fault", "window_ms", "reason", "code"),
    [
        ("refuse", 30_000, "query 'b' does not analyse: column kye not found", ReasonCode.QUERY_INVALID),
        (
            "crash",
            30_000,
            "query 'b' could not be validated: ZeroDivisionError: division by zero",
            ReasonCode.QUERY_RAISED,
        ),
        ("none", 9_999, "window sizes 10s and 9999ms share a boundary only every", ReasonCode.WINDOWS_NOT_CUTTABLE),
    ],
)
def test_a_dry_run_refuses_a_query_with_the_reason_its_submit_is_rejected_with(
    world: World, fault: str, window_ms: int, reason: str, code: ReasonCode
) -> None:
    if fault == "refuse":
        world.graphs.refuse["b"] = reason
    elif fault == "crash":
        world.graphs.crash["b"] = ZeroDivisionError("division by zero\n  File 'b.py', line 3")
    plan = dry_run_of(world, "b", window_ms)
    swap_id = world.submit("b", window_ms)
    world.protocol.step()
    rejected = world.journal.get(swap_id)
    assert rejected.state is SwapPhase.REJECTED
    assert (plan.valid, plan.reason, plan.reason_code) == (False, rejected.error, rejected.reason_code)
    assert reason in (plan.reason or "")
    assert plan.reason_code is code


def test_a_dry_run_is_checked_against_the_query_its_submit_would_be_checked_against(world: World) -> None:
    world.submit("x", 30_000)
    world.protocol.step()  # x is validated, and deploys
    # A submit now would replace x, not a (current): both are checked against x's 30 s windows.
    plan = dry_run_of(world, "b", 20_000)
    b = world.submit("b", 20_000)
    world.protocol.step()
    assert (plan.valid, plan.replaces, plan.replaces_window_ms) == (True, "x", 30_000)
    assert world.state(b) is SwapPhase.VALIDATED
    assert world.graphs.validated == ["x", "b", "b"]  # the dry run, then the submit: one analysis each


def test_the_first_query_is_admitted_as_a_submit_is_and_refused_with_the_same_reason(
    settings: Settings,
) -> None:
    fresh = World(settings)
    first_query(settings, fresh, "a", 10_000)
    served = fresh.graphs.get("a")
    swap_id = fresh.submit("b", 10_000)
    fresh.protocol.step()
    submitted = fresh.graphs.get(fresh.journal.get(swap_id).to_query)
    assert served is not None
    assert submitted is not None
    same = ("window_ms", "slide_ms", "group_columns", "reads", "engine", "partitions", "shadow_results_topic")
    assert {f: getattr(served, f) for f in same} == {f: getattr(submitted, f) for f in same}
    assert served.topic == settings.names.graph_topic("a")

    refused = World(settings)
    refused.graphs.refuse["a"] = "query 'a' has no window(event_time, ...) in its plan; is it windowed?"
    with pytest.raises(QueryRejected, match=r"^query 'a' has no window\(event_time, \.\.\.\) in its plan"):
        first_query(settings, refused, "a", 10_000)
    assert refused.graphs.get("a") is None
