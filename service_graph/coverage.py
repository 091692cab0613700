"""Read coverage: every source record a batch planned to read was read, or counted as expired.

The service graph reads its source with `failOnDataLoss=false`, so that rows deleted by retention
before they were read are counted as expired rather than stopping the namespace. With that setting,
Spark's Kafka reader skips, with only a log line, any offsets it cannot fetch at that moment: rows
retention deleted, and the rest of a range when the broker reports an offset out of range. A batch
is planned as one offset range per partition (the query's own offset log: the previous batch's
end, or the query's first offsets, to this batch's end), so after each batch the service graph
accounts for the whole range:

- offsets after the last one the batch saw, up to the end: a consumer of its own asks Kafka
  whether any record lies there. If one does, the batch fails before it records its state or
  writes a marker, and Spark replays it. A range that holds only transaction markers, compacted
  or expired offsets reads as empty from Kafka too;
- offsets below Kafka's log start that the batch did not read, before its first row or between
  two rows (a segment deleted while Spark read the partition): deleted by retention before they
  were read, counted as expired, a partition the batch read no row of included. Above the log
  start, an offset not read is a transaction marker or compacted away.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from py4j.protocol import Py4JError
from pyspark.sql import SparkSession

from hotswap.contract.causes import root_cause
from hotswap.contract.names import is_store_uri
from hotswap.contract.offset_log import first_offsets, planned_at, planned_ends
from hotswap.service_graph.errors import ServiceGraphError


class SkippedRead(ServiceGraphError):
    """A batch's read could not be accounted for: Spark skipped source records that Kafka still
    holds, or Kafka or the checkpoint store did not answer. The batch fails and Spark replays it."""


@dataclass(frozen=True)
class Unread:
    """Offsets of one source partition that a batch planned to read and did not see: [first, end)."""

    partition: int
    first: int
    end: int

    def __str__(self) -> str:
        return f"partition {self.partition} [{self.first}, {self.end})"


@dataclass(frozen=True)
class Seen:
    """What a batch read of one source partition: its first and last offset, and how many rows."""

    first: int
    last: int
    rows: int

    @property
    def holes(self) -> int:
        """Offsets between the first and the last row read that held no row read."""
        return self.last - self.first + 1 - self.rows


@dataclass(frozen=True)
class PlannedRange:
    """The offsets Spark planned for one batch, per partition: [start, end). A partition whose start
    is unknown (one added to the topic since) has none in `starts`."""

    starts: Mapping[int, int]
    ends: Mapping[int, int]
    planned_at_ms: int | None = field(default=None, compare=False)  # offset_log.planned_at

    @property
    def offsets(self) -> int:
        """How many offsets the batch planned to read, over the partitions whose start is known."""
        return sum(max(0, end - self.starts[p]) for p, end in self.ends.items() if p in self.starts)

    def fully_read(self, seen: Mapping[int, Seen]) -> bool:
        """Whether every partition was read from its start with no offset left out between its rows
        (then nothing can have expired, and Kafka's log start need not be asked)."""
        for partition, end in self.ends.items():
            got = seen.get(partition)
            start = self.starts.get(partition)
            first = end if got is None else got.first
            if (start is not None and start < first) or (got is not None and got.holes > 0):
                return False
        return True

    def expired(self, seen: Mapping[int, Seen], log_start: Mapping[int, int]) -> int:
        """Offsets of the batch's ranges below Kafka's log start that it did not read: before the
        first row read (all of the range, if none was), and between rows read."""
        total = 0
        for partition, end in self.ends.items():
            got = seen.get(partition)
            below = log_start.get(partition, 0)
            start = self.starts.get(partition)
            first = end if got is None else got.first
            if start is not None:
                total += max(0, min(first, below) - start)
            if got is not None:
                total += min(got.holes, max(0, min(below, got.last + 1) - got.first))
        return total


def unread(planned: Mapping[int, int], seen: Mapping[int, int]) -> list[Unread]:
    """For each partition, the offsets after the last one seen (-1: none yet) up to the batch's end.
    Spark drops a range from an offset it cannot fetch to the end of the range, so the batch's tail
    is what Kafka is asked about; what lies before is counted by `PlannedRange.expired`."""
    return [
        Unread(partition, seen.get(partition, -1) + 1, end)
        for partition, end in sorted(planned.items())
        if seen.get(partition, -1) + 1 < end
    ]


class OffsetLog:
    """Spark's offset log of the service graph's query (`<checkpoint>/offsets/<batch>`, and
    `sources/0/0` for its first offsets). A local checkpoint is read as files (Spark's driver wrote
    them); one on a store, or one not found on this machine's disk (a path on the cluster's default
    file system), through Hadoop's FileSystem API, as Spark reads it."""

    def __init__(self, spark: SparkSession, checkpoint: str, topic: str) -> None:
        self._spark = spark
        self._checkpoint = checkpoint
        self._topic = topic
        self._local = None if is_store_uri(checkpoint) else Path(checkpoint)
        self._fs: Any = None
        self._last_planned: tuple[int, PlannedRange | None] = (-1, None)  # its ends: the next batch's starts

    def batch(self, batch_id: int) -> PlannedRange | None:
        """What Spark planned for batch `batch_id`, or None if its entry is not there."""
        entry = self.entry(f"offsets/{batch_id}")
        ends = None if entry is None else planned_ends(entry, self._topic)
        if ends is None:
            return None
        starts: Mapping[int, int] | None
        previous = self.last(batch_id - 1)
        if previous is not None:
            starts = previous.ends
        elif batch_id > 0:
            before = self.entry(f"offsets/{batch_id - 1}")
            starts = None if before is None else planned_ends(before, self._topic)
        else:
            first = self.entry("sources/0/0")
            starts = None if first is None else first_offsets(first, self._topic)
        planned = PlannedRange(starts or {}, ends, None if entry is None else planned_at(entry))
        self._last_planned = (batch_id, planned)
        return planned

    def last(self, batch_id: int) -> PlannedRange | None:
        """What `batch` last returned, if that was for `batch_id`; None otherwise (never a read of its own)."""
        batch, planned = self._last_planned
        return planned if batch == batch_id else None

    def entry(self, name: str) -> str | None:
        if self._local is not None and self._local.is_dir():
            try:
                return (self._local / name).read_text(encoding="utf-8")
            except FileNotFoundError:
                return None
        try:
            return self._hadoop_entry(name)
        except Py4JError as exc:
            raise SkippedRead(
                f"Spark's offset log at {self._checkpoint} cannot be read ({root_cause(exc)}); the batch is "
                "replayed: check the checkpoint store"
            ) from exc

    def _hadoop_entry(self, name: str) -> str | None:
        jvm = self._spark.sparkContext._jvm
        assert jvm is not None
        path = jvm.org.apache.hadoop.fs.Path(f"{self._checkpoint}/{name}")
        if self._fs is None:
            self._fs = path.getFileSystem(self._spark.sparkContext._jsc.hadoopConfiguration())
        if not self._fs.exists(path):
            return None
        stream = self._fs.open(path)
        try:
            return str(jvm.org.apache.commons.io.IOUtils.toString(stream, "UTF-8"))
        finally:
            stream.close()
