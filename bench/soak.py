"""A long run through the local cluster's Service at half its capacity: what drifts, fails or is lost.

Runs against the pods `make pod` left on `make cluster`'s node (``--namespace``: with
``POD_OVERLAY=local-records``, ``rtserve-local-records``, whose records go to an in-cluster
Cassandra node); it is a script, not a test (an hour is too long for CI):

    make pod POD_OVERLAY=local-records && make soak POD_OVERLAY=local-records   # 60 minutes
    make soak POD_OVERLAY=local-records SOAK_MINUTES=3 SOAK_RATE=100   # 3 minutes at 100/s, no burst
    .venv/bin/python -m bench.soak --help          # every bound

1. **Capacity**: a closed-loop burst through the Service (``--capacity-seconds`` 20, 16
   connections): the requests/s answered; the soak's rate is half of it (``--rate`` skips it).
2. **The load**: :class:`bench.loadgen.SteadyLoad` at that rate on 8 keep-alive connections (the
   Service's kube-proxy picks a pod per connection) for ``--minutes``, one request in 20 a bad
   one (answered 400); each request is aggregated as it ends (:class:`Minutes`), never kept.
3. **A sampler** every 30 s on its own thread: each pod's phase and restarts and every eviction
   (``kubectl get pods``, ``kubectl get events``); each container's memory as ``kubectl top pod
   --containers`` reports it (metrics-server's working set: what the memory limit and the
   kubelet's evictions count, not the RSS); each server pod's run directory (``du -sb`` through
   ``kubectl exec``) and records metrics (its exporter's scrape on 127.0.0.1:8082, through exec:
   written, dropped, shipped, pending bytes, the shipper's lag histogram); the Cassandra pod's
   memory when the records component runs one (skipped, and said, when not).
4. **At the end**: the load stops; it waits (``--drain-timeout``) until every pod's pending bytes
   are 0, then looks up every 100th answered request id in the store with one ``kubectl exec``
   into a server pod (:data:`STORE_CHECK`, contact points from its ``RTSERVE_RECORDS_STORE``).

It prints a summary (requests, rate, first-try failures, restarts, evictions, each container's
most memory and slope, each pod's most disk and slope, records answered / written / shipped /
dropped / sampled found, the shipper's lag p50/p99 over the run), writes every minute and
sample to ``bench/results/soak.json``, and draws ``bench/results/soak.png`` (``--docs``: also
``docs/soak.png``). Exit status 0 when nothing failed on its first try, no container restarted,
no pod was evicted, no record was dropped and every sampled id was found.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import re
import shlex
import subprocess
import sys
import threading
import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from bench import common
from bench.loadgen import Record, SteadyLoad, percentile, status_key
from rtserve.errors import DeployError, RtserveError
from rtserve.k8s.deploy import Kubectl
from rtserve.k8s.pod import Deployed, PodState
from rtserve.server.readiness import sample_payload

logger = logging.getLogger(__name__)

#: The server pods' and the records store's ``app.kubernetes.io/name``.
APP = "rtserve"
CASSANDRA_APP = "rtserve-cassandra"
RUN_DIR = "/home/model-server/run"
METRICS_URL = "http://127.0.0.1:8082/metrics"
#: Run inside a server pod: its run directory's bytes (first line), then its exporter's scrape.
POD_SAMPLE = (
    'du -sb "$1" 2>/dev/null | tail -n 1; exec python -c '
    "'import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1], "
    'timeout=10).read().decode())\' "$2"'
)
#: Run inside a server pod (``python -c``): reads request ids on stdin, prints one JSON line per
#: id, ``[id, status, version]`` or ``[id, null, null]`` when the store has no record of it; or
#: one ``{"error": ...}`` line when the pod has no store.
STORE_CHECK = """\
import json, os, sys
from pathlib import Path
points = os.environ.get("RTSERVE_RECORDS_STORE", "").strip()
if not points:
    print(json.dumps({"error": "RTSERVE_RECORDS_STORE is not set in the pod: its records stay in its spool"}))
    sys.exit(0)
from rtserve.records.lookup import Source
from rtserve.records.store import Store
source = Source.of(Path(os.environ.get("RTSERVE_RUN_DIR", ".")), store=points)
with Store.connect(source.store, keyspace=source.keyspace) as store:
    for line in sys.stdin:
        rid = line.strip()
        if rid:
            r = store.find(rid)
            print(json.dumps([rid, r.status, r.model_version] if r else [rid, None, None]), flush=True)
"""
#: The records metrics a sample keeps (the counters' and the gauge's names in the scrape).
RECORDS_METRICS = {
    "written": "rtserve_records_written_total",
    "dropped": "rtserve_records_dropped_total",
    "shipped": "rtserve_records_shipped_total",
    "pending_bytes": "rtserve_records_pending_bytes",
}
LAG_BUCKET = "rtserve_records_ship_lag_seconds_bucket"
_SAMPLE_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
_LE = re.compile(r'le="([^"]+)"')
_QUANTITY = {"Ki": 1 / 1024, "Mi": 1.0, "Gi": 1024.0, "": 1 / 2**20}


# -- reading what kubectl and the exporter say (pure) ----------------------------------------------
def parse_top(text: str) -> dict[str, float]:
    """``kubectl top pod --containers`` as ``{"pod/container": MiB}`` (its MEMORY column: the
    working set metrics-server reports).

    Raises:
        ValueError: no POD, NAME and MEMORY columns in the header.
    """
    lines = [line.split() for line in text.splitlines() if line.strip()]
    if not lines:
        return {}
    header = lines[0]
    try:
        pod, name = header.index("POD"), header.index("NAME")
        memory = next(i for i, h in enumerate(header) if h.startswith("MEMORY"))
    except (ValueError, StopIteration):
        raise ValueError(f"kubectl top: no POD, NAME and MEMORY columns in {' '.join(header)!r}") from None
    out = {}
    for row in lines[1:]:
        found = re.fullmatch(r"(\d+(?:\.\d+)?)([KMG]i)?", row[memory]) if len(row) > memory else None
        if not found:
            raise ValueError(f"kubectl top: no memory quantity in {' '.join(row)!r}")
        out[f"{row[pod]}/{row[name]}"] = float(found.group(1)) * _QUANTITY[found.group(2) or ""]
    return out


@dataclass(frozen=True)
class PodSample:
    """One pod at one sampling: its app, phase, why it failed (``Evicted``), its restarts, and
    the server container's readiness probe period (a probe is a recorded prediction)."""

    name: str
    app: str
    phase: str
    reason: str
    restarts: dict[str, int]
    probe_period: float | None = None

    @property
    def json(self) -> dict:
        return {
            "name": self.name,
            "app": self.app,
            "phase": self.phase,
            "reason": self.reason,
            "restarts": self.restarts,
            "probe_period": self.probe_period,
        }


def parse_pods(doc: dict) -> list[PodSample]:
    """``kubectl get pods -o json``: every pod but finished Jobs' (phase Succeeded), by name."""
    out = []
    for item in doc.get("items", []):
        state = PodState.of(item)
        if state.phase == "Succeeded":
            continue
        app = item["metadata"].get("labels", {}).get("app.kubernetes.io/name", "")
        probes = [
            c.get("readinessProbe", {}).get("periodSeconds", 10)
            for c in item["spec"]["containers"]
            if c["name"] == APP and "readinessProbe" in c
        ]
        out.append(
            PodSample(
                state.name,
                app,
                state.phase,
                item.get("status", {}).get("reason", ""),
                state.restarts,
                probes[0] if probes else None,
            )
        )
    return sorted(out, key=lambda p: p.name)


def parse_evictions(doc: dict) -> list[dict]:
    """``kubectl get events -o json``'s evictions: uid, pod, time and the kubelet's message."""
    return [
        {
            "uid": e["metadata"]["uid"],
            "pod": e.get("involvedObject", {}).get("name", ""),
            "time": e.get("lastTimestamp") or e.get("eventTime") or "",
            "message": e.get("message", ""),
        }
        for e in doc.get("items", [])
        if e.get("reason") == "Evicted"
    ]


def parse_metrics(text: str) -> dict:
    """The records metrics of an exporter's scrape: ``written``, ``dropped``, ``shipped`` (each
    summed over its labels), ``pending_bytes`` (None when absent: no records on that pod) and
    ``lag`` (the ship-lag histogram's cumulative buckets, ``{le: count}``)."""
    names = {v: k for k, v in RECORDS_METRICS.items()}
    out: dict = {k: None for k in RECORDS_METRICS} | {"lag": {}}
    for line in text.splitlines():
        found = _SAMPLE_LINE.match(line)
        if not found:
            continue
        name, labels, value = found.groups()
        if name in names:
            out[names[name]] = (out[names[name]] or 0.0) + float(value)
        elif name == LAG_BUCKET:
            le = _LE.search(labels or "")
            if le:
                out["lag"][le.group(1)] = out["lag"].get(le.group(1), 0.0) + float(value)
    return out


def parse_pod_sample(text: str) -> tuple[int | None, dict]:
    """:data:`POD_SAMPLE`'s output: the run directory's bytes (None: du printed nothing) and
    :func:`parse_metrics` of the rest."""
    first, _, rest = text.partition("\n")
    size = first.split("\t", 1)[0].strip()
    if not size.isdigit():
        return None, parse_metrics(text)
    return int(size), parse_metrics(rest)


# -- arithmetic (pure) -------------------------------------------------------------------------
def counter_delta(prev: float | None, cur: float | None) -> float:
    """How much a counter grew between two readings: ``cur`` after a reset (it went down: the
    process restarted) or when there was no earlier reading; 0 when it has none."""
    if cur is None:
        return 0.0
    if prev is None or cur < prev:
        return cur
    return cur - prev


def bucket_delta(prev: dict[str, float] | None, cur: dict[str, float]) -> dict[str, float]:
    """The histogram's cumulative buckets between two readings (a reset: ``cur`` whole)."""
    if not prev or any(cur.get(le, 0.0) < n for le, n in prev.items()):
        return dict(cur)
    return {le: n - prev.get(le, 0.0) for le, n in cur.items()}


def add_buckets(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    """Two histograms' buckets summed (the pods' together)."""
    return {le: a.get(le, 0.0) + b.get(le, 0.0) for le in a.keys() | b.keys()}


def histogram_quantile(q: float, buckets: dict[str, float]) -> float | None:
    """The ``q`` quantile of cumulative buckets ``{le: count}``, as Prometheus's
    ``histogram_quantile`` estimates it (linear within the bucket it falls in; the largest
    finite bound when it falls in ``+Inf``); None when there is no observation."""
    bounds = sorted((float(le), n) for le, n in buckets.items())
    if not bounds or bounds[-1][1] <= 0:
        return None
    rank = q * bounds[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in bounds:
        if count >= rank and count > below:
            if math.isinf(upper):
                return lower
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """The least-squares slope of ``(seconds, value)`` points, per hour; None with fewer than
    two distinct times."""
    if len({t for t, _ in points}) < 2:
        return None
    n = len(points)
    mt = sum(t for t, _ in points) / n
    my = sum(y for _, y in points) / n
    num = sum((t - mt) * (y - my) for t, y in points)
    den = sum((t - mt) ** 2 for t, _ in points)
    return num / den * 3600


def percentiles(values: array, qs: tuple[float, ...] = (0.5, 0.99)) -> list[float | None]:
    """Nearest-rank percentiles of ``values`` (as ``bench.loadgen`` reports them); None when empty."""
    if not values:
        return [None] * len(qs)
    return [round(percentile(values, q), 2) for q in qs]


@dataclass
class Minute:
    """The requests that started in one minute of the load."""

    sent: int = 0
    answered: int = 0
    bad: int = 0
    resent: int = 0
    failed_after_resend: int = 0
    failed_first: Counter = field(default_factory=Counter)
    latency_ms: array = field(default_factory=lambda: array("f"))


class Minutes:
    """The load's sink (:class:`bench.loadgen.SteadyLoad`'s ``sink``): each request counted in
    the minute it started, its latency kept as a float32, and every ``id_every``-th answered
    request's id, status and version kept for the store check. Called one request at a time."""

    def __init__(self, id_every: int = 100) -> None:
        self.id_every = id_every
        self.minutes: dict[int, Minute] = {}
        self.ids: list[tuple[str, int, str | None]] = []
        self.versions: Counter = Counter()
        self.answered = 0

    def __call__(self, r: Record) -> None:
        m = self.minutes.setdefault(int(r.start // 60), Minute())
        m.sent += 1
        m.bad += r.bad
        m.resent += r.resent
        m.latency_ms.append(r.latency * 1000)
        if r.failed_first:
            m.failed_first[status_key(r.first_status)] += 1
        if not r.answered:
            m.failed_after_resend += 1
            return
        m.answered += 1
        self.answered += 1
        if r.version:
            self.versions[r.version] += 1
        if self.id_every and r.request_id and self.answered % self.id_every == 0:
            self.ids.append((r.request_id, r.status, r.version))

    def rows(self, seconds: float) -> list[dict]:
        """One row per minute of a load that ran ``seconds``: sent, answered, requests/s (the
        last, partial minute over its own length), first-try failures by status, p50/p99 ms.
        Requests started after ``seconds`` (while the load stopped) count in its last minute."""
        last = max(0, math.ceil(seconds / 60) - 1)
        merged: dict[int, Minute] = {}
        for i in sorted(self.minutes):
            m, into = self.minutes[i], merged.setdefault(min(i, last), Minute())
            for name in ("sent", "answered", "bad", "resent", "failed_after_resend"):
                setattr(into, name, getattr(into, name) + getattr(m, name))
            into.failed_first.update(m.failed_first)
            into.latency_ms.extend(m.latency_ms)
        out = []
        for i, m in merged.items():
            length = min(60.0, max(1.0, seconds - 60 * i))
            p50, p99 = percentiles(m.latency_ms)
            out.append(
                {
                    "minute": i,
                    "sent": m.sent,
                    "answered": m.answered,
                    "bad": m.bad,
                    "per_second": round(m.sent / length, 2),
                    "failed_first": sum(m.failed_first.values()),
                    "failed_first_by_status": dict(sorted(m.failed_first.items())),
                    "resent": m.resent,
                    "failed_after_resend": m.failed_after_resend,
                    "p50_ms": p50,
                    "p99_ms": p99,
                }
            )
        return out

    def totals(self, seconds: float) -> dict:
        """The whole load: the rows' counts summed, its rate and p50/p99 over every request."""
        every = array("f")
        failed: Counter = Counter()
        for m in self.minutes.values():
            every.extend(m.latency_ms)
            failed.update(m.failed_first)
        sent = sum(m.sent for m in self.minutes.values())
        p50, p99 = percentiles(every)
        return {
            "sent": sent,
            "answered": self.answered,
            "bad": sum(m.bad for m in self.minutes.values()),
            "per_second": round(sent / seconds, 2) if seconds else 0.0,
            "failed_first": sum(failed.values()),
            "failed_first_by_status": dict(sorted(failed.items())),
            "resent": sum(m.resent for m in self.minutes.values()),
            "failed_after_resend": sum(m.failed_after_resend for m in self.minutes.values()),
            "versions": dict(self.versions),
            "p50_ms": p50,
            "p99_ms": p99,
        }


def records_over_time(samples: list[dict]) -> tuple[list[dict], dict]:
    """The records metrics of successive samples: per interval (from the sample before), the
    counters' growth summed over the pods, the shipper's lag p50/p99 of the records shipped in
    it (from the lag buckets' growth) and the pods' pending bytes; and the same over the whole
    run. The first sample with records is the baseline (nothing counted); a pod first seen
    later counts from zero, and a counter that went down (a restart) from its new value."""
    last: dict[str, dict] = {}
    intervals = []
    run = {"written": 0.0, "dropped": 0.0, "shipped": 0.0, "lag": {}}
    for sample in samples:
        baseline = not last
        grown = {"written": 0.0, "dropped": 0.0, "shipped": 0.0}
        lag: dict[str, float] = {}
        pending = None
        for pod, metrics in sample.get("records", {}).items():
            before = last.get(pod, {})
            for key in grown:
                grown[key] += counter_delta(before.get(key), metrics.get(key))
            lag = add_buckets(lag, bucket_delta(before.get("lag"), metrics.get("lag", {})))
            if metrics.get("pending_bytes") is not None:
                pending = (pending or 0.0) + metrics["pending_bytes"]
            last[pod] = metrics
        if baseline:
            continue
        for key in grown:
            run[key] += grown[key]
        run["lag"] = add_buckets(run["lag"], lag)
        intervals.append(
            {
                "t": sample["t"],
                **{k: int(v) for k, v in grown.items()},
                "lag_p50_s": _round(histogram_quantile(0.5, lag)),
                "lag_p99_s": _round(histogram_quantile(0.99, lag)),
                "pending_bytes": pending,
            }
        )
    total = {k: int(run[k]) for k in ("written", "dropped", "shipped")}
    total |= {
        "lag_p50_s": _round(histogram_quantile(0.5, run["lag"])),
        "lag_p99_s": _round(histogram_quantile(0.99, run["lag"])),
    }
    return intervals, total


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def series(samples: list[dict], key: str) -> dict[str, list[tuple[float, float]]]:
    """``{name: [(t, value), ...]}`` of one per-name mapping of each sample (``memory_mib``,
    ``run_bytes``)."""
    out: dict[str, list[tuple[float, float]]] = {}
    for sample in samples:
        for name, value in sample.get(key, {}).items():
            if value is not None:
                out.setdefault(name, []).append((sample["t"], value))
    return out


def trend(points: dict[str, list[tuple[float, float]]], scale: float = 1.0) -> dict[str, dict]:
    """Each series' most (times ``scale``) and least-squares slope per hour."""
    out = {}
    for name, values in sorted(points.items()):
        slope = slope_per_hour(values)
        out[name] = {
            "max": round(max(v for _, v in values) * scale, 2),
            "slope_per_hour": None if slope is None else round(slope * scale, 3),
            "samples": len(values),
        }
    return out


def _with_pods(samples: list[dict]) -> list[dict]:
    return [s for s in samples if "pods" in s]


def restarts(samples: list[dict]) -> dict[str, int]:
    """``{"pod/container": restarts during the run}``: the last count less the one of the first
    sample with pods (the baseline; a pod first seen later: its whole count); only those that
    restarted."""
    first: dict[str, int] = {}
    latest: dict[str, int] = {}
    for n, sample in enumerate(_with_pods(samples)):
        for pod in sample["pods"]:
            for container, count in pod["restarts"].items():
                key = f"{pod['name']}/{container}"
                first.setdefault(key, count if n == 0 else 0)
                latest[key] = count
    return {k: latest[k] - first[k] for k in sorted(latest) if latest[k] > first[k]}


def probe_predictions(samples: list[dict]) -> int:
    """About how many predictions the server pods' readiness probes made (``python -m rtserve
    probe ready`` asks the model for one; it is recorded like a client's): each running pod's
    time between its first and last sample over its probe period."""
    seen: dict[str, list[float]] = {}
    period: dict[str, float] = {}
    for sample in _with_pods(samples):
        for pod in sample["pods"]:
            if pod["app"] == APP and pod["phase"] == "Running" and pod.get("probe_period"):
                seen.setdefault(pod["name"], []).append(sample["t"])
                period[pod["name"]] = pod["probe_period"]
    return round(sum((max(ts) - min(ts)) / period[name] for name, ts in seen.items()))


def server_pods(samples: list[dict]) -> tuple[int, int]:
    """The server pods running in the first and the last sample with pods (the HPA may add some)."""
    with_pods = _with_pods(samples)
    if not with_pods:
        return 0, 0
    first, last = (
        [p for p in s["pods"] if p["app"] == APP and p["phase"] == "Running"] for s in (with_pods[0], with_pods[-1])
    )
    return len(first), len(last)


def evictions(samples: list[dict], events: list[dict], since: str) -> list[str]:
    """The pods evicted during the run: named by an ``Evicted`` event at or after ``since``
    (ISO 8601, UTC, as the API server writes times) or whose status says ``Evicted`` (but was
    not so in the baseline, the first sample with pods)."""
    pods = {e["pod"] for e in events if e["time"] >= since}
    with_pods = _with_pods(samples)
    before = {p["name"] for p in (with_pods[0]["pods"] if with_pods else []) if p["reason"] == "Evicted"}
    for sample in with_pods:
        pods |= {p["name"] for p in sample["pods"] if p["reason"] == "Evicted"}
    return sorted(pods - before)


def check_sample(sample: list[tuple[str, int, str | None]], lines: list[str]) -> dict:
    """:data:`STORE_CHECK`'s output against the sampled ids: found, missing, and those whose
    stored status or version (a 200's) differs from what the client saw (up to 5 of each)."""
    stored = {}
    for line in lines:
        if line.strip():
            rid, status, version = json.loads(line)
            stored[rid] = (status, version)
    missing, status_off, version_off = [], [], []
    for rid, status, version in sample:
        got = stored.get(rid, (None, None))
        if got[0] is None:
            missing.append(rid)
        elif got[0] != status:
            status_off.append(f"{rid}: {status} answered, {got[0]} stored")
        elif version is not None and got[1] != version:
            version_off.append(f"{rid}: {version} answered, {got[1]} stored")
    return {
        "sampled": len(sample),
        "found": len(sample) - len(missing),
        "missing": len(missing),
        "status_mismatches": len(status_off),
        "version_mismatches": len(version_off),
        "examples": missing[:5] + status_off[:5] + version_off[:5],
    }


# -- the cluster ------------------------------------------------------------------------------
def run_kubectl(command: list[str], *args: str, stdin: str | None = None, timeout: float = 30.0) -> str:
    """``command args``'s stdout, within ``timeout`` seconds.

    Raises:
        DeployError: it failed (with its stderr), took longer, or cannot be run.
    """
    cmd = [*command, *args]
    shown = shlex.join(cmd)
    shown = shown if len(shown) < 200 else shown[:200] + "..."
    try:
        done = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise DeployError(f"{shown}: no answer within {timeout:.0f} s") from None
    except OSError as exc:
        raise DeployError(f"cannot run {cmd[0]}: {exc}") from exc
    if done.returncode:
        raise DeployError(f"{shown} exited {done.returncode}: {done.stderr.strip()[-400:]}")
    return done.stdout


@dataclass
class Cluster:
    """The namespace's pods as the soak reads them (every call bounded by ``timeout``)."""

    kubectl: list[str]
    namespace: str
    timeout: float = 30.0

    def get(self, *args: str, stdin: str | None = None, timeout: float | None = None) -> str:
        return run_kubectl(self.kubectl, "-n", self.namespace, *args, stdin=stdin, timeout=timeout or self.timeout)

    def pods(self) -> list[PodSample]:
        return parse_pods(json.loads(self.get("get", "pods", "-o", "json")))

    def evictions(self) -> list[dict]:
        return parse_evictions(
            json.loads(self.get("get", "events", "--field-selector", "reason=Evicted", "-o", "json"))
        )

    def memory(self) -> dict[str, float]:
        return parse_top(self.get("top", "pod", "--containers"))

    def pod_sample(self, pod: str) -> tuple[int | None, dict]:
        return parse_pod_sample(
            self.get("exec", pod, "-c", APP, "--", "sh", "-c", POD_SAMPLE, "sh", RUN_DIR, METRICS_URL)
        )

    def store_check(self, pod: str, ids: list[str], timeout: float) -> list[str]:
        return self.get(
            "exec",
            "-i",
            pod,
            "-c",
            APP,
            "--",
            "python",
            "-c",
            STORE_CHECK,
            stdin="".join(i + "\n" for i in ids),
            timeout=timeout,
        ).splitlines()


def take_sample(cluster: Cluster, t: float, records_only: bool = False) -> dict:
    """One sampling round at ``t`` seconds: pods, memory, each running server pod's run
    directory and records metrics (``records_only``: those alone); what failed in ``errors``."""
    sample: dict = {"t": round(t, 1), "records": {}, "run_bytes": {}, "errors": []}
    try:
        pods = cluster.pods()
    except (DeployError, ValueError) as exc:
        sample["errors"].append(str(exc))
        return sample
    if not records_only:
        sample["pods"] = [p.json for p in pods]
        try:
            sample["memory_mib"] = cluster.memory()
        except (DeployError, ValueError) as exc:
            sample["errors"].append(f"kubectl top: {exc}")
    for pod in pods:
        if pod.app != APP or pod.phase != "Running":
            continue
        try:
            size, metrics = cluster.pod_sample(pod.name)
        except DeployError as exc:
            sample["errors"].append(str(exc))
            continue
        sample["records"][pod.name] = metrics
        if not records_only:
            sample["run_bytes"][pod.name] = size
    return sample


class Sampler:
    """:func:`take_sample` every ``every`` seconds on a thread of its own until stopped (at most
    ``max_rounds``), plus every eviction event seen (by uid)."""

    def __init__(self, cluster: Cluster, every: float, clock: Callable[[], float], max_rounds: int) -> None:
        self.cluster, self.every, self.clock, self.max_rounds = cluster, every, clock, max_rounds
        self.samples: list[dict] = []
        self.events: dict[str, dict] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def round(self, records_only: bool = False) -> dict:
        sample = take_sample(self.cluster, self.clock(), records_only)
        if not records_only:
            try:
                self.events |= {e["uid"]: e for e in self.cluster.evictions()}
            except (DeployError, ValueError) as exc:
                sample["errors"].append(str(exc))
        for error in sample["errors"]:
            logger.warning("sample at %.0f s: %s", sample["t"], error)
        return sample

    def start(self) -> None:
        self.samples.append(self.round())  # the baseline
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every) and len(self.samples) < self.max_rounds:
            sample = self.round()
            self.samples.append(sample)
            mem = sum(sample.get("memory_mib", {}).values())
            logger.info(
                "%5.1f min: %d pods, %.0f MiB in all, run dirs %s MiB, pending %s bytes",
                sample["t"] / 60,
                len(sample.get("pods", [])),
                mem,
                ", ".join(f"{(b or 0) / 2**20:.1f}" for b in sample["run_bytes"].values()),
                ", ".join(f"{m['pending_bytes'] or 0:.0f}" for m in sample["records"].values()),
            )

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(self.cluster.timeout * 6 + 30)


def precondition(deployed: Deployed) -> list[PodState]:
    """The Deployment's ready pods.

    Raises:
        DeployError: kubectl cannot reach the cluster, or no pod is ready: start them with `make pod`.
    """
    try:
        ready = [p for p in deployed.pods() if p.ready]
    except (DeployError, ValueError, KeyError) as exc:
        raise DeployError(
            f"the soak runs against the pods of `make pod` on the local cluster; none "
            f"could be read in namespace {deployed.namespace} ({exc}): start them with "
            "`make pod`"
        ) from exc
    if not ready:
        raise DeployError(
            f"no pod of {deployed.app} is ready in namespace {deployed.namespace}: "
            "start them with `make pod` (the soak runs against its Service)"
        )
    return ready


def capacity(url: str, token: str, seconds: float, connections: int) -> dict:
    """A closed-loop burst (no pause between requests) on ``connections``: requests/s answered
    (200) of those started within ``seconds``, and its first-try failures."""
    load = SteadyLoad(
        url, sample_payload(), lambda: token, rate=1e6, concurrency=connections, max_seconds=seconds + 5, timeout=10.0
    ).start("capacity")
    time.sleep(seconds)
    records = load.stop()
    within = [r for r in records if r.start < seconds]
    failed = Counter(status_key(r.first_status) for r in within if r.failed_first)
    return {
        "seconds": seconds,
        "connections": connections,
        "sent": len(within),
        "per_second": round(sum(r.answered for r in within) / seconds, 1),
        "failed_first": sum(failed.values()),
        "failed_first_by_status": dict(failed),
    }


def wait_shipped(sampler: Sampler, timeout: float, every: float = 5.0) -> tuple[float | None, dict]:
    """Wait until every server pod's pending bytes are 0 (at most ``timeout`` s): the seconds it
    took (None: not within ``timeout``) and the last records-only sample."""
    began = time.monotonic()
    while True:
        sample = sampler.round(records_only=True)
        pending = [m["pending_bytes"] for m in sample["records"].values()]
        if sample["records"] and not sample["errors"] and all(not p for p in pending):
            return round(time.monotonic() - began, 1), sample
        if time.monotonic() - began > timeout:
            return None, sample
        time.sleep(every)


# -- output -----------------------------------------------------------------------------------
def summary(report: dict) -> list[str]:
    """The figures a closing note quotes, as a table."""
    load, rec, lag = report["load"], report["records"], report["lag"]
    cap = report["capacity"]
    rate = (
        f"{report['rate']:g} req/s (half of {cap['per_second']:g} measured, {cap['connections']} "
        f"connections, {cap['seconds']:g} s)"
        if cap
        else f"{report['rate']:g} req/s (given)"
    )
    by = ", ".join(f"{k}: {n}" for k, n in load["failed_first_by_status"].items())
    sample = rec["sample"]
    lines = [
        f"soak: {report['minutes']:g} min through {report['url']}, {report['connections']} connections, "
        f"1 in {report['bad_every']} a bad request",
        f"  rate             {rate}; sent {load['per_second']:g} req/s",
        f"  requests         {load['sent']:,} sent, {load['answered']:,} answered ({load['bad']:,} bad, "
        f"expected 400); failed on the first try: {load['failed_first']}{f' ({by})' if by else ''}; "
        f"p50 {load['p50_ms']} ms, p99 {load['p99_ms']} ms",
        f"  server pods      {report['server_pods'][0]} at the start, {report['server_pods'][1]} at the end"
        " (the HPA may add some)",
        f"  restarts         {sum(report['restarts'].values())}"
        + "".join(f"; {k}: {n}" for k, n in report["restarts"].items()),
        f"  evictions        {len(report['evictions'])}" + "".join(f"; {p}" for p in report["evictions"]),
        f"  memory ({report['memory_source']})",
    ]
    lines += [
        f"    {name:<48} max {v['max']:>8.1f} MiB  slope {_signed(v['slope_per_hour'])} MiB/h"
        for name, v in report["memory"].items()
    ]
    if report["cassandra"]:
        lines.append(f"    ({report['cassandra']})")
    lines.append("  run directory (du -sb)")
    lines += [
        f"    {name:<48} max {v['max']:>8.2f} MiB  slope {_signed(v['slope_per_hour'])} MiB/h"
        for name, v in report["disk"].items()
    ]
    found = (
        f"{sample['found']:,} of {sample['sampled']:,} sampled found, {sample['missing']} missing, "
        f"{sample['version_mismatches']} version / {sample['status_mismatches']} status mismatches"
        if "sampled" in sample
        else f"sample not checked: {sample.get('skipped')}"
    )
    lines += [
        f"  records          answered {rec['answered']:,}, written {rec['written']:,} "
        f"({rec['written'] - rec['answered']:+,}; the readiness probes' predictions: about "
        f"{rec['probe_predictions']:,}), shipped {rec['shipped']:,}, dropped {rec['dropped']:,}",
        f"                   {found}",
        f"  shipper lag      p50 {_seconds(lag['p50_s'])}, p99 {_seconds(lag['p99_s'])} over the run; "
        + (
            f"nothing pending {rec['drained_s']} s after the load"
            if rec["drained_s"] is not None
            else f"still pending after {report['drain_timeout']:g} s"
        ),
    ]
    return lines


def _signed(value: float | None) -> str:
    return "     n/a" if value is None else f"{value:+8.2f}"


def _seconds(value: float | None) -> str:
    return "n/a" if value is None else f"{value:g} s"


def plot(report: dict, paths: list[Path]) -> None:
    """The soak's five panels (requests and failures, latency, memory, run directories, the
    shipper's lag and pending bytes) against minutes, into each of ``paths``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(5, 1, figsize=(10, 16), dpi=100, sharex=True)
    rows = report["minutes_rows"]
    mins = [r["minute"] + 0.5 for r in rows]
    ax = axes[0]
    ax.plot(mins, [r["per_second"] for r in rows], marker="o", markersize=3, label="requests/s")
    ax.set_ylabel("requests/s")
    ax.set_ylim(bottom=0, top=max([1.0] + [r["per_second"] for r in rows]) * 1.15)
    twin = ax.twinx()
    twin.bar(
        mins, [r["failed_first"] for r in rows], width=0.6, color="tab:red", alpha=0.5, label="failed on the first try"
    )
    twin.set_ylabel("first-try failures / min")
    twin.set_ylim(bottom=0, top=max([1] + [r["failed_first"] for r in rows]) * 1.2)
    ax.legend(
        *[a + b for a, b in zip(ax.get_legend_handles_labels(), twin.get_legend_handles_labels())],
        fontsize=8,
        loc="lower right",
    )
    ax.set_title(
        f"soak: {report['minutes']:g} min at {report['rate']:g} req/s through the Service ({report['started']})",
        fontsize=10,
    )
    axes[1].plot(mins, [r["p50_ms"] for r in rows], marker="o", markersize=3, label="p50")
    axes[1].plot(mins, [r["p99_ms"] for r in rows], marker="^", markersize=3, label="p99")
    axes[1].set_ylabel("latency per minute (ms)")
    axes[1].legend(fontsize=8)
    for name, points in series(report["samples"], "memory_mib").items():
        slope = report["memory"][name]["slope_per_hour"]
        axes[2].plot(
            [t / 60 for t, _ in points], [v for _, v in points], label=f"{name} ({_signed(slope).strip()} MiB/h)"
        )
    axes[2].set_ylabel(f"memory (MiB, {report['memory_source']})", fontsize=8)
    axes[2].legend(fontsize=7)
    for name, points in series(report["samples"], "run_bytes").items():
        slope = report["disk"][name]["slope_per_hour"]
        axes[3].plot(
            [t / 60 for t, _ in points],
            [v / 2**20 for _, v in points],
            marker=".",
            label=f"{name} ({_signed(slope).strip()} MiB/h)",
        )
    axes[3].set_ylabel("run directory (MiB)")
    axes[3].legend(fontsize=7)
    intervals = report["lag"]["intervals"]
    ts = [i["t"] / 60 for i in intervals]
    for key, marker in (("lag_p50_s", "o"), ("lag_p99_s", "^")):
        axes[4].plot(
            ts,
            [i[key] if i[key] is not None else float("nan") for i in intervals],
            marker=marker,
            markersize=3,
            label=f"shipper lag {key[4:7]}",
        )
    if any(i[key] for i in intervals for key in ("lag_p50_s", "lag_p99_s")):
        axes[4].set_yscale("log")
        axes[4].set_ylabel("shipper lag (s, log scale)")
    else:
        axes[4].set_ylabel("shipper lag (s)")
        axes[4].text(
            0.5, 0.75, "no record shipped (no records store)", transform=axes[4].transAxes, ha="center", fontsize=9
        )
    pending = axes[4].twinx()
    pending.plot(
        ts,
        [(i["pending_bytes"] or 0) / 1024 for i in intervals],
        color="tab:gray",
        linestyle="--",
        label="pending (KiB)",
    )
    pending.set_ylabel("pending KiB (all pods)")
    axes[4].legend(
        *[a + b for a, b in zip(axes[4].get_legend_handles_labels(), pending.get_legend_handles_labels())], fontsize=8
    )
    axes[4].set_xlabel("minutes since the load started")
    for ax in axes:
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path)
    plt.close(fig)


# -- the run ----------------------------------------------------------------------------------
def soak(args: argparse.Namespace, deployed: Deployed, cluster: Cluster) -> dict:
    """Measure, load, sample, check (the module's docstring); the report."""
    ready = precondition(deployed)
    url = deployed.service_url() + f"/predictions/{args.model}"
    token = deployed.token()
    logger.info(">> %d pods ready (%s); %s", len(ready), ", ".join(p.name for p in ready), url)
    cap = None
    rate = args.rate
    if not rate:
        logger.info(">> capacity: %g s closed loop on %d connections", args.capacity_seconds, args.capacity_connections)
        cap = capacity(url, token, args.capacity_seconds, args.capacity_connections)
        rate = round(cap["per_second"] / 2, 1)
        logger.info(
            "   %g req/s answered (%d failed on the first try): the soak's rate is %g",
            cap["per_second"],
            cap["failed_first"],
            rate,
        )
        if rate <= 0:
            raise DeployError(f"the capacity burst answered nothing through {url}: {cap}")
    seconds = args.minutes * 60
    began = time.monotonic()
    sampler = Sampler(
        cluster, args.sample_every, lambda: time.monotonic() - began, max_rounds=int(seconds / args.sample_every) + 20
    )
    drained, _ = wait_shipped(sampler, args.drain_timeout)  # the burst's records first
    logger.info(">> the burst's records shipped (%s s)", drained)
    began = time.monotonic()
    sampler.start()
    minutes = Minutes(args.id_every)
    now = datetime.now(UTC)
    started, since = now.strftime("%Y-%m-%d %H:%M UTC"), now.strftime("%Y-%m-%dT%H:%M:%SZ")
    logger.info(
        ">> soak: %g min at %g req/s on %d connections, 1 in %d a bad request",
        args.minutes,
        rate,
        args.connections,
        args.bad_every,
    )
    load = SteadyLoad(
        url,
        sample_payload(),
        lambda: token,
        rate=rate,
        concurrency=args.connections,
        max_seconds=seconds + 60,
        max_requests=int(rate * (seconds + 60)) + 1000,
        timeout=10.0,
        bad_every=args.bad_every,
        sink=minutes,
    ).start("soak")
    try:
        time.sleep(seconds)
    except KeyboardInterrupt:
        logger.warning(">> interrupted: the report covers the %.0f s so far", load.now())
    finally:
        elapsed = min(seconds, load.now())
        load.stop()
        sampler.stop()
    logger.info(">> load stopped after %.0f s: %d requests; waiting for the shipper", elapsed, load.done)
    drained, _ = wait_shipped(sampler, args.drain_timeout)
    final = sampler.round()
    final["final"] = True
    samples = sampler.samples + [final]
    intervals, shipped = records_over_time(samples)
    check = store_check(cluster, samples, minutes.ids, args.store_timeout)
    memory = trend(series(samples, "memory_mib"))
    cassandra_pods = {p["name"] for s in samples for p in s.get("pods", []) if p["app"] == CASSANDRA_APP}
    return {
        "started": started,
        "url": url,
        "minutes": args.minutes,
        "rate": rate,
        "capacity": cap,
        "connections": args.connections,
        "bad_every": args.bad_every,
        "sample_every_s": args.sample_every,
        "drain_timeout": args.drain_timeout,
        "load": minutes.totals(elapsed),
        "minutes_rows": minutes.rows(elapsed),
        "restarts": restarts(samples),
        "evictions": evictions(samples, list(sampler.events.values()), since),
        "eviction_events": list(sampler.events.values()),
        "memory_source": "working set, kubectl top pod --containers",
        "memory": memory,
        "cassandra": None
        if cassandra_pods
        else (f"no {CASSANDRA_APP} pod (the records component): Cassandra's memory not sampled"),
        "disk": trend(series(samples, "run_bytes"), 1 / 2**20),
        "server_pods": server_pods(samples),
        "records": {
            "answered": minutes.answered,
            **{k: shipped[k] for k in ("written", "shipped", "dropped")},
            "probe_predictions": probe_predictions(samples),
            "drained_s": drained,
            "sample": check,
        },
        "lag": {"p50_s": shipped["lag_p50_s"], "p99_s": shipped["lag_p99_s"], "intervals": intervals},
        "samples": samples,
    }


def store_check(cluster: Cluster, samples: list[dict], ids: list[tuple[str, int, str | None]], timeout: float) -> dict:
    """:func:`check_sample` of ``ids`` through one exec into a running server pod."""
    running = [p["name"] for p in samples[-1].get("pods", []) if p["app"] == APP and p["phase"] == "Running"]
    if not running:
        return {"skipped": "no server pod runs"}
    if not ids:
        return {"skipped": "no answered request was sampled"}
    try:
        lines = cluster.store_check(running[0], [i for i, _, _ in ids], timeout)
    except DeployError as exc:
        return {"skipped": f"the lookup failed: {exc}"}
    if lines and lines[0].startswith("{"):
        return {"skipped": json.loads(lines[0])["error"]}
    return check_sample(ids, lines)


def ok(report: dict) -> bool:
    """Nothing failed on its first try, restarted, was evicted, dropped or missing."""
    sample = report["records"]["sample"]
    return (
        report["load"]["failed_first"] == 0
        and not report["restarts"]
        and not report["evictions"]
        and report["records"]["dropped"] == 0
        and sample.get("missing", 0) == 0
        and sample.get("version_mismatches", 0) == 0
        and sample.get("status_mismatches", 0) == 0
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=common.MODEL)
    p.add_argument("--kubectl", default="kubectl", help="the kubectl command, options included")
    p.add_argument("--namespace", default="rtserve-local")
    p.add_argument("--minutes", type=float, default=60.0, help="how long the load runs")
    p.add_argument("--rate", type=float, default=0.0, help="requests/s (0: half the measured capacity)")
    p.add_argument("--connections", type=int, default=8, help="the load's connections")
    p.add_argument("--bad-every", type=int, default=20, help="one request in this many is a bad one (400)")
    p.add_argument("--capacity-seconds", type=float, default=20.0)
    p.add_argument("--capacity-connections", type=int, default=16)
    p.add_argument("--sample-every", type=float, default=30.0, help="seconds between samples")
    p.add_argument("--id-every", type=int, default=100, help="every this many answered ids are checked in the store")
    p.add_argument("--drain-timeout", type=float, default=300.0, help="most seconds to wait for the shipper")
    p.add_argument("--store-timeout", type=float, default=600.0, help="most seconds the store check takes")
    p.add_argument("--out", type=Path, default=common.RESULTS / "soak.json")
    p.add_argument("--png", type=Path, default=common.RESULTS / "soak.png")
    p.add_argument("--docs", action="store_true", help="also draw docs/soak.png")
    args = p.parse_args(argv)
    common.log_to_stdout()
    kubectl = Kubectl(args.kubectl, out=logger.info)
    deployed = Deployed(kubectl, args.namespace, APP)
    try:
        report = soak(args, deployed, Cluster(kubectl.command, args.namespace))
    except RtserveError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    plot(report, [args.png] + ([common.REPO / "docs" / "soak.png"] if args.docs else []))
    text = "\n".join(summary(report) + [f"  (report: {args.out}; plot: {args.png})"])
    return common.finish(report, args.out, text, ok(report))


if __name__ == "__main__":
    sys.exit(main())
