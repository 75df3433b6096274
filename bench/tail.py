"""Where a lone request's tail goes: each c=1 request's window matched with the kernel's scheduler trace.

rtserve is started as ``make bench-quick`` starts it (:class:`bench.perf.RtServe`), warmed up
at one request at a time with ``wrk`` (``--warmup`` s: the frontend's JIT settles), then one
Python client sends ``--requests`` predictions one after another on one keep-alive connection
while ``perf sched record`` traces every context switch and wake-up on the machine (clock
``CLOCK_MONOTONIC``, the client's clock). Each request's window (send to last byte) is then
matched with the trace (``perf sched timehist``):

- **the chain's scheduling delay**: the time, inside the window, that a thread the request
  passes through was runnable but waited for a core (the wake-up to the switch-in), for each
  link: the client, the frontend's Netty event loops, the frontend's worker threads (``W-*``),
  the Python worker's main thread;
- **what else ran** inside the window, per thread kind (the frontend's JIT compiler and GC
  threads, the log appenders, the worker's other threads, other processes by name), summed
  over both cores;
- **the handler's own time** for that request (its record in the spool, by ``x-request-id``).

The slowest 1% of requests (at or above the p99) are compared with the middle half (p25 to
p75): what the slow ones have more of is what owns the tail. Output: a table on stdout and
JSON (default ``bench/results/tail.json``). Needs ``perf`` (root, or perf_event_paranoid <= -1
for the scheduler tracepoints).

    make bench-tail
    .venv/bin/python -m bench.tail --requests 5000 --warmup 10
"""

from __future__ import annotations

import bisect
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from urllib.parse import urlsplit

import psutil

from bench import common
from bench.perf import REQUEST, BenchError, RtServe, run_wrk
from rtserve.runtime.process import spawn, stop_process
from rtserve.server.properties import read_properties
from rtserve.server.torchserve import DEFAULT_CONFIG

#: A ``perf sched timehist`` line: time, [cpu], name[tid/pid] or name[tid], wait, sch delay, run (ms).
TIMEHIST = re.compile(
    r"^\s*(\d+\.\d+)\s+\[(\d+)\]\s+(.+?)\[(\d+)(?:/(\d+))?\]\s+"
    r"(\d+\.\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)\s*$"
)
#: The links of a request's chain (what the request waits on when they wait for a core).
CHAIN = ("client", "frontend Netty", "frontend W- threads", "worker main thread")


@dataclass
class Slice:
    """One run of one thread: it became runnable at ``woken``, ran from ``start`` to ``end`` (s)."""

    woken: float
    start: float
    end: float
    kind: str


@dataclass
class Window:
    """One request: its client-side window (s, CLOCK_MONOTONIC) and what the trace says of it."""

    start: float
    end: float
    request_id: str
    handler_ms: float | None = None
    delay_ms: dict = field(default_factory=dict)
    others_ms: dict = field(default_factory=dict)

    @property
    def ms(self) -> float:
        return (self.end - self.start) * 1000


def _norm(name: str) -> str:
    """A thread name without its numbers ("C2 CompilerThre", "GC Thread#", "W-")."""
    return re.sub(r"[\d]+", "", name).rstrip("-_#:. ") or name


def classify(frontend: int, workers: set[int], client: int):
    """``(tid, pid, name) -> kind``: a chain link (:data:`CHAIN`) or "<process> <thread kind>"."""

    def kind(tid: int, pid: int | None, name: str) -> str:
        pid = pid if pid is not None else tid
        if pid == client:
            return "client" if tid == client else f"client other ({_norm(name)})"
        if pid == frontend:
            if name.startswith("epollEventLoop") or name.startswith("nioEventLoop"):
                return "frontend Netty"
            if name.startswith("W-"):
                return "frontend W- threads"
            return f"frontend {_norm(name)}"
        if pid in workers:
            return "worker main thread" if tid == pid else f"worker thread {_norm(name)}"
        return f"other: {_norm(name)}"

    return kind


def read_trace(text: str, kind) -> list[Slice]:
    """The runs of ``perf sched timehist``'s output, sorted by start (a core's idle time, a line
    without a ``[tid]``, is nobody's)."""
    slices = []
    for line in text.splitlines():
        m = TIMEHIST.match(line)
        if not m:
            continue
        end, tid, pid = float(m.group(1)), int(m.group(4)), m.group(5)
        delay, run = float(m.group(7)) / 1000, float(m.group(8)) / 1000
        start = end - run
        slices.append(Slice(start - delay, start, end, kind(tid, int(pid) if pid else None, m.group(3))))
    slices.sort(key=lambda s: s.start)
    return slices


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def attribute(windows: list[Window], slices: list[Slice], longest_run: float) -> None:
    """Fill each window's chain delays and other threads' run time (ms) from ``slices``."""
    starts = [s.start for s in slices]
    for w in windows:
        # a run that overlaps the window started at most longest_run (+ its delay) before it
        lo = bisect.bisect_left(starts, w.start - longest_run - 0.5)
        hi = bisect.bisect_right(starts, w.end)
        delays: dict[str, float] = defaultdict(float)
        others: dict[str, float] = defaultdict(float)
        for s in slices[lo:hi]:
            if s.kind in CHAIN:
                delays[s.kind] += _overlap(s.woken, s.start, w.start, w.end) * 1000
            else:
                others[s.kind] += _overlap(s.start, s.end, w.start, w.end) * 1000
        w.delay_ms = dict(delays)
        w.others_ms = {k: v for k, v in others.items() if v > 0}


def summarize(windows: list[Window], label: str) -> dict:
    """Means over ``windows``: latency, handler, each chain link's delay, the others' run time."""
    n = len(windows)
    others: dict[str, float] = defaultdict(float)
    for w in windows:
        for k, v in w.others_ms.items():
            others[k] += v / n
    handlers = [w.handler_ms for w in windows if w.handler_ms is not None]
    return {
        "set": label,
        "requests": n,
        "latency_ms": round(mean(w.ms for w in windows), 3),
        "handler_ms": round(mean(handlers), 3) if handlers else None,
        "delay_ms": {k: round(mean(w.delay_ms.get(k, 0.0) for w in windows), 3) for k in CHAIN},
        "others_ms": {k: round(v, 3) for k, v in sorted(others.items(), key=lambda kv: -kv[1])},
    }


def lone_requests(url: str, token: str, count: int) -> list[Window]:
    """``count`` predictions one after another on one keep-alive connection."""
    parts = urlsplit(url)
    body = REQUEST.read_bytes()
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=10)
    out = []
    try:
        for _ in range(count):
            t0 = time.monotonic()
            conn.request("POST", parts.path, body=body, headers=headers)
            resp = conn.getresponse()
            resp.read()
            t1 = time.monotonic()
            if resp.status != 200:
                raise BenchError(f"a lone request answered {resp.status}")
            out.append(Window(t0, t1, resp.getheader("x-request-id") or ""))
    finally:
        conn.close()
    return out


def handler_ms(records: Path) -> dict[str, float]:
    """request id -> the handler's time (ms), from the records in the server's spool."""
    from rtserve.records.spool import lines_of

    out = {}
    for line in lines_of(records):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("request_id"):
            out[event["request_id"]] = event.get("handler_ms")
    return out


def table(report: dict) -> str:
    sets = report["sets"]
    rows = [
        f"{report['requests']} lone requests: p50 {report['p50_ms']:.3f} ms, p99 {report['p99_ms']:.3f} ms, "
        f"p99.9 {report['p999_ms']:.3f} ms (load average {report['load_before']} before)",
        f"{'mean per request, ms':<44}" + "".join(f"{s['set']:>16}" for s in sets),
    ]

    def row(name: str, values: list) -> None:
        rows.append(f"{name:<44}" + "".join(f"{'-' if v is None else f'{v:.3f}':>16}" for v in values))

    row("client latency", [s["latency_ms"] for s in sets])
    row("handler (its record)", [s["handler_ms"] for s in sets])
    for link in CHAIN:
        row(f"waited for a core: {link}", [s["delay_ms"][link] for s in sets])
    kinds = sorted(
        {k for s in sets for k in s["others_ms"]}, key=lambda k: -max(s["others_ms"].get(k, 0.0) for s in sets)
    )
    for k in kinds[:14]:
        row(f"ran meanwhile: {k}"[:44], [s["others_ms"].get(k, 0.0) for s in sets])
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__, "tail.json", attach=False, model=False)
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--warmup", type=float, default=10.0, help="seconds of wrk at c=1 first")
    p.add_argument(
        "--vmargs-extra", default="", help="JVM options added to the frontend's vmargs (e.g. -XX:TieredStopAtLevel=1)"
    )
    args = p.parse_args(argv)
    common.log_to_stdout()
    if shutil.which("perf") is None:
        raise SystemExit("bench.tail needs perf (apt-get install linux-perf)")
    overrides = None
    if args.vmargs_extra:
        overrides = {"vmargs": f"{read_properties(DEFAULT_CONFIG)['vmargs']} {args.vmargs_extra}"}
    server = RtServe(
        args.model_store, args.run_root / "tail", f"{common.MODEL}_{args.version}.mar", overrides=overrides
    )
    trace = args.run_root / "tail" / "sched.data"
    server.start()
    try:
        run_wrk(server.url, 1, args.warmup, server.token())
        frontend = server.pid()
        workers = {c.pid for c in psutil.Process(frontend).children(recursive=True)}
        load = [round(x, 2) for x in os.getloadavg()]
        perf = spawn(["perf", "sched", "record", "-k", "CLOCK_MONOTONIC", "-a", "-o", str(trace)], Path(os.devnull))
        time.sleep(1.0)
        try:
            windows = lone_requests(server.url, server.token(), args.requests)
        finally:
            stop_process(perf.pid, 30, signal.SIGINT)  # perf writes its trace out on SIGINT
        time.sleep(1.0)  # the records of the last batches
        ids = handler_ms(server.ts.files.records)
    finally:
        server.stop()
    text = subprocess.run(
        ["perf", "sched", "timehist", "-i", str(trace)], capture_output=True, text=True, check=True
    ).stdout
    trace.unlink(missing_ok=True)
    slices = read_trace(text, classify(frontend, workers, os.getpid()))
    longest = max((s.end - s.start for s in slices), default=0.0)
    for w in windows:
        w.handler_ms = ids.get(w.request_id)
    attribute(windows, slices, longest)
    by_ms = sorted(windows, key=lambda w: w.ms)
    n = len(by_ms)
    p99 = by_ms[int(n * 0.99)].ms
    report = {
        "requests": n,
        "p50_ms": by_ms[n // 2].ms,
        "p99_ms": p99,
        "p999_ms": by_ms[int(n * 0.999)].ms,
        "load_before": load,
        "trace_runs": len(slices),
        "vmargs": server.ts.props.get("vmargs"),
        "sets": [summarize(by_ms[int(n * 0.99) :], "slowest 1%"), summarize(by_ms[n // 4 : 3 * n // 4], "p25-p75")],
    }
    return common.finish(report, args.out, table(report), ok=True)


if __name__ == "__main__":
    sys.exit(main())
