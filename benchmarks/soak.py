"""The soak (`make soak`, not part of `make test`): hotswap under steady load for SOAK_MINUTES
(default 30), with a swap every 60-90 s and faults injected at random moments, then every window
recomputed from the source topic.

- Load: the generator at a steady rate (event time = wall time, bounded disorder).
- Swaps cycle through queries that change the logic, the columns, the window size, and tumbling versus
  sliding windows; every fifth is a query that fails on every row (a poison row), submitted with
  `--auto-rollback`, so the executor rolls it back itself; every seventh runs as a shadow first and is
  promoted.
- Faults, one at a random moment of every swap, in turn: SIGKILL of the executor (restarted as a
  supervisor would), SIGSTOP of the executor past its lease with a second executor taking over, a
  broker restart, a Redis restart.
- Sampled every 10 s: each process's RSS, open files and threads; the namespace's Redis keys, its Kafka
  topics, its checkpoint bytes.
- At the end: the source topic recomputed by the test oracle (tests/integration/oracle.py), counted as
  missing, duplicate and mismatched results; every swap must have ended.

Writes bench/results/soak-<stamp>.json and .png; exits 1 if a result is wrong or a swap never ended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from random import Random
from typing import Any

from kafka import KafkaAdminClient

from benchmarks.common import RESULTS_DIR
from hotswap.contract.journal import Journal, SwapPhase, SwapRecord
from hotswap.contract.names import Keys
from hotswap.contract.settings import Settings
from hotswap.executor.operator.client import Client, redis_client
from hotswap.executor.stack import EmbeddedStack
from hotswap.executor.tools.generator import GeneratorSpec
from hotswap.service_sink.audit import Result, read_results
from tests.conftest import wait_until
from tests.integration.harness import JARS, REPO, ExecutorProcess, Load, fails_on_rows, namespace_settings
from tests.integration.oracle import (
    Aggregate,
    SourceEvent,
    Version,
    close_enough,
    count_and_total,
    expected_groups,
    mean_and_n,
    owner_of,
    peak_and_low,
    same_result,
    settle,
)

HOME = REPO / ".hotswap" / "soak"
# When faults come and swaps go: seeded, so a run can be repeated (SOAK_SEED).
CHANCE = Random(int(os.environ.get("SOAK_SEED", "7")))  # noqa: S311 - timing, not secrets
EXAMPLES = REPO / "examples"
# The swaps' queries, in turn: (file, the oracle's aggregate). 10 s -> 30 s -> 10 s in Python (other
# columns) -> 10 s -> sliding 30/10 s: each cuts against the one before. The fifth swap of each round
# is the poison query, so its automatic rollback goes back to a sliding query in the first minutes.
CYCLE: list[tuple[Path, Aggregate]] = [
    (EXAMPLES / "max_per_key_30s.sql", peak_and_low),
    (EXAMPLES / "average_per_key.py", mean_and_n),
    (EXAMPLES / "count_per_key.sql", count_and_total),
    (EXAMPLES / "count_per_key_30s_every_10s.sql", count_and_total),
]
FIRST = (EXAMPLES / "count_per_key.sql", count_and_total)
POISON_EVERY = 5  # every fifth swap is a poison query with --auto-rollback
SHADOW_EVERY = 7  # every seventh runs as a shadow, then is promoted
FAULTS = ("kill_executor", "stall_executor", "restart_broker", "restart_redis")
SAMPLE_EVERY_S = 10.0
LEASE_TTL_S = 6.0
JOURNAL_RETENTION = 5  # ended swaps kept: the soak keeps its own copy of every swap for the oracle


@dataclass
class Soak:
    settings: Settings
    stack: EmbeddedStack
    log_dir: Path
    executor: ExecutorProcess | None = None
    load: Load | None = None
    faults: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    aggregates: dict[str, Aggregate] = field(default_factory=dict)  # query id -> its oracle
    # Every swap as last seen: the journal forgets old ones (journal_retention), the oracle needs all.
    swaps: dict[str, SwapRecord] = field(default_factory=dict)
    began: float = field(default_factory=time.monotonic)
    last_sample: float = 0.0

    # -- the executor and the load -----------------------------------------------------------
    def start_executor(self) -> ExecutorProcess:
        env = {
            "HOTSWAP_QUERY_RESTARTS": "1",
            "HOTSWAP_QUERY_RESTART_BACKOFF": "1s",
            "HOTSWAP_AUTO_ROLLBACK": "false",
            "HOTSWAP_LEASE_TTL": f"{LEASE_TTL_S:.0f}s",
            "HOTSWAP_REDIS_MAY_LOSE_WRITES": "false",
            # Small, so that the run shows the journal, graph records, checkpoints and topics level off.
            "HOTSWAP_JOURNAL_RETENTION": str(JOURNAL_RETENTION),
        }
        process = ExecutorProcess(self.settings, FIRST[0], self.log_dir, env=env)
        with redis_client(self.settings.control) as control:
            process.wait_serving(control, Keys(self.settings.namespace), timeout_s=240)
        return process

    def keep_loading(self) -> None:
        if self.load is None or not self.load._thread.is_alive():
            spec = GeneratorSpec(rate=200, keys=6, disorder_ms=400, time_scale=1.0)
            self.load = Load(self.settings, spec).start()

    # -- faults ------------------------------------------------------------------------------
    def inject(self, fault: str) -> None:
        at = round(time.monotonic() - self.began, 1)
        began = time.monotonic()
        entry: dict[str, Any] = {"fault": fault, "at_s": at}
        assert self.executor is not None
        if fault == "kill_executor":
            self.executor.process.send_signal(signal.SIGKILL)
            self.executor.wait_exit(60)
            self.executor.stop()
            self.executor = self.start_executor()
        elif fault == "stall_executor":
            stalled = self.executor
            stalled.process.send_signal(signal.SIGSTOP)
            time.sleep(LEASE_TTL_S + 2)  # past its lease: nothing to poll for, the point is the pause
            self.executor = self.start_executor()  # takes the expired lease
            stalled.process.send_signal(signal.SIGCONT)
            entry["stalled_exit_code"] = stalled.wait_exit(120)  # it wakes without its lease and stops
            stalled.stop()
        else:
            self.restart_service("kafka" if fault == "restart_broker" else "redis")
        self.faults.append({**entry, "took_s": round(time.monotonic() - began, 1)})
        print(f"[{at:7.1f}s] fault {fault} ({self.faults[-1]['took_s']} s)", flush=True)

    def restart_service(self, name: str) -> None:
        pid = next(s.pid for s in self.stack.status() if s.name == name)
        assert pid is not None
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), 120, f"{name} to exit")
        self.stack.up()

    # -- swaps -------------------------------------------------------------------------------
    def swap(self, number: int, client: Client, fault: str | None) -> SwapRecord | None:
        """Submit the next swap; inject `fault` at a random moment while it runs; wait for its end."""
        poison = number % POISON_EVERY == POISON_EVERY - 1
        aggregate: Aggregate
        if poison:
            path, aggregate, name = fails_on_rows(self.log_dir, f"poison_{number}"), count_and_total, f"poison_{number}"
        else:
            path, aggregate = CYCLE[number % len(CYCLE)]
            name = f"{path.stem}_{number}"
        self.aggregates[name] = aggregate
        shadow = not poison and number % SHADOW_EVERY == SHADOW_EVERY - 1
        record = self.until_served(lambda: client.submit(path, name, auto_rollback=poison, shadow=shadow), "submit")
        if poison:
            at = round(time.monotonic() - self.began, 1)
            self.faults.append({"fault": "poison_row", "at_s": at, "took_s": 0.0})
        if shadow:
            client.wait_for(
                record.id, lambda r: r.state is SwapPhase.SHADOWING or r.state.is_terminal, 300, "shadowing"
            )
            self.wait_sampling(20.0)  # it runs beside the current query for a while
            self.until_served(lambda: client.promote(record.id), "promote")
        if fault is not None:
            self.wait_sampling(CHANCE.uniform(0.0, 15.0))
            self.inject(fault)
        end = time.monotonic() + 300
        while time.monotonic() < end:
            swap = client.journal.get(record.id)
            if swap.state.is_terminal:
                break
            self.wait_sampling(1.0)
        swap = client.journal.get(record.id)
        print(f"[{time.monotonic() - self.began:7.1f}s] swap {number} {name}: {swap.state}", flush=True)
        return swap

    def until_served(self, call: Callable[[], SwapRecord], what: str) -> SwapRecord:
        """`call`, retried while the executor restarts (no lease for a moment)."""
        deadline = time.monotonic() + 180
        while True:
            try:
                return call()
            except Exception as exc:  # retried until the deadline, then raised
                if time.monotonic() > deadline:
                    raise
                print(f"  {what} retried: {exc}", flush=True)
                self.wait_sampling(3.0)

    # -- sampling ----------------------------------------------------------------------------
    def wait_sampling(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while True:
            now = time.monotonic()
            if now - self.last_sample >= SAMPLE_EVERY_S:
                self.last_sample = now
                self.sample()
                self.keep_loading()
            if now >= end:
                return
            time.sleep(min(0.5, end - now))

    def sample(self) -> None:
        pids: dict[str, int] = {s.name: s.pid for s in self.stack.status() if s.pid is not None}
        if self.executor is not None and self.executor.process.poll() is None:
            pids["executor"] = self.executor.process.pid
            jvm = _children(self.executor.process.pid, "java")
            if jvm is not None:
                pids["spark_jvm"] = jvm
        processes = {name: _process(pid) for name, pid in pids.items()}
        root = Path(self.settings.names.checkpoint_root)
        prefix = f"hotswap.{self.settings.namespace}."
        try:
            with redis_client(self.settings.control) as control:
                keys = sum(1 for _ in control.scan_iter(match=f"{Keys(self.settings.namespace).prefix}:*", count=500))
                self.keep_swaps(Journal(control, Keys(self.settings.namespace)).all())
            admin = KafkaAdminClient(**self.settings.kafka_python_config())
            try:
                topics = sum(1 for t in admin.list_topics() if t.startswith(prefix))
            finally:
                admin.close()
        except Exception as exc:  # noqa: BLE001 - a fault is under way: this sample has no counts
            keys = topics = -1
            print(f"  sample without counts: {type(exc).__name__}", flush=True)
        self.samples.append(
            {
                "at_s": round(time.monotonic() - self.began, 1),
                "processes": processes,
                "redis_keys": keys,
                "kafka_topics": topics,
                # The service graph's checkpoint keeps every batch's offsets in this run (the oracle
                # reads them), so the graphs' checkpoints are measured apart from it.
                "graph_checkpoint_bytes": _bytes(root) - _bytes(Path(self.settings.names.service_checkpoint)),
                "service_checkpoint_bytes": _bytes(Path(self.settings.names.service_checkpoint)),
            }
        )

    def keep_swaps(self, swaps: list[SwapRecord]) -> None:
        for swap in swaps:
            self.swaps[swap.id] = swap


def _zombie(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().split()[2] == "Z"


def _children(pid: int, name: str) -> int | None:
    out = subprocess.run(["pgrep", "-P", str(pid), name], capture_output=True, text=True, check=False).stdout.split()
    return int(out[0]) if out else None


def _process(pid: int) -> dict[str, float] | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "rss_mb": round(int(fields["VmRSS"].split()[0]) / 1024, 1),
        "open_files": fds,
        "threads": int(fields["Threads"]),
    }


def _bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.exists() else 0


# -- the verdict ----------------------------------------------------------------------------------
def count_wrong(
    results: list[Result], events: list[SourceEvent], versions: list[Version], cuts: list[int], closed_until: int
) -> dict[str, Any]:
    """The oracle's invariants, counted instead of asserted: results owned by the wrong version,
    duplicates (a second, different result for a (window, group)), missing and mismatched results."""
    seen: dict[tuple[int, int, str], Result] = {}
    misowned = duplicate = 0
    for r in results:
        owner = versions[owner_of(versions, cuts, r.window_end)]
        if r.query_id != owner.query_id or r.window_end - r.window_start != owner.window_ms:
            misowned += 1
            continue
        identity = (r.window_start, r.window_end, owner.group_of(r.row))
        if identity in seen and not same_result(seen[identity], r):
            duplicate += 1
            continue
        seen[identity] = r
    answered: dict[tuple[int, int], dict[str, dict[str, Any]]] = defaultdict(dict)
    for (start, end, group), r in seen.items():
        answered[(start, end)][group] = r.row
    missing = mismatched = 0
    first: list[str] = []
    for window, (_, groups) in sorted(expected_groups(events, versions, cuts, closed_until).items()):
        got = answered.get(window, {})
        for group, values in groups.items():
            if group not in got:
                missing += 1
                first.append(f"missing {window} {group}")
            elif not all(close_enough(float(got[group][k]), v) for k, v in values.items()):
                mismatched += 1
                first.append(f"mismatched {window} {group}")
    return {
        "results": len(results),
        "misowned": misowned,
        "duplicate": duplicate,
        "missing": missing,
        "mismatched": mismatched,
        "first_problems": first[:10],
    }


def verdict(soak: Soak, client: Client) -> dict[str, Any]:
    truth = settle(soak.settings, lambda: _final_watermark(client), timeout_s=600)
    soak.keep_swaps(client.journal.all())
    swaps = sorted(soak.swaps.values(), key=lambda s: s.phases[0].at if s.phases else 0)
    done = sorted((s for s in swaps if s.state.is_done), key=lambda s: int(s.cut_window_end or 0))
    first = FIRST[0].stem
    versions = [Version(first, 10_000, FIRST[1])]
    cuts: list[int] = []
    for swap in done:
        window = int(swap.new_window_ms or 10_000)
        slide = swap.new_slide_ms if swap.new_slide_ms and swap.new_slide_ms != window else None
        aggregate = soak.aggregates.get(swap.to_query) or _aggregate_of(swap, soak.aggregates)
        versions.append(Version(swap.to_query, window, aggregate, slide_ms=slide))
        cuts.append(truth.cut(swap))
    counts = count_wrong(
        read_results(soak.settings.kafka, soak.settings.sink_topic), truth.on_time, versions, cuts, truth.closed_until
    )
    states: dict[str, int] = defaultdict(int)
    for swap in swaps:
        states[str(swap.state)] += 1
    return {
        **counts,
        "swaps_attempted": sum(1 for s in swaps if s.rollback_of is None),
        "swaps_completed": sum(1 for s in swaps if s.state in (SwapPhase.COMPLETED, SwapPhase.ROLLED_BACK)),
        "automatic_rollbacks": sum(1 for s in swaps if s.rollback_of is not None and s.state.is_done),
        "swap_states": dict(states),
        "every_swap_ended": all(s.state.is_terminal for s in swaps),
        "events": len(truth.on_time),
    }


def _aggregate_of(swap: SwapRecord, known: dict[str, Aggregate]) -> Aggregate:
    """A swap the executor queued itself (a rollback) runs the query of the one it rolls back to."""
    path = swap.source.path if swap.source else None
    stem = Path(path).stem if path else ""
    return next((aggregate for name, aggregate in known.items() if name.startswith(stem)), count_and_total)


def _final_watermark(client: Client) -> int:
    status = client.status()
    current = status.current.query_id if status.current else None
    graph = status.graphs.get(current or "")
    progress = graph.progress if graph else None
    return (progress.committed_watermark or 0) if progress else 0


def main() -> int:
    minutes = float(os.environ.get("SOAK_MINUTES", "30"))
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    base = Settings(home=HOME, jars_dir=JARS, kafka_port=29092, kafka_controller_port=29093, redis_port=26379)
    stack = EmbeddedStack(base.stack, base.kafka)
    stack.up(timeout_s=180)
    settings = namespace_settings(HOME / stamp, base.bootstrap, base.redis_dsn, "soak")
    soak = Soak(settings, stack, HOME / stamp / "logs")
    soak.aggregates[FIRST[0].stem] = FIRST[1]
    report: dict[str, Any] = {"started": stamp, "minutes": minutes, "machine": {"nproc": os.cpu_count()}}
    client = Client(settings.control, settings.kafka, settings.pipeline)
    try:
        soak.keep_loading()
        soak.executor = soak.start_executor()
        number = 0
        while time.monotonic() - soak.began < minutes * 60:
            began = time.monotonic()
            fault = FAULTS[number % len(FAULTS)]
            soak.swap(number, client, fault)
            number += 1
            # One swap every 60-90 s, from the start of one to the next (at once if it took longer).
            soak.wait_sampling(max(0.0, CHANCE.uniform(60.0, 90.0) - (time.monotonic() - began)))
        assert soak.load is not None
        soak.load.stop()
        report["verdict"] = verdict(soak, client)
    finally:
        report["faults"] = soak.faults
        report["samples"] = soak.samples
        if soak.executor is not None:
            soak.executor.stop()
        if soak.load is not None:
            soak.load.stop()
        stack.down()
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        path = RESULTS_DIR / f"soak-{stamp}.json"
        path.write_text(json.dumps(report, indent=2))
        _plot(report, RESULTS_DIR / f"soak-{stamp}.png")
        print(f"wrote {path}", flush=True)
    result = report["verdict"]
    print(json.dumps({k: v for k, v in result.items() if k != "first_problems"}, indent=2))
    wrong = result["missing"] + result["duplicate"] + result["mismatched"] + result["misowned"]
    return 0 if wrong == 0 and result["every_swap_ended"] else 1


def _plot(report: dict[str, Any], path: Path) -> None:
    """RSS per process, Redis keys, Kafka topics and checkpoint bytes over the run, faults marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = report["samples"]
    if not samples:
        return
    at = [s["at_s"] / 60 for s in samples]
    fig, axes = plt.subplots(5, 1, figsize=(10, 13), sharex=True)
    names = sorted({name for s in samples for name in s["processes"]})
    for name in names:
        rss = [(s["processes"].get(name) or {}).get("rss_mb") for s in samples]
        axes[0].plot(at, rss, label=name)
    axes[0].set_ylabel("RSS (MB)")
    axes[0].legend(fontsize=7)
    for ax, key, label in (
        (axes[1], "redis_keys", "Redis keys"),
        (axes[2], "kafka_topics", "Kafka topics"),
        (axes[3], "graph_checkpoint_bytes", "graphs' checkpoints (bytes)"),
        (axes[4], "service_checkpoint_bytes", "service checkpoint (bytes,\nevery batch kept for the oracle)"),
    ):
        ax.plot(at, [s[key] if s[key] >= 0 else None for s in samples])
        ax.set_ylabel(label)
    for fault in report["faults"]:
        for ax in axes:
            ax.axvline(fault["at_s"] / 60, color="red", alpha=0.3, linewidth=0.8)
    axes[4].set_xlabel("minutes (red: a fault)")
    fig.tight_layout()
    fig.savefig(path, dpi=90)


if __name__ == "__main__":
    sys.exit(main())
