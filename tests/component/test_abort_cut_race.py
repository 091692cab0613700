"""The operator's abort and the service graph's cut racing for one deployed swap, with the second
writer landing between the first one's read and its write script, so the write's compare-and-set
precondition fails and the retry (a fresh read, a fresh decision) is taken."""

from __future__ import annotations

import fakeredis
import pytest

from hotswap.contract.journal import IllegalTransition, Journal, SwapPhase, SwapRecord
from hotswap.contract.names import Keys
from hotswap.contract.settings import Settings
from hotswap.executor.errors import ExecutorError
from tests.component.fakes import RacingRedis, operator

pytestmark = pytest.mark.component

KEYS = Keys("component")
W = 60_000


def deployed_swap(server: fakeredis.FakeServer) -> Journal:
    journal = Journal(fakeredis.FakeRedis(server=server), KEYS)
    journal.create(SwapRecord(id="s", to_query="b", from_query="a"))
    journal.advance("s", SwapPhase.VALIDATED)
    journal.advance("s", SwapPhase.DEPLOYING)
    journal.advance("s", SwapPhase.DEPLOYED)
    return journal


def test_an_abort_that_loses_to_a_cut_retries_and_sees_the_cut() -> None:
    server = fakeredis.FakeServer()
    service = deployed_swap(server)  # the service graph's connection
    executor = Journal(fakeredis.FakeRedis(server=server), KEYS)  # the operator's connection
    attempts: list[SwapPhase] = []

    def abort_when(record: SwapRecord) -> bool:
        attempts.append(record.state)
        if len(attempts) == 1:
            # The swap was read as deployed; the cut lands before our write.
            service.advance("s", SwapPhase.CUT, when=lambda r: r.state is SwapPhase.DEPLOYED, cut_window_end=W)
        return record.state.is_before_cut

    aborted = executor.advance("s", SwapPhase.ABORTED, error="aborted by operator", when=abort_when)

    assert attempts == [SwapPhase.DEPLOYED, SwapPhase.CUT]  # the EXEC failed once, the retry saw the cut
    assert aborted is None
    stored = service.get("s")
    assert stored.state is SwapPhase.CUT
    assert stored.cut_window_end == W
    assert stored.error is None
    assert [p.name for p in stored.phases][-1] is SwapPhase.CUT


def test_a_cut_that_loses_to_an_abort_retries_and_sees_the_abort() -> None:
    server = fakeredis.FakeServer()
    operator = deployed_swap(server)
    service = Journal(fakeredis.FakeRedis(server=server), KEYS)
    attempts: list[SwapPhase] = []

    def cut_when(record: SwapRecord) -> bool:
        attempts.append(record.state)
        if len(attempts) == 1:
            operator.advance("s", SwapPhase.ABORTED, error="aborted by operator", when=lambda r: r.state.is_before_cut)
        return record.state is SwapPhase.DEPLOYED

    cut = service.advance("s", SwapPhase.CUT, when=cut_when, cut_window_end=W, cut_batch=7)

    assert attempts == [SwapPhase.DEPLOYED, SwapPhase.ABORTED]
    assert cut is None
    stored = operator.get("s")
    assert stored.state is SwapPhase.ABORTED
    assert stored.cut_window_end is None  # no window ever left the old query
    assert stored.error == "aborted by operator"


def test_a_loser_without_a_condition_is_refused_after_its_retry() -> None:
    server = fakeredis.FakeServer()
    service = deployed_swap(server)
    executor = Journal(fakeredis.FakeRedis(server=server), KEYS)
    attempts: list[SwapPhase] = []

    def racing(record: SwapRecord) -> bool:
        attempts.append(record.state)
        if len(attempts) == 1:
            service.advance("s", SwapPhase.CUT, cut_window_end=W)
        return True  # no condition of its own: the transition table decides

    with pytest.raises(IllegalTransition, match="from cut to aborted"):
        executor.advance("s", SwapPhase.ABORTED, when=racing)
    assert attempts == [SwapPhase.DEPLOYED, SwapPhase.CUT]
    assert service.get("s").state is SwapPhase.CUT


def test_hotswap_abort_racing_a_cut_reports_the_cut_and_leaves_it() -> None:
    server = fakeredis.FakeServer()
    service = deployed_swap(server)
    racing = RacingRedis(server=server)
    client = operator(Settings(namespace="component"), racing)
    racing.rival = lambda: service.advance(
        "s", SwapPhase.CUT, when=lambda r: r.state is SwapPhase.DEPLOYED, cut_window_end=W
    )
    racing.writes = 0

    with pytest.raises(ExecutorError, match="is cut; only a swap before its cut can be aborted"):
        client.abort("s")

    # One write, refused (the record had changed since it was read); the retry read the cut and wrote nothing.
    assert racing.writes == 1
    stored = service.get("s")
    assert (stored.state, stored.cut_window_end) == (SwapPhase.CUT, W)


def test_a_cut_racing_hotswap_abort_loses_and_the_abort_stands() -> None:
    server = fakeredis.FakeServer()
    deployed_swap(server)
    racing = RacingRedis(server=server)
    service = Journal(racing, KEYS)
    api = operator(Settings(namespace="component"), fakeredis.FakeRedis(server=server))
    racing.rival = lambda: api.abort("s")
    racing.writes = 0

    cut = service.advance("s", SwapPhase.CUT, when=lambda r: r.state is SwapPhase.DEPLOYED, cut_window_end=W)

    assert racing.writes == 1
    assert cut is None
    assert service.get("s").state is SwapPhase.ABORTED
