"""A result writer's per-batch read of the windows it owns: the same answer as a full read of the
journal, at a cost that does not grow with the namespace's history."""

import fakeredis
import pytest

from hotswap.contract.fence import fenced_write
from hotswap.contract.journal import Also, Journal, SwapPhase, SwapRecord
from hotswap.contract.models import CurrentQuery, GraphRecord, QueryKind, QuerySource, new_spark_query_id
from hotswap.contract.names import Keys
from hotswap.contract.ownership import OwnedWindows, OwnershipReader, read_owned_windows
from tests.conftest import DEMO_SOURCE

W = 1_700_000_010_000


def graph(query_id: str) -> GraphRecord:
    source = QuerySource(name="q.sql", kind=QueryKind.SQL, text="SELECT 1")
    return GraphRecord(
        query_id=query_id,
        source=source,
        window_ms=10_000,
        slide_ms=10_000,
        topic=f"t.{query_id}",
        spark_query_id=new_spark_query_id(),
        reads=DEMO_SOURCE,
    )


def to_cut(journal: Journal, swap_id: str, old: str, new: str, cut: int) -> None:
    journal.create(SwapRecord(id=swap_id, to_query=new, from_query=old))
    for phase in (SwapPhase.VALIDATED, SwapPhase.DEPLOYING, SwapPhase.DEPLOYED):
        journal.advance(swap_id, phase)
    journal.record_cut(swap_id, cut, 7)


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    return fakeredis.FakeRedis()


def test_the_reader_follows_each_cut_as_a_full_read_does(client: fakeredis.FakeRedis) -> None:
    keys = Keys("unit")
    journal = Journal(client, keys)
    serving = CurrentQuery(query_id="a", started_at=1)
    fenced_write(client, None, lambda b: b.set(keys.current, serving.model_dump_json()))
    reader_a, reader_b = OwnershipReader(client, keys, graph("a")), OwnershipReader(client, keys, graph("b"))
    assert reader_a() == OwnedWindows(((None, None),))
    assert reader_b() == OwnedWindows(())
    to_cut(journal, "s1", "a", "b", W)
    assert reader_a() == OwnedWindows(((None, W),)) == read_owned_windows(client, keys, graph("a"))
    assert reader_b() == OwnedWindows(((W, None),)) == read_owned_windows(client, keys, graph("b"))
    journal.advance("s1", SwapPhase.DRAINING, also=Also(current=CurrentQuery(query_id="b", started_at=2)))
    assert reader_b() == read_owned_windows(client, keys, graph("b"))


def test_the_reader_reads_the_journal_only_when_it_moved(
    client: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = Keys("unit")
    journal = Journal(client, keys)
    to_cut(journal, "s1", "a", "b", W)
    reads: list[str] = []
    real_all = Journal.all

    def counted(self: Journal) -> list[SwapRecord]:
        reads.append("all")
        return real_all(self)

    monkeypatch.setattr(Journal, "all", counted)
    reader = OwnershipReader(client, keys, graph("b"))
    for _ in range(50):
        reader()
    assert len(reads) == 1  # 50 batches, one read of the history
    journal.update("s1", markers_written=True)
    reader()
    assert len(reads) == 2
