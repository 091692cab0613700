import fakeredis
import pytest

from hotswap.contract.journal import (
    Also,
    Journal,
    SwapPhase,
    SwapRecord,
    UnknownSwap,
    active_swap,
)
from hotswap.contract.names import Keys


@pytest.fixture
def journal() -> Journal:
    return Journal(fakeredis.FakeRedis(), Keys("unit"))


def test_each_transition_is_recorded_with_its_time(journal: Journal) -> None:
    journal.create(SwapRecord(id="a", to_query="q2"))
    journal.advance("a", SwapPhase.VALIDATED)
    journal.advance("a", SwapPhase.DEPLOYING)
    record = journal.advance("a", SwapPhase.DEPLOYED)
    assert record is not None
    assert [p.name for p in record.phases] == [
        SwapPhase.SUBMITTED,
        SwapPhase.VALIDATED,
        SwapPhase.DEPLOYING,
        SwapPhase.DEPLOYED,
    ]
    assert all(p.at > 0 for p in record.phases)
    assert journal.get("a") == record


def test_swaps_are_listed_in_submission_order(journal: Journal) -> None:
    for swap_id in ("c", "a", "b"):
        journal.create(SwapRecord(id=swap_id, to_query=swap_id))
    assert [s.id for s in journal.all()] == ["c", "a", "b"]


def test_unknown_swaps_are_named(journal: Journal) -> None:
    with pytest.raises(UnknownSwap, match="nope"):
        journal.get("nope")


def test_namespaces_do_not_collide() -> None:
    client = fakeredis.FakeRedis()
    Journal(client, Keys("a")).create(SwapRecord(id="x", to_query="q"))
    assert Journal(client, Keys("b")).find("x") is None
    assert Keys("a").swap("x") != Keys("b").swap("x")
    assert Keys("a").swap("x").startswith("hotswap:{a}:")


def at(state: SwapPhase, swap_id: str, **fields: object) -> SwapRecord:
    return SwapRecord(id=swap_id, to_query=swap_id, state=state).changed(**fields)


def test_the_active_swap_is_the_one_past_validation_or_else_the_first_queued() -> None:
    done = at(SwapPhase.COMPLETED, "done")
    submitted = at(SwapPhase.SUBMITTED, "new")
    queued = at(SwapPhase.VALIDATED, "queued")
    later = at(SwapPhase.VALIDATED, "later")
    running = at(SwapPhase.DRAINING, "running")
    assert active_swap([done, queued, running, later]) == running
    assert active_swap([done, submitted, queued, later]) == queued
    assert active_swap([done, submitted]) is None


def test_a_stranded_swap_is_never_active_and_its_recovery_goes_before_the_queue() -> None:
    stranded = at(SwapPhase.STRANDED, "stranded", cut_window_end=60_000)
    queued = at(SwapPhase.VALIDATED, "queued")
    fix = at(SwapPhase.VALIDATED, "fix", recovers="stranded")
    assert active_swap([stranded, queued]) == queued  # it starts once the stranded swap is taken over
    assert active_swap([stranded, queued, fix]) == fix


def test_open_swaps_are_read_without_the_ended_ones(journal: Journal) -> None:
    for swap_id in ("a", "b", "c"):
        journal.create(SwapRecord(id=swap_id, to_query=swap_id))
    journal.advance("b", SwapPhase.REJECTED, error="no")
    assert [s.id for s in journal.open()] == ["a", "c"]
    assert [s.id for s in journal.all()] == ["a", "b", "c"]


def test_reading_open_swaps_reads_none_of_the_ended_ones(journal: Journal, monkeypatch: pytest.MonkeyPatch) -> None:
    """The executor's tick and the service graph read `open()`: 200 swaps of history cost it nothing."""
    for n in range(200):
        journal.create(SwapRecord(id=f"old{n}", to_query="q"))
        journal.advance(f"old{n}", SwapPhase.REJECTED, error="refused")
    journal.create(SwapRecord(id="now", to_query="q"))
    parsed: list[str] = []
    original = SwapRecord.model_validate_json

    def counting(raw: str | bytes, **kwargs: object) -> SwapRecord:
        record = original(raw)
        parsed.append(record.id)
        return record

    monkeypatch.setattr(SwapRecord, "model_validate_json", counting)
    assert [s.id for s in journal.open()] == ["now"]
    assert parsed == ["now"]
    monkeypatch.undo()
    assert len(journal.all()) == 201


def test_a_cut_can_carry_the_batch_s_other_writes_in_its_own_write() -> None:
    keys = Keys("unit")
    client = fakeredis.FakeRedis()
    journal = Journal(client, keys)
    journal.create(SwapRecord(id="s", to_query="b"))
    for phase in (SwapPhase.VALIDATED, SwapPhase.DEPLOYING, SwapPhase.DEPLOYED):
        journal.advance("s", phase)
    plan = Also(queue=lambda batch: batch.set(keys.routing_plan(7), "{}"))
    cut = journal.record_cut(journal.get("s"), 60_000, 7, also=plan)
    assert cut is not None
    assert (cut.state, cut.cut_window_end, cut.cut_batch) == (SwapPhase.CUT, 60_000, 7)
    assert client.get(keys.routing_plan(7)) == b"{}"
    journal.advance("s", SwapPhase.ABORTED, when=lambda r: r.state.is_before_cut)  # refused: nothing written
    assert journal.record_cut("s", 90_000, 8, also=Also(queue=lambda b: b.set(keys.routing_plan(8), "{}"))) is None
    assert client.get(keys.routing_plan(8)) is None


def test_the_service_graph_records_a_cut_or_a_start_only_while_the_swap_waits_for_it() -> None:
    journal = Journal(fakeredis.FakeRedis(), Keys("unit"))
    for swap in (
        SwapRecord(id="plain", to_query="b"),
        SwapRecord(id="recovery", to_query="c", recovers="plain"),
        SwapRecord(id="shadow", to_query="d", shadow=True),
    ):
        journal.create(swap)
        for phase in (SwapPhase.VALIDATED, SwapPhase.DEPLOYING, SwapPhase.DEPLOYED):
            journal.advance(swap.id, phase)
    # A recovery's cut is the executor's; a shadow starts at S before any cut; a plain swap has no S.
    assert journal.record_cut("recovery", 60_000, 7) is None
    assert journal.record_cut("shadow", 60_000, 7) is None
    assert journal.record_shadow_start("plain", 60_000, 7) is None
    assert journal.record_shadow_start("shadow", 60_000, 7) is not None
    # A shadow is cut once an operator promoted it, not before.
    assert journal.record_cut("shadow", 90_000, 9) is None
    assert journal.request_promotion("shadow") is not None
    cut = journal.record_cut("shadow", 90_000, 9)
    assert cut is not None
    assert (cut.state, cut.cut_window_end) == (SwapPhase.CUT, 90_000)
    assert journal.record_cut("plain", 60_000, 7) is not None
    # The drain: once cut, and only once.
    assert journal.record_draining("recovery") is None
    assert journal.record_draining("plain") is not None
    assert journal.record_draining("plain") is None
    assert [journal.get(s).state for s in ("plain", "recovery", "shadow")] == [
        SwapPhase.DRAINING,
        SwapPhase.DEPLOYED,
        SwapPhase.CUT,
    ]


def test_every_journal_write_moves_its_version(journal: Journal) -> None:
    seen = [journal.version()]
    journal.create(SwapRecord(id="a", to_query="q2"))
    seen.append(journal.version())
    journal.advance("a", SwapPhase.VALIDATED)
    seen.append(journal.version())
    journal.update("a", error="x")
    seen.append(journal.version())
    assert seen == sorted(set(seen))  # each write, a new and larger number
    assert len(seen) == 4
    assert journal.advance("a", SwapPhase.DEPLOYING, when=lambda _: False) is None
    assert journal.version() == seen[-1]  # nothing written, nothing moved
