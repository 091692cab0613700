"""Issue 20: watching a swap on the real stack. One `hotswap run` process serves every check, to keep
the suite short: a dry run that changes nothing; a swap followed at once by `status --watch`, by
`/metrics` and by the dashboard in headless Chromium (with a screenshot for the README); history;
a console with no error for the planned swap; and then a query that fails on a live row, whose own
message shows in one line in status, history and the log."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import redis

from hotswap.contract.journal import SwapPhase
from hotswap.contract.models import GraphEngine
from hotswap.contract.names import Keys
from hotswap.contract.reasons import ReasonCode
from hotswap.contract.settings import Settings
from hotswap.executor.operator.client import Client
from hotswap.executor.tools.generator import GeneratorSpec
from tests.conftest import wait_until
from tests.integration.harness import REPO, ExecutorProcess, committed_watermark, continuous_load, run_cli, settings_env
from tests.integration.scenarios import PHASES

pytestmark = [pytest.mark.integration, pytest.mark.slow]

COUNT_10S = REPO / "examples" / "count_per_key.sql"
MAX_30S = REPO / "examples" / "max_per_key_30s.sql"
# The screenshot goes to the test's own directory; HOTSWAP_UPDATE_SCREENSHOT=1 writes docs/dashboard.png instead
# (so a test run never changes a tracked file unless asked).
DOCS_SCREENSHOT = REPO / "docs" / "dashboard.png"
T0 = 1_700_000_000_000
# Chromium as root on this machine: no sandbox, and nothing that phones home (refused connections
# otherwise fill its output and slow it down).
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
POISON = """
SELECT window.start AS window_start, window.end AS window_end, key,
       count(CASE WHEN value >= 0 THEN raise_error('poison row') END) AS n
FROM events
GROUP BY window(event_time, '10 seconds'), key
"""
WRAPPERS = ("Python Proxy", "Py4J", "py4j", "Traceback", "An error occurred while calling")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    assert binary, "Chromium is missing: `apt-get install chromium` (make test installs it)"
    with tempfile.TemporaryDirectory(prefix="hotswap-chromium-") as profile:
        return subprocess.run(
            [binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", *args],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )


def dashboard_dom(url: str) -> str:
    return chromium("--virtual-time-budget=3000", "--dump-dom", url).stdout


def metrics(url: str) -> dict[str, float]:
    """The exposition as {'name{labels}': value}."""
    with urllib.request.urlopen(f"{url}metrics", timeout=10) as response:  # noqa: S310 - our own http URL
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def test_a_swap_shows_in_the_live_view_metrics_dashboard_and_history_and_prints_no_error(
    settings: Settings, control: redis.Redis, client: Client, tmp_path: Path
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    screenshot = DOCS_SCREENSHOT if os.environ.get("HOTSWAP_UPDATE_SCREENSHOT") == "1" else tmp_path / "dashboard.png"
    # No restart: the poisoned query below fails for good at its first live row, while its swap drains, so the
    # swap is stranded. With a restart, the swap could complete during the back-off, before the query gave up.
    env = {"HOTSWAP_LOG_FORMAT": "console", "HOTSWAP_QUERY_RESTARTS": "0", "HOTSWAP_QUERY_RESTART_BACKOFF": "1s"}
    executor = ExecutorProcess(settings, COUNT_10S, tmp_path / "logs", args=("--metrics-port", str(port)), env=env)
    watch_out = (tmp_path / "watch.txt").open("w")
    watch = subprocess.Popen(
        [sys.executable, "-m", "hotswap", "status", "--watch", "--interval", "0.5"],
        env=settings_env(settings),
        stdout=watch_out,
        stderr=subprocess.STDOUT,
        cwd=REPO,
    )
    spec = GeneratorSpec(rate=300, keys=3, seed=20, disorder_ms=300, time_scale=10, start_ts=T0)
    after_poison: int | None = None  # where the executor's console stood once the poisoned query had failed
    try:
        with continuous_load(settings, spec):
            executor.wait_serving(control, Keys(settings.namespace))
            wait_until(lambda: committed_watermark(client, "count_per_key") > T0 + 10_000, 120, "first windows")

            # A dry run answers with the plan and changes nothing.
            graphs_before = client.graph_records()
            dry = run_cli(settings, "submit", str(MAX_30S), "--dry-run", "--json")
            assert dry.returncode == 0, dry.stderr
            plan = json.loads(dry.stdout)
            assert plan["valid"] is True
            assert (plan["window_ms"], plan["group_columns"], plan["replaces"]) == (30_000, ["key"], "count_per_key")
            assert plan["cut_window_end"] % 30_000 == 0
            assert plan["floor"] == plan["cut_window_end"] + settings.lateness.ms
            assert plan["ahead"] == []
            assert "event_time TIMESTAMP" in plan["schema_ddl"]
            assert client.journal.all() == []
            assert client.graph_records() == graphs_before

            # The swap, followed on /metrics and in the dashboard while it runs.
            swap = client.submit(MAX_30S)
            active: set[str] = set()
            seen_mid_swap = False
            while not client.journal.get(swap.id).state.is_terminal:
                sample = metrics(url)
                active |= {p for p in PHASES if sample.get(f'hotswap_swap_phase{{phase="{p}"}}') == 1.0}
                state = client.journal.get(swap.id).state
                if not seen_mid_swap and state.is_draining:
                    # During the swap: the page shows the phases so far, and W (the README's screenshot).
                    shown = [p.name for p in client.journal.get(swap.id).phases]
                    dom = dashboard_dom(url)
                    assert all(f">{name}<" in dom for name in shown), dom
                    assert "W = " in dom
                    chromium("--window-size=1400,1100", "--virtual-time-budget=3000", f"--screenshot={screenshot}", url)
                    seen_mid_swap = True
                time.sleep(0.3)
            done = client.wait_until_done(swap.id, 10)
            assert seen_mid_swap
            assert active, "the swap's phase never showed on /metrics"

            # A scrape shares the endpoint's snapshot of the last half second: wait for the one after the end.
            def after_the_end() -> dict[str, float] | None:
                scraped = metrics(url)
                return scraped if scraped.get('hotswap_swaps_total{outcome="completed"}') == 1.0 else None

            final = wait_until(after_the_end, 10, "the completed swap on /metrics")
            assert final is not None
            sample = final
            for phase in PHASES:
                assert sample[f'hotswap_swap_phase_transitions_total{{phase="{phase}"}}'] == 1.0, phase
            for phase in PHASES[:-1]:
                assert sample[f'hotswap_swap_phase_duration_seconds_count{{phase="{phase}"}}'] == 1.0, phase
            assert sample['hotswap_swaps_total{outcome="completed"}'] == 1.0
            assert sample["hotswap_lease_renewals_total"] >= 1
            assert sample['hotswap_microbatch_duration_seconds_count{query="service"}'] >= 1
            assert sample["hotswap_results_written_total"] > 0

            dom = dashboard_dom(url)
            for phase in PHASES:
                assert f">{phase}<" in dom, phase
            assert "W = " in dom
            assert "max_per_key_30s" in dom
            assert "value DOUBLE" in dom  # the schema the current version reads
            assert screenshot.stat().st_size > 10_000

            history = run_cli(settings, "history", "--json")
            assert history.returncode == 0, history.stderr
            [entry] = json.loads(history.stdout)
            assert (entry["id"], entry["state"], entry["cut_window_end"]) == (swap.id, "completed", done.cut_window_end)
            assert [p["name"] for p in entry["phases"]] == PHASES
            assert all(p["seconds"] is not None for p in entry["phases"][:-1])

            # A planned swap printed no error on the executor's console.
            console = executor.log_path.read_text(errors="replace")
            for noise in ("Traceback", " ERROR ", "Exception"):
                assert noise not in console, f"{noise!r} in the executor's console:\n{console[-4000:]}"

            # A query that fails on a live row (so after its cut: the swap is stranded): its own message,
            # in one line, everywhere. A closing graph computes a window only once it closes, after its swap
            # completed, so there it fails as the serving query (test_recovery.py covers that on each engine).
            if settings.graph_engine is GraphEngine.STATEFUL:
                poison = tmp_path / "poisoned.sql"
                poison.write_text(POISON)
                failing = client.submit(poison)
                failed = client.wait_for(failing.id, lambda r: r.state.is_settled, 180, "stranded")
                assert (failed.state, failed.reason_code) == (SwapPhase.STRANDED, ReasonCode.QUERY_FAILED_AFTER_CUT)
                assert failed.error is not None
                assert "[USER_RAISED_EXCEPTION] poison row" in failed.error
                assert "\n" not in failed.error
                assert not any(w in failed.error for w in WRAPPERS), failed.error
                table = run_cli(settings, "status").stdout.splitlines()
                assert f"swap {failing.id} {failed.state}: {failed.error} [{failed.reason_code}]" in table
                listed = json.loads(run_cli(settings, "history", "--json", "--limit", "1").stdout)
                assert listed[0]["id"] == failing.id
                assert "[USER_RAISED_EXCEPTION] poison row" in listed[0]["error"]
                console = executor.log_path.read_text(errors="replace")
                logged = [line for line in console.splitlines() if "poison row" in line]
                assert any("execution graph failed" in line for line in logged), logged
                for wrapper in ("Python Proxy", "Traceback"):
                    assert wrapper not in console, f"{wrapper!r} on the executor's console:\n{console[-4000:]}"
                # Spark's own lines for that failure, with their stack traces, are kept whole in a file.
                assert "poison row" in (settings.home / "logs" / "spark.log").read_text(errors="replace")
            after_poison = len(executor.log_path.read_bytes())
    finally:
        watch.send_signal(signal.SIGINT)
        watch_rc = watch.wait(timeout=30)
        watch_out.close()
        executor.stop()
    # Stopping the executor (its queries, the retired graphs' writers, Spark) printed no error either.
    assert after_poison is not None
    shutdown = executor.log_path.read_bytes()[after_poison:].decode(errors="replace")
    for noise in ("Traceback", " ERROR ", "Exception"):
        assert noise not in shutdown, f"{noise!r} while the executor stopped:\n{shutdown[-4000:]}"
    frames = (tmp_path / "watch.txt").read_text()
    assert watch_rc == 0, frames[-3000:]
    assert "Traceback" not in frames
    for phase in PHASES:
        assert phase in frames, phase
    assert "W = " in frames
