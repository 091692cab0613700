"""The lease as a fence, lost control state, and taking over a dead executor's lease (fakeredis)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis

from hotswap.contract.errors import ControlStateLost, LeaseLost
from hotswap.contract.fence import Batch, Fence, fenced_write, write
from hotswap.contract.journal import Also, IllegalTransition, Journal, SwapPhase, SwapRecord
from hotswap.contract.models import GraphRecord, NamespaceRecord, QueryKind, QuerySource, new_spark_query_id
from hotswap.contract.names import Keys
from hotswap.contract.settings import Settings
from hotswap.execution_graph.checkpoint import PROBE_FILE, LocalDir, check_checkpoints
from hotswap.execution_graph.errors import CheckpointsUnreachable, GraphStartFailed
from hotswap.execution_graph.graph import claim_checkpoint
from hotswap.executor.control.lease import Lease, holder_is_dead, process_space
from hotswap.executor.control.namespace import claim, reset
from tests.conftest import DEMO_SOURCE

KEYS = Keys("unit")


class NoTopics:
    def names(self, prefix: str) -> list[str]:
        return []

    def delete(self, topic: str) -> None:
        raise AssertionError("no topic to delete")


def holding(client: fakeredis.FakeRedis, holder: str = "host:1:a") -> Fence:
    client.set(KEYS.lease, holder)
    client.set(KEYS.namespace_record, "{}")
    return Fence(KEYS, holder)


def test_a_writer_that_holds_the_lease_advances_a_swap() -> None:
    client = fakeredis.FakeRedis()
    journal = Journal(client, KEYS, holding(client))
    journal.create(SwapRecord(id="s", to_query="b"))
    assert journal.advance("s", SwapPhase.VALIDATED) is not None


def test_a_writer_whose_lease_was_taken_over_writes_nothing() -> None:
    client = fakeredis.FakeRedis()
    journal = Journal(client, KEYS, holding(client))
    journal.create(SwapRecord(id="s", to_query="b"))
    client.set(KEYS.lease, "host:2:b")  # another executor took over
    with pytest.raises(LeaseLost, match="lost its lease"):
        journal.advance("s", SwapPhase.VALIDATED)
    with pytest.raises(LeaseLost):
        fenced_write(client, Fence(KEYS, "host:1:a"), lambda pipe: pipe.set(KEYS.current, "x"))
    assert journal.get("s").state is SwapPhase.SUBMITTED
    assert client.get(KEYS.current) is None


def test_a_flushed_redis_is_detected_and_not_written_to() -> None:
    client = fakeredis.FakeRedis()
    fence = holding(client)
    client.flushall()
    client.set(KEYS.lease, fence.token)  # the heartbeat takes a vanished lease back
    with pytest.raises(ControlStateLost, match="vanished from Redis"):
        fenced_write(client, fence, lambda pipe: pipe.set(KEYS.service, "{}"))
    assert client.get(KEYS.service) is None


def test_a_namespace_with_checkpoints_but_no_control_state_is_refused(tmp_path: Path) -> None:
    settings = Settings(namespace="unit", home=tmp_path)
    Path(settings.names.service_checkpoint).mkdir(parents=True)
    checkpoints = LocalDir(Path(settings.names.checkpoint_root))
    client = fakeredis.FakeRedis()
    with pytest.raises(ControlStateLost, match="--reset-namespace"):
        claim(client, settings.control, NoTopics(), checkpoints, "host:1:a", DEMO_SOURCE)  # type: ignore[arg-type]
    assert not client.exists(KEYS.namespace_record)
    with pytest.raises(LeaseLost):  # only under the namespace's lease
        reset(client, settings.control, NoTopics(), checkpoints, "host:1:a")  # type: ignore[arg-type]
    assert Path(settings.names.service_checkpoint).exists()
    client.set(KEYS.lease, "host:1:a")
    client.set(KEYS.current, "{}")
    assert reset(client, settings.control, NoTopics(), checkpoints, "host:1:a") == [  # type: ignore[arg-type]
        "1 Redis key(s)",
        f"checkpoints in {settings.names.checkpoint_root}",
    ]
    assert client.get(KEYS.lease) == b"host:1:a"  # kept: nobody starts before the reset lets go
    claim(client, settings.control, NoTopics(), checkpoints, "host:1:a", DEMO_SOURCE)  # type: ignore[arg-type]
    record = NamespaceRecord.model_validate_json(client.get(KEYS.namespace_record) or b"")
    assert (record.created_by, record.source) == ("host:1:a", DEMO_SOURCE)


def test_a_namespace_whose_record_is_gone_but_not_its_journal_is_refused(tmp_path: Path) -> None:
    settings = Settings(namespace="unit", home=tmp_path)
    checkpoints = LocalDir(Path(settings.names.checkpoint_root))
    client = fakeredis.FakeRedis()
    client.set(KEYS.current, '{"query_id": "a", "started_at": 1}')
    with pytest.raises(ControlStateLost, match=r"not its record.*--reset-namespace"):
        claim(client, settings.control, NoTopics(), checkpoints, "host:1:a", DEMO_SOURCE)  # type: ignore[arg-type]
    assert not client.exists(KEYS.namespace_record)


def test_only_a_process_of_this_host_that_has_exited_is_provably_dead() -> None:
    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    host, space = socket.gethostname(), process_space()
    assert holder_is_dead(f"{host}:{int(exited.stdout)}:x:{space}")
    assert not holder_is_dead(f"{host}:{os.getpid()}:x:{space}")
    assert not holder_is_dead(f"{host}:{os.getppid()}:x:{space}")
    assert not holder_is_dead(f"elsewhere:{int(exited.stdout)}:x:{space}")
    assert not holder_is_dead(f"{host}:{int(exited.stdout)}:x:another-container")
    assert not holder_is_dead("garbage")


def test_the_lease_of_a_dead_executor_is_taken_over_at_once() -> None:
    exited = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    client = fakeredis.FakeRedis()
    client.set(KEYS.lease, f"{socket.gethostname()}:{int(exited.stdout)}:x:{process_space()}", px=15_000)
    lease = Lease(client, KEYS.lease)
    lease.acquire(wait_s=0)  # no waiting: the holder has exited
    try:
        assert client.get(KEYS.lease) == lease.token.encode()
    finally:
        lease.release()


class Files:
    """A checkpoint's files in memory (execution_graph.checkpoint.CheckpointFiles)."""

    def __init__(self) -> None:
        self.texts: dict[str, str] = {}

    def read_text(self, name: str) -> str | None:
        return self.texts.get(name)

    def write_once(self, name: str, text: str) -> bool:
        written = name not in self.texts
        self.texts.setdefault(name, text)
        return written

    def replace(self, name: str, text: str) -> None:
        self.texts[name] = text

    def has_entries(self, name: str) -> bool:
        return any(key.startswith(f"{name}/") for key in self.texts)


def graph_record() -> GraphRecord:
    return GraphRecord(
        query_id="a",
        source=QuerySource(name="a", kind=QueryKind.SQL, text="--"),
        window_ms=10_000,
        slide_ms=10_000,
        topic="t",
        spark_query_id=new_spark_query_id(),
        reads=DEMO_SOURCE,
    )


def test_a_graph_resumes_only_the_checkpoint_made_for_it() -> None:
    record = graph_record()
    files = Files()
    claim_checkpoint(files, "graph-a", record)  # first start: the id is written before Spark runs
    claim_checkpoint(files, "graph-a", record)  # a restart finds its own id
    stranger = record.model_copy(update={"spark_query_id": new_spark_query_id()})
    with pytest.raises(GraphStartFailed, match=r"belongs to Spark query .*--reset-namespace"):
        claim_checkpoint(files, "graph-a", stranger)


def test_an_unreadable_checkpoint_metadata_is_told_apart_from_another_querys() -> None:
    record = graph_record()
    files = Files()
    files.texts["metadata"] = '{"id": "4f2'  # a write cut short, before Spark ran a batch
    claim_checkpoint(files, "graph-a", record)
    assert record.spark_query_id in files.texts["metadata"]
    files.texts["metadata"] = ""  # the same, once batches ran: refused, with what to do
    files.texts["offsets/0"] = "v1"
    with pytest.raises(GraphStartFailed, match=f"cannot be read.*restore the file with its id {record.spark_query_id}"):
        claim_checkpoint(files, "graph-a", record)


class CountingRedis(fakeredis.FakeRedis):
    """Counts the commands sent to Redis (each one a round trip), and can fail the next N with a
    connection error, as a restarting Redis would."""

    def __init__(self) -> None:
        super().__init__()
        self.commands: list[str] = []
        self.refuse = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.commands.append(str(args[0]))
        if self.refuse:
            self.refuse -= 1
            raise redis.ConnectionError("Redis is loading its append-only file")
        return super().execute_command(*args, **options)  # type: ignore[no-untyped-call]


def test_a_fenced_write_with_its_preconditions_is_one_round_trip() -> None:
    client = CountingRedis()
    fence = holding(client)
    journal = Journal(client, KEYS, fence)
    journal.create(SwapRecord(id="s", to_query="b"))  # loads the write script
    record = journal.get("s")
    client.commands.clear()
    graph = GraphRecord(
        query_id="b",
        source=QuerySource(name="b", kind=QueryKind.SQL, text="--"),
        window_ms=1,
        slide_ms=1,
        topic="t",
        spark_query_id=new_spark_query_id(),
        reads=DEMO_SOURCE,
    )
    moved = journal.advance(record, SwapPhase.VALIDATED, also=Also(graphs=[graph]))
    assert moved is not None
    assert client.commands == ["EVALSHA"]  # lease, namespace, compare-and-set, record, graph: one script
    assert client.hget(KEYS.graphs, "b") is not None
    journal.open()  # the first call loads the read script into Redis; later ones name it by its hash
    client.commands.clear()
    assert [s.id for s in journal.open()] == ["s"]
    assert client.commands == ["EVALSHA"]


def test_a_write_whose_precondition_fails_writes_nothing() -> None:
    client = fakeredis.FakeRedis()
    fence = holding(client)
    client.set(KEYS.current, "a")
    refused = Batch().expect(KEYS.current, "b").set(KEYS.current, "c").hset(KEYS.graphs, "x", "1")
    assert not write(client, fence, refused)
    assert (client.get(KEYS.current), client.hgetall(KEYS.graphs)) == (b"a", {})
    assert write(client, fence, Batch().expect(KEYS.current, "a").set(KEYS.current, "c"))
    assert client.get(KEYS.current) == b"c"
    assert not write(client, fence, Batch().expect(KEYS.current, None).set(KEYS.current, "d"))


def test_a_stale_record_read_before_another_writer_moved_it_is_read_again_and_decided_again() -> None:
    client = fakeredis.FakeRedis()
    journal = Journal(client, KEYS, holding(client))
    journal.create(SwapRecord(id="s", to_query="b"))
    stale = journal.get("s")
    journal.advance("s", SwapPhase.ABORTED)
    with pytest.raises(IllegalTransition, match="from aborted to validated"):
        journal.advance(stale, SwapPhase.VALIDATED)
    assert journal.advance(stale, SwapPhase.VALIDATED, when=lambda r: r.state is SwapPhase.SUBMITTED) is None


def test_a_control_write_waits_for_a_restarting_redis() -> None:
    client = CountingRedis()
    fence = holding(client)
    client.refuse = 2
    fenced_write(client, fence, lambda batch: batch.set(KEYS.service, "{}"))
    assert client.get(KEYS.service) == b"{}"


def test_a_local_checkpoint_root_that_cannot_be_written_stops_run_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    root = str(tmp_path / "a-file" / "checkpoints" / "unit")
    with pytest.raises(CheckpointsUnreachable, match=r"^the checkpoint root .*/a-file/checkpoints/unit cannot be "):
        check_checkpoints(root, None)  # a local root needs no Spark


def test_a_probe_a_crash_left_behind_is_no_leftover(tmp_path: Path) -> None:
    checkpoints = LocalDir(tmp_path / "unit")
    check_checkpoints(checkpoints.where, None)
    assert not checkpoints.holds_anything()
    (tmp_path / "unit" / PROBE_FILE).write_text("hotswap\n")  # the process died between the write and the removal
    assert not checkpoints.holds_anything()
    (tmp_path / "unit" / f".{PROBE_FILE}.tmp").write_text("hot")  # or between the write and the rename
    (tmp_path / "unit" / f".{PROBE_FILE}.5f3c9a.tmp").write_text("hot")  # each write names its own
    assert not checkpoints.holds_anything()
    checkpoints.replace("journal-version", "3\n")
    assert checkpoints.holds_anything()
