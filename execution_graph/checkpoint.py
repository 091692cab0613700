"""hotswap's own files in a graph's Spark checkpoint, through Hadoop's FileSystem API, so they live
wherever the checkpoint does (a local directory, or a cluster's shared store)."""

from __future__ import annotations

from typing import Any, Protocol

from pyspark.sql import SparkSession


class CheckpointFiles(Protocol):
    """What hotswap reads and writes in a checkpoint (CheckpointDir; a fake in unit tests)."""

    def read_text(self, name: str) -> str | None: ...

    def write_once(self, name: str, text: str) -> None: ...

    def replace(self, name: str, text: str) -> None: ...

    def has_entries(self, name: str) -> bool: ...


class CheckpointDir:
    """Files below one checkpoint directory, by relative name ("closing/12")."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        jvm = spark.sparkContext._jvm
        assert jvm is not None
        self._jvm = jvm
        self._root = jvm.org.apache.hadoop.fs.Path(root)
        self._fs = self._root.getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())

    def path(self, name: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(self._root, name)

    def exists(self, name: str) -> bool:
        return bool(self._fs.exists(self.path(name)))

    def read_text(self, name: str) -> str | None:
        """The file's text, or None if there is no such file."""
        path = self.path(name)
        if not self._fs.exists(path):
            return None
        stream = self._fs.open(path)
        try:
            return str(self._jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()

    def write_once(self, name: str, text: str) -> None:
        """Write the file unless it exists. Written whole to a temporary file first, then renamed, so
        a reader never finds half a file; an existing file is kept (the callers write the same text
        again only when Spark replays the batch that wrote it)."""
        path = self.path(name)
        if self._fs.exists(path):
            return
        temporary = self.path(f"{name}.tmp")
        stream = self._fs.create(temporary, True)
        try:
            stream.write(bytearray(text.encode()))
            stream.hsync()
        finally:
            stream.close()
        if not self._fs.rename(temporary, path):
            raise OSError(f"could not rename {temporary} to {path}")

    def replace(self, name: str, text: str) -> None:
        """Write the file whole, in place of whatever is there (through a temporary file and a rename)."""
        self.delete(name)
        self.write_once(name, text)

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
