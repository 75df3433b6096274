"""Side-by-side performance: the raw forward pass, the seed's FastAPI server, and rtserve's TorchServe.

One run, one client (``wrk``, closed loop, loopback only): every server is started here on free
ports, warmed up (10 s at the highest concurrency, excluded), then driven at each concurrency
for a fixed time after a short excluded warm-up. For each point: throughput, p50/p95/p99
latency, errors, server CPU per request (the whole server process tree, from /proc before and
after), resident memory of the tree, and the CPU other processes used meanwhile. Per server:
cold start to the first prediction, the first and second request's latency. TorchServe also
runs a soak at the highest concurrency, after which its memory is read. Output: a table on
stdout, JSON, and a PNG of latency percentiles against throughput.

    make bench                                     # the full comparison
    .venv/bin/python -m bench.perf --servers torchserve --duration 5   # one server, shorter

Load on the machine skews everything: each point records the CPU share other processes used
during it (``others_cpu_pct``; ``--retry-busy`` measures a disturbed point again, once by default) and the share
the hypervisor took from the machine's cores (``steal_pct``: a virtual machine's host running
something else, which no process here can see), and each
server's block the load average and other processes' CPU share just before it started.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import NamedTuple

import psutil
import requests

from bench import common
from bench.common import MODEL, REPO, RESULTS
from bench.fastapi_seed import FORMS, check_forms
from rtserve.client.rest import TorchServeError
from rtserve.runtime.ports import free_ports
from rtserve.runtime.process import spawn, stop_process
from rtserve.server.properties import read_properties
from rtserve.server.torchserve import DEFAULT_CONFIG, TorchServe
from rtserve.settings import Settings
from rtserve.testing.server import on_free_ports

logger = logging.getLogger("bench.perf")

WRK_SCRIPT = Path(__file__).with_name("wrk_post.lua")
REQUEST = REPO / "examples" / "request.json"
JSON = "application/json"
CONCURRENCIES = (1, 8, 32, 64)
#: The JVM option that keeps TorchServe from starting a thread per batch (config.properties).
COMMON_POOL = " -Djava.util.concurrent.ForkJoinPool.common.parallelism=2"
#: rtserve's variants: description, config.properties overrides, handler/model-config changes
#: (a variant with model-config changes gets its own archive of the same weights).
#: Stands for the agent jar of the run's settings in a variant's overrides (:func:`variant_overrides`).
AGENT_JAR = "<agent_jar>"
VARIANTS: dict[str, tuple[str, dict, dict]] = {
    "torchserve": ("rtserve as shipped (greedy batching, telemetry on)", {}, {}),
    "torchserve-stock": (
        "rtserve, TorchServe's own batching (rtserve_greedy_batching=false)",
        {"rtserve_greedy_batching": "false"},
        {},
    ),
    "torchserve-notelemetry": (
        "rtserve, handler metrics and records off",
        {},
        {"handler": {"metrics": False}, "records": {"enabled": False}},
    ),
    "torchserve-bs1": ("rtserve, batchSize 1 (no batching at all)", {}, {"batchSize": 1}),
    "torchserve-nowarmup": (
        "rtserve, no start-up warm-up (rtserve_warmup_requests=0)",
        {"rtserve_warmup_requests": "0"},
        {},
    ),
    "torchserve-nometrics": (
        "rtserve, handler metrics and drift off (records on)",
        {},
        {"handler": {"metrics": False}},
    ),
    "torchserve-norecords": ("rtserve, records off (metrics and drift on)", {}, {"records": {"enabled": False}}),
    "torchserve-unbuffered": (
        "rtserve, TorchServe's own worker reads (one recv per field)",
        {},
        {"handler": {"buffered_reads": False}},
    ),
    "torchserve-noroutes": (
        "rtserve without the live routes patch (the agent with routes=off "
        "and no OIP model routes: greedy batching only)",
        {"vmargs": read_properties(DEFAULT_CONFIG)["vmargs"] + f" -javaagent:{AGENT_JAR}=routes=off"},
        {},
    ),
    "torchserve-jitnice": (
        "rtserve, the JIT compiler threads at nice 19",
        {
            "vmargs": read_properties(DEFAULT_CONFIG)["vmargs"]
            + " -XX:ThreadPriorityPolicy=1 -XX:CompilerThreadPriority=19"
        },
        {},
    ),
    "torchserve-threadperbatch": (
        "rtserve, the JVM's default common pool (a thread per batch on 2 cores)",
        {"vmargs": read_properties(DEFAULT_CONFIG)["vmargs"].replace(COMMON_POOL, "")},
        {},
    ),
}


def variant_overrides(name: str, settings: Settings) -> dict:
    """A variant's config.properties overrides, :data:`AGENT_JAR` replaced by the settings' agent."""
    return {key: value.replace(AGENT_JAR, str(settings.agent_jar)) for key, value in VARIANTS[name][1].items()}


#: The FastAPI peers: the seed as written (plain def, the eager module), then the tuned server with
#: the model in each form, and the tuned server at one worker in the form that served most
#: (``-best``, resolved during the run). A name reads ``fastapi-<workers>w[-async][-<form>|-best]``.
PEERS = ("fastapi-2w", *(f"fastapi-2w-async-{form}" for form in FORMS), "fastapi-1w-async-best")
DEFAULT_SERVERS = ",".join((*PEERS, "torchserve", "torchserve-stock", "torchserve-notelemetry", "torchserve-bs1"))
#: Cumulative counters read around the c=1 point: the frontend's time per request from the
#: request's arrival to its answer, the part of it spent queued, and the handler's stages.
BREAKDOWN_COUNTERS = (
    "ts_inference_requests_total",
    "ts_inference_latency_microseconds",
    "ts_queue_latency_microseconds",
    "rtserve_handler_batches_total",
    "rtserve_handler_stage_seconds_sum",
)


#: Against the best FastAPI peer, per concurrency: (c, latency key, most rtserve may take as a
#: multiple of the peer's) and (c, least throughput as a multiple of the peer's).
LATENCY_TARGETS = ((1, "p50_ms", 1.5), (1, "p99_ms", 2.0), (64, "p99_ms", 0.35))
THROUGHPUT_TARGETS = ((8, 1.2), (32, 2.0), (64, 3.0))


class BenchError(RuntimeError):
    """A server did not start, or the load tool failed."""


# --------------------------------------------------------------------------- measurement


@dataclass
class Point:
    """One closed-loop run at one concurrency."""

    concurrency: int
    seconds: float
    requests: int
    rps: float
    mean_ms: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    errors: int
    error_kinds: dict
    cpu_ms_per_request: float
    server_cpu_pct: float
    client_cpu_pct: float
    others_cpu_pct: float
    root_cpu_share: float
    rss_mb: float
    cpu_split_us_per_request: dict = field(default_factory=dict)
    steal_pct: float = 0.0
    #: The :class:`Body` sent, by name ("" for a run of one body).
    body: str = ""


class Body(NamedTuple):
    """A request body the load tool sends: a name for the tables, its file and its Content-Type."""

    name: str
    path: Path
    content_type: str = JSON


@dataclass
class ServerResult:
    """Everything measured for one server."""

    name: str
    description: str
    cold_start_s: float
    first_request_ms: float
    second_request_ms: float
    rss_idle_mb: float
    load_before: list
    others_cpu_pct: float
    points: list[Point] = field(default_factory=list)
    soak: dict = field(default_factory=dict)
    settings: dict = field(default_factory=dict)
    breakdown: dict = field(default_factory=dict)


def steal_cpu() -> float:
    """CPU seconds the hypervisor gave the machine's cores to others (0 on bare metal)."""
    return getattr(psutil.cpu_times(), "steal", 0.0)


def busy_cpu() -> float:
    """CPU seconds all processes of the machine ran (user, nice, system).

    Interrupt and softirq time is left out: loopback traffic's network stack runs there, and
    it is nobody's process time.
    """
    t = psutil.cpu_times()
    return t.user + t.nice + t.system


#: Thread names (``/proc/<pid>/task/<tid>/comm``) of TorchServe's frontend, by what they do.
THREAD_GROUPS = (
    ("epollEventLoopG", "frontend HTTP (Netty)"),
    ("W-", "frontend worker threads"),
    ("ForkJoinPool", "frontend socket writes"),
    ("Log4j2", "frontend log appenders"),
    ("CompilerThre", "frontend JIT"),
    ("GC", "frontend GC"),
    ("VM Thread", "frontend GC"),
)


def thread_cpu(pid: int) -> dict[str, float]:
    """CPU seconds so far of the tree's threads, grouped: the JVM's by :data:`THREAD_GROUPS`,
    every other process (the Python workers) as ``python workers``."""
    ticks = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for proc in tree(pid):
        java = proc.name() == "java"
        try:
            tasks = os.listdir(f"/proc/{proc.pid}/task")
        except OSError:
            continue
        for tid in tasks:
            try:
                comm = Path(f"/proc/{proc.pid}/task/{tid}/comm").read_text().strip()
                fields = Path(f"/proc/{proc.pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            group = (
                "python workers"
                if not java
                else next((name for prefix, name in THREAD_GROUPS if prefix in comm), "frontend other")
            )
            out[group] = out.get(group, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return out


def tree(pid: int) -> list[psutil.Process]:
    """The process and all its descendants (those still alive)."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def tree_cpu(pid: int) -> tuple[float, float]:
    """User + system CPU seconds of a process tree, and of its root alone (exited children not counted)."""
    total = root = 0.0
    for proc in tree(pid):
        try:
            t = proc.cpu_times()
            total += t.user + t.system
            if proc.pid == pid:
                root = t.user + t.system
        except psutil.Error:
            pass
    return total, root


def tree_rss_mb(pid: int) -> float:
    """Resident memory of a process tree in MiB (RSS summed; shared pages counted per process)."""
    total = 0
    for proc in tree(pid):
        try:
            total += proc.memory_info().rss
        except psutil.Error:
            pass
    return round(total / 2**20, 1)


def machine() -> dict:
    """The machine a report was measured on: CPUs, Python, platform, load average at the end."""
    return {
        "cpus": psutil.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_after": list(os.getloadavg()),
    }


def machine_load(exclude: set[int] | None = None, interval: float = 1.0) -> tuple[list, float]:
    """The load average and the CPU share (of all cores, %) used by other processes over ``interval``."""
    exclude = exclude or set()
    mine = {os.getpid(), *exclude}
    procs = []
    for proc in psutil.process_iter():
        if proc.pid in mine:
            continue
        try:
            proc.cpu_percent(None)
            procs.append(proc)
        except psutil.Error:
            pass
    time.sleep(interval)
    busy = 0.0
    for proc in procs:
        try:
            busy += proc.cpu_percent(None)
        except psutil.Error:
            pass
    return [round(x, 2) for x in os.getloadavg()], round(busy / psutil.cpu_count(), 1)


def wait_quiet(max_wait: float, others_pct: float, exclude_tree: int | None = None) -> tuple[list, float]:
    """Wait (bounded) until other processes used at most ``others_pct`` of the CPU for 3 s running."""
    deadline = time.monotonic() + max_wait
    while True:
        exclude = {p.pid for p in tree(exclude_tree)} if exclude_tree else set()
        load, others = machine_load(exclude, interval=3.0)
        if others <= others_pct or time.monotonic() >= deadline:
            return load, others
        logger.info("   machine busy (load %s, other processes %.0f%% CPU): waiting", load, others)
        time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))


def wrk_path() -> str:
    """The ``wrk`` binary (``make bench`` installs Debian's package if it is missing)."""
    path = shutil.which("wrk")
    if not path:
        raise BenchError("wrk not found: `apt-get install -y wrk` (make bench does it)")
    return path


def run_wrk(
    url: str, concurrency: int, seconds: float, token: str | None, body: Path = REQUEST, content_type: str = JSON
) -> dict:
    """One closed-loop wrk run of POSTs of ``body`` as ``content_type``; returns the JSON summary
    printed by ``wrk_post.lua``."""
    cmd = [
        wrk_path(),
        "-t1",
        f"-c{concurrency}",
        f"-d{max(1, round(seconds))}s",
        "--timeout",
        "10s",
        "-s",
        str(WRK_SCRIPT),
        url,
        "--",
        str(body),
        token or "",
        content_type,
    ]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    ps = psutil.Process(proc.pid)
    cpu0 = sum(ps.cpu_times()[:2])
    try:
        cpu1 = cpu0
        while proc.poll() is None:
            try:
                cpu1 = sum(ps.cpu_times()[:2])
            except psutil.Error:
                break
            time.sleep(0.2)
        out, _ = proc.communicate(timeout=seconds + 30)
    finally:
        if proc.poll() is None:
            proc.kill()
    match = re.search(r"^WRK_JSON (.*)$", out, re.M)
    if proc.returncode != 0 or not match:
        raise BenchError(f"wrk failed ({proc.returncode}): {out[-2000:]}")
    result = json.loads(match.group(1))
    result["wall_s"] = time.monotonic() - start
    result["client_cpu_s"] = cpu1 - cpu0
    return result


def measure_point(
    url: str,
    token: Callable[[], str | None],
    pid: int,
    concurrency: int,
    seconds: float,
    warmup: float,
    retries: int = 0,
    busy_pct: float = 10.0,
    body: Body | None = None,
) -> Point:
    """Measure one point of POSTs of ``body`` (default :data:`REQUEST` as JSON); while it was
    disturbed (other processes used more than ``busy_pct`` of the CPU during it, or the
    hypervisor took more than that share from the cores), wait for a quiet moment and measure
    again (at most ``retries`` more times), keeping the least disturbed run."""
    body = body or Body("", REQUEST)
    best = _measure_once(url, token, pid, concurrency, seconds, warmup, body)
    for _ in range(retries):
        if _disturbance(best) <= busy_pct:
            break
        wait_quiet(120, busy_pct, pid)
        again = _measure_once(url, token, pid, concurrency, seconds, warmup, body)
        logger.info(
            "   (c=%d disturbed: other processes %.0f%%, steal %.0f%% of the CPU; measured again: %.0f%%, %.0f%%)",
            concurrency,
            best.others_cpu_pct,
            best.steal_pct,
            again.others_cpu_pct,
            again.steal_pct,
        )
        if _disturbance(again) < _disturbance(best):
            best = again
    return best


def _disturbance(point: Point) -> float:
    """The larger of the CPU shares other processes and the hypervisor took during ``point``."""
    return max(point.others_cpu_pct, point.steal_pct)


def _measure_once(
    url: str, token: Callable[[], str | None], pid: int, concurrency: int, seconds: float, warmup: float, body: Body
) -> Point:
    """Warm up (excluded), then one measured run with server CPU and memory around it."""
    if warmup > 0:
        run_wrk(url, concurrency, warmup, token(), body.path, body.content_type)
    busy0, steal0 = busy_cpu(), steal_cpu()
    cpu0, root0 = tree_cpu(pid)
    split0 = thread_cpu(pid)
    res = run_wrk(url, concurrency, seconds, token(), body.path, body.content_type)
    cpu1, root1 = tree_cpu(pid)
    split1 = thread_cpu(pid)
    cpu, root = cpu1 - cpu0, root1 - root0
    busy, steal = busy_cpu() - busy0, steal_cpu() - steal0
    duration = res["duration_us"] / 1e6
    others = max(0.0, busy - cpu - res["client_cpu_s"]) / res["wall_s"] / psutil.cpu_count() * 100
    n = res["requests"]
    lat = res["latency_us"]
    errors = res["errors"]
    return Point(
        concurrency=concurrency,
        seconds=round(duration, 2),
        requests=n,
        rps=round(n / duration, 1),
        mean_ms=round(lat["mean"] / 1000, 3),
        p50_ms=lat["p50"] / 1000,
        p95_ms=lat["p95"] / 1000,
        p99_ms=lat["p99"] / 1000,
        max_ms=lat["max"] / 1000,
        errors=sum(errors.values()),
        error_kinds={k: v for k, v in errors.items() if v},
        cpu_ms_per_request=round(cpu / n * 1000, 4) if n else 0.0,
        server_cpu_pct=round(cpu / duration * 100, 1),
        client_cpu_pct=round(res["client_cpu_s"] / duration * 100, 1),
        others_cpu_pct=round(others, 1),
        steal_pct=round(steal / res["wall_s"] / psutil.cpu_count() * 100, 1),
        root_cpu_share=round(root / cpu, 2) if cpu else 0.0,
        rss_mb=tree_rss_mb(pid),
        cpu_split_us_per_request={
            k: round((v - split0.get(k, 0.0)) / n * 1e6, 1)
            for k, v in sorted(split1.items(), key=lambda kv: -kv[1])
            if n and v - split0.get(k, 0.0) > 0
        },
        body=body.name,
    )


# --------------------------------------------------------------------------- servers


class Server:
    """A server under test: start (timed to the first prediction), URL, token, root PID, stop.

    ``body`` is what its first and second requests send, and its load unless told otherwise.
    """

    name = "server"
    description = ""
    url = ""
    body = Body("", REQUEST)

    def start(self) -> tuple[float, float]:
        """Start and return (cold start to first prediction in s, first request in ms)."""
        raise NotImplementedError

    def token(self) -> str | None:
        """The bearer token to send, if any."""
        return None

    def pid(self) -> int:
        """The root process of the server's tree."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the server and every process it started."""
        raise NotImplementedError

    def settings(self) -> dict:
        """What to record about this server's configuration."""
        return {}

    def post(self) -> tuple[int, float]:
        """One timed POST of :attr:`body` (:func:`timed_post`): (status, seconds)."""
        token = self.token()
        headers = {"Content-Type": self.body.content_type, **({"Authorization": f"Bearer {token}"} if token else {})}
        return timed_post(self.url, self.body.path.read_bytes(), headers)

    def second_request_ms(self) -> float:
        """The latency of one more request right after the first (ms)."""
        status, seconds = self.post()
        if status != 200:
            raise BenchError(f"{self.name}: second request answered {status}")
        return round(seconds * 1000, 2)

    def first_request_detail(self) -> dict:
        """Where the first request's time went, if the server's logs say."""
        return {}


def timed_post(url: str, body: bytes, headers: dict, timeout: float = 5.0) -> tuple[int, float]:
    """One POST on a fresh, already connected keep-alive connection: (status, seconds).

    The timer covers the request and the whole answer, not the TCP connect or any client
    library set-up, so that it compares with wrk's per-request latencies.
    """
    import http.client
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    try:
        conn.connect()
        start = time.perf_counter()
        conn.request("POST", parts.path, body=body, headers={"Content-Type": "application/json", **headers})
        resp = conn.getresponse()
        resp.read()
        return resp.status, time.perf_counter() - start
    finally:
        conn.close()


def _first_prediction(
    send: Callable[[], tuple[int, float]],
    ready: Callable[[], bool],
    started: float,
    timeout: float,
    alive: Callable[[], bool],
) -> tuple[float, float]:
    """Poll ``ready`` (every 20 ms), then send the first prediction: (cold start s, its latency ms)."""
    deadline = started + timeout
    while time.monotonic() < deadline:
        if not alive() and time.monotonic() - started > 5:
            raise BenchError("server died during start-up")
        try:
            if ready():
                status, seconds = send()
                if status == 200:
                    return round(time.monotonic() - started, 3), round(seconds * 1000, 2)
        except (requests.RequestException, OSError, TorchServeError):
            pass
        time.sleep(0.02)
    raise BenchError(f"no prediction within {timeout:.0f}s")


def parse_peer(name: str) -> tuple[int, bool, str]:
    """``fastapi-<workers>w[-async][-<form>|-best]`` -> (workers, async endpoint, form); the form
    defaults to the eager module. Raises ValueError for any other name."""
    parts = name.split("-")
    if len(parts) < 2 or parts[0] != "fastapi" or not re.fullmatch(r"\d+w", parts[1]):
        raise ValueError(f"not a FastAPI peer: {name!r}")
    rest = parts[2:]
    async_endpoint = bool(rest) and rest[0] == "async"
    rest = rest[1:] if async_endpoint else rest
    form = rest[0] if rest else FORMS[0]
    if len(rest) > 1 or form not in (*FORMS, "best"):
        raise ValueError(f"not a FastAPI peer: {name!r} (forms: {', '.join(FORMS)}, best)")
    return int(parts[1][:-1]), async_endpoint, form


def best_form(results: list[ServerResult]) -> str:
    """The form of the FastAPI peer that answered the most requests over its points so far (the
    eager module if none ran)."""
    peers = [r for r in results if r.name.startswith("fastapi") and r.points]
    if not peers:
        return FORMS[0]
    best = max(peers, key=lambda r: sum(p.rps for p in r.points))
    return best.settings.get("forward", FORMS[0])


class FastAPISeed(Server):
    """The seed-style FastAPI app (bench/fastapi_seed.py) under uvicorn with ``workers`` processes,
    the model in ``form`` (``bench.fastapi_seed.FORMS``)."""

    def __init__(
        self,
        workers: int,
        model_dir: Path,
        run_dir: Path,
        async_endpoint: bool = False,
        form: str = FORMS[0],
        name: str | None = None,
        body: Body | None = None,
    ) -> None:
        self.workers = workers
        self.body = body or self.body
        self.model_dir = model_dir
        self.run_dir = run_dir
        self.async_endpoint = async_endpoint
        self.form = form
        self.port = free_ports(1)[0]
        self.name = name or (
            f"fastapi-{workers}w" + ("-async" if async_endpoint else "") + (f"-{form}" if form != FORMS[0] else "")
        )
        self.description = (
            f"{'tuned' if async_endpoint else 'seed'} FastAPI, uvicorn {workers} "
            f"worker{'s' if workers > 1 else ''}, uvloop+httptools, TCP_NODELAY, "
            f"1 torch thread each, {'async' if async_endpoint else 'plain def'} "
            f"endpoint, the model as {form}"
        )
        self.url = f"http://127.0.0.1:{self.port}/predict"
        self.proc: subprocess.Popen | None = None

    def start(self) -> tuple[float, float]:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        log = self.run_dir / f"{self.name}.log"
        log.unlink(missing_ok=True)
        started = time.monotonic()
        self.proc = spawn(
            [
                sys.executable,
                "-m",
                "bench.fastapi_seed",
                "--port",
                str(self.port),
                "--workers",
                str(self.workers),
                "--model-dir",
                str(self.model_dir),
                "--forward",
                self.form,
            ]
            + (["--async-endpoint"] if self.async_endpoint else []),
            log,
            cwd=REPO,
        )
        try:
            return _first_prediction(
                self.post,
                lambda: (
                    len(tree(self.proc.pid)) >= (1 if self.workers == 1 else self.workers + 1) and _port_open(self.port)
                ),
                started,
                60,
                lambda: self.proc.poll() is None,
            )
        except BenchError as exc:
            raise BenchError(f"{self.name}: {exc}: {(self.run_dir / f'{self.name}.log').read_text()[-2000:]}") from exc

    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        """SIGTERM uvicorn; SIGKILL after 20 s, and to any of its workers left behind."""
        if self.proc is None or self.proc.poll() is not None:
            return
        stop_process(self.proc.pid, 20, tree=True)

    def settings(self) -> dict:
        return {
            "workers": self.workers,
            "torch_threads_per_worker": 1,
            "access_log": False,
            "async_endpoint": self.async_endpoint,
            "forward": self.form,
        }


def _port_open(port: int) -> bool:
    import socket

    with socket.socket() as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


class RtServe(Server):
    """rtserve's TorchServe deployment: config.properties and the archive as built by the Makefile."""

    def __init__(
        self,
        model_store: Path,
        run_dir: Path,
        mar: str,
        name: str = "torchserve",
        overrides: dict | None = None,
        log_config: Path | None | str = "shipped",
        settings: Settings | None = None,
        model: str = MODEL,
        body: Body | None = None,
    ) -> None:
        self.name = name
        self.model = model
        self.body = body or self.body
        self.description = VARIANTS.get(name, (name,))[0]
        kwargs: dict = {} if log_config == "shipped" else {"log_config": log_config}
        if settings is not None:
            kwargs["settings"] = settings
        self.ts = on_free_ports(run_dir, model_store, [f"{model}={mar}"], overrides, **kwargs)
        self.url = f"{self.ts.props['inference_address']}/predictions/{model}"
        self.client = self.ts.client(timeout=5.0, retries=0)

    def start(self) -> tuple[float, float]:
        started = time.monotonic()
        self.ts.start()

        def ready() -> bool:
            """rtserve's own readiness (what `make serve` and the pod's probe wait for): /ping,
            every worker READY and one real prediction; the first request after it is timed."""
            self.ts.wait_ready(timeout=120, models=[self.model])
            return True

        try:
            return _first_prediction(
                self.post,
                ready,
                started,
                120,
                lambda: self.ts.pid() is not None,
            )
        except BenchError as exc:
            raise BenchError(f"{self.name}: {exc}:\n{self.ts.log_tail()}") from exc

    def token(self) -> str | None:
        return self.client.keys.get("inference")

    def first_request_detail(self) -> dict:
        """The timed first request's time in TorchServe (its access-log line) and in the handler
        (its record), read after the second request: of the client predictions (the readiness
        prediction, the first, the second; warm-up requests carry their query parameter and
        are not recorded), the one before the last."""
        from rtserve.records.spool import lines_of

        out = {}
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and len(out) < 2:
            try:
                access = (self.ts.log_dir / "access_log.log").read_text()
            except OSError:
                access = ""
            kept = list(lines_of(self.ts.files.records))
            frontend = re.findall(r'"POST /predictions/[^\s?]+ HTTP/1.1" 200 (\d+)', access)
            if len(frontend) >= 3:
                out["first_request_frontend_ms"] = int(frontend[-2])
            if len(kept) >= 3:
                out["first_request_handler_ms"] = json.loads(kept[-2])["handler_ms"]
            time.sleep(0.1)
        return out

    def counters(self) -> dict[str, float]:
        """The scrape's counters the c=1 breakdown reads (summed over their labels)."""
        text = requests.get(f"{self.ts.props['metrics_address']}/metrics", timeout=10).text
        out: dict[str, float] = {}
        for name in BREAKDOWN_COUNTERS:
            out[name] = sum(float(v) for v in re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))
        return out

    def pid(self) -> int:
        pid = self.ts.pid()
        if pid is None:
            raise BenchError(f"{self.name} is not running:\n{self.ts.log_tail()}")
        return pid

    def stop(self) -> None:
        self.ts.stop()

    def settings(self) -> dict:
        desc = self.client.describe(self.model)[0]
        props = self.ts.props
        return {
            "batchSize": desc.get("batchSize"),
            "maxBatchDelay": desc.get("maxBatchDelay"),
            "workers": len(desc.get("workers", [])),
            "vmargs": props.get("vmargs", ""),
            "log_config": str(self.ts.log_config) if self.ts.log_config else "TorchServe built-in",
            "model_config": _archive_model_config(self.ts),
        }


def _archive_model_config(ts: TorchServe) -> dict:
    import zipfile

    import yaml

    mar = ts.model_store / ts.models[0].split("=", 1)[1]
    with zipfile.ZipFile(mar) as zf:
        manifest = json.loads(zf.read("MAR-INF/MANIFEST.json"))
        name = manifest["model"].get("configFile")
        return yaml.safe_load(zf.read(name)) if name else {}


# --------------------------------------------------------------------------- runs


def bench_server(
    server: Server,
    concurrencies: tuple[int, ...],
    seconds: float,
    warmup: float,
    soak: float = 0.0,
    quiet_wait: float = 0.0,
    retries: int = 0,
    server_warmup: float = 10.0,
    bodies: Sequence[Body] = (),
    check: Callable[[Server], None] | None = None,
) -> ServerResult:
    """Start ``server``, measure every concurrency (and the soak), stop it.

    Each of ``bodies`` is measured at every concurrency (concurrency by concurrency, the bodies
    in order at each; default: the server's own ``body``); the warm-up and the soak send the
    server's own. ``check``, when given, is called
    on the started server before any load (it raises to stop the run: answers that differ from
    another server's, say).

    After the start (timed) and before the first point, ``server_warmup`` seconds of load at the
    highest concurrency, then half as long at the lowest, are excluded: the JVM's JIT compilers
    keep a core busy for several seconds of traffic after a start, and again for several seconds
    when the load's shape changes (1.3 ms of JIT CPU per request at c=1 right after c=64, 0.05-0.2
    ms five seconds later), which would otherwise land on the first points. Every server gets
    the same warm-up.

    With ``quiet_wait``, first wait up to that many seconds until other processes use at most
    10% of the machine's CPU (the load average lags a minute behind, so it is only recorded).
    """
    load, others = wait_quiet(quiet_wait, 10.0) if quiet_wait > 0 else machine_load()
    logger.info("== %s (load %s, other processes %.0f%% CPU)", server.name, load, others)
    try:
        cold, first = server.start()
        second = server.second_request_ms()
        result = ServerResult(
            server.name,
            server.description,
            cold,
            first,
            second,
            tree_rss_mb(server.pid()),
            load,
            others,
            settings=server.settings(),
        )
        result.settings.update(server.first_request_detail())
        logger.info(
            "   cold start %.2fs, first request %.1f ms, second %.1f ms, idle RSS %.0f MiB %s",
            cold,
            first,
            second,
            result.rss_idle_mb,
            server.first_request_detail(),
        )
        if isinstance(server, RtServe):
            result.settings["warmup"] = asdict(server.ts.warmup)
        if check is not None:
            check(server)
        own = server.body
        if server_warmup > 0:
            run_wrk(server.url, max(concurrencies), server_warmup, server.token(), own.path, own.content_type)
            if min(concurrencies) < max(concurrencies):
                run_wrk(server.url, min(concurrencies), server_warmup / 2, server.token(), own.path, own.content_type)
        for c, body in ((c, body) for c in concurrencies for body in bodies or (own,)):
            before = server.counters() if c == 1 and isinstance(server, RtServe) and not result.breakdown else None
            point = measure_point(server.url, server.token, server.pid(), c, seconds, warmup, retries, body=body)
            if before is not None:
                result.breakdown = breakdown(before, server.counters(), point)
            result.points.append(point)
            logger.info(
                "   %sc=%-3d %8.0f req/s  p50 %6.2f  p95 %6.2f  p99 %6.2f ms  err %d  "
                "CPU %.3f ms/req (root %.0f%%)  RSS %.0f MiB  others %.0f%%  steal %.1f%%",
                f"{body.name} " if body.name else "",
                c,
                point.rps,
                point.p50_ms,
                point.p95_ms,
                point.p99_ms,
                point.errors,
                point.cpu_ms_per_request,
                point.root_cpu_share * 100,
                point.rss_mb,
                point.others_cpu_pct,
                point.steal_pct,
            )
        if soak > 0:
            c = max(concurrencies)
            point = measure_point(server.url, server.token, server.pid(), c, soak, 0, body=own)
            result.soak = {**asdict(point), "rss_after_mb": tree_rss_mb(server.pid())}
            logger.info(
                "   soak %.0fs at c=%d: %.0f req/s, p99 %.2f ms, RSS after %.0f MiB",
                soak,
                c,
                point.rps,
                point.p99_ms,
                result.soak["rss_after_mb"],
            )
    finally:
        server.stop()
    return result


def breakdown(before: dict, after: dict, point: Point) -> dict:
    """Where a request's time goes at c=1 (means over the point, microseconds), hop by hop:
    the client's whole request; the frontend's part (arrival at the frontend to its answer);
    of that, the time queued and the handler's stages; the rest of the frontend's part is the
    worker round trip (frontend -> worker socket -> TorchServe's Python protocol code -> back)."""
    d = {k: after[k] - before[k] for k in after}
    n = d["ts_inference_requests_total"] or 1
    batches = d["rtserve_handler_batches_total"] or 1
    frontend = d["ts_inference_latency_microseconds"] / n
    queued = d["ts_queue_latency_microseconds"] / n
    handler = d["rtserve_handler_stage_seconds_sum"] * 1e6 / batches
    client = point.mean_ms * 1000
    return {
        "requests": int(n),
        "client_mean_us": round(client, 1),
        "frontend_mean_us": round(frontend, 1),
        "client_to_frontend_and_back_us": round(client - frontend, 1),
        "queued_mean_us": round(queued, 1),
        "handler_mean_us": round(handler, 1),
        "worker_round_trip_us": round(frontend - queued - handler, 1),
    }


def best_fastapi(results: list[ServerResult]) -> dict[int, dict]:
    """Per concurrency, the best FastAPI configuration's throughput and latencies."""
    best: dict[int, dict] = {}
    for r in results:
        if not r.name.startswith("fastapi"):
            continue
        for p in r.points:
            b = best.setdefault(p.concurrency, {"rps": 0.0, "p50_ms": float("inf"), "p99_ms": float("inf")})
            if p.rps > b["rps"]:
                b.update(rps=p.rps, rps_from=r.name)
            if p.p50_ms < b["p50_ms"]:
                b.update(p50_ms=p.p50_ms, p50_from=r.name)
            if p.p99_ms < b["p99_ms"]:
                b.update(p99_ms=p.p99_ms, p99_from=r.name)
    return best


def ratios(results: list[ServerResult], target: str = "torchserve") -> dict[int, dict]:
    """TorchServe over the best FastAPI configuration, per concurrency."""
    best = best_fastapi(results)
    ts = next((r for r in results if r.name == target), None)
    if ts is None or not best:
        return {}
    out = {}
    for p in ts.points:
        b = best.get(p.concurrency)
        if b and b["rps"]:
            out[p.concurrency] = {
                "rps_ratio": round(p.rps / b["rps"], 2),
                "p50_ratio": round(p.p50_ms / b["p50_ms"], 2),
                "p99_ratio": round(p.p99_ms / b["p99_ms"], 2),
            }
    return out


def targets(results: list[ServerResult], handler: dict | None, target: str = "torchserve") -> list[dict]:
    """The performance issue's targets (one run, shipped settings), each with the measured
    figure and whether it is met."""
    ts = next((r for r in results if r.name == target), None)
    bs1 = next((r for r in results if r.name == "torchserve-bs1"), None)
    best = best_fastapi(results)
    if ts is None:
        return []
    by_c = {p.concurrency: p for p in ts.points}
    out = []

    def add(name: str, value: float | None, limit: str, ok: bool | None) -> None:
        out.append({"target": name, "measured": value, "limit": limit, "met": ok})

    bs1_c1 = next((p for p in bs1.points if p.concurrency == 1), None) if bs1 else None
    if 1 in by_c and bs1_c1:
        r = round(by_c[1].p50_ms / bs1_c1.p50_ms, 2)
        add("c=1 p50 / same archive at batchSize 1", r, "<= 1.15", r <= 1.15)
    for c, key, ceiling in LATENCY_TARGETS:
        if c in by_c and c in best:
            r = round(getattr(by_c[c], key) / best[c][key], 2)
            add(f"c={c} {key[:3]} / best FastAPI {key[:3]}", r, f"<= {ceiling}", r <= ceiling)
    for c, floor in THROUGHPUT_TARGETS:
        if c in by_c and c in best:
            r = round(by_c[c].rps / best[c]["rps"], 2)
            add(f"c={c} throughput / best FastAPI", r, f">= {floor}", r >= floor)
    if handler and "telemetry_us_per_request" in handler:
        v = handler["telemetry_us_per_request"]
        add(f"telemetry us/request in a full batch of {handler['batch']}", v, "<= 4", v <= 4)
        if 1 in by_c:
            share = round(handler["telemetry_us_batch_of_1"] / (by_c[1].p50_ms * 1000) * 100, 2)
            add("telemetry for a batch of 1, % of c=1 p50", share, "<= 5", share <= 5)
    if 1 in by_c:
        limit = round(2 * by_c[1].p99_ms, 2)
        add(
            "first request after readiness ms / 2x steady c=1 p99",
            ts.first_request_ms,
            f"<= {limit}",
            ts.first_request_ms <= limit,
        )
    if ts.soak:
        v = ts.soak["rss_after_mb"]
        add(f"RSS MiB after {ts.soak['seconds']:.0f}s at c={ts.soak['concurrency']}", v, "< 1024", v < 1024)
    return out


def table(results: list[ServerResult], floor: dict | None, handler: dict | None) -> str:
    """The human-readable report."""
    lines = []
    if floor:
        lines.append("raw forward pass (1 thread, us): " + ", ".join(f"{k[:-3]} {v}" for k, v in floor.items()))
    if handler:
        stages = (
            handler["preprocess_us_per_request"]
            + handler["inference_us_per_request"]
            + handler["postprocess_us_per_request"]
        )
        lines.append(
            f"handler per request in a batch of {handler['batch']} (us): preprocess "
            f"{handler['preprocess_us_per_request']} + inference {handler['inference_us_per_request']} + "
            f"postprocess {handler['postprocess_us_per_request']} = {stages:.2f}; handle() with "
            f"TorchServe's own bookkeeping (metrics, checks) {handler['handle_us_per_request']}"
        )
        if "handle_us_batch_of_1" in handler:
            lines.append(
                f"handler for a batch of 1 (us): preprocess {handler['preprocess_us_batch_of_1']} + "
                f"inference {handler['inference_us_batch_of_1']} + postprocess "
                f"{handler['postprocess_us_batch_of_1']}; handle() with telemetry "
                f"{handler['handle_us_batch_of_1']}"
            )
        if "telemetry_us_per_request" in handler:
            lines.append(
                f"telemetry (metrics, drift, records): {handler['telemetry_us_per_request']} us per "
                f"request in that batch, {handler['telemetry_us_batch_of_1']} us for a batch of 1"
            )
    lines.append("")
    lines.append(
        f"{'server':<26} {'conc':>4} {'req/s':>8} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7} "
        f"{'errors':>6} {'CPU ms/req':>10} {'RSS MiB':>8} {'others %':>8} {'steal %':>7}"
    )
    for r in results:
        for p in r.points:
            lines.append(
                f"{r.name:<26} {p.concurrency:>4} {p.rps:>8.0f} {p.p50_ms:>7.2f} {p.p95_ms:>7.2f} "
                f"{p.p99_ms:>7.2f} {p.errors:>6} {p.cpu_ms_per_request:>10.3f} {p.rss_mb:>8.0f} "
                f"{p.others_cpu_pct:>8.0f} {p.steal_pct:>7.1f}"
            )
    lines.append("")
    lines.append(
        f"{'server':<26} {'cold start s':>12} {'first req ms':>12} {'second ms':>9} {'idle RSS MiB':>12}  "
        "load avg / others' CPU before"
    )
    for r in results:
        lines.append(
            f"{r.name:<26} {r.cold_start_s:>12.2f} {r.first_request_ms:>12.1f} {r.second_request_ms:>9.1f} "
            f"{r.rss_idle_mb:>12.0f}  {r.load_before} / {r.others_cpu_pct}%"
        )
    for r in results:
        if r.soak:
            lines.append(
                f"{r.name} soak {r.soak['seconds']:.0f}s at c={r.soak['concurrency']}: "
                f"{r.soak['rps']:.0f} req/s, p99 {r.soak['p99_ms']:.2f} ms, errors {r.soak['errors']}, "
                f"RSS after {r.soak['rss_after_mb']:.0f} MiB"
            )
    for r in results:
        if r.name.startswith("torchserve"):
            for p in r.points:
                if p.cpu_split_us_per_request:
                    lines.append(
                        f"{r.name} c={p.concurrency} server CPU per request (us, by thread): "
                        + ", ".join(f"{k} {v:.0f}" for k, v in p.cpu_split_us_per_request.items())
                    )
    for r in results:
        if r.breakdown:
            b = r.breakdown
            lines.append(
                f"{r.name} c=1 hop by hop, means (us): client {b['client_mean_us']} = client<->frontend "
                f"{b['client_to_frontend_and_back_us']} + frontend {b['frontend_mean_us']} (queued "
                f"{b['queued_mean_us']}, worker round trip {b['worker_round_trip_us']}, handler "
                f"{b['handler_mean_us']})"
            )
    rat = ratios(results)
    if rat:
        lines.append("")
        lines.append(
            "best FastAPI (per figure, over every peer): "
            + "  ".join(
                f"c={c}: {b['rps']:.0f} req/s ({b['rps_from']}), p50 {b['p50_ms']:.2f} ms "
                f"({b['p50_from']}), p99 {b['p99_ms']:.2f} ms ({b['p99_from']})"
                for c, b in best_fastapi(results).items()
            )
        )
        lines.append(
            "torchserve / best FastAPI:  "
            + "  ".join(
                f"c={c}: x{v['rps_ratio']} req/s, x{v['p50_ratio']} p50, x{v['p99_ratio']} p99" for c, v in rat.items()
            )
        )
    tg = targets(results, handler)
    if tg:
        lines.append("")
        for t in tg:
            lines.append(f"  [{'met' if t['met'] else 'MISSED'}] {t['target']}: {t['measured']} (target {t['limit']})")
    return "\n".join(lines)


def markdown(report: dict) -> str:
    """The docs' tables from a run's JSON (``--markdown``): every server's figures per
    concurrency, the best FastAPI per figure and the targets."""
    servers = report["servers"]
    cs = report["method"]["concurrency"]
    head = ["server"] + [f"c={c} req/s, p50 / p99 ms" for c in cs] + [f"CPU ms/req at c={cs[-1]}", "steal % (max)"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in servers:
        by_c = {p["concurrency"]: p for p in r["points"]}
        cells = [r["name"]]
        for c in cs:
            p = by_c.get(c)
            cells.append(f"{p['rps']:,.0f}, {p['p50_ms']:.2f} / {p['p99_ms']:.2f}" if p else "")
        last = by_c.get(cs[-1])
        cells.append(f"{last['cpu_ms_per_request']:.3f}" if last else "")
        cells.append(f"{max(p.get('steal_pct', 0.0) for p in r['points']):.0f}" if r["points"] else "")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| best FastAPI | req/s | p50 ms | p99 ms |", "|---|---|---|---|"]
    for c, b in report["best_fastapi"].items():
        lines.append(
            f"| c={c} | {b['rps']:,.0f} ({b['rps_from']}) | {b['p50_ms']:.2f} ({b['p50_from']}) "
            f"| {b['p99_ms']:.2f} ({b['p99_from']}) |"
        )
    lines += ["", "| target | measured | |", "|---|---|---|"]
    for t in report["targets"]:
        lines.append(f"| {t['target']} {t['limit']} | {t['measured']} | {'met' if t['met'] else 'missed'} |")
    return "\n".join(lines)


def plot(results: list[ServerResult], path: Path, title: str) -> None:
    """Latency percentiles (log scale) against throughput, one colour per server."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 7), dpi=100)
    styles = {"p50_ms": ("-", "o"), "p95_ms": ("--", "s"), "p99_ms": (":", "^")}
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, r in enumerate(results):
        xs = [p.rps for p in r.points]
        for key, (ls, marker) in styles.items():
            ax.plot(
                xs,
                [getattr(p, key) for p in r.points],
                linestyle=ls,
                marker=marker,
                color=colors[i % len(colors)],
                markersize=4,
                label=f"{r.name} {key[:-3]}",
            )
        for p in r.points:
            ax.annotate(
                f"c{p.concurrency}",
                (p.rps, p.p50_ms),
                textcoords="offset points",
                xytext=(3, -10),
                fontsize=7,
                color=colors[i % len(colors)],
            )
    ax.set_yscale("log")
    ax.set_xlabel("throughput (requests/s)")
    ax.set_ylabel("latency (ms, log scale)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.1))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)


def variant_store(name: str, changes: dict, model_store: Path, version: str) -> Path:
    """A model store holding the shipped archive rebuilt with ``changes`` to its model config
    (same weights, same handler), by `make archive` into build/bench/<name>/."""
    import yaml

    root = REPO / "build" / "bench" / name
    config = yaml.safe_load((REPO / "model" / "model-config.yaml").read_text())
    for key, value in changes.items():
        if isinstance(value, dict):
            config.setdefault(key, {}).update(value)
        else:
            config[key] = value
    root.mkdir(parents=True, exist_ok=True)
    (root / "model-config.yaml").write_text(yaml.safe_dump(config))
    subprocess.run(
        [
            "make",
            "-s",
            "archive",
            f"MODEL_VERSION={version}",
            f"MODEL_STORE={root / 'store'}",
            f"MODEL_CONFIG={root / 'model-config.yaml'}",
        ],
        cwd=REPO,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return root / "store"


def _title(concurrencies: list[int], cpus: int) -> str:
    return f"rtserve vs FastAPI, closed loop c={concurrencies}, {cpus} cores, loopback"


def _log_to_stdout() -> None:
    """Progress lines from ``bench.*`` on stdout; everything else (the handler's own INFO lines
    in the micro-benchmark) formatted as in a worker but written to /dev/null."""
    logging.basicConfig(stream=open(os.devnull, "w"), format="%(message)s", level=logging.INFO)
    out = logging.getLogger("bench")
    out.addHandler(logging.StreamHandler(sys.stdout))
    out.propagate = False


def main(argv: list[str] | None = None) -> int:
    """Run the comparison and write the table, JSON and plot."""
    parser = common.parser(__doc__, "perf.json", attach=False, run_root=False, model=False)
    parser.add_argument(
        "--servers",
        default=DEFAULT_SERVERS,
        help=f"comma-separated, from: fastapi-<workers>w[-async][-<form>|-best] "
        f"(forms: {', '.join(FORMS)}; best: the form that served most "
        f"earlier in the run), {', '.join(VARIANTS)}",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="make bench-quick: the tuned FastAPI in each of the model's forms and "
        "rtserve as shipped, c=1,8,64, 3 s per point, no soak (about 2 minutes)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the test suite's run: rtserve as shipped (unless --servers), c=1, 1 s, "
        "no warm-ups, soak or forward floor; checks the harness, measures "
        "nothing worth keeping",
    )
    parser.add_argument("--concurrency", default=",".join(map(str, CONCURRENCIES)))
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds per point")
    parser.add_argument("--warmup", type=float, default=2.0, help="excluded seconds before each point")
    parser.add_argument(
        "--server-warmup",
        type=float,
        default=10.0,
        help="excluded seconds at the highest concurrency after each server start",
    )
    parser.add_argument(
        "--soak",
        type=float,
        default=60.0,
        help="seconds at the highest concurrency before TorchServe's memory is read (0: skip)",
    )
    parser.add_argument(
        "--model-dir",
        type=Path,
        help="model.pt2 + meta.json for FastAPI and the handler timings (default artifacts/VERSION)",
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        help="before each server, wait up to this many seconds for a quiet machine",
    )
    parser.add_argument(
        "--retry-busy",
        type=int,
        default=1,
        help="measure a point again (this many times at most, default 1) when "
        "other processes or the hypervisor (steal) took over 10%% of the CPU "
        "during it; the least disturbed run is kept",
    )
    parser.add_argument("--plot", type=Path, default=RESULTS / "perf.png")
    parser.add_argument("--replot", type=Path, metavar="JSON", help="only draw --plot again from an earlier run's JSON")
    parser.add_argument(
        "--markdown",
        type=Path,
        metavar="JSON",
        help="only print the docs' tables (markdown) from an earlier run's JSON",
    )
    args = parser.parse_args(argv)
    _log_to_stdout()
    if args.quick:
        if args.servers == DEFAULT_SERVERS:  # else the ones asked for (e.g. torchserve,torchserve-norecords)
            args.servers = ",".join(f"fastapi-2w-async-{form}" for form in FORMS) + ",torchserve"
        args.concurrency = "1,8,64"
        args.duration, args.warmup, args.server_warmup, args.soak = 3.0, 1.0, 8.0, 0.0
        if args.out == RESULTS / "perf.json":
            args.out, args.plot = RESULTS / "quick.json", RESULTS / "quick.png"
    if args.smoke:
        if args.servers == DEFAULT_SERVERS:
            args.servers = "torchserve"
        args.concurrency, args.duration, args.warmup, args.server_warmup, args.soak = "1", 1.0, 0.0, 0.0, 0.0
        args.retry_busy = 0
    if args.markdown:
        sys.stdout.write(markdown(json.loads(args.markdown.read_text())) + "\n")
        return 0
    if args.replot:
        report = json.loads(args.replot.read_text())
        results = [
            ServerResult(**{**r, "points": [Point(**{"mean_ms": 0.0, **p}) for p in r["points"]]})
            for r in report["servers"]
        ]
        plot(results, args.plot, _title(report["method"]["concurrency"], report["machine"]["cpus"]))
        return 0
    settings = Settings.from_env()  # the one read of the environment: handed to every server
    concurrencies = tuple(int(c) for c in args.concurrency.split(","))
    model_dir = (args.model_dir or REPO / "artifacts" / args.version).resolve()
    wrk_path()
    import yaml

    from bench.handler_micro import forward_floor, handler_time, variants

    n_features = len(json.loads((model_dir / "meta.json").read_text())["feature_names"])
    floor = None if args.quick or args.smoke else forward_floor(variants(model_dir, None), n_features)
    handler = handler_time(
        model_dir, yaml.safe_load((REPO / "model" / "model-config.yaml").read_text()), json.loads(REQUEST.read_text())
    )
    run_root = Path(tempfile.mkdtemp(prefix="bench-perf-", dir=REPO / "build"))
    results: list[ServerResult] = []
    names = args.servers.split(",")
    forms_check = check_forms(model_dir) if any(n.startswith("fastapi") for n in names) else {}
    for name in names:
        if name.startswith("fastapi-"):
            try:
                workers, async_endpoint, form = parse_peer(name)
            except ValueError as exc:
                raise SystemExit(str(exc)) from exc
            server: Server = FastAPISeed(
                workers, model_dir, run_root, async_endpoint, best_form(results) if form == "best" else form, name
            )
            soak = 0.0
        elif name in VARIANTS:
            overrides = variant_overrides(name, settings)
            changes = VARIANTS[name][2]
            store = variant_store(name, changes, args.model_store, args.version) if changes else args.model_store
            server = RtServe(
                store, run_root / name, f"{MODEL}_{args.version}.mar", name=name, overrides=overrides, settings=settings
            )
            soak = args.soak if name == "torchserve" else 0.0
        else:
            raise SystemExit(f"unknown server {name!r}")
        results.append(
            bench_server(
                server,
                concurrencies,
                args.duration,
                args.warmup,
                soak,
                args.wait_quiet,
                args.retry_busy,
                args.server_warmup,
            )
        )
    report = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "method": {
            "client": "wrk -t1 (closed loop), loopback",
            "concurrency": list(concurrencies),
            "seconds": args.duration,
            "warmup_s": args.warmup,
            "soak_s": args.soak,
            "server_warmup_s": args.server_warmup,
        },
        "forward_floor_us": floor,
        "handler": handler,
        "servers": [asdict(r) for r in results],
        "peer_forms_max_abs_diff": forms_check,
        "best_fastapi": {str(k): v for k, v in best_fastapi(results).items()},
        "ratios": {str(k): v for k, v in ratios(results).items()},
        "targets": targets(results, handler),
    }
    text = table(results, floor, handler)
    if forms_check:
        text = (
            "FastAPI's model forms, largest logit difference from the eager module on the "
            "golden rows: " + ", ".join(f"{k} {v:g}" for k, v in forms_check.items()) + "\n" + text
        )
    sys.stdout.write("\n" + text + "\n")
    common.write_json(report, args.out)
    plot(results, args.plot, _title(list(concurrencies), psutil.cpu_count()))
    shutil.rmtree(run_root, ignore_errors=True)
    logger.info("JSON: %s  plot: %s", args.out, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
