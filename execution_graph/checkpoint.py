"""hotswap's own files beside Spark's checkpoints, so they live wherever the checkpoints do: a local
directory, a cluster's shared store, or an object store (s3a://). A graph's (its claim, its closing
state: CheckpointDir, through Hadoop's FileSystem API) and the namespace's (the journal's version
seen, the removal of it all: RootFiles)."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol, TypeVar

from py4j.protocol import Py4JError
from pyspark.sql import SparkSession

from hotswap.contract.causes import root_cause
from hotswap.contract.names import is_store_uri
from hotswap.execution_graph.errors import CheckpointsUnreachable

# Stores whose files appear whole when their writer closes them, and whose rename is a copy: a file
# is written in place there, never through a temporary one.
OBJECT_STORE_SCHEMES = frozenset({"s3a", "gs"})
# What `os.link` raises on a file system that has no hard links (some network and FUSE mounts).
NO_HARD_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EMLINK, errno.ENOSYS})
PROBE_FILE = ".hotswap-probe"  # written and removed by check_checkpoints; a crash may leave it
# The probe's own S3 client: S3A's retries of a failed request (`retry.limit`, 7 by default, with
# growing pauses) and the AWS SDK's retries inside each try (`attempts.maximum`, 5), two of each.
PROBE_CLIENT = {"fs.s3a.retry.limit": "2", "fs.s3a.attempts.maximum": "2"}
_T = TypeVar("_T")


class CheckpointFiles(Protocol):
    """What hotswap reads and writes in a checkpoint (CheckpointDir; a fake in unit tests)."""

    def read_text(self, name: str) -> str | None: ...

    def write_once(self, name: str, text: str) -> bool: ...

    def replace(self, name: str, text: str) -> None: ...

    def has_entries(self, name: str) -> bool: ...


class GraphFiles(CheckpointFiles, Protocol):
    """A graph's checkpoint as a closing graph keeps its logs there (`offsets`, `commits`, its state)."""

    def exists(self, name: str) -> bool: ...

    def batch_ids(self, name: str) -> set[int]: ...

    def delete(self, name: str) -> None: ...


class RootFiles(Protocol):
    """The files at the root of a namespace's checkpoints (executor/control/namespace.py)."""

    @property
    def where(self) -> str: ...

    def read_text(self, name: str) -> str | None: ...

    def replace(self, name: str, text: str) -> None: ...

    def holds_anything(self) -> bool: ...

    def remove(self, name: str) -> None: ...

    def remove_all(self) -> None: ...


def root_files(location: str, spark: SparkSession | None) -> RootFiles:
    """The files below `location`: a local directory's through the OS, a store's through Spark's
    Hadoop client (so `spark` is needed only for a store)."""
    if not is_store_uri(location):
        return LocalDir(Path(location))
    if spark is None:
        raise ValueError(f"{location} is on an object store: its files are reached through a Spark session")
    return StoreRoot(CheckpointDir(spark, location))


def graph_files(spark: SparkSession, location: str) -> GraphFiles:
    """A graph's checkpoint directory: through the OS when it is on this machine's disk, else through
    Spark's Hadoop client. Where a path without a scheme lies is Hadoop's to say, as for Spark: on the
    cluster's default file system, which may not be the local one."""
    files = CheckpointDir(spark, location)
    if files.on_local_disk and not is_store_uri(location):
        return LocalCheckpointDir(Path(location))
    return files


def check_checkpoints(location: str, spark: SparkSession | None) -> None:
    """Say in one line, before anything starts, that the checkpoint root cannot be written: a local
    directory without the permission, or a store that refuses (its endpoint down, keys it does not
    take, a bucket that does not exist: that one lists as empty, so a file is written and removed).
    `spark` is needed only for a store."""
    if is_store_uri(location):
        if spark is None:
            raise ValueError(f"{location} is on an object store: its files are reached through a Spark session")
        # A client that gives up after a few retries: with Hadoop's defaults, an endpoint that
        # refuses connections was said only after 112 s.
        try:
            store = CheckpointDir(spark, location, PROBE_CLIENT)
        except Py4JError as exc:  # no S3 client for the scheme, or settings it does not take
            raise _unreachable(location, exc) from exc
        root = StoreRoot(store)
        try:
            root.replace(PROBE_FILE, "hotswap\n")
            root.remove(PROBE_FILE)
        finally:
            with contextlib.suppress(Py4JError):  # what the probe found is the news, not its client's close
                store.close()
        return
    files = LocalDir(Path(location))
    try:
        files.replace(PROBE_FILE, "hotswap\n")
        files.remove(PROBE_FILE)
    except OSError as exc:
        raise CheckpointsUnreachable(
            f"the checkpoint root {location} cannot be written ({exc}); check HOTSWAP_CHECKPOINT_ROOT and its "
            "permissions"
        ) from exc


class LocalDir:
    """Files below a local checkpoint root, written atomically (a temporary file, fsync, rename)."""

    def __init__(self, root: Path) -> None:
        self._root = root

    @property
    def where(self) -> str:
        return str(self._root)

    def read_text(self, name: str) -> str | None:
        try:
            return (self._root / name).read_text(encoding="utf-8")
        except FileNotFoundError:
            return None

    def replace(self, name: str, text: str) -> None:
        path = self._root / name
        temporary = _written_aside(path, text)
        try:
            os.replace(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)

    def holds_anything(self) -> bool:
        # The probe, and the probe's temporary file if a process died between its write and its rename.
        def probe(name: str) -> bool:
            return name == PROBE_FILE or (name.startswith(f".{PROBE_FILE}.") and name.endswith(".tmp"))

        return self._root.is_dir() and any(not probe(path.name) for path in self._root.iterdir())

    def remove(self, name: str) -> None:
        (self._root / name).unlink(missing_ok=True)

    def remove_all(self) -> None:
        if self._root.exists():
            shutil.rmtree(self._root)


class LocalCheckpointDir:
    """A graph's local checkpoint directory, through the OS. A closing batch writes three files (its
    offsets, its state, its commit) on the path a swap's drain waits on: through Hadoop's client, each
    was a dozen py4j round trips and forked processes, 38-63 ms under load (docs/performance.md); here
    well under one. Spark's own files here (a stateful graph's) have `.crc` siblings, which Hadoop's
    listings hide and its deletes remove; so do these methods."""

    def __init__(self, root: Path) -> None:
        self._root = root

    @property
    def where(self) -> str:
        return str(self._root)

    def exists(self, name: str) -> bool:
        return (self._root / name).exists()

    def read_text(self, name: str) -> str | None:
        # Damaged bytes are read as U+FFFD, as Hadoop's reader did: the caller finds the text unreadable
        # and says so in its own words (claim_checkpoint), rather than failing on a decode error.
        try:
            return (self._root / name).read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return None

    def write_once(self, name: str, text: str) -> bool:
        """Write the file unless it exists, whole: a temporary file, synced, then linked into place (a
        link, unlike a rename, fails when another writer got there first, whose file is kept). Returns
        whether it wrote."""
        path = self._root / name
        if path.exists():
            return False
        temporary = _written_aside(path, text)
        try:
            # Hadoop's checksum of a file of that name removed by hand: Spark would check the new one against it.
            _checksum_of(path).unlink(missing_ok=True)
            os.link(temporary, path)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in NO_HARD_LINKS:
                raise
            os.replace(temporary, path)  # a file system without hard links: a rename, as Hadoop's
        finally:
            temporary.unlink(missing_ok=True)
        return True

    def replace(self, name: str, text: str) -> None:
        path = self._root / name
        temporary = _written_aside(path, text)
        try:
            _checksum_of(path).unlink(missing_ok=True)  # Hadoop's, of the file replaced: it would not match
            os.replace(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)

    def has_entries(self, name: str) -> bool:
        return any(not _is_checksum(entry) for entry in self._entries(name))

    def batch_ids(self, name: str) -> set[int]:
        return {int(entry) for entry in self._entries(name) if entry.isdigit()}

    def delete(self, name: str) -> None:
        path = self._root / name
        path.unlink(missing_ok=True)
        _checksum_of(path).unlink(missing_ok=True)

    def _entries(self, name: str) -> list[str]:
        try:
            return os.listdir(self._root / name)
        except FileNotFoundError:
            return []


def _written_aside(path: Path, text: str) -> Path:
    """`text` in a hidden file of its own beside `path` (no reader lists it), synced: renamed or
    linked into place, a reader finds the file whole or not at all. Removed if it cannot be written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with temporary.open("w", encoding="utf-8") as out:
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
    except OSError:
        temporary.unlink(missing_ok=True)
        raise
    return temporary


def _checksum_of(path: Path) -> Path:
    """Where Hadoop's local file system keeps the checksum of `path`."""
    return path.with_name(f".{path.name}.crc")


def _is_checksum(entry: str) -> bool:
    return entry.startswith(".") and entry.endswith(".crc")


class StoreRoot:
    """A namespace's root on an object store, through Spark's Hadoop client: a store that fails a
    request is said in one line (CheckpointsUnreachable), not as a JVM stack trace."""

    def __init__(self, files: CheckpointDir) -> None:
        self._files = files

    @property
    def where(self) -> str:
        return self._files.where

    def read_text(self, name: str) -> str | None:
        return self._call(lambda: self._files.read_text(name))

    def replace(self, name: str, text: str) -> None:
        self._call(lambda: self._files.replace(name, text))

    def holds_anything(self) -> bool:
        return self._call(self._files.holds_anything)

    def remove(self, name: str) -> None:
        self._call(lambda: self._files.delete(name))

    def remove_all(self) -> None:
        self._call(self._files.remove_all)

    def _call(self, request: Callable[[], _T]) -> _T:
        try:
            return request()
        except Py4JError as exc:
            raise _unreachable(self.where, exc) from exc


def _unreachable(where: str, exc: Py4JError) -> CheckpointsUnreachable:
    return CheckpointsUnreachable(
        f"the checkpoint root {where} cannot be reached ({root_cause(exc)}); check HOTSWAP_S3_ENDPOINT, "
        "HOTSWAP_S3_ACCESS_KEY and HOTSWAP_S3_SECRET_KEY, and that the bucket exists"
    )


class CheckpointDir:
    """Files below one checkpoint directory, by relative name ("closing/12")."""

    def __init__(self, spark: SparkSession, root: str, overrides: Mapping[str, str] | None = None) -> None:
        """`overrides`: Hadoop settings for a client of this object's own (closed by `close`), on top of
        the session's; without them, the session's shared client."""
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        self._where = root
        # Looked up once: py4j resolves each segment of `jvm.a.b.C` with a round trip of its own,
        # and a closing graph's batch touches a handful of files.
        self._path_class = jvm.org.apache.hadoop.fs.Path
        self._io = jvm.org.apache.commons.io.IOUtils
        self._root = self._path_class(root)
        conf = spark.sparkContext._jsc.hadoopConfiguration()
        self._own_client = bool(overrides)
        if overrides:
            conf = jvm.org.apache.hadoop.conf.Configuration(conf)
            for key, value in overrides.items():
                conf.set(key, value)
            self._fs = jvm.org.apache.hadoop.fs.FileSystem.newInstance(self._root.toUri(), conf)
        else:
            self._fs = self._root.getFileSystem(conf)
        self._scheme = str(self._fs.getScheme())
        self._object_store = self._scheme in OBJECT_STORE_SCHEMES

    def close(self) -> None:
        """Close the client, if it is this object's own (the session's shared one stays open)."""
        if self._own_client:
            self._fs.close()

    @property
    def where(self) -> str:
        return self._where

    @property
    def on_local_disk(self) -> bool:
        return self._scheme == "file"

    def path(self, name: str) -> Any:
        return self._path_class(self._root, name)

    def exists(self, name: str) -> bool:
        return bool(self._fs.exists(self.path(name)))

    def read_text(self, name: str) -> str | None:
        """The file's text, or None if there is no such file."""
        path = self.path(name)
        if not self._fs.exists(path):
            return None
        stream = self._fs.open(path)
        try:
            return str(self._io.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def write_once(self, name: str, text: str) -> bool:
        """Write the file unless it exists, so that a reader never finds half a file: on a file
        system, whole to a temporary file first, then renamed; on an object store, in place (the
        object appears when its stream closes). An existing file is kept (the callers write the same
        text again only when Spark replays the batch that wrote it). Returns whether it wrote."""
        path = self.path(name)
        if self._fs.exists(path):
            return False
        if self._object_store:
            self._write(path, text)
            return True
        temporary = self.path(f"{name}.tmp")
        self._write(temporary, text)
        if not self._fs.rename(temporary, path):
            raise OSError(f"could not rename {temporary} to {path}")
        return True

    def replace(self, name: str, text: str) -> None:
        """Write the file whole, in place of whatever is there (on a file system through a temporary
        file and a rename; on an object store one write replaces the object at once)."""
        if self._object_store:
            self._write(self.path(name), text)
            return
        self.delete(name)
        self.write_once(name, text)

    def _write(self, path: Any, text: str) -> None:
        stream = self._fs.create(path, True)
        try:
            stream.write(bytearray(text.encode()))
            if stream.hasCapability("hsync"):  # an object store has no sync: its close publishes
                stream.hsync()
        finally:
            stream.close()

    def holds_anything(self) -> bool:
        """Whether the directory holds anything but check_checkpoints' probe."""
        if not self._fs.exists(self._root):
            return False
        return any(str(status.getPath().getName()) != PROBE_FILE for status in self._fs.listStatus(self._root))

    def remove_all(self) -> None:
        if self._fs.exists(self._root):
            self._fs.delete(self._root, True)

    def has_entries(self, name: str) -> bool:
        """Whether the directory `name` exists and holds anything (Spark's `offsets`, say)."""
        path = self.path(name)
        return bool(self._fs.exists(path)) and len(self._fs.listStatus(path)) > 0

    def batch_ids(self, name: str) -> set[int]:
        """The numbered entries of directory `name` (Spark's `offsets`, `commits`): empty if none."""
        path = self.path(name)
        if not self._fs.exists(path):
            return set()
        entries = (str(s.getPath().getName()) for s in self._fs.listStatus(path))
        return {int(entry) for entry in entries if entry.isdigit()}

    def delete(self, name: str) -> None:
        path = self.path(name)
        if self._fs.exists(path):
            self._fs.delete(path, False)
