"""The swap's phases: the one table that defines them.

For each phase, `TABLE` says where a swap may go next (and what each move records), its stage (before
the cut, past it, stranded, ended), whether the old graph still owns rows before W, and what the swap
waits for there, for an ordinary swap and for a recovery (a rollback or fix forward that takes over a
stranded swap's input). The executor dispatches its step on that wait (executor/control/swap.py, one
handler per wait), `status` says it with the text below, and docs/swap-states.md draws the table
(`make schema` writes it; a unit test fails while it is stale).

A new phase is one more row: for example a shadow run would add `shadowing` between `deployed` and
`cut`, with its own wait, and `abort` as one of its moves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from types import MappingProxyType

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

    def waits_for(self, *, recovery: bool, shadow: bool = False) -> Wait | None:
        """What a swap in this phase waits for: a recovery's differs where it has nothing to cut or
        drain, a shadow's where it starts at S instead of cutting."""
        rule = self.rule
        if recovery:
            return rule.recovery_waits or rule.waits
        if shadow:
            return rule.shadow_waits or rule.waits
        return rule.waits


class Stage(StrEnum):
    BEFORE_CUT = "before the cut"  # the old query owns every window; abort is safe
    PAST_CUT = "past the cut"  # W is recorded; the swap only goes forward
    STRANDED = "stranded"  # past the cut, and its new query failed for good
    ENDED_BEFORE_CUT = "ended before the cut"  # the old query never gave up a window
    ENDED_PAST_CUT = "ended past the cut"  # its cut moved ownership for good


class Wait(StrEnum):
    """What a swap waits for. Each has one status text (`WAIT_TEXT`) and, when the executor drives
    it, one handler in executor/control/swap.py."""

    VALIDATION = "validation"
    TURN = "turn"
    GRAPH_START = "graph start"
    CUT = "cut"
    SHADOW_START = "shadow start"
    PROMOTION = "promotion"
    STOP_POINT = "stop point"
    WATERMARK = "watermark"
    NOTHING_TO_DRAIN = "nothing to drain"
    OLD_GRAPH_OUTPUT = "old graph output"
    RETIRE = "retire"
    OLD_GRAPH_STOP = "old graph stop"
    COMPLETION = "completion"
    TAKEOVER = "takeover"


@dataclass(frozen=True)
class PhaseRule:
    stage: Stage
    # Where a swap may go from here, each with what the move records (the diagram's labels).
    next: Mapping[SwapPhase, str] = field(default_factory=dict)
    waits: Wait | None = None
    recovery_waits: Wait | None = None  # where a recovery waits for something else
    shadow_waits: Wait | None = None  # where a shadow waits for something else
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

# What `status` says a swap waits for, one line per wait; the fields come from WaitFacts.
WAIT_TEXT: Mapping[Wait, str] = MappingProxyType(
    {
        Wait.VALIDATION: "validation by the executor",
        Wait.TURN: "its turn: {turn}",
        Wait.GRAPH_START: "its new graph {to_query} to start (deploying for {elapsed})",
        Wait.CUT: "the cut at the service graph's next batch or tick",
        Wait.SHADOW_START: "its start S at the service graph's next batch or tick",
        Wait.PROMOTION: "an operator: `hotswap diff {id}`, then `hotswap promote {id}` or `hotswap abort {id}`"
        "{promoting}",
        Wait.STOP_POINT: "the executor to record where {from_query} stopped",
        Wait.WATERMARK: "drain: service watermark {watermark} < W {cut}{idle}",
        Wait.NOTHING_TO_DRAIN: "the executor to record that {from_query}, which failed, has nothing to drain",
        Wait.OLD_GRAPH_OUTPUT: "{from_query} to emit its windows through W {cut} (its watermark {old_watermark}){old}",
        Wait.RETIRE: "the executor to retire {from_query}",
        Wait.OLD_GRAPH_STOP: "{from_query} to stop",
        Wait.COMPLETION: "the executor to make {to_query} current",
        Wait.TAKEOVER: "`hotswap rollback {id}` or `hotswap submit FILE --fix {id}` to take over its input{taker}",
    }
)


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
    promoting: bool = False  # a shadow whose promotion was asked for: the cut comes at the next batch


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
        promoting="; promoted: the cut comes at the service graph's next batch or tick" if facts.promoting else "",
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
        "| phase | stage | old graph owns rows before W | waits for | a recovery waits for | status says |",
        "|---|---|---|---|---|---|",
    ]
    for phase, rule in TABLE.items():
        waits = rule.waits
        said = WAIT_TEXT[waits].replace("|", "\\|") if waits else ""
        lines.append(
            f"| `{phase}` | {rule.stage} | {'yes' if rule.drains else ''} | {waits or ''} | "
            f"{rule.recovery_waits or ''} | {said} |"
        )
    recovery_texts = sorted({r.recovery_waits for r in TABLE.values() if r.recovery_waits}, key=list(Wait).index)
    lines += ["", "A recovery's own waits say:", ""]
    lines += [f"- {wait}: {WAIT_TEXT[wait]}" for wait in recovery_texts]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(diagram_markdown(), end="")
