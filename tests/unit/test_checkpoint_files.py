"""A graph's local checkpoint directory, written through the OS (execution_graph.checkpoint.LocalCheckpointDir):
whole files, written once, beside Spark's own files and their `.crc` siblings."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from hotswap.contract.models import GraphRecord, QueryKind, QuerySource, new_spark_query_id
from hotswap.execution_graph import checkpoint
from hotswap.execution_graph.checkpoint import LocalCheckpointDir
from hotswap.execution_graph.graph import claim_checkpoint
from tests.conftest import DEMO_SOURCE


def test_a_file_is_written_once_and_whole(tmp_path: Path) -> None:
    files = LocalCheckpointDir(tmp_path / "graph")
    assert files.read_text("offsets/0") is None
    assert not files.exists("offsets/0")

    assert files.write_once("offsets/0", "v1\n{}\n")
    assert not files.write_once("offsets/0", "another writer's text")  # the first one is kept

    assert files.exists("offsets/0")
    assert files.read_text("offsets/0") == "v1\n{}\n"
    assert sorted(p.name for p in (tmp_path / "graph" / "offsets").iterdir()) == ["0"]  # no temporary left


def test_a_writer_that_loses_the_race_keeps_the_winners_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = LocalCheckpointDir(tmp_path)
    written_aside = checkpoint._written_aside

    def while_another_writes(path: Path, text: str) -> Path:
        temporary = written_aside(path, text)
        path.write_text("the other writer's", encoding="utf-8")  # after our look, before our link
        return temporary

    monkeypatch.setattr(checkpoint, "_written_aside", while_another_writes)
    assert not files.write_once("commits/3", "ours")
    assert files.read_text("commits/3") == "the other writer's"
    assert [p.name for p in (tmp_path / "commits").iterdir()] == ["3"]


def test_listings_read_sparks_directories_as_hadoop_does(tmp_path: Path) -> None:
    offsets = tmp_path / "offsets"
    offsets.mkdir()
    for name in ("0", "1", ".0.crc", ".1.crc", ".2.5f3c.tmp"):
        (offsets / name).write_text("x", encoding="utf-8")
    only_checksums = tmp_path / "commits"
    only_checksums.mkdir()
    (only_checksums / ".0.crc").write_text("x", encoding="utf-8")
    files = LocalCheckpointDir(tmp_path)

    assert files.batch_ids("offsets") == {0, 1}
    assert files.has_entries("offsets")
    assert files.batch_ids("commits") == set()
    assert not files.has_entries("commits")  # Hadoop's listing hides checksum files
    assert files.batch_ids("missing") == set()
    assert not files.has_entries("missing")


def test_delete_and_replace_leave_no_stale_checksum(tmp_path: Path) -> None:
    for name in ("metadata", ".metadata.crc", "0", ".0.crc"):
        (tmp_path / name).write_text("written by Hadoop", encoding="utf-8")
    files = LocalCheckpointDir(tmp_path)

    files.delete("0")
    files.delete("never-written")
    files.replace("metadata", '{"id": "q"}\n')

    assert sorted(p.name for p in tmp_path.iterdir()) == ["metadata"]
    assert files.read_text("metadata") == '{"id": "q"}\n'


def test_a_stale_checksum_goes_before_a_file_of_its_name_is_written(tmp_path: Path) -> None:
    (tmp_path / ".metadata.crc").write_text("Hadoop's, of a metadata file removed by hand", encoding="utf-8")
    files = LocalCheckpointDir(tmp_path)
    assert files.write_once("metadata", '{"id": "q"}\n')
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metadata"]  # Spark would check the new file against it


def test_a_file_system_without_hard_links_gets_a_rename(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refused(source: object, target: object) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", refused)
    files = LocalCheckpointDir(tmp_path)
    assert files.write_once("commits/0", "v1\n")
    assert files.read_text("commits/0") == "v1\n"
    assert [p.name for p in (tmp_path / "commits").iterdir()] == ["0"]


def test_a_write_that_fails_leaves_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def full(descriptor: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    files = LocalCheckpointDir(tmp_path)
    with pytest.raises(OSError, match="No space left"):
        files.write_once("closing/4", "{}")
    assert list((tmp_path / "closing").iterdir()) == []


def test_a_damaged_metadata_file_before_any_batch_is_written_again(tmp_path: Path) -> None:
    (tmp_path / "metadata").write_bytes(b"\xff\xfe\x00garbage")
    files = LocalCheckpointDir(tmp_path)
    record = GraphRecord(
        query_id="a",
        source=QuerySource(name="a", kind=QueryKind.SQL, text="--"),
        window_ms=10_000,
        slide_ms=10_000,
        topic="t",
        spark_query_id=new_spark_query_id(),
        reads=DEMO_SOURCE,
    )
    claim_checkpoint(files, str(tmp_path), record)  # read as text that is no JSON: no decode error
    assert json.loads(files.read_text("metadata") or "")["id"] == record.spark_query_id
