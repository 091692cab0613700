"""The swap journal: each swap's record in Redis, moved from phase to phase by the table in
contract/phases.py.

`Journal.advance` is the one function that changes a swap's phase. It refuses illegal transitions,
and writes the new phase (with its time) before the caller performs the action the phase records,
together with whatever else must change at the same instant (a graph record, the current query,
the swap a rollback undoes) in one fenced write (contract/fence.py).

Reads that the executor and the service graph make on every tick or batch do not grow with the
namespace's history: `open()` reads the swaps that are not over (an index kept in the same write as
each transition), in one round trip. `all()` reads every swap, for history and status; a reader
that derives something from all of them (a graph's owned windows) keeps it until `version()`, a
counter every journal write increments, moves.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import redis

from hotswap.contract.errors import HotswapError
from hotswap.contract.fence import Batch, Fence, write
from hotswap.contract.models import CurrentQuery, GraphRecord, QuerySource, Record, now_ms
from hotswap.contract.names import Keys
from hotswap.contract.phases import Driver, IllegalTransition, SwapPhase, Wait, check_transition, driven_by, wait_of
from hotswap.contract.reasons import ReasonCode

__all__ = [
    "IllegalTransition",
    "Journal",
    "PhaseEntry",
    "SwapPhase",
    "SwapRecord",
    "UnknownSwap",
    "active_swap",
    "check_transition",
]

# Reads the records a list of swap ids names, in one round trip. The keys are derived from the
# list's own key (they share the namespace's hash tag, so a Redis Cluster keeps them in one slot).
_READ_LISTED = """
local ids = redis.call('lrange', ARGV[1], 0, -1)
local out = {}
for i, id in ipairs(ids) do
  local raw = redis.call('get', ARGV[2] .. id)
  if raw then
    out[#out + 1] = raw
  end
end
return out
"""


class UnknownSwap(HotswapError):
    """No swap with that id exists in this namespace."""


class SwapExists(HotswapError):
    """A swap with that id exists already."""


class PhaseEntry(Record):
    name: SwapPhase
    at: int


class SwapRecord(Record):
    id: str
    to_query: str
    source: QuerySource | None = None
    from_query: str | None = None
    state: SwapPhase = SwapPhase.SUBMITTED
    phases: tuple[PhaseEntry, ...] = ()
    cut_window_end: int | None = None
    cut_batch: int | None = None
    # The earliest event time routed to the new graph from the cut on, when it is before what the new
    # windows need: a swap that rolls back on its own keeps what the old version's windows after W
    # need, so that its rollback can take over from W (contract.windows.buffer_start).
    buffer_from: int | None = None
    new_window_ms: int | None = None
    old_window_ms: int | None = None
    # How often a window starts, recorded with each size (None while that size is).
    new_slide_ms: int | None = None
    old_slide_ms: int | None = None
    markers_written: bool = False
    error: str | None = None
    # Beside `error`, for every failure, rejection and abort: a word a program can match (contract.reasons).
    reason_code: ReasonCode | None = None
    rollback_of: str | None = None  # the swap this one undoes (a swap back to its previous query)
    # A stranded swap (its new query failed for good after its cut): this one's query takes over that
    # query's buffer (its topic) for every window it did not emit. Its cut is decided by the executor,
    # where the failed query stopped, not by the service graph.
    recovers: str | None = None
    # The serving query, failed for good, when no swap made it current (the namespace's first
    # query): this one's query takes over its buffer for every window it did not emit, as `recovers`
    # does for a swap's (`hotswap replace`).
    replaces: str | None = None
    # A shadow (`submit --shadow`): from S (`shadow_since`, a boundary of its windows) on it receives
    # every row beside the current query, and writes its results to its own topic until promoted.
    shadow: bool = False
    shadow_since: int | None = None
    shadow_batch: int | None = None  # the service-graph batch S first applied to (as cut_batch for W)
    promote: bool = False  # `hotswap promote`: the service graph cuts to the shadow at its next batch or tick
    promoted_at: int | None = None  # when `hotswap promote` was asked (epoch ms)
    # Roll back on its own if its new query fails for good after the cut (`submit --auto-rollback`).
    auto_rollback: bool = False
    # Why the executor queued this swap itself (an automatic rollback), in one line; None if an operator did.
    cause: str | None = None

    @property
    def is_recovery(self) -> bool:
        return self.recovers is not None or self.replaces is not None

    @property
    def wait(self) -> Wait | None:
        """What the swap waits for now (the phase table's row for its phase and kind); None once ended."""
        return wait_of(self)

    def advanced(
        self, target: SwapPhase, *, error: str | None = None, reason_code: ReasonCode | None = None, **changes: object
    ) -> SwapRecord:
        """This record moved to `target`; raises IllegalTransition if that move is not allowed."""
        check_transition(self.state, target)
        entry = PhaseEntry(name=target, at=now_ms())
        update: dict[str, object] = {"state": target, "phases": (*self.phases, entry), **changes}
        if error is not None:
            update["error"] = error
        if reason_code is not None:
            update["reason_code"] = reason_code
        return self.changed(**update)


class Queued(Protocol):
    """What `active_swap` reads of a swap: a journal record, or its line in the status document."""

    @property
    def state(self) -> SwapPhase: ...

    @property
    def is_recovery(self) -> bool: ...


S = TypeVar("S", bound=Queued)


def active_swap(swaps: Iterable[S]) -> S | None:
    """The one swap the executor drives now, or None: the only decision of which swap is active.

    Swaps run one at a time, in submission order: the swap past validation if there is one, else
    the first validated (queued) swap. A recovery of a stranded swap goes before the swaps queued
    ahead of it, as they cannot start until the query it takes over serves again.
    """
    queued: list[S] = []
    for swap in swaps:
        if not swap.state.is_in_flight:
            continue
        if swap.state is not SwapPhase.VALIDATED:
            return swap
        queued.append(swap)
    return next((s for s in queued if s.is_recovery), queued[0] if queued else None)


@dataclass(frozen=True)
class Also:
    """What else changes in the same write as a transition."""

    graphs: Sequence[GraphRecord] = ()
    current: CurrentQuery | None = None
    # Another swap moved at the same instant: (its id, the phase), e.g. the swap a rollback undid.
    relabel: tuple[str, SwapPhase] | None = None
    # More commands of the same write (for example the service graph's routing plan and state with a cut).
    queue: Callable[[Batch], object] | None = None
    # A swap created in the same write (an automatic rollback, queued as its swap is stranded).
    creates: SwapRecord | None = None


class Journal:
    """Reads and writes swap records of one namespace."""

    def __init__(self, client: redis.Redis, keys: Keys, fence: Fence | None = None) -> None:
        self._redis = client
        self._keys = keys
        self._fence = fence  # set for an executor: its writes need the lease (contract.fence)

    # -- reads -----------------------------------------------------------------------------
    def get(self, swap_id: str) -> SwapRecord:
        raw = self._redis.get(self._keys.swap(swap_id))
        if raw is None:
            raise UnknownSwap(f"no swap {swap_id!r} in namespace {self._keys.namespace!r}; see `hotswap status`")
        return SwapRecord.model_validate_json(raw)

    def find(self, swap_id: str) -> SwapRecord | None:
        raw = self._redis.get(self._keys.swap(swap_id))
        return None if raw is None else SwapRecord.model_validate_json(raw)

    def all(self) -> list[SwapRecord]:
        """Every swap in submission order, in one round trip (for history and status)."""
        return self._listed(self._keys.swaps)

    def open(self) -> list[SwapRecord]:
        """The swaps that are not over (stranded ones included: they still shape routing), in
        submission order, in one round trip: what the executor's tick and the service graph read."""
        return self._listed(self._keys.open_swaps)

    def version(self) -> int:
        """How many writes the journal has had (0 before the first): unchanged means nothing in it changed."""
        return int(self._redis.get(self._keys.journal_version) or 0)

    def _listed(self, list_key: str) -> list[SwapRecord]:
        # No declared keys: Redis's ACL takes a script's declared keys as written to, and a submitter's
        # user may only read the journal. Every key it reads shares the namespace's hash slot.
        raws = self._redis.register_script(_READ_LISTED)(keys=[], args=[list_key, self._keys.swap("")])
        return [SwapRecord.model_validate_json(raw) for raw in raws]

    # -- writes ----------------------------------------------------------------------------
    def create(self, record: SwapRecord) -> SwapRecord:
        batch = Batch()
        first = self._creating(batch, record)
        if not write(self._redis, self._fence, batch):
            raise SwapExists(f"swap {record.id} already exists in namespace {self._keys.namespace!r}")
        return first

    def _creating(self, batch: Batch, record: SwapRecord) -> SwapRecord:
        """Adds a new swap, `submitted`, to a write (which fails if the id is taken)."""
        first = record.changed(phases=(PhaseEntry(name=SwapPhase.SUBMITTED, at=now_ms()),))
        (
            batch.expect(self._keys.swap(record.id), None)
            .set(self._keys.swap(record.id), first.model_dump_json())
            .rpush(self._keys.swaps, record.id)
            .rpush(self._keys.open_swaps, record.id)
            .incr(self._keys.journal_version)
        )
        return first

    def advance(
        self,
        swap: str | SwapRecord,
        target: SwapPhase,
        *,
        error: str | None = None,
        reason_code: ReasonCode | None = None,
        when: Callable[[SwapRecord], bool] | None = None,
        also: Also | None = None,
        **changes: object,
    ) -> SwapRecord | None:
        """Move a swap to `target`, with `also` in the same write; raises IllegalTransition if the
        move is not legal. Pass the record just read to save a round trip.

        `when` may refuse the move after reading the latest record; then nothing is written and None
        is returned. Concurrent writers (the service graph cutting, an operator aborting) cannot both
        win: the loser reads again and checks again.
        """

        def change(record: SwapRecord) -> SwapRecord | None:
            if when is not None and not when(record):
                return None
            return record.advanced(target, error=error, reason_code=reason_code, **changes)

        return self._compare_and_set(swap, change, also or Also())

    def record_cut(self, swap_id: str | SwapRecord, boundary: int, batch_id: int, **changes: Any) -> SwapRecord | None:
        """The service graph's cut: W and the batch it first applies to, only while the swap waits for
        a cut the service graph's batch takes (the phase table says which); an abort that got there
        first wins, and then None. `also=Also(queue=...)` adds the batch's other writes (its routing
        plan, say) to the same fenced write."""
        return self.advance(
            swap_id,
            SwapPhase.CUT,
            when=lambda record: driven_by(record, Driver.SERVICE_BATCH) in (Wait.CUT, Wait.PROMOTED_CUT),
            cut_window_end=boundary,
            cut_batch=batch_id,
            **changes,
        )

    def record_shadow_start(self, swap_id: str | SwapRecord, since: int, batch_id: int) -> SwapRecord | None:
        """The service graph's start of a shadow: S, recorded before the batch it applies to, only
        while the swap waits for it (an abort that got there first wins; then None)."""
        return self.advance(
            swap_id,
            SwapPhase.SHADOWING,
            when=lambda record: driven_by(record, Driver.SERVICE_BATCH) is Wait.SHADOW_START,
            shadow_since=since,
            shadow_batch=batch_id,
        )

    def request_promotion(self, swap_id: str) -> SwapRecord | None:
        """`hotswap promote`: mark a shadow in `shadowing` for its cut; None if it is not one (any more)."""

        def change(record: SwapRecord) -> SwapRecord | None:
            if not (record.shadow and record.state is SwapPhase.SHADOWING):
                return None
            return record.changed(promote=True, promoted_at=now_ms())

        return self._compare_and_set(swap_id, change, Also())

    def record_draining(self, swap_id: str | SwapRecord, **changes: Any) -> SwapRecord | None:
        """The service watermark passed W, while the swap waits for it; None if another writer
        recorded it first."""
        return self.advance(
            swap_id,
            SwapPhase.DRAINING,
            when=lambda record: driven_by(record, Driver.SERVICE_BATCH) is Wait.WATERMARK,
            **changes,
        )

    def update(self, swap_id: str | SwapRecord, **changes: object) -> SwapRecord | None:
        """Change fields other than the phase (for example `markers_written`)."""
        return self._compare_and_set(swap_id, lambda record: record.changed(**changes), Also())

    def _compare_and_set(
        self, swap: str | SwapRecord, change: Callable[[SwapRecord], SwapRecord | None], also: Also
    ) -> SwapRecord | None:
        """Apply `change` to the swap as stored, in one fenced write that fails if the record (or the
        relabelled one) changed since it was read; then read again and decide again."""
        known = swap if isinstance(swap, SwapRecord) else None
        swap_id = swap.id if isinstance(swap, SwapRecord) else swap
        # The record the caller read is the first guess at what is stored (one round trip when it is right).
        raw = known.model_dump_json().encode() if known is not None else self._raw(swap_id)
        relabel_raw = self._raw(also.relabel[0]) if also.relabel else None
        while True:
            record = SwapRecord.model_validate_json(raw)
            updated = change(record)
            if updated is None:
                return None
            batch = (
                Batch().expect(self._keys.swap(swap_id), raw).set(self._keys.swap(swap_id), updated.model_dump_json())
            )
            self._index(batch, updated)
            batch.incr(self._keys.journal_version)
            if also.relabel is not None and relabel_raw is not None:
                other = SwapRecord.model_validate_json(relabel_raw)
                if other.state is not also.relabel[1]:  # already recorded: nothing to relabel
                    moved = other.advanced(also.relabel[1])
                    batch.expect(self._keys.swap(other.id), relabel_raw)
                    batch.set(self._keys.swap(other.id), moved.model_dump_json())
                    self._index(batch, moved)
            for graph in also.graphs:
                batch.hset(self._keys.graphs, graph.query_id, graph.model_dump_json())
            if also.current is not None:
                batch.set(self._keys.current, also.current.model_dump_json())
            if also.queue is not None:
                also.queue(batch)
            if also.creates is not None:
                self._creating(batch, also.creates)
            if write(self._redis, self._fence, batch):
                return updated
            raw = self._raw(swap_id)
            relabel_raw = self._raw(also.relabel[0]) if also.relabel else None

    def forget(self, swaps: Sequence[SwapRecord]) -> bool:
        """Remove ended swaps from the journal (retention), in one write that fails if any of them
        changed since it was read (a completed swap may still be relabelled). True if removed."""
        if not swaps:
            return True
        batch = Batch()
        for swap in swaps:
            assert swap.state.is_terminal, swap.id
            raw = self._raw(swap.id)
            if SwapRecord.model_validate_json(raw) != swap:
                return False  # changed since it was read: the next sweep decides again
            batch.expect(self._keys.swap(swap.id), raw)
            batch.delete(self._keys.swap(swap.id)).lrem(self._keys.swaps, 0, swap.id)
            batch.delete(self._keys.shadow_diff(swap.id))
        batch.incr(self._keys.journal_version)
        return write(self._redis, self._fence, batch)

    def _raw(self, swap_id: str) -> bytes:
        raw = self._redis.get(self._keys.swap(swap_id))
        if raw is None:
            raise UnknownSwap(f"no swap {swap_id!r} in namespace {self._keys.namespace!r}")
        return raw if isinstance(raw, bytes) else str(raw).encode()

    def _index(self, batch: Batch, record: SwapRecord) -> None:
        """A swap that ended leaves the index of open swaps, in the write that ends it."""
        if record.state.is_terminal:
            batch.lrem(self._keys.open_swaps, 0, record.id)

    # -- the index of open swaps -----------------------------------------------------------
