"""Rehearse a Kubernetes rolling update on one machine: real TorchServe replicas behind real nginx.

Starts ``--replicas`` TorchServe replicas of the old version (each its own run dir and free
loopback ports, token auth on), a real nginx in front of them (bench/balancer.py: its own config,
PID file and logs, one hop per replica carrying that replica's key), and steady client traffic
through nginx. Then it replaces the replicas one at a time by replicas of the new version, as a
Deployment with ``maxSurge: 1, maxUnavailable: 0`` does:

    start new -> wait ready (ping + a prediction) -> add it to nginx (reload)
    -> take the old one out (reload) -> drain the old one (rtserve.server.drain) -> stop it (SIGTERM)

and rolls back to the old version the same way. Every phase boundary is logged; it prints
requests sent, failed on the first try (must be 0: the drain leaves no request behind and nginx
never retries a POST it sent upstream), resent and failed after resending (the load resends a
"Worker died." once, as rtserve's client does), and the versions seen in each phase, and writes
JSON.

    make bench-rehearsal                       # 2 replicas, 1.0 -> 2.0 -> 1.0, about 60 s
    .venv/bin/python -m bench.rolling_rehearsal --replicas 3 --hold 3
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import requests

from bench import common
from bench.balancer import Backend, Nginx
from bench.common import REPO
from bench.loadgen import Counts, SteadyLoad, summarize
from rtserve.runtime.ports import free_ports
from rtserve.server.properties import port_overrides
from rtserve.server.readiness import sample_payload
from rtserve.server.torchserve import TorchServe

logger = logging.getLogger(__name__)


@dataclass
class Replica:
    """One TorchServe replica (a pod) and its balancer hop port."""

    name: str
    version: str
    server: TorchServe
    hop_port: int

    def backend(self) -> Backend:
        """How nginx reaches it: its inference address and its current inference key."""
        key = self.server.client().keys.get("inference")
        if not key:
            raise RuntimeError(f"{self.name}: no inference key in {self.server.key_file}")
        return Backend(self.name, self.server.props["inference_address"], key, self.hop_port)


class Rehearsal:
    """Replicas, the balancer and the load, with the step log."""

    def __init__(self, work_dir: Path, model_store: Path, model: str, quiet: float, hold: float) -> None:
        self.work_dir = Path(work_dir)
        self.model_store = Path(model_store)
        self.model = model
        self.quiet = quiet
        self.hold = hold
        self.started: list[Replica] = []  # every replica ever started (all stopped in the end)
        self.live: list[Replica] = []  # running: has a hop in the config
        self.rotation: list[str] = []  # receiving traffic from the public listener
        self.nginx: Nginx | None = None
        self.load: SteadyLoad | None = None
        self.steps: list[dict] = []
        self.auth: dict[str, int] = {}
        self._t0 = time.monotonic()
        self._lock = threading.RLock()  # the balancer's config, the rotation, the phase marks

    def _new_replica(self, version: str) -> Replica:
        name = f"r{len(self.started) + 1}"
        server = TorchServe(
            self.work_dir / name,
            self.model_store,
            [f"{self.model}={self.model}_{version}.mar"],
            overrides=port_overrides(free_ports(6)),
        )
        replica = Replica(name, version, server, free_ports(1)[0])
        self.started.append(replica)
        server.start()
        return replica

    def _phase(self, label: str) -> None:
        versions = "+".join(f"{r.name}:{r.version}" for r in self.live if r.name in self.rotation)
        phase = f"{label} [{versions}]"
        logger.info("%6.1fs  %s", time.monotonic() - self._t0, phase)
        if self.load:
            self.load.mark(phase)

    def _apply(self) -> float:
        return self.nginx.apply([r.backend() for r in self.live], self.rotation)

    def _step(self, action: str, replica: str, seconds: float, **extra) -> None:
        self.steps.append({"action": action, "replica": replica, "seconds": round(seconds, 2), **extra})

    def start(self, version: str, replicas: int, rate: float, concurrency: int) -> None:
        """Start the first replicas (in parallel), nginx, and the traffic."""
        t = time.monotonic()
        first = [self._new_replica(version) for _ in range(replicas)]
        for r in first:
            self._wait_ready(r)
        self._step("start", "+".join(r.name for r in first), time.monotonic() - t)
        self.live = list(first)
        self.rotation = [r.name for r in first]
        self.nginx = Nginx(self.work_dir / "nginx", free_ports(1)[0])
        self.nginx.start([r.backend() for r in self.live], self.rotation)
        url = f"{self.nginx.url}/predictions/{self.model}"
        self.auth = self.check_auth()
        self.load = SteadyLoad(
            url,
            sample_payload(),
            lambda: self.nginx.gateway_key,
            rate=rate,
            concurrency=concurrency,
            max_seconds=1800,
            timeout=30.0,
        )
        self._phase(f"all on {version}")
        self.load.start(self.load.phase)

    def post_status(self, base: str, key: str | None) -> int:
        """The status of one prediction sent to ``base`` with bearer ``key`` (none: no header)."""
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return requests.post(
            f"{base}/predictions/{self.model}", json=sample_payload(), headers=headers, timeout=10
        ).status_code

    def check_auth(self) -> dict[str, int]:
        """Statuses without the right token at each hop (all refused), and with it (200)."""
        replica = self.live[0]
        post = self.post_status
        return {
            "balancer without a key": post(self.nginx.url, None),
            "balancer with a wrong key": post(self.nginx.url, "wrong"),
            "balancer with a replica's key": post(self.nginx.url, replica.backend().key),
            "hop without a key": post(f"http://127.0.0.1:{replica.hop_port}", None),
            "replica without a key": post(replica.server.props["inference_address"], None),
            "balancer with the gateway key": post(self.nginx.url, self.nginx.gateway_key),
        }

    def replace(self, old: Replica, version: str) -> None:
        """Replace ``old`` by a new replica of ``version``: surge one, then retire the old.

        Each phase is marked when its step begins, labelled with the rotation it leads to.
        """
        self._surge(old, version)
        self._retire(old)

    def _surge(self, old: Replica, version: str) -> None:
        """Start a replica of ``version``, put it in rotation once ready, then take ``old`` out."""
        t = time.monotonic()
        with self._lock:
            self._phase(f"r{len(self.started) + 1} ({version}) starting")
        new = self._new_replica(version)
        self._wait_ready(new)
        self._step("start", new.name, time.monotonic() - t, version=version)
        with self._lock:
            self.live.append(new)
            self.rotation.append(new.name)
            self._phase(f"{new.name} in")
            self._step("add", new.name, self._apply())
            self.rotation.remove(old.name)
            self._phase(f"{old.name} out, draining")
            self._step("remove", old.name, self._apply())

    def _retire(self, old: Replica) -> None:
        """Drain and stop ``old`` (out of rotation), then drop its hop."""
        self._drain_and_stop(old)
        with self._lock:
            self.live.remove(old)
            self._apply()  # drop the stopped replica's hop
            self._phase(f"{old.name} stopped")

    def _wait_ready(self, replica: Replica) -> None:
        replica.server.wait_ready(180, [self.model])

    def _drain_and_stop(self, old: Replica) -> None:
        """Drain ``old`` (rtserve.server.drain), then stop it; both are steps."""
        report = old.server.drain(timeout=30.0, quiet=self.quiet)
        if not report.drained:
            raise RuntimeError(f"{old.name} did not drain: {report}")
        self._step(
            "drain",
            old.name,
            report.seconds,
            arrivals=report.arrivals,
            peak_pending=report.peak_pending,
            peak_busy=report.peak_busy,
        )
        t = time.monotonic()
        old.server.stop()
        self._step("stop", old.name, time.monotonic() - t)

    def roll(self, version: str) -> None:
        """Replace every replica in rotation, one at a time, then hold."""
        for old in [r for r in self.live if r.name in self.rotation]:
            self.replace(old, version)
        self._phase(f"all on {version}")
        time.sleep(self.hold)

    def stop(self) -> list:
        """Stop the traffic, nginx and every replica still running; return the load records."""
        records = self.load.stop() if self.load else []
        if self.nginx:
            self.nginx.stop()
        for r in self.started:
            r.server.stop()
        return records


def run(
    work_dir: Path,
    model_store: Path,
    model: str = "realtime-classifier",
    old: str = "1.0",
    new: str = "2.0",
    replicas: int = 2,
    hold: float = 3.0,
    rate: float = 100.0,
    concurrency: int = 4,
    quiet: float = 0.5,
    roll_back: bool = True,
) -> dict:
    """The whole rehearsal: old -> new (-> old) under traffic; returns the report."""
    rehearsal = Rehearsal(work_dir, model_store, model, quiet, hold)
    started = time.monotonic()
    try:
        rehearsal.start(old, replicas, rate, concurrency)
        time.sleep(hold)
        rehearsal.roll(new)
        if roll_back:
            rehearsal.roll(old)
    finally:
        records = rehearsal.stop()
    elapsed = time.monotonic() - started
    phases = summarize(records)
    steady = {f"all on {old}": old, f"all on {new}": new}
    steady_seen = [(v, p.versions) for p in phases for k, v in steady.items() if p.phase.startswith(k + " [")]
    timeline = [
        [round(t, 1), dict(Counter(r.version for r in records if t <= r.start < t + 1 and r.version))]
        for t in range(int(max((r.start for r in records), default=0)) + 1)
    ]
    return {
        "model": model,
        "old": old,
        "new": new,
        "replicas": replicas,
        "rate_target": rate,
        "concurrency": concurrency,
        "seconds": round(elapsed, 1),
        "requests": len(records),
        **vars(Counts.of(records)),
        "versions": dict(Counter(r.version for r in records if r.version)),
        "phases": [asdict(p) for p in phases],
        "steady_ok": len(steady_seen) == (3 if roll_back else 2) and all(set(seen) == {v} for v, seen in steady_seen),
        "steps": rehearsal.steps,
        "timeline": timeline,
        "replicas_started": [r.name for r in rehearsal.started],
        "auth": rehearsal.auth,
        "balancer_url": rehearsal.nginx.url if rehearsal.nginx else None,
    }


def render(report: dict) -> str:
    """The report as text."""
    lines = [
        f"{report['requests']} requests through nginx in {report['seconds']} s "
        f"({report['rate_target']}/s target, {report['concurrency']} concurrent, "
        f"{report['replicas']} replicas); {Counts.read(report).text()}",
        *common.phase_lines(report["phases"], 44, title="phase [replicas in rotation]"),
    ]
    by_action: dict[str, list[float]] = {}
    for s in report["steps"]:
        by_action.setdefault(s["action"], []).append(s["seconds"])
    lines.append("step seconds: " + "; ".join(f"{a} {', '.join(str(x) for x in v)}" for a, v in by_action.items()))
    lines.append("auth: " + ", ".join(f"{k} {v}" for k, v in report["auth"].items()))
    lines.append(f"steady phases ('all on X') saw only version X: {report['steady_ok']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the rehearsal; print and save the report."""
    parser = common.parser(
        __doc__, "rolling_rehearsal.json", {"old": "1.0", "new": "2.0"}, attach=False, run_root=False
    )  # it starts and stops its own replicas
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--hold", type=float, default=3.0, help="seconds of traffic on each steady state")
    parser.add_argument("--rate", type=float, default=100.0, help="target requests per second")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--quiet", type=float, default=0.5, help="drain: idle seconds required")
    parser.add_argument(
        "--roll-back",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="roll back to --old after the roll to --new",
    )
    parser.add_argument("--work-dir", type=Path, default=REPO / "build" / "rehearsal")
    args = parser.parse_args(argv)
    if args.replicas < 2:
        parser.error("--replicas must be at least 2")
    common.log_to_stdout()
    report = run(
        args.work_dir,
        args.model_store,
        args.model,
        args.old,
        args.new,
        args.replicas,
        args.hold,
        args.rate,
        args.concurrency,
        args.quiet,
        args.roll_back,
    )
    return finish(report, args.out)


def finish(report: dict, out: Path) -> int:
    """Print a rehearsal's report, write its JSON to ``out``; exit status 0 when no request
    failed, counted on the first try, and each steady phase saw only its version."""
    return common.finish(report, out, render(report), report["failed_first"] == 0 and report["steady_ok"])


if __name__ == "__main__":
    sys.exit(main())
