"""The oracle: what the results must be, worked out from the source topic, Spark's own offset log of
the service graph and the documented rules alone, never from what hotswap reports about itself.

- **The cut W** is read from the journal, then checked against the rule: the first boundary of both
  versions' grids (their slides; their sizes when tumbling) at or after the largest window end E
  among the rows routed before the cut's batch (rows before the batch's start offsets in Spark's
  offset log), plus the new version's size minus its slide (its first window after W starts that
  far before W, and every row of it must come after E). A sliding old version must also not have
  closed a window after W: W >= min(watermark, E + its size - slide), the watermark being what
  the routed rows imply when no partition was idle.
- **Ownership** is by window end: version i answers the windows ending in (cut i-1, cut i], each
  valued from every on-time source event in it, whichever versions the service graph sent it to.
- **Late events** are predicted from event times and the lateness: a row is surely late when its
  event time is behind every partition's position minus the lateness, and can only be late when it
  is behind some partition's position minus the lateness (unless the whole source went quiet for
  the idle timeout before it, which lets the watermark run ahead on processing time). The late
  topic's content must lie between the two.
- **The closed horizon** is the watermark the source implies once every row is read: the slowest
  partition's largest event time minus the lateness (less 1 ms for the serving graph). Every window
  ending at or before it must have its result; the test waits for the product to get there, it
  does not ask it where it is.
- **Values** are worked out per (window, group) from every on-time event in the window, by the
  oracle's own arithmetic: counts, sums, extremes, means, distinct counts and exact percentiles
  (Spark's definition: interpolated at fraction * (n - 1) of the sorted values). A top-N query
  answers only the first groups of each window; its ranking is checked window by window on the
  values it emitted (see `assert_ranking`).
"""

from __future__ import annotations

import bisect
import itertools
import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from hotswap.contract.journal import SwapRecord
from hotswap.contract.settings import Settings
from hotswap.service_sink.audit import Result, read_topic_records
from tests.conftest import wait_until
from tests.integration.s3proxy import local_copy

EventId = tuple[int, int]  # (source partition, offset)


# Spark keeps its offset log for the last 20 batches by default (spark_session.py); the oracle reads
# every batch's offsets, so test sessions keep them all.
KEEP_EVERY_BATCH = {"spark.sql.streaming.minBatchesToRetain": "1000000"}


@dataclass(frozen=True)
class SourceEvent:
    partition: int
    offset: int
    key: str
    value: float
    ts: int
    created: int  # the Kafka record's timestamp (when the generator sent it), epoch ms
    fields: Mapping[str, Any] = field(default_factory=dict)  # the record's fields, as the test decoded them

    @property
    def id(self) -> EventId:
        return (self.partition, self.offset)


# Reads one source record the way the test wrote it: None for a record the test made unreadable on
# purpose (it must be in the dead-letter topic).
Decode = Callable[[Any], SourceEvent | None]


def demo_event(record: Any) -> SourceEvent | None:
    """A record of the generator's `events` profile, as JSON: {key, value, ts (epoch ms)}."""
    body = json.loads(record.value)
    return SourceEvent(
        record.partition, record.offset, body["key"], float(body["value"]), int(body["ts"]), int(record.timestamp)
    )


def source_events(settings: Settings, decode: Decode = demo_event) -> list[SourceEvent]:
    events = []
    for r in read_topic_records(settings.kafka, settings.source_topic, timeout_s=60):
        try:
            event = decode(r)
        except (ValueError, KeyError, TypeError):
            event = None
        if event is not None:
            events.append(event)
    return events


def event_ids(settings: Settings, topic: str) -> set[EventId]:
    """The source rows that hotswap set aside in its late or dead-letter topic, each the raw record. A
    late row names its source position in its route header ("late,partition,offset,..."), a dead
    letter in its source header ("partition/offset")."""
    ids: set[EventId] = set()
    for record in read_topic_records(settings.kafka, topic, timeout_s=60):
        headers = dict(record.headers or [])
        if "hotswap.source" in headers:
            partition, offset = headers["hotswap.source"].decode().split("/")
        else:
            _, partition, offset, *_ = headers["hotswap.route"].decode().split(",")
        ids.add((int(partition), int(offset)))
    return ids


def batch_ends(settings: Settings, batch_id: int) -> dict[int, int]:
    """The end offsets (exclusive) of one service-graph batch in the source, from Spark's offset log:
    a version line, the batch metadata, then one line of offsets per source."""
    lines = (local_copy(settings.names.service_checkpoint) / "offsets" / str(batch_id)).read_text().splitlines()
    return {int(p): int(o) for p, o in json.loads(lines[2])[settings.source_topic].items()}


class ServiceBatches:
    """Spark's offset log of the service graph: where each of its batches ended in the source.

    `offsets/N` holds the end offsets (exclusive) of batch N, written before the batch runs; batch N
    starts where N-1 ended. The tests' Spark sessions keep every entry (minBatchesToRetain)."""

    def __init__(self, settings: Settings) -> None:
        directory = local_copy(settings.names.service_checkpoint) / "offsets"
        ids = [int(path.name) for path in directory.iterdir() if path.name.isdigit()]
        self._ends = {batch_id: batch_ends(settings, batch_id) for batch_id in ids}
        self._order = sorted(self._ends)
        self._partition_ends: dict[int, list[int]] = {}
        assert self._order == list(range(len(self._order))), (
            f"the service graph's offset log is not complete ({self._order[:3]}…); raise minBatchesToRetain"
        )

    def start_of(self, batch_id: int) -> dict[int, int]:
        """The first offset of `batch_id` in each partition: everything before it was routed earlier."""
        return self._ends.get(batch_id - 1, {})

    def batch_of(self, event: SourceEvent) -> int | None:
        """The batch that read this row, or None if no batch has read it."""
        ends = self._partition_ends.get(event.partition)
        if ends is None:  # per partition, batch after batch: never decreasing
            ends = self._partition_ends[event.partition] = [self._ends[b].get(event.partition, 0) for b in self._order]
        i = bisect.bisect_right(ends, event.offset)
        return self._order[i] if i < len(self._order) else None


# -- the oracle's own window arithmetic (never the product's) ------------------------------------------
def end_of_window(ts: int, size_ms: int) -> int:
    """The end of the epoch-aligned window of `size_ms` holding `ts`."""
    return ts - ts % size_ms + size_ms


def window_ends(ts: int, size_ms: int, slide_ms: int) -> range:
    """The ends of every window holding `ts`: windows of `size_ms` starting every `slide_ms` from the
    epoch, so their ends lie on multiples of the slide in (ts, ts + size]."""
    first = ts - ts % slide_ms + slide_ms
    return range(first, ts + size_ms + 1, slide_ms)


def first_multiple_at_or_after(value: int, step: int) -> int:
    return -(-value // step) * step


@dataclass
class Truth:
    """What the source says, once every row was read: the rows that count, and how far windows closed."""

    settings: Settings
    events: list[SourceEvent]
    late: set[EventId]
    dead: set[EventId]
    batches: ServiceBatches
    closed_until: int
    checked_cuts: list[int] = field(default_factory=list)

    @property
    def on_time(self) -> list[SourceEvent]:
        return [e for e in self.events if e.id not in self.late and e.id not in self.dead]

    def cut(self, swap: SwapRecord) -> int:
        """The swap's W from the journal, checked against the rule (a recovery's W is where the failed
        query stopped, decided by the executor from that query's output: it is returned unchecked)."""
        assert swap.cut_window_end is not None, f"swap {swap.id} has no cut"
        w = int(swap.cut_window_end)
        if swap.recovers is None and swap.replaces is None:
            assert swap.cut_batch is not None, swap
            since = None
            if swap.shadow:
                # A shadow's start S follows the cut rule at its own batch; its promotion's W need only
                # be at or after S (it holds every row from S on) and the largest routed window end.
                assert swap.shadow_batch is not None, swap
                assert swap.shadow_since is not None, swap
                rule_s = self._rule(swap, swap.shadow_batch, None)
                assert swap.shadow_since == rule_s, f"shadow {swap.id} started at {swap.shadow_since}; rule: {rule_s}"
                since = swap.shadow_since
            rule = self._rule(swap, swap.cut_batch, since)
            assert w == rule, f"swap {swap.id} cut at {w}; the rule gives {rule} (batch {swap.cut_batch})"
        self.checked_cuts.append(w)
        return w

    def _rule(self, swap: SwapRecord, batch: int, shadow_since: int | None) -> int:
        """The boundary the rule gives for a cut (or a shadow's start) decided before `batch`."""
        assert swap.old_window_ms, swap
        assert swap.new_window_ms, swap
        old_size, new_size = swap.old_window_ms, swap.new_window_ms
        old_slide, new_slide = swap.old_slide_ms or old_size, swap.new_slide_ms or new_size
        start = self.batches.start_of(batch)
        step = math.lcm(old_slide, new_slide)
        counted = [e for e in self.events if e.id not in self.dead and e.id not in self.late]
        routed = [e for e in counted if e.offset < start.get(e.partition, 0)]
        if not routed:
            return 0 if shadow_since is None else first_multiple_at_or_after(shadow_since, step)
        largest_end = max(end_of_window(e.ts, self.settings.window.ms) for e in routed)
        tops: dict[int, int] = {}
        for e in routed:
            tops[e.partition] = max(tops.get(e.partition, e.ts), e.ts)
        watermark = min(tops.values()) - self.settings.lateness.ms
        old_reach = min(watermark, largest_end + old_size - old_slide)
        if shadow_since is None:
            # A swap that rolls back on its own also keeps what the old version's windows after W need.
            kept = old_size - old_slide if swap.auto_rollback and swap.rollback_of is None else 0
            lower = max(largest_end + max(new_size - new_slide, kept), old_reach)
        else:
            lower = max(shadow_since, largest_end, old_reach)
        return first_multiple_at_or_after(lower, step)


def horizon(on_time: Iterable[SourceEvent], lateness_ms: int) -> int:
    """The serving graph's watermark once every row is read: the service watermark (the slowest
    partition's largest routed event time minus the lateness) less 1 ms, because the next batch
    would route rows at the service watermark as on time and Spark drops rows at its own."""
    tops: dict[int, int] = {}
    for e in on_time:
        tops[e.partition] = max(tops.get(e.partition, e.ts), e.ts)
    return min(tops.values()) - lateness_ms - 1 if tops else 0


def routed_everything(settings: Settings, source_ends: dict[int, int]) -> bool:
    """Spark's logs say the service graph committed a batch that ends at the source's end."""
    checkpoint = local_copy(settings.names.service_checkpoint)
    committed = [int(p.name) for p in (checkpoint / "commits").glob("[0-9]*") if p.name.isdigit()]
    if not committed:
        return not any(source_ends.values())
    ends = batch_ends(settings, max(committed))
    return all(ends.get(p, 0) >= end for p, end in source_ends.items())


@runtime_checkable
class KnowsItsGrid(Protocol):
    """A final graph's committed watermark that also says the grid its closing windows end on."""

    def __call__(self) -> int: ...

    def closes_on_ms(self) -> int | None: ...


def settle(
    settings: Settings,
    watermark_of_final: Callable[[], int],
    timeout_s: float = 180,
    decode: Decode = demo_event,
    *,
    closes_on_ms: int | None = None,
) -> Truth:
    """Once the load has stopped: wait until the service graph routed every source row, check the
    late topic against the prediction, then wait until the final query's committed watermark
    reaches the horizon the source implies. Call it while the executor still runs.

    `closes_on_ms`: the final graph runs on the closing engine, with windows ending on this grid
    (its slide). Its committed watermark is how far it closed, a window end: it stops at the last
    one at or before the horizon until the quiet source goes idle, so that is what to wait for
    (every window ending at or before the horizon ends there too). A `watermark_of_final` that
    knows its graph (harness.FinalGraph) gives the grid itself."""
    events = source_events(settings, decode)
    source_ends: dict[int, int] = {}
    for e in events:
        source_ends[e.partition] = max(source_ends.get(e.partition, 0), e.offset + 1)
    wait_until(lambda: routed_everything(settings, source_ends), timeout_s, "the service graph to route every row")
    dead = event_ids(settings, settings.names.dead_letter_topic)
    late = event_ids(settings, settings.names.late_topic)
    check_late(settings, events, late, dead)
    closed_until = horizon((e for e in events if e.id not in late and e.id not in dead), settings.lateness.ms)
    grid = closes_on_ms
    if grid is None and isinstance(watermark_of_final, KnowsItsGrid):
        grid = watermark_of_final.closes_on_ms()
    reached = closed_until if grid is None else closed_until - closed_until % grid
    wait_until(lambda: watermark_of_final() >= reached, timeout_s, f"every window through {closed_until} to close")
    return Truth(settings, events, late, dead, ServiceBatches(settings), closed_until)


def check_late(settings: Settings, events: list[SourceEvent], late: set[EventId], dead: set[EventId]) -> None:
    """The late topic holds every row that was surely late, and none that could not have been."""
    batches = ServiceBatches(settings)
    by_batch: dict[int, list[SourceEvent]] = defaultdict(list)
    for e in events:
        batch_id = batches.batch_of(e)
        assert batch_id is not None or e.id not in late, f"row {e.id} is in the late topic but was never read"
        if batch_id is not None:
            by_batch[batch_id].append(e)
    lateness = settings.lateness.ms
    idle_ms = settings.idle_timeout.ms if settings.idle_timeout else None
    positions: dict[int, int] = {}
    last_created: int | None = None
    quiet_seen = False
    for batch_id in sorted(by_batch):
        rows = by_batch[batch_id]
        first_created = min(e.created for e in rows)
        # Only a source quiet for the idle timeout lets the watermark move on processing time.
        if idle_ms is not None and last_created is not None and first_created - last_created >= idle_ms:
            quiet_seen = True
        for e in rows:
            if e.id in dead or not positions:
                continue
            if e.ts < min(positions.values()) - lateness:
                assert e.id in late, f"row {e.id} (ts {e.ts}) was behind every partition but not sent to the late topic"
            if e.id in late and not quiet_seen:
                assert e.ts < max(positions.values()) - lateness, f"row {e.id} (ts {e.ts}) sent to the late topic early"
        for e in rows:
            if e.id not in dead and e.id not in late:
                positions[e.partition] = max(positions.get(e.partition, e.ts), e.ts)
        last_created = max([e.created for e in rows] + ([last_created] if last_created is not None else []))


# -- expected results ----------------------------------------------------------------------------
Aggregate = Callable[[list[SourceEvent]], dict[str, float]]


def count_and_total(events: list[SourceEvent]) -> dict[str, float]:
    return {"n": len(events), "total": sum(e.value for e in events)}


def peak_and_low(events: list[SourceEvent]) -> dict[str, float]:
    return {"peak": max(e.value for e in events), "low": min(e.value for e in events)}


def mean_and_n(events: list[SourceEvent]) -> dict[str, float]:
    return {"mean": sum(e.value for e in events) / len(events), "n": len(events)}


def distinct_keys_and_n(events: list[SourceEvent]) -> dict[str, float]:
    """examples/distinct_keys_per_window.sql: how many different keys sent events, and how many events."""
    return {"distinct_keys": len({e.key for e in events}), "n": len(events)}


def exact_percentile(values: list[float], fraction: float) -> float:
    """The exact percentile as Spark's `percentile` defines it: at position fraction * (n - 1) of the
    sorted values, linearly interpolated between the two values around it."""
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    lower, upper = math.floor(position), math.ceil(position)
    if lower == upper or ordered[lower] == ordered[upper]:
        return ordered[lower]
    return (upper - position) * ordered[lower] + (position - lower) * ordered[upper]


def p90_and_n(events: list[SourceEvent]) -> dict[str, float]:
    """examples/p90_per_key.sql: the exact 90th percentile of the values, and how many there were."""
    return {"p90": exact_percentile([e.value for e in events], 0.9), "n": len(events)}


def exact_total(events: list[SourceEvent]) -> dict[str, float]:
    """The sum of the values, rounded once (what examples/top3_keys_per_window.sql ranks by)."""
    return {"total": math.fsum(e.value for e in events)}


def by_key(event: SourceEvent) -> Any:
    return event.key


def whole_window(event: SourceEvent) -> Any:
    """The group of a query that groups by its window alone: one result per window."""
    return ""


@dataclass(frozen=True)
class TopN:
    """A ranking within each window: of a window's groups only the `n` with the largest `by` value
    answer (on equal values the smaller group first), numbered from 1 in `rank_column`."""

    n: int
    by: str
    rank_column: str = "rank"


@dataclass(frozen=True)
class Version:
    query_id: str
    window_ms: int
    aggregate: Aggregate
    group: Callable[[SourceEvent], Any] = by_key  # the group an event counts in
    group_column: str = "key"  # the result column holding it; "" when the query groups by its window alone
    keep: Callable[[SourceEvent], bool] = lambda event: True  # the query's own filter
    slide_ms: int | None = None  # how often a window starts; None: tumbling (every window_ms)
    top: TopN | None = None  # the query keeps only the first groups of each window (see TopN)

    @property
    def slide(self) -> int:
        return self.slide_ms or self.window_ms

    def group_of(self, row: Mapping[str, Any]) -> str:
        """The group a result row answers for, as `group` names it."""
        return str(row[self.group_column]) if self.group_column else ""


# A result's identity: (window_start, window_end, group).
Identity = tuple[int, int, str]
Window = tuple[int, int]  # (window_start, window_end)


def owner_of(versions: list[Version], cuts: list[int], window_end: int) -> int:
    """The index of the version answering windows ending at `window_end`: (cut i-1, cut i]."""
    return bisect.bisect_left(cuts, window_end)


def expected_groups(
    events: list[SourceEvent], versions: list[Version], cuts: list[int], closed_until: int
) -> dict[Window, tuple[int, dict[str, dict[str, float]]]]:
    """(window_start, window_end) -> (index of the owning version, group -> values) for every closed
    window with events, every group of it (a top-N version answers only the first ones: `assert_ranking`).

    Version i owns the windows ending in (cuts[i-1], cuts[i]]; each is valued from every event in
    it, whichever version received it. Windows close when their end is at or before `closed_until`.
    """
    assert len(cuts) == len(versions) - 1, (cuts, [v.query_id for v in versions])
    grouped: dict[tuple[int, int, str], list[SourceEvent]] = defaultdict(list)
    for e in events:
        for i, version in enumerate(versions):
            if not version.keep(e):
                continue
            for end in window_ends(e.ts, version.window_ms, version.slide):
                if end <= closed_until and owner_of(versions, cuts, end) == i:
                    grouped[(i, end, str(version.group(e)))].append(e)
    out: dict[Window, tuple[int, dict[str, dict[str, float]]]] = {}
    for (i, end, group_value), group in grouped.items():
        window = (end - versions[i].window_ms, end)
        out.setdefault(window, (i, {}))[1][group_value] = versions[i].aggregate(group)
    return out


def close_enough(value: float, expected: float) -> bool:
    return math.isclose(value, expected, rel_tol=1e-9, abs_tol=1e-6)


def assert_ranking(
    window: Window, answered: Mapping[str, Mapping[str, Any]], groups: Mapping[str, Mapping[str, float]], top: TopN
) -> None:
    """One closed window of a top-N query: `answered` (group -> result row) against every group's
    recomputed values.

    The query ranks by the values it computed, and a sum of floats may differ from the exact one in
    its last bits, enough to order two groups whose exact values are equal either way. So the order
    is checked on the values the query emitted (larger first, on equal values the smaller group), and
    those values against the recomputation; a group left out must not be worth more than the last
    one answered (give or take those bits)."""
    assert len(answered) == min(top.n, len(groups)), (
        f"window {window}: {len(answered)} groups ranked, expected {min(top.n, len(groups))} "
        f"({sorted(answered)}, of {len(groups)} groups)"
    )
    for group, row in answered.items():
        assert group in groups, f"window {window}: group {group!r} ranked, but it has no events there"
        for name, value in groups[group].items():
            assert close_enough(float(row[name]), value), (
                f"window {window} {group!r}: {name}={row[name]}, recomputed {value}"
            )
    order = sorted(answered, key=lambda group: int(answered[group][top.rank_column]))
    assert [int(answered[g][top.rank_column]) for g in order] == list(range(1, len(order) + 1)), (
        f"window {window}: ranks {[answered[g][top.rank_column] for g in order]}"
    )
    for better, worse in itertools.pairwise(order):
        high, low = float(answered[better][top.by]), float(answered[worse][top.by])
        assert high > low or (high == low and better < worse), (
            f"window {window}: {better!r} ({top.by} {high}) ranked before {worse!r} ({top.by} {low})"
        )
    if order:
        last = order[-1]
        lowest = float(answered[last][top.by])
        for group, values in groups.items():
            if group not in answered:
                value = values[top.by]
                assert value < lowest or close_enough(value, lowest), (
                    f"window {window}: {group!r} ({top.by} {value}) left out, but {last!r} ({lowest}) was ranked"
                )


def same_result(a: Result, b: Result) -> bool:
    """The same record under the same key; a float may differ in its last bits, because a replayed
    batch can add the same values in another order."""
    if a.key != b.key or a.row.keys() != b.row.keys():
        return False
    for column, value in a.row.items():
        other = b.row[column]
        if isinstance(value, float) and isinstance(other, float):
            if not math.isclose(value, other, rel_tol=1e-9):
                return False
        elif value != other:
            return False
    return True


def assert_invariants(
    results: list[Result],
    events: list[SourceEvent],
    versions: list[Version],
    cuts: list[int],
    closed_until: int,
    *,
    allow_redelivery: bool = False,
) -> None:
    """Exactly once per (window, group), owned by the right version, no gap, correct values, one key
    per result. A top-N version (Version.top) answers exactly its first groups of each window, in
    order (see `assert_ranking`).

    With `allow_redelivery` (after a crash) a result may appear twice in the topic, but only as
    the identical record with the same key (a replayed batch overwriting itself).
    """
    seen: dict[Identity, Result] = {}
    keys: dict[str, Identity] = {}
    for r in results:
        # Ownership for every result, closed or not: windows ending at or before W are the old
        # version's, the others the new one's, and each has that version's size and grid.
        owner = versions[owner_of(versions, cuts, r.window_end)]
        assert r.query_id == owner.query_id, (
            f"window [{r.window_start}, {r.window_end}) answered by {r.query_id}, owner is {owner.query_id}"
        )
        assert r.window_end - r.window_start == owner.window_ms, f"{r.query_id} answered a window of another size: {r}"
        assert r.window_end % owner.slide == 0, f"{r.query_id} answered a window off its grid: {r}"
        identity = (r.window_start, r.window_end, owner.group_of(r.row))
        # One key per result: a reader that upserts by key keeps every (window, group) apart.
        assert keys.setdefault(r.key, identity) == identity, f"key {r.key} holds {keys[r.key]} and {identity}"
        if identity in seen and allow_redelivery and same_result(seen[identity], r):
            continue
        assert identity not in seen, f"duplicate result for window {identity}: {seen[identity].row} and {r.row}"
        seen[identity] = r
    answered: dict[Window, dict[str, Mapping[str, Any]]] = defaultdict(dict)
    for (start, end, group_value), r in seen.items():
        answered[(start, end)][group_value] = r.row
    expected = expected_groups(events, versions, cuts, closed_until)
    missing = [
        (*window, group_value)
        for window, (i, groups) in sorted(expected.items())
        if versions[i].top is None
        for group_value in sorted(set(groups) - set(answered.get(window, {})))
    ]
    assert not missing, f"{len(missing)} closed (window, group) results missing, first {missing[:5]}"
    # A window that closed after `closed_until` may already be out; it is owned right (above).
    for window, (i, groups) in sorted(expected.items()):
        got = answered.get(window, {})
        top = versions[i].top
        if top is not None:
            assert_ranking(window, got, groups, top)
            continue
        for group_value in set(groups) & set(got):
            for name, value in groups[group_value].items():
                assert close_enough(float(got[group_value][name]), value), (
                    f"window {(*window, group_value)} {name}={got[group_value][name]}, recomputed {value}"
                )
