"""Operator requests: `submit`, `abort` and `promote` reach the journal only through the executor,
which checks each request, and a request the executor never took leaves nothing behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotswap.contract.journal import SwapPhase, SwapRecord, UnknownSwap
from hotswap.contract.requests import OperatorRequest, RequestKind
from hotswap.executor.control.requests import OperatorRequests
from hotswap.executor.errors import ExecutorError, RequestNotTaken
from hotswap.executor.operator import client as client_module
from hotswap.executor.operator.client import Client
from tests.component.fakes import World, query

pytestmark = pytest.mark.component


def leave(world: World, request: OperatorRequest) -> None:
    """What a client with a submitter's rights can write: a request and its id in the list."""
    world.client.set(world.keys.request(request.id), request.model_dump_json())
    world.client.lpush(world.keys.requests, request.id)


def test_a_hand_written_submission_cannot_record_a_cut_or_a_phase(world: World) -> None:
    forged = SwapRecord(
        id="f", to_query="b", source=query("b", 10_000), state=SwapPhase.COMPLETED, cut_window_end=60_000, cause="x"
    )
    leave(world, OperatorRequest(id="r1", kind=RequestKind.SUBMIT, swap_id="f", swap=forged))
    OperatorRequests(world.client, world.keys, None).apply_pending()
    recorded = world.journal.get("f")
    assert (recorded.state, recorded.cut_window_end, recorded.cause) == (SwapPhase.SUBMITTED, None, None)
    assert [p.name for p in recorded.phases] == [SwapPhase.SUBMITTED]


def test_a_request_for_an_unknown_swap_is_answered_with_a_reason(world: World) -> None:
    with pytest.raises(UnknownSwap, match="no swap 'nope'"):  # the client checks first, in one line
        world.operator().promote("nope")
    leave(world, OperatorRequest(id="r2", kind=RequestKind.ABORT, swap_id="nope"))
    OperatorRequests(world.client, world.keys, None).apply_pending()
    answer = world.client.get(world.keys.request_answer("r2"))
    assert answer is not None
    assert b"no swap 'nope'" in answer


def test_an_abort_the_executor_never_takes_is_withdrawn_and_changes_nothing(
    world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    swap_id = world.submit("b")
    world.client.set(world.keys.lease, "an executor that does not tick")
    monkeypatch.setattr(client_module, "ANSWER_WAIT_S", 0.0)
    with pytest.raises(RequestNotTaken, match="withdrawn and nothing changed"):
        Client(
            world.settings.control,
            world.settings.kafka,
            world.settings.pipeline,
            world.client,
            between_polls=lambda: None,
        ).abort(swap_id)
    # The request is gone: an executor that ticks later does not abort the swap.
    OperatorRequests(world.client, world.keys, None).apply_pending()
    assert world.state(swap_id) is SwapPhase.SUBMITTED


def test_abort_and_promote_through_the_executor_keep_their_one_line_reasons(world: World) -> None:
    swap_id = world.submit("b")
    operator = world.operator()
    with pytest.raises(ExecutorError, match="is not a shadow"):
        operator.promote(swap_id)
    assert operator.abort(swap_id).state is SwapPhase.ABORTED
    assert operator.abort(swap_id).state is SwapPhase.ABORTED  # what was asked holds: not an error


def test_a_submit_the_executor_never_takes_leaves_no_swap_behind(world: World, tmp_path: Path) -> None:
    query_file = tmp_path / "b.sql"
    query_file.write_text("30000")
    world.client.set(world.keys.lease, "an executor that does not tick")
    client = Client(
        world.settings.control, world.settings.kafka, world.settings.pipeline, world.client, between_polls=lambda: None
    )
    with pytest.raises(RequestNotTaken, match="withdrawn and nothing changed"):
        client.submit(query_file, validation_timeout_s=0.0)
    OperatorRequests(world.client, world.keys, None).apply_pending()  # the executor ticks at last
    assert world.journal.all() == []


def test_a_submission_the_executor_recorded_before_is_answered_ok_but_another_with_its_id_is_refused(
    world: World,
) -> None:
    """A write retried after its reply was lost finds itself: the client must not hear "refused"."""
    swap = SwapRecord(id="s1", to_query="b", source=query("b", 10_000))
    requests = OperatorRequests(world.client, world.keys, None)
    for request_id in ("r1", "r2"):  # the same submission twice: recorded once, answered ok twice
        leave(world, OperatorRequest(id=request_id, kind=RequestKind.SUBMIT, swap_id="s1", swap=swap))
    other = SwapRecord(id="s1", to_query="c", source=query("c", 20_000))
    leave(world, OperatorRequest(id="r3", kind=RequestKind.SUBMIT, swap_id="s1", swap=other))
    requests.apply_pending()
    answers = [world.client.get(world.keys.request_answer(r)) or b"" for r in ("r1", "r2", "r3")]
    assert [b'"ok":true' in a for a in answers] == [True, True, False]
    assert [s.to_query for s in world.journal.all()] == ["b"]
