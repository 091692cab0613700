"""Spark's offset log, as hotswap reads it beside Spark: `offsets/N` is a version line, the batch's
metadata, then one line of offsets per source; `sources/0/0` is a version line (after a NUL byte),
then the offsets a Kafka source's first batch starts from. Each line of offsets is a JSON object
{topic: {partition: offset}}."""

from __future__ import annotations

import json
from collections.abc import Iterable


def planned_ends(offset_log_entry: str, topic: str) -> dict[int, int] | None:
    """The end offset of each partition of `topic` in `offsets/N`, or None if it does not name the topic."""
    return topic_offsets(offset_log_entry.splitlines()[2:], topic)


def planned_at(offset_log_entry: str) -> int | None:
    """When Spark planned the batch of `offsets/N` (its metadata's `batchTimestampMs`, taken once the
    sources had answered with their latest offsets: every row the batch reads had reached Kafka by
    then), or None if the entry does not say."""
    lines = offset_log_entry.splitlines()
    try:
        metadata = json.loads(lines[1]) if len(lines) > 1 else None
        stamp = metadata.get("batchTimestampMs") if isinstance(metadata, dict) else None
        return int(stamp) if isinstance(stamp, int) and stamp > 0 else None
    except (ValueError, TypeError):
        return None


def first_offsets(sources_entry: str, topic: str) -> dict[int, int] | None:
    """The offsets of `topic` in `sources/0/0`, or None if it does not name the topic."""
    return topic_offsets(sources_entry.splitlines()[1:], topic)


def topic_offsets(lines: Iterable[str], topic: str) -> dict[int, int] | None:
    """The first line of `lines` that holds offsets of `topic`, as partition -> offset."""
    for line in lines:
        try:
            offsets = json.loads(line)
            if isinstance(offsets, dict) and isinstance(offsets.get(topic), dict):
                return {int(p): int(o) for p, o in offsets[topic].items()}
        except (ValueError, TypeError):
            continue
    return None
