"""Report an image and its pod on the local cluster: size with a breakdown, time to ready,
memory idle and under load, and the sizing that follows from them.

Measured, never asserted: `make pod-report` runs against the pod `make pod` left running on
`make cluster`'s node (the local overlay, two replicas behind their Service), and prints (and
writes JSON):

- the image's size, per layer (base, Java runtime, virtualenv, rtserve) and the largest packages;
- a pod's time to ready: one replica deleted, seconds from then until its replacement is Ready
  (scheduled, started, probes passed: the kubelet's own work) (``--no-restart`` skips it);
- each container's memory at idle and under load (its cgroup's working set, as the kubelet counts
  it), and the load's rate and latency percentiles through the Service;
- the sizing sweep: ``wrk`` (closed loop, one thread, bench/wrk_post.lua) against one pod's
  address at rising concurrency, each point's requests/s, p99, the pod's CPU (in cores, from its
  cgroup's usage) and memory; the pod's capacity is the most requests/s of a point with p99
  under ``--p99-ms`` (15) and no errors. On a machine with no more cores than the pod's CPU limit,
  wrk and the pod share them, so the capacity is a lower bound.
- what follows (:func:`sizing`): the HPA's CPU target, requests/limits, and pods and cores for
  10k and 100k requests/s.

    make pod && make pod-report
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench import common
from bench.loadgen import SteadyLoad, summarize
from bench.perf import run_wrk
from rtserve.k8s.deploy import Kubectl
from rtserve.k8s.pod import Deployed, PodState, cpu_seconds, memory_mib
from rtserve.server.readiness import sample_payload

logger = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parent.parent
SITE = "/opt/venv/lib/python3.11/site-packages"
CONTAINERS = ("rtserve", "gateway")


def podman(*args: str, cwd: Path | None = None) -> str:
    """podman's stdout, stripped, with the project's containers.conf (explicit ulimits: what
    `make image` uses); RuntimeError with its stderr when it fails."""
    env = {"CONTAINERS_CONF": str(REPO / "deploy" / "podman" / "containers.conf"), **os.environ}
    done = subprocess.run(["podman", *args], cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    if done.returncode:
        raise RuntimeError(f"podman {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout.strip()


def image_breakdown(image: str) -> dict:
    """Total size, sizes per layer (largest first) and the largest installed packages, in MB."""
    size = int(podman("image", "inspect", "--format", "{{.Size}}", image))
    layers = []
    for line in podman("history", "--no-trunc", "--format", "{{.Size}}\t{{.CreatedBy}}", image).splitlines():
        human, created = line.split("\t", 1)
        if human.strip() not in ("0 B", "0B"):
            layers.append({"size": human.strip(), "step": " ".join(created.split())[:90]})
    du = podman(
        "run", "--rm", "--entrypoint", "sh", image, "-c", f"du -sm {SITE}/* /usr/lib/jvm/* | sort -rn | head -12"
    )
    packages = {
        line.split("\t")[1].removeprefix(SITE + "/"): int(line.split("\t")[0])
        for line in du.splitlines()
        if "\t" in line
    }
    return {"image": image, "size_mb": round(size / 1e6), "layers": layers, "largest_mb": packages}


def memory(pod: PodState) -> dict[str, float]:
    """Memory (MiB) per container of ``pod``."""
    return {c: round(memory_mib(pod, c), 1) for c in CONTAINERS if c in pod.container_ids}


def seconds_to_ready(deployed: Deployed, timeout: float = 600) -> float:
    """Delete the first replica; seconds until its replacement is Ready (looked at every second).

    The timeout is the local overlay's start-up budget (its startupProbe: 10 minutes)."""
    before = deployed.pods()
    began = time.monotonic()
    deployed.kubectl("-n", deployed.namespace, "delete", "pod", before[0].name, "--wait=false")
    old = {p.name for p in before}
    while time.monotonic() - began < timeout:
        if any(p.ready for p in deployed.pods() if p.name not in old):
            return time.monotonic() - began
        time.sleep(1)
    raise RuntimeError(f"no replacement of {before[0].name} was ready within {timeout:.0f} s")


def cpu_limit(pod: dict) -> float | None:
    """The pod's CPU: the sum of its containers' limits (what the HPA divides by), None when one
    has no limit."""
    total = 0.0
    for c in pod["spec"].get("initContainers", []) + pod["spec"]["containers"]:
        value = str((c.get("resources") or {}).get("limits", {}).get("cpu", ""))
        if not value:
            return None
        total += int(value[:-1]) / 1000 if value.endswith("m") else float(value)
    return total


def sweep(pod: PodState, url: str, token: str, concurrencies: list[int], seconds: float, body: Path) -> list[dict]:
    """wrk against the pod's gateway at each concurrency: rate, latency, pod CPU (cores) and memory."""
    points = []
    run_wrk(url, max(concurrencies), 2, token, body)  # warm-up, not measured
    for c in concurrencies:
        cpu0, t0 = cpu_seconds(pod), time.monotonic()
        res = run_wrk(url, c, seconds, token, body)
        cores = (cpu_seconds(pod) - cpu0) / (time.monotonic() - t0)
        mem = memory(pod)
        errors = sum(res["errors"].values())
        point = {
            "concurrency": c,
            "per_second": round(res["requests"] / (res["duration_us"] / 1e6), 1),
            "p50_ms": round(res["latency_us"]["p50"] / 1e3, 2),
            "p99_ms": round(res["latency_us"]["p99"] / 1e3, 2),
            "errors": errors,
            "pod_cores": round(cores, 2),
            "memory": mem,
            "memory_mib": round(sum(mem.values())),
        }
        logger.info(
            "c=%-3d %7.1f req/s  p50 %6.2f ms  p99 %6.2f ms  errors %d  pod %.2f cores  %s",
            c,
            point["per_second"],
            point["p50_ms"],
            point["p99_ms"],
            errors,
            cores,
            mem,
        )
        points.append(point)
    return points


def sizing(
    points: list[dict],
    p99_ms: float,
    cpu_limit: float,
    memory_idle_mib: float,
    headroom: float,
    rates: tuple[int, ...] = (10_000, 100_000),
) -> dict:
    """What the sweep says: the capacity per pod, the HPA CPU target, requests and limits, pods
    and cores for ``rates``.

    - capacity: the most req/s of a point with p99 under ``p99_ms`` and no errors;
    - HPA target: the pod's CPU use at that capacity as a share of its limit, times ``headroom``
      (scaling out starts before a pod reaches its p99 limit: the HPA reacts in tens of seconds);
    - CPU requests = limits = the manifest's limit (Guaranteed QoS; the capacity was measured at
      it); memory requests = limits = the most measured under load, plus 50 %, rounded up to
      256 MiB;
    - pods for a rate: the rate over the load a pod carries at the HPA's target.
    """
    ok = [p for p in points if p["p99_ms"] < p99_ms and p["errors"] == 0]
    if not ok:
        return {"capacity_per_second": None, "note": f"no point had p99 under {p99_ms} ms"}
    best = max(ok, key=lambda p: p["per_second"])
    used = min(1.0, best["pod_cores"] / cpu_limit)
    target_pct = int(used * headroom * 100 // 5 * 5)
    per_pod = best["per_second"] * headroom
    peak_mib = max([memory_idle_mib] + [p["memory_mib"] for p in points])
    request_mib = math.ceil(peak_mib * 1.5 / 256) * 256
    return {
        "p99_limit_ms": p99_ms,
        "capacity_per_second": best["per_second"],
        "at_concurrency": best["concurrency"],
        "p99_ms_at_capacity": best["p99_ms"],
        "pod_cores_at_capacity": best["pod_cores"],
        "cpu_limit": cpu_limit,
        "hpa_target_utilization_pct": target_pct,
        "per_pod_at_target": round(per_pod, 1),
        "memory_peak_mib": round(peak_mib),
        "memory_request_mib": request_mib,
        "pods_for": {str(r): math.ceil(r / per_pod) for r in rates},
        "cores_for": {str(r): math.ceil(r / per_pod) * cpu_limit for r in rates},
    }


def render_sizing(s: dict) -> str:
    """The sizing as a Markdown table (docs/image-and-pod.md)."""
    if not s.get("capacity_per_second"):
        return s.get("note", "no sizing")
    rows = [
        (
            f"per pod at its CPU limit, p99 < {s['p99_limit_ms']:g} ms",
            f"{s['capacity_per_second']:.0f} req/s (c={s['at_concurrency']}, p99 {s['p99_ms_at_capacity']} ms, "
            f"{s['pod_cores_at_capacity']} of {s['cpu_limit']:g} cores)",
        ),
        ("memory, most measured", f"{s['memory_peak_mib']} MiB"),
        ("pod CPU requests = limits (rtserve + gateway)", f"{s['cpu_limit']:g}"),
        ("memory requests = limits", f"{s['memory_request_mib']} Mi"),
        ("HPA CPU target", f"{s['hpa_target_utilization_pct']} % ({s['per_pod_at_target']:.0f} req/s per pod)"),
    ] + [(f"{int(r):,} req/s", f"{n} pods, {s['cores_for'][r]:g} cores") for r, n in s["pods_for"].items()]
    return "\n".join(["| | |", "|---|---|"] + [f"| {a} | {b} |" for a, b in rows])


#: (flag, type, default, help) of the numeric options.
NUMERIC_OPTIONS = (
    ("--rate", float, 200.0, "steady load: target requests per second"),
    ("--concurrency", int, 8, "steady load: client threads"),
    ("--seconds", float, 20.0, "steady load: seconds (memory is read at its end)"),
    ("--sweep-seconds", float, 8.0, "seconds of each sweep point"),
    ("--p99-ms", float, 15.0, "a sweep point counts toward capacity only under this p99"),
    ("--headroom", float, 0.7, "share of the capacity a pod carries at the HPA's target"),
    ("--settle", float, 5.0, "seconds between ready and the idle memory reading"),
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tag", default="1.0", help="the rtserve image tag (model version)")
    parser.add_argument("--image", default="registry.example.com/ml/rtserve")
    parser.add_argument("--kubectl", default="kubectl", help="the kubectl command, options included")
    parser.add_argument("--namespace", default="rtserve-local")
    parser.add_argument("--app", default="rtserve")
    parser.add_argument("--model", default=common.MODEL)
    for flag, kind, default, text in NUMERIC_OPTIONS:
        parser.add_argument(flag, type=kind, default=default, help=text)
    parser.add_argument(
        "--concurrency-sweep", default="1,2,4,8,16,32", help="wrk concurrencies of the sizing sweep ('' skips it)"
    )
    parser.add_argument("--no-restart", action="store_true", help="skip the time to ready (no pod is deleted)")
    parser.add_argument("--out", type=Path, default=common.RESULTS / "pod_report.json")
    args = parser.parse_args(argv)
    common.log_to_stdout()
    deployed = Deployed(Kubectl(args.kubectl, out=logger.info), args.namespace, args.app)
    report = {"image": image_breakdown(f"{args.image}:{args.tag}")}
    replicas = len(deployed.wait_ready(1, 60))
    report["seconds_to_ready"] = None if args.no_restart else round(seconds_to_ready(deployed), 1)
    pod = deployed.wait_ready(replicas, 600)[0]
    time.sleep(args.settle)
    report["pod"] = pod.name
    report["memory_idle"] = memory(pod)
    token = deployed.token()
    path = f"/predictions/{args.model}"
    load = SteadyLoad(
        deployed.service_url() + path,
        sample_payload(),
        lambda: token,
        rate=args.rate,
        concurrency=args.concurrency,
        max_seconds=args.seconds + 30,
        timeout=10.0,
    )
    load.start("load")
    time.sleep(args.seconds)
    report["memory_load"] = memory(pod)
    (phase,) = summarize(load.stop())
    report["load"] = {
        "rate_target": args.rate,
        "sent": phase.sent,
        "failed_first": phase.failed_first,
        "failed_first_by_status": phase.failed_first_by_status,
        "resent": phase.resent,
        "failed_after_resend": phase.failed_after_resend,
        "per_second": round(phase.sent / args.seconds, 1),
        "p50_ms": phase.p50_ms,
        "p99_ms": phase.p99_ms,
    }
    if args.concurrency_sweep:
        spec = json.loads(deployed.get("pod", pod.name, "-o", "json"))
        limit = cpu_limit(spec)
        report["cpu_limit"] = limit if limit else f"none: the machine's {os.cpu_count()} cores"
        with tempfile.TemporaryDirectory() as tmp:
            body = Path(tmp) / "request.json"
            body.write_text(json.dumps(sample_payload()))
            points = sweep(
                pod,
                f"http://{pod.ip}:8080{path}",
                token,
                [int(c) for c in args.concurrency_sweep.split(",")],
                args.sweep_seconds,
                body,
            )
        report["sweep"] = points
        report["sizing"] = sizing(
            points, args.p99_ms, limit or float(os.cpu_count() or 1), sum(report["memory_idle"].values()), args.headroom
        )
    build_log = REPO / "build" / "image" / f"{args.tag}.log"
    report["build_log"] = str(build_log) if build_log.exists() else None
    text = json.dumps(report, indent=1) + ("\n" + render_sizing(report["sizing"]) if "sizing" in report else "")
    return common.finish(report, args.out, text, report["load"]["failed_first"] == 0)


if __name__ == "__main__":
    sys.exit(main())
