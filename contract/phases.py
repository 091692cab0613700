"""The swap's phases: the one table that defines them.

For each phase, `TABLE` says where a swap may go next (and what each move records), its stage (before
the cut, past it, stranded, ended), whether the old graph still owns rows before W, and what the swap
waits for there, for an ordinary swap, a recovery (a rollback or fix forward that takes over a
stranded swap's input), a shadow, and a shadow an operator promoted. `WAITS` says, for each wait,
who moves the swap on from it (its `Driver`: the executor's loop, the service graph's batch, or an
operator) and what `status` says meanwhile.

Both loops act on a swap through `driven_by`: the executor's step dispatches on the waits it moves
on (executor/control/swap.py, one handler per wait) and only watches the others' time; the service
graph's batch takes a cut, or starts a shadow, exactly when the active swap's wait is its own
(service_graph/query.py); and the journal checks the same again inside the write that records the
move (contract/journal.py). docs/swap-states.md draws both tables (`make schema` writes it; a unit
test fails while it is stale).

A new phase is one more row and the handler of its wait (a new wait is one more row of `WAITS`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from types import MappingProxyType
from typing import Protocol

from hotswap.contract.errors import HotswapError


class SwapPhase(StrEnum):
    SUBMITTED = "submitted"
    VALIDATED = "validated"
    DEPLOYING = "deploying"
    DEPLOYED = "deployed"
    SHADOWING = "shadowing"
    CUT = "cut"
    DRAINING = "draining"
    DRAINED = "drained"
    RETIRING = "retiring"
    RETIRED = "retired"
    COMPLETED = "completed"
    FAILED = "failed"
    STRANDED = "stranded"
    REJECTED = "rejected"
    ABORTED = "aborted"
    ROLLED_BACK = "rolled_back"
    FIXED_FORWARD = "fixed_forward"

    @property
    def rule(self) -> PhaseRule:
        return TABLE[self]

    @property
    def is_terminal(self) -> bool:
        """Nothing more happens to the swap itself (a completed one may still be relabelled `rolled_back`)."""
        return self.rule.stage in (Stage.ENDED_BEFORE_CUT, Stage.ENDED_PAST_CUT)

    @property
    def is_before_cut(self) -> bool:
        """Not ended and not cut yet: the old query still owns every window, so abort is safe."""
        return self.rule.stage is Stage.BEFORE_CUT

    @property
    def is_past_cut(self) -> bool:
        """W is recorded and the swap has not ended: routing keeps W, and a recorded cut is never re-decided."""
        return self.rule.stage in (Stage.PAST_CUT, Stage.STRANDED)

    @property
    def is_stranded(self) -> bool:
        """Failed for good after its cut: its rows wait in its topic for a rollback or a fix forward."""
        return self.rule.stage is Stage.STRANDED

    @property
    def is_draining(self) -> bool:
        """Past the cut, with the old graph still owning the rows before W (routing sends them there)."""
        return self.rule.drains

    @property
    def is_in_flight(self) -> bool:
        """Validated and driven by the executor: neither ended nor stranded."""
        return not (self.is_terminal or self.is_stranded or self is SwapPhase.SUBMITTED)

    @property
    def is_done(self) -> bool:
        """Ended past its cut (completed, and maybe undone since): its cut moved ownership for good."""
        return self.rule.stage is Stage.ENDED_PAST_CUT

    @property
    def is_settled(self) -> bool:
        """Ended, or stranded: nothing more happens to it without an operator."""
        return self.is_terminal or self.is_stranded

    @property
    def next_phases(self) -> frozenset[SwapPhase]:
        return frozenset(self.rule.next)

    def can_become(self, target: SwapPhase) -> bool:
        return target in self.rule.next

    def waits_for(self, *, recovery: bool, shadow: bool = False, promoted: bool = False) -> Wait | None:
        """What a swap in this phase waits for: a recovery's differs where it has nothing to cut or
        drain, a shadow's where it starts at S instead of cutting, and a promoted shadow's where the
        operator's promotion is asked for and its cut is due."""
        rule = self.rule
        if recovery:
            return rule.recovery_waits or rule.waits
        if shadow and promoted and rule.promoted_waits:
            return rule.promoted_waits
        if shadow:
            return rule.shadow_waits or rule.waits
        return rule.waits


class Stage(StrEnum):
    BEFORE_CUT = "before the cut"  # the old query owns every window; abort is safe
    PAST_CUT = "past the cut"  # W is recorded; the swap only goes forward
    STRANDED = "stranded"  # past the cut, and its new query failed for good
    ENDED_BEFORE_CUT = "ended before the cut"  # the old query never gave up a window
    ENDED_PAST_CUT = "ended past the cut"  # its cut moved ownership for good


class Driver(StrEnum):
    """Who moves a swap on from what it waits for."""

    EXECUTOR = "executor"  # the executor's loop: one handler per wait (executor/control/swap.py)
    SERVICE_BATCH = "service graph batch"  # the service graph, at a micro-batch boundary or a tick
    OPERATOR = "operator"  # a command: `hotswap promote`, `abort`, `rollback`, `submit --fix`


class Wait(StrEnum):
    """What a swap waits for. Each has one row in `WAITS`: who moves the swap on from it and what
    `status` says meanwhile; when its driver is the executor, it has one handler in
    executor/control/swap.py, when it is the service graph's batch, one in service_graph/query.py."""

    VALIDATION = "validation"
    TURN = "turn"
    GRAPH_START = "graph start"
    CUT = "cut"
    SHADOW_START = "shadow start"
    PROMOTION = "promotion"
    PROMOTED_CUT = "promoted cut"
    STOP_POINT = "stop point"
    WATERMARK = "watermark"
    NOTHING_TO_DRAIN = "nothing to drain"
    OLD_GRAPH_OUTPUT = "old graph output"
    RETIRE = "retire"
    OLD_GRAPH_STOP = "old graph stop"
    COMPLETION = "completion"
    TAKEOVER = "takeover"

    @property
    def driver(self) -> Driver:
        return WAITS[self].driver


@dataclass(frozen=True)
class PhaseRule:
    stage: Stage
    # Where a swap may go from here, each with what the move records (the diagram's labels).
    next: Mapping[SwapPhase, str] = field(default_factory=dict)
    waits: Wait | None = None
    recovery_waits: Wait | None = None  # where a recovery waits for something else
    shadow_waits: Wait | None = None  # where a shadow waits for something else
    promoted_waits: Wait | None = None  # where a shadow an operator promoted waits for something else
    drains: bool = False  # the old graph still owns rows before W


P = SwapPhase
_ABORT = "hotswap abort"

# The one table of phases and legal moves. Before the cut a swap can still fail or be aborted; after
# it, it only goes forward, or is stranded (routing keeps W either way) until a recovery takes over.
TABLE: Mapping[SwapPhase, PhaseRule] = MappingProxyType(
    {
        P.SUBMITTED: PhaseRule(
            Stage.BEFORE_CUT,
            {
                P.VALIDATED: "query analyses, windows can be cut; graph recorded",
                P.REJECTED: "refused, with a one-line reason",
                P.ABORTED: _ABORT,
            },
            waits=Wait.VALIDATION,
        ),
        P.VALIDATED: PhaseRule(
            Stage.BEFORE_CUT,
            {
                P.DEPLOYING: "its turn; bound to the query serving now",
                P.FAILED: "cannot replace the query serving now",
                P.ABORTED: _ABORT,
            },
            waits=Wait.TURN,
        ),
        P.DEPLOYING: PhaseRule(
            Stage.BEFORE_CUT,
            {
                P.DEPLOYED: "new graph's query runs",
                P.FAILED: "it did not start (deploy_timeout)",
                P.ABORTED: _ABORT,
            },
            waits=Wait.GRAPH_START,
        ),
        P.DEPLOYED: PhaseRule(
            Stage.BEFORE_CUT,
            {
                P.CUT: "W recorded before the batch it applies to",
                P.SHADOWING: "a shadow: S recorded before the batch it applies to",
                P.FAILED: "new query died, or no cut (cut_timeout)",
                P.ABORTED: _ABORT,
            },
            waits=Wait.CUT,
            recovery_waits=Wait.STOP_POINT,
            shadow_waits=Wait.SHADOW_START,
        ),
        # A shadow (`submit --shadow`): it receives every row from S on beside the current query, and
        # writes its results to its own topic, until `hotswap promote` cuts to it (no deploy: it runs).
        P.SHADOWING: PhaseRule(
            Stage.BEFORE_CUT,
            {
                P.CUT: "promoted: W recorded before the batch it applies to",
                P.FAILED: "shadow query died",
                P.ABORTED: _ABORT,
            },
            waits=Wait.PROMOTION,
            promoted_waits=Wait.PROMOTED_CUT,
        ),
        P.CUT: PhaseRule(
            Stage.PAST_CUT,
            {P.DRAINING: "service watermark passed W", P.STRANDED: "new query failed for good"},
            waits=Wait.WATERMARK,
            recovery_waits=Wait.NOTHING_TO_DRAIN,
            drains=True,
        ),
        P.DRAINING: PhaseRule(
            Stage.PAST_CUT,
            {P.DRAINED: "old graph committed its windows through W", P.STRANDED: "new query failed for good"},
            waits=Wait.OLD_GRAPH_OUTPUT,
            recovery_waits=Wait.NOTHING_TO_DRAIN,
            drains=True,
        ),
        P.DRAINED: PhaseRule(
            Stage.PAST_CUT,
            {P.RETIRING: "old query about to stop", P.STRANDED: "new query failed for good"},
            waits=Wait.RETIRE,
            drains=True,
        ),
        P.RETIRING: PhaseRule(Stage.PAST_CUT, {P.RETIRED: "old query stopped"}, waits=Wait.OLD_GRAPH_STOP),
        P.RETIRED: PhaseRule(Stage.PAST_CUT, {P.COMPLETED: "new graph current"}, waits=Wait.COMPLETION),
        P.COMPLETED: PhaseRule(Stage.ENDED_PAST_CUT, {P.ROLLED_BACK: "a swap back completed"}),
        P.FAILED: PhaseRule(Stage.ENDED_BEFORE_CUT),
        P.REJECTED: PhaseRule(Stage.ENDED_BEFORE_CUT),
        P.ABORTED: PhaseRule(Stage.ENDED_BEFORE_CUT),
        P.STRANDED: PhaseRule(
            Stage.STRANDED,
            {P.ROLLED_BACK: "a rollback took over its input", P.FIXED_FORWARD: "a fix took over its input"},
            waits=Wait.TAKEOVER,
            drains=True,
        ),
        P.ROLLED_BACK: PhaseRule(Stage.ENDED_PAST_CUT),
        P.FIXED_FORWARD: PhaseRule(Stage.ENDED_PAST_CUT),
    }
)


@dataclass(frozen=True)
class WaitRule:
    driver: Driver  # who moves the swap on from this wait
    text: str  # what `status` says a swap waits for, in one line; the fields come from WaitFacts


_PROMOTION = "an operator: `hotswap diff {id}`, then `hotswap promote {id}` or `hotswap abort {id}`"

# Who moves a swap on from each wait, and what `status` says while it waits. The executor dispatches
# its step on the waits it drives and only watches the time of the others; the service graph's batch
# moves a swap on from its own waits alone; an operator's command ends the operator's.
WAITS: Mapping[Wait, WaitRule] = MappingProxyType(
    {
        Wait.VALIDATION: WaitRule(Driver.EXECUTOR, "validation by the executor"),
        Wait.TURN: WaitRule(Driver.EXECUTOR, "its turn: {turn}"),
        Wait.GRAPH_START: WaitRule(Driver.EXECUTOR, "its new graph {to_query} to start (deploying for {elapsed})"),
        Wait.CUT: WaitRule(Driver.SERVICE_BATCH, "the cut at the service graph's next batch or tick"),
        Wait.SHADOW_START: WaitRule(Driver.SERVICE_BATCH, "its start S at the service graph's next batch or tick"),
        Wait.PROMOTION: WaitRule(Driver.OPERATOR, _PROMOTION),
        # `hotswap promote` was asked: the service graph's next batch or tick cuts to the shadow.
        Wait.PROMOTED_CUT: WaitRule(
            Driver.SERVICE_BATCH, f"{_PROMOTION}; promoted: the cut comes at the service graph's next batch or tick"
        ),
        Wait.STOP_POINT: WaitRule(Driver.EXECUTOR, "the executor to record where {from_query} stopped"),
        Wait.WATERMARK: WaitRule(Driver.SERVICE_BATCH, "drain: service watermark {watermark} < W {cut}{idle}"),
        Wait.NOTHING_TO_DRAIN: WaitRule(
            Driver.EXECUTOR, "the executor to record that {from_query}, which failed, has nothing to drain"
        ),
        Wait.OLD_GRAPH_OUTPUT: WaitRule(
            Driver.EXECUTOR, "{from_query} to emit its windows through W {cut} (its watermark {old_watermark}){old}"
        ),
        Wait.RETIRE: WaitRule(Driver.EXECUTOR, "the executor to retire {from_query}"),
        Wait.OLD_GRAPH_STOP: WaitRule(Driver.EXECUTOR, "{from_query} to stop"),
        Wait.COMPLETION: WaitRule(Driver.EXECUTOR, "the executor to make {to_query} current"),
        # A rollback or a fix forward takes the stranded swap over: an operator's (or an automatic rollback).
        Wait.TAKEOVER: WaitRule(
            Driver.OPERATOR,
            "`hotswap rollback {id}` or `hotswap submit FILE --fix {id}` to take over its input{taker}",
        ),
    }
)

# What `status` says a swap waits for, one line per wait (`WAITS`' texts).
WAIT_TEXT: Mapping[Wait, str] = MappingProxyType({wait: rule.text for wait, rule in WAITS.items()})


class Waiting(Protocol):
    """What `wait_of` reads of a swap: a journal record, or its line in the status document."""

    @property
    def state(self) -> SwapPhase: ...

    @property
    def is_recovery(self) -> bool: ...

    @property
    def shadow(self) -> bool: ...

    @property
    def promote(self) -> bool: ...


def wait_of(swap: Waiting) -> Wait | None:
    """What `swap` waits for now, by the table's row for its phase and its kind; None once it has ended."""
    return swap.state.waits_for(recovery=swap.is_recovery, shadow=swap.shadow, promoted=swap.promote)


def driven_by(swap: Waiting | None, driver: Driver) -> Wait | None:
    """What `swap` waits for, if `driver` is who moves it on from there; None otherwise (or for no swap).

    The one answer to whose turn a swap is: the executor's step and the service graph's batch act on
    a swap through it, and the journal asks it again inside the write that records the move, so a
    writer that got there first (an operator's abort, the executor failing the swap) wins."""
    wait = None if swap is None else wait_of(swap)
    return wait if wait is not None and wait.driver is driver else None


@dataclass(frozen=True)
class WaitFacts:
    """What a wait's status text needs beyond the swap record (read by `status` or the executor)."""

    turn: str = ""  # for TURN: what holds a queued swap back
    watermark: int | None = None  # the service watermark
    idle: tuple[str, ...] = ()  # idle source partitions
    old_watermark: int | None = None  # the old graph's committed watermark
    old_failed: bool = False  # the old graph failed for good while it drained
    elapsed_ms: int | None = None  # time in the current phase
    taker: str | None = None  # the recovery that takes a stranded swap over


class IllegalTransition(HotswapError):
    """A swap was asked to move to a phase it cannot reach from where it is."""


def check_transition(current: SwapPhase, target: SwapPhase) -> None:
    if not current.can_become(target):
        raise IllegalTransition(f"swap cannot go from {current} to {target}")


def clock(ms: int | None) -> str:
    """A time of day for one-line messages (UTC, with milliseconds)."""
    return "-" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M:%S.%f")[:-3]


def seconds(ms: int | None) -> str:
    return "-" if ms is None else f"{ms / 1000:.1f}s"


def wait_text(
    wait: Wait, *, swap_id: str, to_query: str, from_query: str | None, cut: int | None, facts: WaitFacts
) -> str:
    """The one line `status` shows for `wait`."""
    idle = f"; partitions {', '.join(facts.idle)} idle" if facts.idle else ""
    old = (
        f"; {from_query} failed for good: fix its cause and restart `hotswap run`, which resumes it"
        if facts.old_failed
        else ""
    )
    return WAIT_TEXT[wait].format(
        id=swap_id,
        to_query=to_query,
        from_query=from_query or "-",
        cut=clock(cut),
        turn=facts.turn,
        watermark=clock(facts.watermark),
        idle=idle,
        old_watermark=clock(facts.old_watermark),
        old=old,
        elapsed=seconds(facts.elapsed_ms),
        taker=f" (swap {facts.taker} is taking it over)" if facts.taker else "",
    )


# -- the diagram (docs/swap-states.md) ---------------------------------------------------------------
_STAGE_CLASS = {
    Stage.BEFORE_CUT: "beforeCut",
    Stage.PAST_CUT: "pastCut",
    Stage.STRANDED: "strandedStage",
    Stage.ENDED_BEFORE_CUT: "endedBeforeCut",
    Stage.ENDED_PAST_CUT: "endedPastCut",
}
_STAGE_STYLE = {
    "beforeCut": "fill:#e8f1fb,stroke:#4a79b5",
    "pastCut": "fill:#eaf6ea,stroke:#4c9a4c",
    "strandedStage": "fill:#fdecea,stroke:#c0392b",
    "endedBeforeCut": "fill:#f2f2f2,stroke:#888888",
    "endedPastCut": "fill:#f2f2f2,stroke:#4c9a4c",
}


def diagram_markdown() -> str:
    """docs/swap-states.md, byte for byte: the table as a Mermaid state diagram and as a table."""
    lines = [
        "# Swap states",
        "",
        "Generated from the phase table (`TABLE` in `contract/phases.py`) by `make schema`; do not edit by hand.",
        "A unit test fails when this file differs from what the table generates.",
        "",
        "```mermaid",
        "stateDiagram-v2",
        f"    [*] --> {SwapPhase.SUBMITTED}",
    ]
    for phase, rule in TABLE.items():
        for target, label in rule.next.items():
            lines.append(f"    {phase} --> {target}: {label}")
    for phase in SwapPhase:
        if phase.is_terminal:
            lines.append(f"    {phase} --> [*]")
    for name, style in _STAGE_STYLE.items():
        lines.append(f"    classDef {name} {style}")
    for stage, name in _STAGE_CLASS.items():
        members = [str(p) for p in SwapPhase if p.rule.stage is stage]
        lines.append(f"    class {','.join(members)} {name}")
    lines += [
        "```",
        "",
        "What a swap waits for in each phase, and who moves it on from there: the executor (its loop, one handler",
        "per wait), the service graph batch (at a micro-batch boundary, or a tick between batches), or an operator",
        "(a command). A recovery, a shadow and a promoted shadow have rows of their own where they wait for",
        "something else.",
        "",
        "| phase | stage | old graph owns rows before W | for | waits for | moved on by | status says |",
        "|---|---|---|---|---|---|---|",
    ]
    for phase, rule in TABLE.items():
        lines.append(_wait_row(f"`{phase}` | {rule.stage} | {'yes' if rule.drains else ''}", "", rule.waits))
        for kind, wait in _other_waits(phase):
            lines.append(_wait_row(f"`{phase}` |  | ", kind, wait))
    return "\n".join(lines) + "\n"


def _other_waits(phase: SwapPhase) -> list[tuple[str, Wait | None]]:
    """The kinds of swap that wait for something else in `phase` than an ordinary one, with their wait."""
    ordinary = phase.waits_for(recovery=False)
    shadow = phase.waits_for(recovery=False, shadow=True)
    kinds = [
        ("a recovery", phase.waits_for(recovery=True), ordinary),
        ("a shadow", shadow, ordinary),
        ("a promoted shadow", phase.waits_for(recovery=False, shadow=True, promoted=True), shadow),
    ]
    return [(kind, wait) for kind, wait, otherwise in kinds if wait is not otherwise]


def _wait_row(phase: str, kind: str, wait: Wait | None) -> str:
    if wait is None:
        return f"| {phase} | {kind} |  |  |  |"
    said = WAIT_TEXT[wait].replace("|", "\\|")
    return f"| {phase} | {kind or 'a swap'} | {wait} | {wait.driver} | {said} |"


if __name__ == "__main__":
    print(diagram_markdown(), end="")
