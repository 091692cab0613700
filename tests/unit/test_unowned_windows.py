"""A closing graph runs no job for windows another version owns: a swap's new graph is sent markers
for the windows up to its cut as they close, and a job over them would write nothing while it took
the cores from the old graph's last close job."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame

from hotswap.contract.models import GraphRecord, QueryKind, QuerySource, new_spark_query_id
from hotswap.contract.ownership import OwnedWindows
from hotswap.contract.settings import Settings
from hotswap.contract.windows import Windowing
from hotswap.execution_graph.closing import ClosingState, WindowCloser, closing_for
from hotswap.service_sink.results import ResultWriter
from tests.conftest import DEMO_SOURCE

W = 1_700_000_010_000
SIZE = 10_000
KAFKA = Settings(namespace="unit").kafka


def writer(owned: OwnedWindows | None, unowned_topic: str | None = None) -> ResultWriter:
    owns = None if owned is None else (lambda: owned)
    return ResultWriter(KAFKA, "results", "q", ("key",), owned=owns, unowned_topic=unowned_topic)


def test_a_new_graph_emits_nothing_up_to_its_cut_and_everything_after() -> None:
    new = writer(OwnedWindows(((W, None),)))
    assert not new.emits_within(None, W)
    assert not new.emits_within(W - SIZE, W)
    assert new.emits_within(W, W + SIZE)
    assert new.emits_within(W - SIZE, W + SIZE), "one owned window among them is enough"


def test_an_old_graph_emits_up_to_the_cut_and_nothing_after() -> None:
    old = writer(OwnedWindows(((None, W),)))
    assert old.emits_within(None, W)
    assert old.emits_within(W - SIZE, W)
    assert not old.emits_within(W, W + SIZE)


def test_a_graph_that_owns_nothing_yet_emits_nothing_and_a_shadow_or_an_unknown_owner_everything() -> None:
    assert not writer(OwnedWindows(())).emits_within(None, W)
    assert writer(OwnedWindows(()), unowned_topic="shadow-results").emits_within(None, W)
    assert writer(None).emits_within(None, W)


class _Writer:
    def __init__(self, emits: bool) -> None:
        self.emits = emits
        self.asked: list[tuple[int | None, int]] = []

    def emits_within(self, after: int | None, through: int) -> bool:
        self.asked.append((after, through))
        return self.emits

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        raise AssertionError("no job was to run")


class _Files:
    """A checkpoint that takes every state file (the batch's own state is all these tests read)."""

    def write_once(self, name: str, text: str) -> bool:
        return True


def test_a_closing_graph_runs_no_job_for_windows_it_does_not_own_and_leaves_their_rows_to_its_first_own_job() -> None:
    record = GraphRecord(
        query_id="q-2",
        source=QuerySource(name="q.sql", kind=QueryKind.SQL, text="SELECT 1"),
        window_ms=SIZE,
        slide_ms=SIZE,
        topic="t.q-2",
        spark_query_id=new_spark_query_id(),
        reads=DEMO_SOURCE,
    )
    fake = _Writer(emits=False)
    files: Any = _Files()
    no_spark: Any = None  # a job would need Spark: none runs
    closer = WindowCloser(KAFKA, record, lambda events: events, fake, files)
    closer._states[2] = ClosingState(batch_id=2, closed_through=W - 2 * SIZE, markers={0: W - 2 * SIZE})
    # The cut's window and the one before it close while the rows after the cut arrive.
    state = closer.run(no_spark, 3, {0: 0}, {0: 40}, W - SIZE)
    assert (state.closed_through, state.unread, state.deferred) == (W - SIZE, {0: (0, 40)}, True)
    state = closer.run(no_spark, 4, {0: 40}, {0: 60}, W)
    assert (state.closed_through, state.unread, state.deferred) == (W, {0: (0, 60)}, True), "no headers pass"
    assert fake.asked == [(W - 2 * SIZE, W - SIZE), (W - SIZE, W)]


def test_a_state_that_defers_its_rows_survives_its_file() -> None:
    state = ClosingState(batch_id=4, closed_through=W, unread={0: (0, 60)}, deferred=True)
    assert ClosingState.from_json(state.to_json()) == state
    assert not ClosingState.from_json(ClosingState(batch_id=4).to_json()).deferred


def test_the_first_close_job_of_its_own_windows_reads_every_row_the_graph_deferred() -> None:
    deferred = ClosingState(batch_id=4, closed_through=W, unread={0: (0, 60), 1: (5, 30)}, deferred=True)
    closing = closing_for(deferred, W + SIZE, {0: 60, 1: 30}, {0: 80, 1: 30}, Windowing.of(SIZE, None))
    assert closing.offsets == {0: (0, 80), 1: (5, 30)}
    sliding = closing_for(deferred, W + SIZE, {0: 60, 1: 30}, {0: 80, 1: 30}, Windowing.of(3 * SIZE, SIZE))
    assert sliding.offsets == {0: (0, 80), 1: (5, 30)}, "a sliding version's rows before its cut are among them"


class _Lease:
    def __init__(self) -> None:
        self.checked = 0

    def __call__(self) -> None:
        self.checked += 1


def test_a_writer_that_says_it_emits_nothing_checks_the_lease_as_its_write_would() -> None:
    lease = _Lease()
    owned = OwnedWindows(((W, None),))
    asked = ResultWriter(KAFKA, "results", "q", ("key",), lease, owned=lambda: owned)
    assert not asked.emits_within(W - SIZE, W)
    assert lease.checked == 1
    assert asked.emits_within(W, W + SIZE)
    assert lease.checked == 1, "the write that follows checks it"
