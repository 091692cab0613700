import fakeredis
import pytest

from hotswap.contract.journal import (
    Journal,
    SwapPhase,
    SwapRecord,
    UnknownSwap,
)
from hotswap.contract.names import Keys


@pytest.fixture
def journal() -> Journal:
    return Journal(fakeredis.FakeRedis(), Keys("unit"))


def test_each_transition_is_recorded_with_its_time(journal: Journal) -> None:
    journal.create(SwapRecord(id="a", to_query="q2"))
    journal.advance("a", SwapPhase.VALIDATED)
    record = journal.advance("a", SwapPhase.DEPLOYED)
    assert record is not None
    assert [p.name for p in record.phases] == [SwapPhase.SUBMITTED, SwapPhase.VALIDATED, SwapPhase.DEPLOYED]
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
