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
- offsets from the start to the first row the batch read, below Kafka's log start: deleted by
  retention before they were read, counted as expired (a partition the batch read no row of
  included).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

from hotswap.contract.names import is_store_uri
from hotswap.service_graph.errors import ServiceGraphError


class SkippedRead(ServiceGraphError):
    """Spark's read of a batch skipped source records that Kafka still holds; the batch is replayed."""


@dataclass(frozen=True)
class Unread:
    """Offsets of one source partition that a batch planned to read and did not see: [first, end)."""

    partition: int
    first: int
    end: int

    def __str__(self) -> str:
        return f"partition {self.partition} [{self.first}, {self.end})"


def planned_ends(offset_log_entry: str, topic: str) -> dict[int, int] | None:
    """The end offset of each partition of `topic` in one entry of Spark's offset log (`offsets/N`:
    a version line, the batch's metadata, then one line per source), or None if the entry does not
    name the topic."""
    return _offsets(offset_log_entry.splitlines()[2:], topic)


def first_offsets(sources_entry: str, topic: str) -> dict[int, int] | None:
    """The offsets a Kafka source's first batch starts from (`sources/0/0`: a version line, then
    the offsets), or None if the entry does not name the topic."""
    return _offsets(sources_entry.splitlines()[1:], topic)


def _offsets(lines: list[str], topic: str) -> dict[int, int] | None:
    for line in lines:
        if not line.startswith("{"):
            continue
        try:
            offsets = json.loads(line)
        except ValueError:
            continue
        if isinstance(offsets, dict) and isinstance(offsets.get(topic), dict):
            return {int(p): int(o) for p, o in offsets[topic].items()}
    return None


@dataclass(frozen=True)
class BatchRange:
    """The offsets Spark planned for one batch, per partition: [start, end). A partition whose start
    is unknown (one added to the topic since) has none in `starts`."""

    starts: Mapping[int, int]
    ends: Mapping[int, int]

    def read_late(self, firsts: Mapping[int, int]) -> dict[int, tuple[int, int]]:
        """Partitions whose first row read (`firsts`; none read: the end) lies after their start:
        partition -> (start, that first offset)."""
        late = {}
        for partition, end in self.ends.items():
            start, first = self.starts.get(partition), firsts.get(partition, end)
            if start is not None and start < first:
                late[partition] = (start, first)
        return late


def expired(read_late: Mapping[int, tuple[int, int]], log_start: Mapping[int, int]) -> int:
    """Offsets of the batch's ranges that lie before the first row read and below Kafka's log start:
    rows retention deleted before they were read. Offsets above the log start that were not read
    are transaction markers or compacted away, not expired."""
    return sum(max(0, min(first, log_start.get(p, 0)) - start) for p, (start, first) in read_late.items())


def unread(planned: Mapping[int, int], seen: Mapping[int, int]) -> list[Unread]:
    """For each partition, the offsets after the last one seen (-1: none yet) up to the batch's end.

    Spark drops a range only from an offset it cannot fetch to the end of the range, so a skipped
    range always reaches the planned end: the batch's tail is what needs looking at. Gaps below the
    last offset seen are retention (counted as expired), compaction or transaction markers."""
    return [
        Unread(partition, seen.get(partition, -1) + 1, end)
        for partition, end in sorted(planned.items())
        if seen.get(partition, -1) + 1 < end
    ]


class OffsetLog:
    """Spark's offset log of the service graph's query (`<checkpoint>/offsets/<batch>`, and
    `sources/0/0` for its first offsets): a local checkpoint is read as files (Spark's driver wrote
    them), one on a store through Hadoop's FileSystem API, as Spark reads it."""

    def __init__(self, spark: SparkSession, checkpoint: str, topic: str) -> None:
        self._spark = spark
        self._checkpoint = checkpoint
        self._topic = topic
        self._local = None if is_store_uri(checkpoint) else Path(checkpoint)
        self._fs: Any = None
        self._last: tuple[int, dict[int, int]] | None = None  # the last batch's ends: the next one's starts

    def batch(self, batch_id: int) -> BatchRange | None:
        """What Spark planned for batch `batch_id`, or None if its entry is not there."""
        entry = self.entry(f"offsets/{batch_id}")
        ends = None if entry is None else planned_ends(entry, self._topic)
        if ends is None:
            return None
        starts: dict[int, int] | None
        if self._last is not None and self._last[0] == batch_id - 1:
            starts = self._last[1]
        elif batch_id > 0:
            before = self.entry(f"offsets/{batch_id - 1}")
            starts = None if before is None else planned_ends(before, self._topic)
        else:
            first = self.entry("sources/0/0")
            starts = None if first is None else first_offsets(first, self._topic)
        self._last = (batch_id, ends)
        return BatchRange(starts or {}, ends)

    def entry(self, name: str) -> str | None:
        if self._local is not None:
            try:
                return (self._local / name).read_text(encoding="utf-8")
            except FileNotFoundError:
                return None
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
