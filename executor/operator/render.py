"""How `hotswap status` and `hotswap stack` look in a terminal."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rich.console import Console
from rich.table import Table

from hotswap.contract.settings import Settings
from hotswap.contract.status import Status

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
    swaps = Table("swap", "from", "to", "state", "cut (W)", "phases", "waiting for / error", title="swaps")
    for s in doc.swaps:
        swaps.add_row(
            s.id,
            s.from_query or "-",
            s.to_query,
            s.state,
            iso(s.cut_window_end),
            " > ".join(p.name for p in s.phases),
            (f"{s.reason_code}: {s.error}" if s.reason_code else s.error)
            or " ".join(filter(None, (s.cause, s.waiting_for)))
            or s.note
            or "",
        )
    console.print(swaps)
    owners = " | ".join(
        f"{o.query_id} {iso(o.after) if o.after else '…'} .. {iso(o.through) if o.through else '…'}" for o in doc.owners
    )
    if owners:
        console.print(f"[bold]windows by version[/] (window end after .. through) {owners}", soft_wrap=True)


def print_stack(settings: Settings, statuses: list[Any]) -> None:
    external = {"kafka": settings.kafka_bootstrap is not None, "redis": settings.redis_url is not None}
    table = Table("service", "address", "pid", "run by", "healthy")
    for s in statuses:
        run_by = "this stack" if s.managed else ("external" if external.get(s.name) else "-")
        table.add_row(s.name, s.address, str(s.pid or "-"), run_by, "yes" if s.healthy else "NO")
    console.print(table)
