"""Peak resident memory per process and per phase, sampled in a background thread.

Three processes: this one (the executor and the PySpark driver side), the Spark driver JVM (our
child `java`), and the embedded Kafka broker (its pid from the stack's status). Sections name the
phase they are in (`sampler.phase = "swap"`); each sample is charged to the current phase.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

import psutil

MB = 1024 * 1024


class MemorySampler:
    def __init__(self, kafka_pid: int | None, every_s: float = 0.5) -> None:
        self.phase = "start"
        self.kafka_pid = kafka_pid
        self.every_s = every_s
        self.peaks: dict[str, dict[str, float]] = {}  # phase -> process -> peak MB
        self.series: list[tuple[float, str, float]] = []  # (time, process, MB), for the record
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._me = psutil.Process(os.getpid())

    def start(self) -> MemorySampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _processes(self) -> dict[str, psutil.Process]:
        found = {"bench_python": self._me}
        # The Spark driver JVM is a child of this process (pyspark launches it); the broker may be
        # one too (the stack starts it), so it is told apart by pid.
        for child in self._me.children(recursive=True):
            try:
                if child.pid != self.kafka_pid and "java" in child.name():
                    found["spark_jvm"] = child
            except psutil.Error:
                continue
        if self.kafka_pid is not None:
            with contextlib.suppress(psutil.Error):
                found["kafka_broker"] = psutil.Process(self.kafka_pid)
        return found

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            phase = self.peaks.setdefault(self.phase, {})
            now = time.time()
            for name, proc in self._processes().items():
                try:
                    mb = proc.memory_info().rss / MB
                except psutil.Error:
                    continue
                phase[name] = max(phase.get(name, 0.0), round(mb, 1))
                self.series.append((now, name, round(mb, 1)))

    def summary(self) -> dict[str, object]:
        """Peaks per phase, and whether memory stayed flat: no process's peak under extra load (the
        swap at twice the rate, the backlog catch-up) above 1.25x its peak at the normal rate once
        warmed up (after the first swap: before it, the JVMs are still growing their heaps toward
        their caps, which is start-up, not load)."""
        baseline = self.peaks.get("after_swap") or self.peaks.get("steady", {})
        growth: dict[str, float] = {}
        for phase in ("swap_at_2x_rate", "throughput_hotswap", "backlog_1m_catch_up"):
            for name, mb in self.peaks.get(phase, {}).items():
                if baseline.get(name):
                    growth[name] = max(growth.get(name, 0.0), round(mb / baseline[name], 2))
        return {
            "peak_rss_mb": self.peaks,
            "baseline_phase": "after_swap" if "after_swap" in self.peaks else "steady",
            "peak_over_baseline": growth,
            "flat": bool(growth) and all(g <= 1.25 for g in growth.values()),
        }
