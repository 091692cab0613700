"""How `hotswap status` and `hotswap stack` look in a terminal."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from hotswap.contract.models import ShadowDiff
from hotswap.contract.phases import SwapPhase
from hotswap.contract.plans import DryRunPlan
from hotswap.contract.settings import StackSettings
from hotswap.contract.status import Status
from hotswap.contract.windows import format_duration_ms
from hotswap.executor.operator.history import SwapHistory

console = Console()


def iso(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def render_status(doc: Status) -> None:
    current = doc.current
    console.print(
        f"[bold]namespace[/] {doc.namespace}   [bold]executor[/] {doc.executor.phase} "
        f"({doc.executor.holder or 'no lease'})   "
        f"[bold]current[/] {current.query_id if current else '-'}",
        soft_wrap=True,
    )
    if doc.executor.holder is None and current is None and not doc.swaps:
        console.print(
            f"namespace {doc.namespace!r} has no executor and no swaps: start one with `hotswap run --query FILE`, "
            "or name the namespace yours runs in with --namespace",
            soft_wrap=True,
        )
        return
    service = doc.service
    table = Table("partition", "window end", "event time", "offset", "idle", title="service graph")
    for p, node in service.partitions.items():
        table.add_row(p, iso(node.window_end), iso(node.event_time), str(node.offset), "yes" if node.idle else "")
    console.print(table)
    console.print(
        f"watermark {iso(service.watermark)}   late records {doc.late_records}   "
        f"dead-letter records {doc.dead_letter_records}   expired records {doc.expired_records}"
    )
    swaps = Table("swap", "from", "to", "state", "cut (W)", "phases", "waiting for", title="swaps")
    for s in doc.swaps:
        swaps.add_row(
            s.id,
            s.from_query or "-",
            s.to_query,
            s.state,
            iso(s.cut_window_end),
            " > ".join(p.name for p in s.phases),
            " ".join(filter(None, (s.cause, s.waiting_for))) or s.note or ("see below" if s.error else ""),
        )
    console.print(swaps)
    for s in doc.swaps:
        if s.diff is not None and not s.state.is_terminal:
            console.print(f"[bold]diff[/] {diff_line(s.diff)} (`hotswap diff {s.id}` again to refresh)")
    # A failure's reason is one line with its root cause: printed whole, never wrapped in a column.
    for s in doc.swaps:
        if s.error:
            code = f" [{s.reason_code}]" if s.reason_code else ""
            # Not markup: a reason code in brackets ([query_failed_after_cut]) would read as a style tag.
            console.print(f"swap {s.id} {s.state}: {s.error}{code}", soft_wrap=True, markup=False)
    owners = " | ".join(
        f"{o.query_id} {iso(o.after) if o.after else '…'} .. {iso(o.through) if o.through else '…'}" for o in doc.owners
    )
    if owners:
        console.print(f"[bold]windows by version[/] (window end after .. through) {owners}", soft_wrap=True)


def render_history(entries: list[SwapHistory], out: Console = console) -> None:
    """One swap per paragraph, newest first: what it swapped, its outcome, W and duration, then each
    phase with the seconds it lasted, then a failure's reason. Lines, not a table: it reads the same
    in a narrow terminal and in a log."""
    if not entries:
        out.print("no swaps yet")
        return
    for e in entries:
        waits = "waits for a rollback or a fix" if SwapPhase(e.state).is_stranded else "running"
        outcome = e.state if e.ended else f"{e.state} ({waits})"
        took = "" if e.seconds is None else f" in {e.seconds:.1f} s"
        w = f", W = {iso(e.cut_window_end)}" if e.cut_window_end is not None else ", no cut"
        head = f"[bold]{e.id}[/] {e.from_query or '?'} -> {e.to_query}: {outcome}{took}{w}"
        out.print(f"{head}, submitted {iso(e.submitted_at)}", soft_wrap=True)
        spans = " > ".join(p.name + ("" if p.seconds is None else f" {p.seconds:.1f} s") for p in e.phases)
        out.print(f"  {spans}", soft_wrap=True)
        if e.error:
            out.print(f"  {e.error}" + (f" [{e.reason_code}]" if e.reason_code else ""), soft_wrap=True, markup=False)


def render_plan(plan: DryRunPlan) -> None:
    """A dry run's plan, in a few lines (the JSON form has every field)."""
    console.print(f"[bold]dry run of {plan.query}[/]: {'would be accepted' if plan.valid else 'would be rejected'}")
    if not plan.valid:
        return
    window = format_duration_ms(plan.window_ms) if plan.window_ms else "?"
    slide = f", sliding every {format_duration_ms(plan.slide_ms)}" if plan.slide_ms else ""
    console.print(f"  window {window}{slide}; group columns {', '.join(plan.group_columns) or '-'}", soft_wrap=True)
    console.print(f"  reads {plan.schema_ddl or '?'}", soft_wrap=True)
    old = f" ({format_duration_ms(plan.replaces_window_ms)} windows)" if plan.replaces_window_ms else ""
    console.print(f"  replaces {plan.replaces or '-'}{old}")
    if plan.cut_window_end is not None:
        console.print(
            f"  a cut now would take W = {iso(plan.cut_window_end)} (event time); it cannot complete before the "
            f"service watermark passes W + lateness = {iso(plan.floor)}"
        )
    else:
        console.print("  no cut yet: the service graph has routed no row")
    console.print(f"  ahead in the queue: {', '.join(plan.ahead) if plan.ahead else 'nothing'}")
    console.print("  nothing was changed")


def print_stack(stack: StackSettings, statuses: list[Any]) -> None:
    external = {"kafka": stack.kafka_bootstrap is not None, "redis": stack.redis_url is not None}
    table = Table("service", "address", "pid", "run by", "healthy")
    for s in statuses:
        run_by = "this stack" if s.managed else ("external" if external.get(s.name) else "-")
        table.add_row(s.name, s.address, str(s.pid or "-"), run_by, "yes" if s.healthy else "NO")
    console.print(table)
    if any(s.name == "postgres" for s in statuses):
        console.print(
            "for the postgres sink: --sink postgres:TABLE --sink-url "
            + next(s.address for s in statuses if s.name == "postgres")
        )


def render_diff(summary: ShadowDiff) -> None:
    """`hotswap diff`: a shadow against the current version, for the windows both closed since S."""
    console.print(diff_line(summary))
    groups = ", ".join(summary.group_columns) or "-"
    columns = ", ".join(summary.columns_compared) or "-"
    console.print(f"matched by window and {groups}; values compared: {columns}")
    if summary.group_columns_differ:
        console.print("[yellow]the versions' group columns differ; groups were matched by the ones they share[/]")
    if summary.examples:
        table = Table("window start", "window end", "group", "column", "current", "shadow", title="examples")
        for e in summary.examples:
            group = ", ".join(f"{k}={v}" for k, v in e.group.items())
            table.add_row(iso(e.window_start), iso(e.window_end), group, e.column, str(e.current), str(e.shadow))
        console.print(table)


def diff_line(summary: ShadowDiff) -> str:
    """The summary in one line, as `status`, the live view and the dashboard show it."""
    return (
        f"shadow {summary.shadow_id} since {iso(summary.since)}, windows closed through {iso(summary.closed_through)}: "
        f"{summary.windows_compared} windows, {summary.groups_compared} groups compared, "
        f"{summary.values_differ} values differ, {summary.only_current} groups only in the current version, "
        f"{summary.only_shadow} only in the shadow"
    )
