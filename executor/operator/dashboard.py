"""The dashboard: one server-rendered HTML page (see web.py), refreshed by a small script that
fetches the page's live part again every second. No build step and nothing vendored.

It shows the current query with its text and the schema it reads, a timeline of recent swaps
(each phase a bar over wall time, the cut W marked), the windows each version answers (the
status document's `owners`), the service graph's partitions and watermark, and the late and
dead-letter counts. Everything is rendered from one Snapshot (observe.py), written generically
over the phases the journal recorded, so a new phase simply appears.
"""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape

from hotswap.contract.journal import SwapPhase
from hotswap.contract.status import SwapStatus
from hotswap.contract.windows import format_duration_ms
from hotswap.executor.operator.history import swap_history
from hotswap.executor.operator.observe import Rates, Snapshot
from hotswap.executor.operator.render import diff_line

SWAPS_SHOWN = 6
REFRESH_MS = 1000

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;background:#f6f7f9;color:#1d2330}
header{background:#1d2330;color:#fff;padding:10px 20px;display:flex;gap:24px;align-items:baseline}
header h1{font-size:18px;margin:0}
main{padding:12px 20px;display:grid;grid-template-columns:minmax(0,1fr) minmax(0,1fr);gap:14px}
section{background:#fff;border:1px solid #dde1e7;border-radius:6px;padding:10px 14px}
section.wide{grid-column:1/3}
h2{font-size:15px;margin:0 0 8px}
pre{background:#f0f2f5;padding:8px;border-radius:4px;white-space:pre-wrap;margin:4px 0;font-size:12px}
table{border-collapse:collapse;width:100%}
td,th{text-align:left;padding:2px 8px 2px 0;font-size:13px;vertical-align:top}
th{color:#5b6474;font-weight:600}
.num{font-variant-numeric:tabular-nums}
.swap{margin:10px 0 14px}
.swap .title{font-weight:600}
.bar{position:relative;height:26px;background:#eef0f3;border-radius:4px;margin:4px 0;overflow:hidden}
.bar .phase{position:absolute;top:0;bottom:0;color:#fff;font-size:11px;line-height:26px;padding-left:3px;
 overflow:hidden;white-space:nowrap;border-right:1px solid #fff;box-sizing:border-box}
.bar .cut{position:absolute;top:0;bottom:0;border-left:3px solid #d7263d}
.spans{font-size:12px;color:#3d4656}
.spans span{margin-right:10px;white-space:nowrap}
.dot{display:inline-block;width:9px;height:9px;border-radius:2px;margin-right:3px}
.w{color:#d7263d;font-weight:600}
.error{color:#b3261e}
.muted{color:#7a8394}
.owners .seg{display:inline-block;padding:3px 8px;margin:2px 2px 2px 0;border-radius:3px;color:#fff;font-size:12px}
"""

_SCRIPT = f"""
const live = document.getElementById('live');
async function refresh() {{
  try {{
    const response = await fetch('fragment', {{cache: 'no-store'}});
    if (response.ok) live.innerHTML = await response.text();
  }} catch (e) {{ /* the executor stopped or restarts: keep the last page */ }}
}}
setInterval(refresh, {REFRESH_MS});
"""


def clock(ms: int | None) -> str:
    return "-" if ms is None else datetime.fromtimestamp(ms / 1000, UTC).strftime("%H:%M:%S.%f")[:-3]


def phase_color(name: str) -> str:
    """A colour per phase, from its place in SwapPhase (a phase unknown here still gets one)."""
    phases = [str(p) for p in SwapPhase]
    index = phases.index(name) if name in phases else len(phases) + sum(map(ord, name))
    return f"hsl({(index * 137) % 360},55%,45%)"


def page(snap: Snapshot, rates: Rates) -> str:
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>hotswap · {escape(snap.status.namespace)}</title><style>{_STYLE}</style></head><body>"
        f"<div id='live'>{fragment(snap, rates)}</div><script>{_SCRIPT}</script></body></html>"
    )


def fragment(snap: Snapshot, rates: Rates) -> str:
    """The live part of the page: everything but the script."""
    status = snap.status
    executor = status.executor
    return (
        f"<header><h1>hotswap · {escape(status.namespace)}</h1>"
        f"<span>executor {escape(str(executor.phase))}</span>"
        f"<span>current {escape(status.current.query_id if status.current else '-')}</span>"
        f"<span class='muted'>updated {clock(snap.at_ms)} UTC</span></header>"
        f"<main>{_current(snap)}{_counts(snap, rates)}{_timeline(snap)}{_owners(snap)}{_service(snap)}</main>"
    )


def _current(snap: Snapshot) -> str:
    record = snap.current_record()
    if record is None:
        return "<section><h2>Current query</h2><p class='muted'>no query yet</p></section>"
    return (
        f"<section><h2>Current query: {escape(record.query_id)}</h2>"
        f"<div class='muted'>{escape(str(record.source.kind))} · {format_duration_ms(record.window_ms)} windows · "
        f"groups {escape(', '.join(record.group_columns) or '-')} · since {clock(record.started_at)}</div>"
        f"<pre>{escape(record.source.text.strip())}</pre>"
        f"<div><b>schema it reads</b></div><pre>{escape(record.reads.schema_ddl)}</pre></section>"
    )


def _counts(snap: Snapshot, rates: Rates) -> str:
    status = snap.status

    def rate(value: float | None) -> str:
        return "-" if value is None else f"{value:,.1f}/s"

    rows = [
        ("source rows read", f"{snap.source_read:,}", rate(rates.source_read)),
        ("rows routed", f"{sum(snap.per_query('routed:').values()):,}", rate(rates.routed_total)),
        (
            "results written",
            "-" if snap.results_written is None else f"{snap.results_written:,}",
            rate(rates.results),
        ),
        ("late records", f"{status.late_records:,}", ""),
        ("dead-letter records", f"{status.dead_letter_records:,}", ""),
        ("expired records", f"{status.expired_records:,}", ""),
    ]
    body = "".join(f"<tr><th>{escape(a)}</th><td class='num'>{b}</td><td class='num'>{c}</td></tr>" for a, b, c in rows)
    reasons = snap.dead_letters_by_reason
    by_reason = ", ".join(f"{escape(k)} {v:,}" for k, v in reasons.items()) if reasons else "none"
    return (
        f"<section><h2>Records</h2><table>{body}</table>"
        f"<div class='muted'>dead letters by reason: {by_reason}</div></section>"
    )


def _timeline(snap: Snapshot) -> str:
    swaps = snap.status.swaps[-SWAPS_SHOWN:]
    if not swaps:
        return "<section class='wide'><h2>Swaps</h2><p class='muted'>no swap yet</p></section>"
    rows = "".join(_swap_row(s, snap.at_ms) for s in reversed(swaps))
    return f"<section class='wide'><h2>Swaps (newest first)</h2>{rows}</section>"


def _swap_row(swap: SwapStatus, now_ms: int) -> str:
    entry = swap_history(swap, now_ms)
    start = entry.submitted_at or now_ms
    end = max(entry.ended_at or now_ms, start + 1)
    span = end - start
    bars = []
    cut_mark = ""
    for i, phase in enumerate(entry.phases):
        until = entry.phases[i + 1].at if i + 1 < len(entry.phases) else (now_ms if not entry.ended else phase.at)
        left = 100 * (phase.at - start) / span
        width = max(100 * (until - phase.at) / span, 0.6)
        took = "" if phase.seconds is None else f" for {phase.seconds:.1f} s"
        bars.append(
            f"<div class='phase' style='left:{left:.2f}%;width:{width:.2f}%;background:{phase_color(phase.name)}'"
            f" title='{escape(phase.name)} at {clock(phase.at)}{took}'>{escape(phase.name)}</div>"
        )
        if phase.name == str(SwapPhase.CUT) and swap.cut_window_end is not None:
            cut_mark = f"<div class='cut' style='left:{left:.2f}%' title='cut: W = {clock(swap.cut_window_end)}'></div>"
    spans = "".join(
        f"<span><i class='dot' style='background:{phase_color(p.name)}'></i>{escape(p.name)} {clock(p.at)}"
        + ("" if p.seconds is None else f" ({p.seconds:.1f} s)")
        + "</span>"
        for p in entry.phases
    )
    w = f" · <span class='w'>W = {clock(swap.cut_window_end)}</span>" if swap.cut_window_end is not None else ""
    took = f" · {entry.seconds:.1f} s" if entry.seconds is not None else ""
    detail = swap.error or swap.waiting_for or swap.note
    reason_code = swap.reason_code
    detail_html = ""
    if detail:
        css = "error" if swap.error else "muted"
        code = f" [{escape(str(reason_code))}]" if reason_code else ""
        label = "error" if swap.error else ("waiting for" if swap.waiting_for else "note")
        detail_html = f"<div class='{css}'>{label}: {escape(detail)}{code}</div>"
    if swap.diff is not None:
        detail_html += f"<div class='muted'>diff: {escape(diff_line(swap.diff))}</div>"
    return (
        f"<div class='swap'><div class='title'>{escape(swap.id)}: {escape(swap.from_query or '?')} → "
        f"{escape(swap.to_query)} · {escape(str(swap.state))}{took}{w}</div>"
        f"<div class='bar'>{''.join(bars)}{cut_mark}</div><div class='spans'>{spans}</div>{detail_html}</div>"
    )


def _owners(snap: Snapshot) -> str:
    owners = snap.status.owners
    if not owners:
        return "<section><h2>Windows by version</h2><p class='muted'>none yet</p></section>"
    segments = "".join(
        f"<span class='seg' style='background:{phase_color(o.query_id)}'>{escape(o.query_id)}</span>" for o in owners
    )
    rows = "".join(
        f"<tr><td>{escape(o.query_id)}</td><td>{clock(o.after) if o.after is not None else 'the first'}</td>"
        f"<td>{clock(o.through) if o.through is not None else 'now on'}</td><td>{escape(o.swap_id or '-')}</td></tr>"
        for o in owners
    )
    return (
        "<section><h2>Windows by version</h2><div class='owners'>"
        f"{segments}</div><table><tr><th>version</th><th>windows ending after</th><th>through</th><th>swap</th></tr>"
        f"{rows}</table></section>"
    )


def _service(snap: Snapshot) -> str:
    service = snap.status.service
    rows = "".join(
        f"<tr><td>{escape(p)}</td><td>{clock(n.window_end)}</td><td>{clock(n.event_time)}</td>"
        f"<td class='num'>{n.offset:,}</td><td>{'idle' if n.idle else ''}</td></tr>"
        for p, n in service.partitions.items()
    )
    return (
        f"<section><h2>Service graph · watermark {clock(service.watermark)}</h2>"
        "<table><tr><th>partition</th><th>window end</th><th>event time</th><th>offset</th><th></th></tr>"
        f"{rows}</table></section>"
    )
