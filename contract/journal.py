"""The swap journal: a swap's phases as a state machine, persisted in Redis.

`advance` is the one function that changes a swap's phase. It refuses illegal transitions and
writes the new phase (with its time) before the caller performs the action the phase records.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

import redis
from redis.client import Pipeline

from hotswap.contract.errors import HotswapError
from hotswap.contract.fence import Fence, fenced
from hotswap.contract.models import QuerySource, Record, now_ms
from hotswap.contract.names import Keys
from hotswap.contract.reasons import ReasonCode


class SwapPhase(StrEnum):
    """A swap's phases. Every question about a phase (is it terminal, is it past the cut, where can
    it go next) is answered here and nowhere else; docs/architecture.md draws the machine."""

    SUBMITTED = "submitted"
    VALIDATED = "validated"
    DEPLOYED = "deployed"
    CUT = "cut"
    DRAINING = "draining"
    DRAINED = "drained"
    RETIRED = "retired"
    COMPLETED = "completed"
    FAILED = "failed"
    REJECTED = "rejected"
    ABORTED = "aborted"
    ROLLED_BACK = "rolled_back"  # completed, then undone by a later swap back to its previous query

    @property
    def is_terminal(self) -> bool:
        """Nothing more happens to the swap itself (a rollback may still relabel it `rolled_back`)."""
        return self in _TERMINAL

    @property
    def is_before_cut(self) -> bool:
        """Not terminal and not cut yet: the old query still owns every window, so abort is safe."""
        return self in _BEFORE_CUT

    @property
    def is_past_cut(self) -> bool:
        """From the cut on, the swap can only go forward: a recorded cut is never re-decided."""
        return self in _PAST_CUT

    @property
    def is_draining(self) -> bool:
        """Past the cut, with the old graph still emitting its windows up to W."""
        return self in _DRAINING

    @property
    def is_in_flight(self) -> bool:
        """Validated and not terminal: the swap holds its place as the one in progress."""
        return not self.is_terminal and self is not SwapPhase.SUBMITTED

    @property
    def is_done(self) -> bool:
        """The swap completed (and may have been rolled back since): its new query served."""
        return self in (SwapPhase.COMPLETED, SwapPhase.ROLLED_BACK)

    @property
    def next_phases(self) -> frozenset[SwapPhase]:
        return _NEXT.get(self, frozenset())

    def can_become(self, target: SwapPhase) -> bool:
        return target in self.next_phases


_TERMINAL = frozenset(
    {SwapPhase.COMPLETED, SwapPhase.FAILED, SwapPhase.REJECTED, SwapPhase.ABORTED, SwapPhase.ROLLED_BACK}
)
_BEFORE_CUT = frozenset({SwapPhase.SUBMITTED, SwapPhase.VALIDATED, SwapPhase.DEPLOYED})
_DRAINING = frozenset({SwapPhase.CUT, SwapPhase.DRAINING, SwapPhase.DRAINED})
_PAST_CUT = _DRAINING | {SwapPhase.RETIRED}

# The one table of legal moves. Before the cut a swap can still fail or be aborted; after it, it
# can only go forward or fail (routing keeps W either way).
_NEXT: dict[SwapPhase, frozenset[SwapPhase]] = {
    SwapPhase.SUBMITTED: frozenset({SwapPhase.VALIDATED, SwapPhase.REJECTED, SwapPhase.ABORTED}),
    SwapPhase.VALIDATED: frozenset({SwapPhase.DEPLOYED, SwapPhase.FAILED, SwapPhase.ABORTED}),
    SwapPhase.DEPLOYED: frozenset({SwapPhase.CUT, SwapPhase.FAILED, SwapPhase.ABORTED}),
    SwapPhase.CUT: frozenset({SwapPhase.DRAINING, SwapPhase.FAILED}),
    SwapPhase.DRAINING: frozenset({SwapPhase.DRAINED, SwapPhase.FAILED}),
    SwapPhase.DRAINED: frozenset({SwapPhase.RETIRED, SwapPhase.FAILED}),
    SwapPhase.RETIRED: frozenset({SwapPhase.COMPLETED}),
    # Recorded when the swap that rolls this one back completes; routing is unchanged by it.
    SwapPhase.COMPLETED: frozenset({SwapPhase.ROLLED_BACK}),
    SwapPhase.FAILED: frozenset({SwapPhase.ROLLED_BACK}),  # a failure after the cut, rolled back on its buffer
}


class IllegalTransition(HotswapError):
    """A swap was asked to move to a phase it cannot reach from where it is."""


class UnknownSwap(HotswapError):
    """No swap with that id exists in this namespace."""


def check_transition(current: SwapPhase, target: SwapPhase) -> None:
    if not current.can_become(target):
        raise IllegalTransition(f"swap cannot go from {current} to {target}")


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
    new_window_ms: int | None = None
    old_window_ms: int | None = None
    markers_written: bool = False
    error: str | None = None
    # Beside `error`, for every failure, rejection and abort: a word a program can match (contract.reasons).
    reason_code: ReasonCode | None = None
    rollback_of: str | None = None  # the swap this one undoes (a swap back to its previous query)
    # A swap whose new query failed for good after its cut: this one's query takes over that
    # query's buffer (its topic) for every window it did not emit. Its cut is decided by the
    # executor, where the failed query stopped, not by the service graph.
    recovers: str | None = None

    @property
    def failed_after_cut(self) -> bool:
        """Failed with its cut recorded: routing keeps that cut, and its new query's rows wait in its topic."""
        return self.state is SwapPhase.FAILED and self.cut_window_end is not None

    @property
    def ended_before_cut(self) -> bool:
        """Rejected, aborted, or failed before a cut was recorded: the old query never gave up a window."""
        return self.state in (SwapPhase.REJECTED, SwapPhase.ABORTED) or (
            self.state is SwapPhase.FAILED and self.cut_window_end is None
        )

    def advanced(self, target: SwapPhase, *, error: str | None = None, **changes: object) -> SwapRecord:
        """This record moved to `target`; raises IllegalTransition if that move is not allowed."""
        check_transition(self.state, target)
        entry = PhaseEntry(name=target, at=now_ms())
        update: dict[str, object] = {"state": target, "phases": (*self.phases, entry), **changes}
        if error is not None:
            update["error"] = error
        return self.changed(**update)


class Journal:
    """Reads and writes swap records of one namespace."""

    def __init__(self, client: redis.Redis, keys: Keys, fence: Fence | None = None) -> None:
        self._redis = client
        self._keys = keys
        self._fence = fence  # set for an executor: its writes need the lease (contract.fence)

    def create(self, record: SwapRecord) -> SwapRecord:
        first = record.changed(phases=(PhaseEntry(name=SwapPhase.SUBMITTED, at=now_ms()),))
        pipe = self._redis.pipeline(transaction=True)
        pipe.set(self._keys.swap(record.id), first.model_dump_json())
        pipe.rpush(self._keys.swaps, record.id)
        pipe.execute()
        return first

    def get(self, swap_id: str) -> SwapRecord:
        raw = self._redis.get(self._keys.swap(swap_id))
        if raw is None:
            raise UnknownSwap(f"no swap {swap_id!r} in namespace {self._keys.namespace!r}; see `hotswap status`")
        return SwapRecord.model_validate_json(raw)

    def find(self, swap_id: str) -> SwapRecord | None:
        raw = self._redis.get(self._keys.swap(swap_id))
        return None if raw is None else SwapRecord.model_validate_json(raw)

    def all(self) -> list[SwapRecord]:
        """Every swap in submission order, in two round trips (the service graph reads this per batch)."""
        ids = [i.decode() if isinstance(i, bytes) else str(i) for i in self._redis.lrange(self._keys.swaps, 0, -1)]
        if not ids:
            return []
        raws = self._redis.mget([self._keys.swap(i) for i in ids])
        return [SwapRecord.model_validate_json(raw) for raw in raws if raw is not None]

    def advance(
        self,
        swap_id: str,
        target: SwapPhase,
        *,
        error: str | None = None,
        when: Callable[[SwapRecord], bool] | None = None,
        **changes: object,
    ) -> SwapRecord | None:
        """Move a swap to `target` atomically; raises IllegalTransition if the move is not legal.

        `when` may refuse the move after reading the latest record; then nothing is written and
        None is returned. Concurrent writers (the service graph cutting, the executor aborting)
        cannot both win: the loser re-reads and re-checks.
        """

        def change(record: SwapRecord) -> SwapRecord | None:
            if when is not None and not when(record):
                return None
            return record.advanced(target, error=error, **changes)

        return self._compare_and_set(swap_id, change)

    def record_cut(self, swap_id: str, boundary: int, batch_id: int) -> SwapRecord | None:
        """The service graph's cut: W and the batch it first applies to, only while the swap is still
        `deployed` (an abort that got there first wins; then None)."""
        return self.advance(
            swap_id,
            SwapPhase.CUT,
            when=lambda record: record.state is SwapPhase.DEPLOYED,
            cut_window_end=boundary,
            cut_batch=batch_id,
        )

    def record_draining(self, swap_id: str) -> SwapRecord | None:
        """The service watermark passed W; None if another writer recorded it first."""
        return self.advance(swap_id, SwapPhase.DRAINING, when=lambda record: record.state is SwapPhase.CUT)

    def update(self, swap_id: str, **changes: object) -> SwapRecord | None:
        """Change fields other than the phase (for example `markers_written`)."""
        return self._compare_and_set(swap_id, lambda record: record.changed(**changes))

    def _compare_and_set(self, swap_id: str, change: Callable[[SwapRecord], SwapRecord | None]) -> SwapRecord | None:
        key = self._keys.swap(swap_id)

        def write(pipe: Pipeline) -> SwapRecord | None:
            raw = pipe.get(key)
            if raw is None:
                raise UnknownSwap(f"no swap {swap_id!r} in namespace {self._keys.namespace!r}")
            updated = change(SwapRecord.model_validate_json(raw))
            if updated is not None:
                pipe.multi()
                pipe.set(key, updated.model_dump_json())
            return updated

        return fenced(self._redis, self._fence, write, watch=(key,))
