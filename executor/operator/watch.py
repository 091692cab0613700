"""`hotswap status --watch`: a live terminal view of the namespace, redrawn every interval.

On a terminal it redraws in place (rich Live); into a file or a pipe it prints one frame after
another, so its output can be logged or read by a test. Ctrl-C ends it cleanly (exit 0).

It shows the current query and its rates, each source partition's window, event time and
idleness, the service watermark, the swap in progress with every phase and its time, progress
bars where progress is measurable (the deploy against its timeout, the service watermark and the
old graph's committed watermark against W, the rows waiting in the new graph's topic), and the
late, dead-letter and expired counts. Phases are read from the journal as recorded, so a phase
added to the swap machine shows without a change here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

import redis
from rich.console import Console, Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.rule import Rule
from rich.table import Table
from rich.text import Text

from hotswap.contract.phases import Wait, wait_of
from hotswap.contract.settings import KafkaSettings, PipelineSettings, Timeouts
from hotswap.contract.status import SwapStatus
from hotswap.contract.windows import format_duration_ms
from hotswap.executor.operator.client import Client
from hotswap.executor.operator.history import swap_history
from hotswap.executor.operator.observe import KafkaPositions, Rates, RateWindow, Snapshot, take_snapshot
from hotswap.executor.operator.render import diff_line, iso

BAR_WIDTH = 40


@dataclass
class WatchMemory:
    """What the view remembers between frames, only to draw progress: where each drain started
    and the most rows seen waiting in each graph's topic."""

    drain_from: dict[str, int] = field(default_factory=dict)
    backlog_peak: dict[str, int] = field(default_factory=dict)


def clock(ms: int | None) -> str:
    return iso(ms)[11:] if ms is not None else "-"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}/s"


def _bar(label: str, completed: float, total: float, detail: str) -> Table:
    grid = Table.grid(padding=(0, 1))
    grid.add_column(width=26)
    grid.add_column(width=BAR_WIDTH)
    grid.add_column()
    share = 0.0 if total <= 0 else min(1.0, max(0.0, completed / total))
    grid.add_row(
        label, ProgressBar(total=100, completed=100 * share, width=BAR_WIDTH), f"{100 * share:3.0f}%  {detail}"
    )
    return grid


def render_watch(
    snap: Snapshot,
    rate: Rates,
    memory: WatchMemory,
    pipeline: PipelineSettings,
    timeouts: Timeouts,
    error: str | None = None,
) -> RenderableType:
    status = snap.status
    parts: list[RenderableType] = []
    current = status.current
    record = snap.current_record()
    header = Text.assemble(
        ("hotswap ", "bold"),
        f"{status.namespace}  ",
        ("executor ", "bold"),
        f"{status.executor.phase}  ",
        ("current ", "bold"),
        f"{current.query_id if current else '-'}",
        f" ({format_duration_ms(record.window_ms)} windows)" if record else "",
        f"  · {clock(snap.at_ms)} UTC",
    )
    parts.append(header)
    parts.append(
        Text(
            f"source read {_rate(rate.source_read)}   routed {_rate(rate.routed_total)}   "
            f"results {_rate(rate.results)}"
            + "".join(f"   [{q}: routed {_rate(v)}]" for q, v in sorted(rate.routed.items()) if v)
        )
    )
    if error:
        parts.append(Text(f"control state unreachable: {error}", style="red"))
    partitions = Table("partition", "window end", "event time", "offset", "idle", title="source partitions")
    for p, node in status.service.partitions.items():
        partitions.add_row(
            p, clock(node.window_end), clock(node.event_time), f"{node.offset:,}", "idle" if node.idle else ""
        )
    parts.append(partitions)
    parts.append(Text(f"service watermark {clock(status.service.watermark)}"))
    swap = snap.active_swap
    if swap is not None:
        parts.append(Rule(f"swap {swap.id} in progress: {swap.from_query or '?'} -> {swap.to_query}"))
        parts.extend(_swap_view(snap, swap, memory, pipeline, timeouts))
    elif snap.last_swap is not None:
        last = snap.last_swap
        parts.append(Rule(f"last swap {last.id}: {last.from_query or '?'} -> {last.to_query}, {last.state}"))
        parts.extend(_swap_view(snap, last, memory, pipeline, timeouts))
    else:
        parts.append(Text("no swap yet", style="dim"))
    parts.append(
        Text(
            f"late records {status.late_records:,}   dead-letter records {status.dead_letter_records:,}   "
            f"expired records {status.expired_records:,}"
        )
    )
    reasons = snap.dead_letters_by_reason
    if reasons:
        parts.append(Text("dead letters by reason: " + ", ".join(f"{k} {v:,}" for k, v in reasons.items())))
    owners = " | ".join(
        f"{o.query_id} {clock(o.after) if o.after is not None else '…'} .. {clock(o.through) if o.through else '…'}"
        for o in status.owners
    )
    if owners:
        parts.append(Text(f"windows by version (ending after .. through): {owners}"))
    return Group(*parts)


def _swap_view(
    snap: Snapshot, swap: SwapStatus, memory: WatchMemory, pipeline: PipelineSettings, timeouts: Timeouts
) -> list[RenderableType]:
    entry = swap_history(swap, snap.at_ms)
    phases = Table("phase", "entered", "for", box=None, padding=(0, 2))
    for span in entry.phases:
        took = "" if span.seconds is None else f"{span.seconds:.1f} s"
        now = span is entry.phases[-1] and not entry.ended
        phases.add_row(
            Text(span.name, style="bold yellow" if now else ""), clock(span.at), took + (" …" if now else "")
        )
    out: list[RenderableType] = [phases]
    w = swap.cut_window_end
    if w is not None:
        out.append(Text(f"W = {clock(w)} (event time)", style="bold red"))
    if swap.waiting_for:
        out.append(Text(f"waiting for: {swap.waiting_for}"))
    if swap.diff is not None:
        out.append(Text(f"diff: {diff_line(swap.diff)}"))
    if swap.error:
        code = f" [{swap.reason_code}]" if swap.reason_code else ""
        out.append(Text(f"error: {swap.error}{code}", style="red"))
    if entry.ended:
        return out
    # What the phase waits for (the phase table, contract/phases.py) says which progress is measurable.
    wait = wait_of(swap)
    if wait is Wait.GRAPH_START and swap.phases:
        # The deploy: from `deploying` until the new graph runs, against deploy_timeout.
        elapsed = max(0, snap.at_ms - swap.phases[-1].at) / 1000
        limit = timeouts.deploy_timeout.s
        out.append(_bar("deploy", elapsed, limit, f"{elapsed:.1f} s of {limit:.0f} s allowed"))
    if w is not None:
        watermark = snap.status.service.watermark
        old_window = swap.old_window_ms or 0
        if watermark is not None and wait is Wait.WATERMARK:
            start = w - old_window - pipeline.lateness.ms
            out.append(
                _bar("service watermark -> W", watermark - start, w - start, f"{clock(watermark)} of {clock(w)}")
            )
        old = snap.status.graphs.get(swap.from_query or "")
        reached = old.progress.committed_watermark if old and old.progress else None
        if reached is not None and swap.from_query:
            start = memory.drain_from.setdefault(swap.id, min(reached, w - old_window))
            out.append(
                _bar(f"{swap.from_query} emitted -> W", reached - start, w - start, f"{clock(reached)} of {clock(w)}")
            )
        waiting = snap.backlog.get(swap.to_query)
        if waiting is not None:
            peak = max(memory.backlog_peak.get(swap.to_query, 0), waiting)
            memory.backlog_peak[swap.to_query] = peak
            out.append(
                _bar(
                    f"{swap.to_query} topic read",
                    peak - waiting,
                    peak,
                    f"{waiting:,} rows waiting in its topic",
                )
            )
    return out


def watch(
    client: Client,
    pipeline: PipelineSettings,
    kafka: KafkaSettings,
    timeouts: Timeouts,
    console: Console,
    interval_s: float = 0.5,
    stop: threading.Event | None = None,
) -> None:
    """Redraw until `stop` is set (the CLI sets it on Ctrl-C or SIGTERM) or Ctrl-C raises.

    On a terminal in place; elsewhere one frame after another. Ctrl-C sets an event instead of
    raising: kafka-python runs its tasks in the calling thread and logs and drops any exception a
    task raises, KeyboardInterrupt included, so an interrupt landing in a Kafka read was lost and the
    view never ended."""
    stop = stop or threading.Event()
    positions = KafkaPositions(kafka, pipeline.sink.target if pipeline.sink.is_kafka else None)
    memory = WatchMemory()
    window = RateWindow()
    previous: Snapshot | None = None
    try:
        if console.is_terminal:
            from rich.live import Live

            with Live(console=console, auto_refresh=False, transient=False) as live:

                def redraw(view: RenderableType) -> None:
                    live.update(view, refresh=True)

                while not stop.is_set():
                    previous = _frame(client, pipeline, timeouts, positions, memory, window, previous, redraw)
                    stop.wait(interval_s)
        else:
            while not stop.is_set():
                previous = _frame(client, pipeline, timeouts, positions, memory, window, previous, console.print)
                console.print(Rule(style="dim"))
                console.file.flush()
                stop.wait(interval_s)
    except KeyboardInterrupt:
        pass
    finally:
        positions.close()


def _frame(
    client: Client,
    pipeline: PipelineSettings,
    timeouts: Timeouts,
    positions: KafkaPositions,
    memory: WatchMemory,
    window: RateWindow,
    previous: Snapshot | None,
    show: Callable[[RenderableType], object],
) -> Snapshot | None:
    try:
        snap = take_snapshot(client, positions)
    except redis.RedisError as exc:
        if previous is not None:
            show(render_watch(previous, Rates(), memory, pipeline, timeouts, error=str(exc)))
        else:
            show(Text(f"control state unreachable: {exc}", style="red"))
        return previous
    show(render_watch(snap, window.add(snap), memory, pipeline, timeouts))
    return snap
