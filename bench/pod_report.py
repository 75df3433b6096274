"""Report an image and its pod: size with a breakdown, time to ready, memory idle and under load.

Measured, never asserted: `make pod-report` builds what is missing, starts a pod on free loopback
ports, sends steady load through its gateway, and prints (and writes JSON):

- the image's size, per layer (base, Java runtime, virtualenv, rtserve) and the largest packages;
- seconds from `podman run` until the kubelet loop saw every probe pass;
- each container's memory at idle and under load (``podman stats``), and the load's rate and
  latency percentiles through the gateway.

    .venv/bin/python -m bench.pod_report --tag 1.0
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from bench.loadgen import SteadyLoad, summarize
from deploy.podman.pod import PodConfig, down, podman, up
from rtserve.server import free_ports, sample_payload

logger = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parent.parent
SITE = "/opt/venv/lib/python3.11/site-packages"


def image_breakdown(image: str) -> dict:
    """Total size, sizes per layer (largest first) and the largest installed packages, in MB."""
    size = int(podman("image", "inspect", "--format", "{{.Size}}", image).stdout)
    layers = []
    for line in podman("history", "--no-trunc", "--format", "{{.Size}}\t{{.CreatedBy}}", image).stdout.splitlines():
        human, created = line.split("\t", 1)
        if human.strip() not in ("0 B", "0B"):
            layers.append({"size": human.strip(), "step": " ".join(created.split())[:90]})
    du = podman("run", "--rm", "--entrypoint", "sh", image, "-c",
                f"du -sm {SITE}/* /usr/lib/jvm/* | sort -rn | head -12").stdout
    packages = {line.split("\t")[1].removeprefix(SITE + "/"): int(line.split("\t")[0])
                for line in du.splitlines() if "\t" in line}
    return {"image": image, "size_mb": round(size / 1e6), "layers": layers, "largest_mb": packages}


def memory(pod: str) -> dict[str, str]:
    """Memory use per container of ``pod`` (podman stats)."""
    out = podman("stats", "--no-stream", "--format", "{{.Name}}\t{{.MemUsage}}").stdout
    return {n.removeprefix(pod + "-"): m.split("/")[0].strip()
            for n, m in (line.split("\t") for line in out.splitlines()) if n.startswith(pod + "-")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tag", default="1.0", help="the rtserve image tag (model version)")
    parser.add_argument("--image", default="registry.example.com/ml/rtserve")
    parser.add_argument("--rate", type=float, default=200.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--work-dir", type=Path, default=REPO / ".run" / "pod-report")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "pod_report.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    report = {"image": image_breakdown(f"{args.image}:{args.tag}")}
    build_log = REPO / "build" / "image" / f"{args.tag}.log"
    ports = dict(zip(("inference", "management", "metrics"), free_ports(3)))
    config = PodConfig("rtserve-report", args.work_dir, None, ports, args.tag)
    try:
        report["seconds_to_ready"] = round(up(config), 1)
        time.sleep(5)
        report["memory_idle"] = memory(config.name)
        token = config.token_file.read_text().strip()
        load = SteadyLoad(f"http://127.0.0.1:{ports['inference']}/predictions/realtime-classifier",
                          sample_payload(), lambda: token, rate=args.rate,
                          concurrency=args.concurrency, max_seconds=args.seconds + 30, timeout=10.0)
        load.start("load")
        time.sleep(args.seconds)
        report["memory_load"] = memory(config.name)
        (phase,) = summarize(load.stop())
        report["load"] = {"rate_target": args.rate, "sent": phase.sent, "failed": phase.failed,
                          "per_second": round(phase.sent / args.seconds, 1),
                          "p50_ms": phase.p50_ms, "p99_ms": phase.p99_ms}
    finally:
        down(config.pod_dir)
    report["build_log"] = str(build_log) if build_log.exists() else None
    print(json.dumps(report, indent=1))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
