"""Which query version owns which windows: one rule, read by `status` (to say it) and by each
graph's result writer (to emit only its own windows).

A version owns windows by their end: after the cut of the swap that made it serve, through the cut
of the swap that took over from it (unbounded before any cut, and while it serves). Windows by end
are the natural unit because every query's window ends lie on its grid and W is on both grids of
its swap, whatever the two window kinds (docs/architecture.md, "The ownership filter").

Why a writer may read these ranges at any batch and still never emit a window twice: every range
is fixed by the time a graph can close a window it decides.
- Its lower bound, the cut W that made it serve, is recorded before any row goes to it (a
  recovery's, `start_after`, before its graph starts).
- Its upper bound, the next cut W2, is chosen at or after its watermark, or where its windows
  ending after W2 hold no row yet (contract.windows.cut_boundary); and from W2 on its markers stop
  at W2. So a window ending after W2 is never closed with rows, before or after W2 is known.
A replayed batch (same rows, same watermark) therefore emits the same windows, whichever of the
two ranges it reads.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import redis

from hotswap.contract.journal import Journal, SwapPhase, SwapRecord
from hotswap.contract.models import GraphRecord, GraphState, Record
from hotswap.contract.names import Keys
from hotswap.contract.records import read_current


class WindowOwner(Record):
    """One query version and the windows it answers: those ending after `after` and at or before
    `through` (None: unbounded)."""

    query_id: str
    after: int | None
    through: int | None
    swap_id: str | None = None  # the swap whose cut gave it these windows; None before any cut

    def owns(self, window_end: int) -> bool:
        return (self.after is None or window_end > self.after) and (self.through is None or window_end <= self.through)


def window_owners(swaps: Iterable[SwapRecord], current: str | None) -> list[WindowOwner]:
    """Which version answers which windows, oldest first. Each recorded cut moves ownership, whether
    its swap completed, was rolled back later (its windows stay its own), is stranded (its rows wait
    in its topic) or is still draining.

    Cuts are taken in the order of their W (each swap's cut is at or after the one before it), which
    is not always the journal's: a fix or a rollback of a failed query goes ahead of swaps queued
    before it. Equal Ws keep the order in which they were recorded."""
    owners: list[WindowOwner] = []
    cuts = sorted(
        (
            (swap.cut_window_end, _cut_recorded_at(swap), swap.from_query, swap)
            for swap in swaps
            if swap.cut_window_end is not None
            and swap.from_query is not None
            and (swap.state.is_past_cut or swap.state.is_done)
        ),
        key=lambda cut: cut[:2],
    )
    for cut, _, from_query, swap in cuts:
        if not owners:
            owners.append(WindowOwner(query_id=from_query, after=None, through=None))
        owners[-1] = owners[-1].changed(through=cut)
        owners.append(WindowOwner(query_id=swap.to_query, after=cut, through=None, swap_id=swap.id))
    if not owners and current is not None:
        owners.append(WindowOwner(query_id=current, after=None, through=None))
    return owners


def _cut_recorded_at(swap: SwapRecord) -> int:
    return next((entry.at for entry in swap.phases if entry.name is SwapPhase.CUT), 0)


@dataclass(frozen=True)
class OwnedWindows:
    """The windows one graph may emit, by window end: the union of its (after, through] ranges
    (None: unbounded). No range: it owns nothing (yet)."""

    ranges: tuple[tuple[int | None, int | None], ...]

    def holds(self, window_end: int) -> bool:
        return any(
            (after is None or window_end > after) and (through is None or window_end <= through)
            for after, through in self.ranges
        )

    def overlaps(self, after: int | None, through: int) -> bool:
        """Whether any owned range meets the windows ending in (after, through]."""
        return any(
            (owned_after is None or owned_after < through)
            and (owned_through is None or after is None or owned_through > after)
            for owned_after, owned_through in self.ranges
        )


def owned_windows(owners: Iterable[WindowOwner], graph: GraphRecord) -> OwnedWindows:
    """The ranges `graph` owns. A graph that took over a failed graph's topic owns windows ending
    after its `start_after` from the moment it starts, before its swap records that point as its cut.
    A discarded graph never served, and owns nothing."""
    if graph.state is GraphState.DISCARDED:
        return OwnedWindows(())
    ranges = tuple((o.after, o.through) for o in owners if o.query_id == graph.query_id)
    if not ranges and graph.start_after is not None:
        ranges = ((graph.start_after, None),)
    return OwnedWindows(ranges)


def read_owned_windows(client: redis.Redis, keys: Keys, graph: GraphRecord) -> OwnedWindows:
    """`owned_windows` from the journal and the current query in Redis, as they are now."""
    current = read_current(client, keys)
    owners = window_owners(Journal(client, keys).all(), current.query_id if current else None)
    return owned_windows(owners, graph)


class OwnershipReader:
    """A graph's owned windows for its result writer, once per batch, at a cost that does not grow
    with the namespace's history: one round trip reads the journal's version and the current query,
    and the whole journal is read again only when one of them moved (a swap written, a query made
    current). Ownership depends on nothing else, so the cached answer is the one a full read gives."""

    def __init__(self, client: redis.Redis, keys: Keys, graph: GraphRecord) -> None:
        self._redis = client
        self._keys = keys
        self._graph = graph
        self._seen: tuple[object, object] | None = None
        self._owned = OwnedWindows(())

    def __call__(self) -> OwnedWindows:
        version, current = self._redis.mget([self._keys.journal_version, self._keys.current])
        if self._seen != (version, current):
            # Read before deciding, so a write landing in between makes the next batch read again.
            self._owned = read_owned_windows(self._redis, self._keys, self._graph)
            self._seen = (version, current)
        return self._owned
