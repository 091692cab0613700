"""Memory and CPU of the processes that do the work, sampled from a process of its own.

Four processes: this one (the executor and the PySpark driver side: every foreachBatch runs here),
the Spark driver JVM (our child `java`; in local mode it also runs the tasks), the embedded Kafka
broker and Redis. The sampler (`probe.ResourceSampler`) records resident memory and cumulative CPU
seconds of each every 0.5 s; the benchmark names the phase it is in (`resources.phase("swap")`),
and each sample is charged to the phase that was current when it was taken.
"""

from __future__ import annotations

import bisect
import os
from typing import Any

import psutil

from benchmarks.measures import change_between
from benchmarks.probe import ResourceSampler
from hotswap.contract.models import now_ms

FLAT_LIMIT = 1.25
# Each engine's (the closing one's phases carry `_closing`); every process is shared by both, so
# both are judged against the one warmed-up baseline.
LOADED_PHASES = (
    "swap_at_2x_rate",
    "throughput_hotswap",
    "backlog_1m_catch_up",
    "swap_at_2x_rate_closing",
    "throughput_hotswap_closing",
    "backlog_1m_catch_up_closing",
)


def spark_jvm_pid(kafka_pid: int | None, redis_pid: int | None) -> int | None:
    """The Spark driver JVM: a `java` child of this process that is not the broker."""
    for child in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if child.pid not in (kafka_pid, redis_pid) and "java" in child.name():
                return child.pid
        except psutil.Error:
            continue
    return None


PSEUDO = ("machine", "steal", "bench_tree")  # sampled CPU totals that are not one process


class Resources:
    def __init__(self, pids: dict[str, int], detached: list[int]) -> None:
        self.pids = pids
        self._sampler = ResourceSampler(pids, os.getpid(), detached)
        self._phases: list[tuple[int, str]] = []  # (from epoch ms, phase)
        self._samples: list[tuple[int, str, float, float]] = []
        self.phase("start")

    def phase(self, name: str) -> None:
        self._phases.append((now_ms(), name))

    def refresh(self) -> None:
        """Fetch the samples taken so far (after a measured period, never during one)."""
        self._samples = self._sampler.samples()

    def stop(self) -> None:
        final = self._sampler.stop()
        if final:
            self._samples = final

    def span(self) -> tuple[int, int] | None:
        """The first and last moments sampled (the sampler stops between two samples)."""
        times = [t for t, name, _, _ in self._samples if name == "machine"]
        return (min(times), max(times)) if times else None

    def cpu_s(self, process: str, start_ms: int, end_ms: int) -> float | None:
        series = [(t, cpu) for t, name, _, cpu in self._samples if name == process]
        spent = change_between(series, start_ms, end_ms)
        return None if spent is None else round(spent, 3)

    def elsewhere(self, start_ms: int, end_ms: int) -> dict[str, float | None]:
        """How busy the machine was with work that is not the benchmark's, in cores, on average:
        other processes (`others_cores`) and other guests of the hypervisor (`steal_cores`). A run
        whose numbers moved while these were high measured the neighbours too."""
        seconds = (end_ms - start_ms) / 1000
        machine, tree = self.cpu_s("machine", start_ms, end_ms), self.cpu_s("bench_tree", start_ms, end_ms)
        steal = self.cpu_s("steal", start_ms, end_ms)
        if seconds <= 0:
            return {"others_cores": None, "steal_cores": None}
        return {
            "others_cores": None if machine is None or tree is None else round(max(0.0, machine - tree) / seconds, 2),
            "steal_cores": None if steal is None else round(steal / seconds, 2),
        }

    def _phase_at(self, t: int) -> str:
        starts = [at for at, _ in self._phases]
        i = bisect.bisect_right(starts, t) - 1
        return self._phases[i][1] if i >= 0 else "start"

    def peaks(self) -> dict[str, dict[str, float]]:
        peaks: dict[str, dict[str, float]] = {}
        for t, name, mb, _ in self._samples:
            if name in PSEUDO:
                continue
            phase = peaks.setdefault(self._phase_at(t), {})
            phase[name] = max(phase.get(name, 0.0), mb)
        return peaks

    def summary(self) -> dict[str, Any]:
        """Peaks per phase, and whether memory stayed flat: no process's peak under extra load (the
        swap at twice the rate, the throughput drain, the backlog catch-up, on either engine) above
        1.25x its peak at the normal rate once warmed up (after the stateful engine's first swap:
        before it, the JVMs are still growing their heaps toward their caps, which is start-up, not
        load)."""
        peaks = self.peaks()
        baseline = peaks.get("after_swap") or peaks.get("steady", {})
        growth: dict[str, float] = {}
        for phase in LOADED_PHASES:
            for name, mb in peaks.get(phase, {}).items():
                if baseline.get(name):
                    growth[name] = max(growth.get(name, 0.0), round(mb / baseline[name], 2))
        return {
            "peak_rss_mb": peaks,
            "baseline_phase": "after_swap" if "after_swap" in peaks else "steady",
            "peak_over_baseline": growth,
            "flat": bool(growth) and all(g <= FLAT_LIMIT for g in growth.values()),
        }
