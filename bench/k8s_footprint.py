"""Measure what the Kubernetes manifests assume: the pod's memory and the exec probes' cost.

Starts TorchServe the way the pod does (``python -m rtserve server run`` with the cluster's
config.properties, listeners moved to free loopback ports), sends a bounded burst of
predictions, and prints the peak resident memory of TorchServe's process tree and how long
``python -m rtserve probe ready`` and ``live`` take, wall and CPU (:func:`bench.probe_cost.cost`;
``make bench-probe`` has the probes' figures alone). Run it after ``make archive``:

    .venv/bin/python bench/k8s_footprint.py [--requests 2000]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.probe_cost import cost, precompile  # noqa: E402
from rtserve.runtime.process import spawn, terminate, wait_until  # noqa: E402
from rtserve.server.probe import local_client  # noqa: E402
from rtserve.server.properties import read_properties, write_properties  # noqa: E402
from rtserve.server.torchserve import TorchServe  # noqa: E402
from rtserve.testing.server import free_port_overrides  # noqa: E402

MODEL = "realtime-classifier"


def tree_rss(pid: int) -> int:
    """Resident bytes of a process and all its children."""
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return 0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--version", default="1.0")
    parser.add_argument("--model-store", type=Path, default=REPO / "model_store")
    parser.add_argument("--probe-runs", type=int, default=7, help="timed runs of each probe")
    args = parser.parse_args(argv)
    mar = args.model_store / f"{MODEL}_{args.version}.mar"
    if not mar.exists():
        sys.exit(f"{mar} missing: run `make archive MODEL_VERSION={args.version}` first")
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "config.properties"
        props = read_properties(REPO / "deploy" / "k8s" / "base" / "config.properties")
        props.update(free_port_overrides())
        # The image's paths (/opt/rtserve/...) are this checkout's outside a container.
        props = {k: v.replace("/opt/rtserve/", f"{REPO}/") for k, v in props.items()}
        write_properties(config, props)
        run_dir = Path(tmp) / "run"
        env = dict(
            os.environ,
            RTSERVE_RUN_DIR=str(run_dir),
            RTSERVE_CONFIG=str(config),
            RTSERVE_MODEL_STORE=str(mar.parent),
            RTSERVE_MODEL=MODEL,
            RTSERVE_MODELS=f"{MODEL}={mar.name}",
        )
        runner = spawn([sys.executable, "-m", "rtserve", "server", "run"], Path(os.devnull), cwd=REPO, env=env)
        server = TorchServe(run_dir, mar.parent, config=config)
        try:
            started = time.monotonic()

            def ready() -> bool:  # the startup probe passes (or the pod's main process died)
                return (
                    runner.poll() is not None
                    or subprocess.run(
                        [sys.executable, "-m", "rtserve", "probe", "ready"], env=env, cwd=REPO, capture_output=True
                    ).returncode
                    == 0
                )

            # 300 s: beside the cluster tier (CI, a load of 11-17 on 2 cores) 120 s was too short
            if not wait_until(ready, 300, poll=0.5) or runner.poll() is not None:
                sys.exit("TorchServe did not become ready:\n" + server.log_tail())
            print(f"ready (startup probe passes) after {time.monotonic() - started:.1f}s")
            pid = server.pid()
            idle = tree_rss(pid)
            peak = idle
            done = threading.Event()

            def sample() -> None:
                nonlocal peak
                while not done.wait(0.2):
                    peak = max(peak, tree_rss(pid))

            sampler = threading.Thread(target=sample)
            sampler.start()
            client = local_client(run_dir, timeout=30)
            body = {"features": [0.5] * 32}
            t = time.perf_counter()
            with ThreadPoolExecutor(max_workers=16) as pool:
                list(pool.map(lambda _: client.predict(MODEL, body), range(args.requests)))
            elapsed = time.perf_counter() - t
            done.set()
            sampler.join()
            print(f"{args.requests} predictions from 16 threads in {elapsed:.1f}s")
            print(f"TorchServe process tree RSS: idle {idle / 2**20:.0f} MiB, peak under load {peak / 2**20:.0f} MiB")
            precompile()
            for check in ("ready", "live"):
                probe = cost([sys.executable, "-m", "rtserve", "probe", check], args.probe_runs, env)
                print(
                    f"python -m rtserve probe {check}: median {probe['wall_ms']:.0f} ms, max "
                    f"{probe['wall_max_ms']:.0f} ms, CPU median {probe['cpu_ms']:.0f} ms "
                    f"({args.probe_runs} runs)"
                )
        finally:
            terminate(runner.pid, 60)
            runner.wait()
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
