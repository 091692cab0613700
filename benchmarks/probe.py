"""The benchmark's helpers that must not share the GIL with the executor: the event generator, the
results watcher and the resource sampler each run in a child process of their own.

`python -m benchmarks.probe ROLE` reads one JSON line of configuration on stdin, answers
`{"ready": true}`, then answers each command line with exactly one JSON line. End of stdin stops it,
so a benchmark that dies leaves none of them behind. This module imports neither PySpark nor
hotswap: a child starts in well under a second and stays small.

- `load`: events `{key, value, ts}` with event time = wall time (minus up to `disorder_ms`), paced
  at a rate the parent can change (`rate R`); `count` says how many were sent so far.
- `watch`: tails a results topic from its start; `windows` summarises each window seen (first and
  last Kafka timestamp, results, events counted), `stop` reads to the end and returns every result.
- `sample`: every `every_s`, resident memory and cumulative CPU seconds of named processes; also the
  whole machine's busy CPU seconds (`machine`) and the benchmark's own (`bench_tree`: its process,
  every descendant, the ones that exited, and the stack's services), so the report can say how much
  of the machine other work took during the run.

The parent side (`Probe` and its typed wrappers) runs in the benchmark's own process.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import selectors
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MB = 1024 * 1024


def _now_ms() -> int:
    return int(time.time() * 1000)


# ---------------------------------------------------------------------------------------------
# Parent side
# ---------------------------------------------------------------------------------------------


class ProbeFailed(RuntimeError):
    """A probe process died or did not answer in time."""


class Probe:
    """One child process and its line protocol."""

    def __init__(self, role: str, config: dict[str, Any], start_timeout_s: float = 60.0) -> None:
        self.role = role
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.probe", role],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=str(REPO),
            text=True,
            bufsize=1,
        )
        self._lock = threading.Lock()
        self._write(json.dumps(config))
        self._read(start_timeout_s)  # {"ready": true}

    @property
    def pid(self) -> int:
        return self._proc.pid

    def ask(self, command: str, timeout_s: float = 60.0) -> dict[str, Any]:
        with self._lock:
            self._write(command)
            return self._read(timeout_s)

    def close(self, command: str = "stop", timeout_s: float = 120.0) -> dict[str, Any]:
        """Send the final command, return its answer, and make sure the process is gone."""
        try:
            return self.ask(command, timeout_s) if self._proc.poll() is None else {}
        finally:
            self.kill()

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            if self._proc.stdin is not None:
                self._proc.stdin.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait(timeout=10)

    def _write(self, line: str) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(line + "\n")
            self._proc.stdin.flush()
        except OSError as exc:
            raise ProbeFailed(f"probe {self.role} is gone (exit code {self._proc.poll()})") from exc

    def _read(self, timeout_s: float) -> dict[str, Any]:
        out = self._proc.stdout
        assert out is not None
        with selectors.DefaultSelector() as selector:
            selector.register(out, selectors.EVENT_READ)
            if not selector.select(timeout_s):
                raise ProbeFailed(f"probe {self.role} did not answer within {timeout_s:.0f}s")
        line = out.readline()
        if not line:
            raise ProbeFailed(f"probe {self.role} exited (code {self._proc.poll()}); its error is above")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise ProbeFailed(f"probe {self.role}: {answer['error']}")
        return answer


class LoadProcess:
    """The generator in its own process: `rate` events per second into `topic`."""

    def __init__(self, kafka: dict[str, Any], topic: str, rate: float, seed: int, keys: int, disorder_ms: int) -> None:
        self.rate = rate
        self.started_ms = _now_ms()
        self._probe = Probe(
            "load",
            {"kafka": kafka, "topic": topic, "rate": rate, "seed": seed, "keys": keys, "disorder_ms": disorder_ms},
        )

    def set_rate(self, rate: float) -> int:
        """Change the rate from now on; returns events sent before the change."""
        self.rate = rate
        return int(self._probe.ask(f"rate {rate}")["sent"])

    def sent(self) -> tuple[int, int]:
        """(events sent so far, at epoch ms)."""
        answer = self._probe.ask("count")
        return int(answer["sent"]), int(answer["at_ms"])

    def stop(self) -> int:
        return int(self._probe.close().get("sent", 0))


Emission = tuple[int, int, int, str, int]  # (Kafka timestamp ms, window_start, window_end, query_id, n)
WindowSeen = tuple[int, int, int, int, int, int]  # (start, end, first emit ms, last emit ms, results, n)


class ResultWatcher:
    """Tails a results topic in its own process; every side's progress is read from there."""

    def __init__(self, kafka: dict[str, Any], topic: str) -> None:
        self._probe = Probe("watch", {"kafka": kafka, "topic": topic})

    def windows(self) -> list[WindowSeen]:
        return [tuple(w) for w in self._probe.ask("windows")["windows"]]

    def stop(self) -> list[Emission]:
        """Every result in the topic (read to its end), ordered by Kafka timestamp."""
        rows = self._probe.close("stop", timeout_s=180)["results"]
        return sorted((int(a), int(b), int(c), str(d), int(e)) for a, b, c, d, e in rows)


class ResourceSampler:
    """Memory and CPU of the processes that do the work, sampled from outside them."""

    def __init__(self, pids: dict[str, int], tree_root: int, detached: list[int], every_s: float = 0.5) -> None:
        config = {"pids": pids, "every_s": every_s, "tree_root": tree_root, "detached": detached}
        self._probe = Probe("sample", config)

    def samples(self) -> list[tuple[int, str, float, float]]:
        """Every sample so far: (epoch ms, process, resident MB, cumulative CPU seconds)."""
        return [(int(t), str(n), float(m), float(c)) for t, n, m, c in self._probe.ask("samples")["samples"]]

    def stop(self) -> list[tuple[int, str, float, float]]:
        answer = self._probe.close()
        return [(int(t), str(n), float(m), float(c)) for t, n, m, c in answer.get("samples", [])]


# ---------------------------------------------------------------------------------------------
# Child side
# ---------------------------------------------------------------------------------------------


class _Load:
    def __init__(self, config: dict[str, Any]) -> None:
        from kafka import KafkaProducer

        self._producer = KafkaProducer(**config["kafka"], acks="all", linger_ms=5)
        # The generator stands in for producers on other machines: it must send at the rate asked
        # however busy Spark keeps the cores, so it runs ahead of them (when allowed). Its CPU is
        # never counted as the pipeline's.
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, -5)
        self._topic = str(config["topic"])
        self._keys = int(config["keys"])
        self._disorder = int(config["disorder_ms"])
        self._rng = random.Random(int(config["seed"]))  # noqa: S311 - seeded load, not secrets
        self._lock = threading.Lock()
        self._rate = float(config["rate"])
        self._step_began = time.monotonic()
        self._step_sent = 0
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        rng, topic, keys, disorder = self._rng, self._topic, self._keys, self._disorder
        while not self._stop.is_set():
            with self._lock:
                due = int((time.monotonic() - self._step_began) * self._rate) - self._step_sent
            if due <= 0:
                time.sleep(0.002)
                continue
            # Never more than 0.1 s worth at once: a stalled process catches up in steps, not a burst.
            for _ in range(min(due, max(1, int(self._rate / 10)))):
                key = f"k{rng.randrange(keys)}"
                ts = _now_ms() - (rng.randint(0, disorder) if disorder else 0)
                # The generator's JSON ({key, value, ts}), formatted directly: json.dumps per event
                # costs more than the rest of the loop, and at 8,000 ev/s the generator needs its CPU.
                value = f'{{"key": "{key}", "value": {round(rng.uniform(0, 100), 3)}, "ts": {ts}}}'.encode()
                self._producer.send(topic, key=key.encode(), value=value)
                with self._lock:
                    self._step_sent += 1
                    self.sent += 1

    def command(self, line: str) -> dict[str, Any]:
        if line.startswith("rate "):
            with self._lock:
                self._rate = float(line.split()[1])
                self._step_began, self._step_sent = time.monotonic(), 0
        elif line == "stop":
            self.close()
        with self._lock:
            return {"sent": self.sent, "at_ms": _now_ms()}

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._producer.flush(timeout=30)
        self._producer.close(timeout=10)


class _Watch:
    def __init__(self, config: dict[str, Any]) -> None:
        from kafka import KafkaConsumer, TopicPartition

        self._consumer = KafkaConsumer(**config["kafka"], enable_auto_commit=False)
        topic = str(config["topic"])
        deadline = time.monotonic() + 60
        while not (partitions := self._consumer.partitions_for_topic(topic)):
            if time.monotonic() > deadline:
                raise RuntimeError(f"results topic {topic} does not exist")
            time.sleep(0.2)
        self._parts = [TopicPartition(topic, p) for p in sorted(partitions)]
        self._consumer.assign(self._parts)
        self._consumer.seek_to_beginning(*self._parts)
        self._lock = threading.Lock()
        self.results: list[Emission] = []
        self.windows: dict[tuple[int, int], list[int]] = {}  # (start, end) -> [first, last, results, n]
        self._finish = threading.Event()
        self._done = threading.Event()
        self._error: str | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _take(self, records: list[Any]) -> None:
        batch: list[Emission] = []
        for record in records:
            row = json.loads(record.value)
            batch.append(
                (
                    int(record.timestamp),
                    int(row["window_start"]),
                    int(row["window_end"]),
                    str(row.get("query_id")),
                    int(row.get("n") or 0),
                )
            )
        with self._lock:
            self.results.extend(batch)
            for emit, start, end, _, n in batch:
                seen = self.windows.get((start, end))
                if seen is None:
                    self.windows[(start, end)] = [emit, emit, 1, n]
                else:
                    seen[0], seen[1] = min(seen[0], emit), max(seen[1], emit)
                    seen[2] += 1
                    seen[3] += n

    def _run(self) -> None:
        try:
            while not self._finish.is_set():
                for records in self._consumer.poll(timeout_ms=200).values():
                    self._take(records)
            # Read to the end the topic has now: the parent stopped the writers before asking.
            end = self._consumer.end_offsets(self._parts)
            deadline = time.monotonic() + 120
            while any(self._consumer.position(tp) < end[tp] for tp in self._parts):
                if time.monotonic() > deadline:
                    self._error = "results topic not read to its end within 120 s"
                    break
                for records in self._consumer.poll(timeout_ms=500).values():
                    self._take(records)
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which records it
            self._error = f"{type(exc).__name__}: {exc}"
        finally:
            self._done.set()

    def command(self, line: str) -> dict[str, Any]:
        if line == "windows":
            with self._lock:
                windows = [[s, e, *seen] for (s, e), seen in sorted(self.windows.items())]
            return {"windows": windows, "error": self._error} if self._error else {"windows": windows}
        if line == "stop":
            self.close()
            if self._error:
                return {"error": self._error}
            with self._lock:
                return {"results": self.results}
        return {"error": f"unknown command {line!r}"}

    def close(self) -> None:
        self._finish.set()
        self._done.wait(timeout=150)
        self._consumer.close()


class _Sample:
    def __init__(self, config: dict[str, Any]) -> None:
        import psutil

        self._psutil = psutil
        self._pids = {str(name): int(pid) for name, pid in config["pids"].items()}
        self._every = float(config["every_s"])
        self._root = psutil.Process(int(config["tree_root"]))
        self._detached = [int(pid) for pid in config["detached"]]
        self._lock = threading.Lock()
        self.samples: list[tuple[int, str, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _cpu(self, proc: Any, with_descendants: bool) -> float:
        times = proc.cpu_times()
        total = float(times.user + times.system)
        if with_descendants:
            for child in proc.children(recursive=True):
                with contextlib.suppress(self._psutil.Error):
                    child_times = child.cpu_times()
                    total += float(child_times.user + child_times.system)
        return total

    def _tree_cpu(self) -> float:
        """CPU seconds of the benchmark's process tree: the root (with its reaped children's, which the
        kernel adds to it), its live descendants, and the stack's detached services."""
        times = self._root.cpu_times()
        total = float(times.user + times.system + times.children_user + times.children_system)
        others = [*self._root.children(recursive=True)]
        for pid in self._detached:
            with contextlib.suppress(self._psutil.Error):
                others.append(self._psutil.Process(pid))
        for proc in others:
            with contextlib.suppress(self._psutil.Error):
                child = proc.cpu_times()
                total += float(child.user + child.system)
        return total

    def _machine_cpu(self) -> tuple[float, float]:
        """Busy CPU seconds of the whole machine, every core (all but idle, I/O wait and steal), and
        the seconds the hypervisor gave to other guests (steal): both are work that is not ours."""
        times = self._psutil.cpu_times()
        steal = float(getattr(times, "steal", 0.0))
        return float(sum(times) - times.idle - getattr(times, "iowait", 0.0)) - steal, steal

    def _run(self) -> None:
        procs: dict[str, Any] = {}
        while True:
            now = _now_ms()
            taken: list[tuple[int, str, float, float]] = []
            with contextlib.suppress(self._psutil.Error):
                busy, steal = self._machine_cpu()
                taken.append((now, "machine", 0.0, round(busy, 3)))
                taken.append((now, "steal", 0.0, round(steal, 3)))
                taken.append((now, "bench_tree", 0.0, round(self._tree_cpu(), 3)))
            for name, pid in self._pids.items():
                try:
                    proc = procs.get(name) or procs.setdefault(name, self._psutil.Process(pid))
                    # The Spark JVM's Python workers (user UDFs) are its children: their work is Spark's.
                    cpu = self._cpu(proc, with_descendants=name == "spark_jvm")
                    taken.append((now, name, round(proc.memory_info().rss / MB, 1), round(cpu, 3)))
                except self._psutil.Error:
                    continue
            with self._lock:
                self.samples.extend(taken)
            if self._stop.wait(self._every):
                return

    def command(self, line: str) -> dict[str, Any]:
        if line == "stop":
            self._stop.set()
            self._thread.join(timeout=10)
        if line in ("samples", "stop"):
            with self._lock:
                return {"samples": list(self.samples)}
        return {"error": f"unknown command {line!r}"}

    def close(self) -> None:
        self._stop.set()


ROLES: dict[str, Callable[[dict[str, Any]], Any]] = {"load": _Load, "watch": _Watch, "sample": _Sample}


def _answer(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload) + "\n")
    sys.stdout.flush()


def main() -> None:
    role = sys.argv[1]
    config = json.loads(sys.stdin.readline())
    try:
        worker = ROLES[role](config)
    except Exception as exc:  # noqa: BLE001 - the parent raises it with this text
        _answer({"error": f"{type(exc).__name__}: {exc}"})
        return
    _answer({"ready": True, "pid": os.getpid()})
    for raw in sys.stdin:
        line = raw.strip()
        try:
            _answer(worker.command(line))
        except Exception as exc:  # noqa: BLE001 - the parent raises it with this text
            _answer({"error": f"{type(exc).__name__}: {exc}"})
        if line == "stop":
            return
    worker.close()  # stdin closed: the benchmark is gone


if __name__ == "__main__":
    main()
