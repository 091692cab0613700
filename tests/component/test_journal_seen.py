"""The journal's version kept beside the checkpoints: a Redis that lost acknowledged writes (an older
snapshot, a lagging replica) still has the namespace's record, and is refused all the same."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import fakeredis
import pytest

from hotswap.contract.errors import ControlStateLost
from hotswap.contract.models import NamespaceRecord
from hotswap.contract.names import Keys
from hotswap.contract.settings import Settings
from hotswap.execution_graph.checkpoint import LocalDir
from hotswap.executor.control.namespace import JournalSeen, claim, refuse_lost_state
from hotswap.executor.control.topics import Topics
from tests.component.fakes import FakeTopics
from tests.conftest import DEMO_SOURCE

pytestmark = pytest.mark.component


def namespace(tmp_path: Path, journal_version: int) -> tuple[Settings, fakeredis.FakeRedis, Keys]:
    settings = Settings(namespace="seen", home=tmp_path)
    keys = Keys(settings.namespace)
    client = fakeredis.FakeRedis()
    client.set(keys.namespace_record, NamespaceRecord(created_by="earlier", source=DEMO_SOURCE).model_dump_json())
    client.set(keys.journal_version, journal_version)
    return settings, client, keys


def files(settings: Settings) -> LocalDir:
    """The namespace's checkpoint root on the local disk (a store's is reached through Spark)."""
    return LocalDir(Path(settings.names.checkpoint_root))


def test_a_redis_whose_journal_is_older_than_the_checkpoints_have_seen_is_refused(tmp_path: Path) -> None:
    settings, client, _ = namespace(tmp_path, journal_version=5)
    JournalSeen(files(settings)).note(9)  # an executor saw 9 writes, then Redis came back from an older snapshot
    with pytest.raises(ControlStateLost, match=r"Redis holds version 5 .* its checkpoints have seen version 9"):
        claim(client, settings.control, cast(Topics, FakeTopics()), files(settings), "me", DEMO_SOURCE)


def test_a_redis_that_kept_every_write_is_taken_and_later_versions_are_noted(tmp_path: Path) -> None:
    settings, client, _ = namespace(tmp_path, journal_version=9)
    JournalSeen(files(settings)).note(9)
    claim(client, settings.control, cast(Topics, FakeTopics()), files(settings), "me", DEMO_SOURCE)
    seen = JournalSeen(files(settings))
    seen.note(12)
    seen.note(11)  # never backwards
    assert JournalSeen(files(settings)).read() == 12
    assert not list(Path(settings.names.checkpoint_root).glob(".*.tmp"))  # written by rename


def test_a_namespace_without_the_file_is_taken(tmp_path: Path) -> None:
    settings, client, _ = namespace(tmp_path, journal_version=3)
    claim(client, settings.control, cast(Topics, FakeTopics()), files(settings), "me", DEMO_SOURCE)
    assert JournalSeen(files(settings)).read() is None


def test_the_check_before_spark_starts_refuses_a_flushed_namespace_and_writes_nothing(tmp_path: Path) -> None:
    """`hotswap run` asks before it starts Spark, of Redis and the checkpoints only: a namespace whose
    checkpoints outlived its Redis keys is refused in a second, and the check writes no key."""
    settings = Settings(namespace="flushed", home=tmp_path)
    client = fakeredis.FakeRedis()
    JournalSeen(files(settings)).note(4)  # the namespace ran: its checkpoint root holds a file
    with pytest.raises(ControlStateLost, match=r"checkpoints in .* Redis holds no control state .* --reset-namespace"):
        refuse_lost_state(client, settings.control, None, files(settings))
    assert client.keys("*") == []
    # Graph topics left without checkpoints are the executor's to find: it asks Kafka, under its lease.
    fresh = Settings(namespace="fresh", home=tmp_path / "fresh")
    assert refuse_lost_state(client, fresh.control, None, files(fresh)) is False
    topics = FakeTopics()
    topics.existing.add(fresh.names.graph_topic("count_per_key"))
    with pytest.raises(ControlStateLost, match=r"1 graph topic\(s\) such as"):
        refuse_lost_state(client, fresh.control, cast(Topics, topics), files(fresh))
    assert client.keys("*") == []
