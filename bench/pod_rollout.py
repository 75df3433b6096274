"""Rolling replacement of real pods behind a real nginx, under steady load.

The rehearsal of bench/rolling_rehearsal.py with its replicas as production pods run by
deploy/podman/pod.py (rtserve image + gateway sidecar, probes, preStop): two pods of the old
version behind nginx (bench/balancer.py; its hop per pod sends the shared gateway token, the
pod's gateway adds the pod's own TorchServe key), replaced one at a time by pods of the new
version, then back:

    start the new pod -> wait until its probes say ready -> add it to nginx
    -> take the old pod out -> its preStop hook (drain) -> stop within the grace period

As a Deployment with maxSurge 1 and maxUnavailable 0 does, the next new pod starts as soon as the
old one is out of the balancer: a terminating pod no longer counts, so its drain and stop
overlap the next pod's start. The first two pods start together.

    make pod-rollout            # 1.0 -> 2.0 -> 1.0, about 4 minutes
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from bench import common
from bench.balancer import Backend
from bench.rolling_rehearsal import REPO, Rehearsal, finish
from bench.rolling_rehearsal import run as run_rehearsal
from deploy.podman.pod import PodConfig, down, ensure_token, up
from rtserve.runtime.ports import free_ports

logger = logging.getLogger(__name__)
DRAINED = re.compile(r"drained after ([\d.]+)s \((\d+) requests seen")


@dataclass
class PodReplica:
    """One pod and its balancer hop port."""

    name: str
    version: str
    config: PodConfig
    hop_port: int
    ready: Future | None = field(default=None, repr=False)  # up(): seconds to ready

    def backend(self) -> Backend:
        """The balancer reaches the pod's gateway with the shared token (as a Service would)."""
        token = self.config.token_file.read_text().strip()
        return Backend(self.name, f"http://127.0.0.1:{self.config.ports['inference']}", token,
                       self.hop_port)


class PodRehearsal(Rehearsal):
    """:class:`bench.rolling_rehearsal.Rehearsal` with pods as its replicas.

    Args:
        tags: the rtserve image tag of each model version.
        pod_prefix: pod names are ``<prefix>-r1``, ``<prefix>-r2``, ...
    """

    def __init__(self, work_dir: Path, model: str, hold: float, tags: dict[str, str],
                 pod_prefix: str = "rtserve-rollout") -> None:
        super().__init__(work_dir, work_dir, model, quiet=2.0, hold=hold)
        self.tags = tags
        self.pod_prefix = pod_prefix
        self.token_file = self.work_dir / "gateway-token"
        ensure_token(self.token_file)
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="pod")
        self._terminating: list[Future] = []

    def _new_replica(self, version: str) -> PodReplica:
        name = f"r{len(self.started) + 1}"
        ports = dict(zip(("inference", "management", "metrics"), free_ports(3)))
        config = PodConfig(f"{self.pod_prefix}-{name}", self.work_dir / name, self.token_file,
                           ports, self.tags[version])
        replica = PodReplica(name, version, config, free_ports(1)[0])
        self.started.append(replica)
        replica.ready = self._pool.submit(up, config)  # pods start in parallel
        return replica

    def _wait_ready(self, replica: PodReplica) -> None:
        replica.ready.result()

    def replace(self, old: PodReplica, version: str) -> None:
        """Surge one new pod; once it is in the balancer and ``old`` out, ``old`` drains and
        stops in the background while the caller goes on (the next pod starts)."""
        self._surge(old, version)
        self._terminating.append(self._pool.submit(self._retire, old))

    def roll(self, version: str) -> None:
        """Replace every pod in rotation (terminations overlapping the next start), wait until
        the old ones are gone, then hold."""
        for old in [r for r in self.live if r.name in self.rotation]:
            self.replace(old, version)
        for done in self._terminating:
            done.result()
        self._terminating.clear()
        self._phase(f"all on {version}")
        time.sleep(self.hold)

    def _drain_and_stop(self, old: PodReplica) -> None:
        """The pod's preStop hook (python -m rtserve probe drain), then SIGTERM within the grace period."""
        t = time.monotonic()
        hooks = down(old.config.pod_dir)
        match = next((m for m in map(DRAINED.search, hooks) if m), None)
        if match is None:
            raise RuntimeError(f"{old.name}: its preStop hook did not drain: {hooks}")
        drained = float(match.group(1))
        self._step("drain", old.name, drained, arrivals=int(match.group(2)))
        self._step("stop", old.name, time.monotonic() - t - drained)

    def check_auth(self) -> dict[str, int]:
        """Statuses without the shared token (refused) and with it (200), at each hop."""
        replica = self.live[0]
        pod_url = replica.backend().inference_url
        key = json.loads((replica.config.pod_dir / "volumes" / "run" / "key_file.json").read_text())
        post = self.post_status
        return {
            "balancer without a key": post(self.nginx.url, None),
            "balancer with a wrong key": post(self.nginx.url, "wrong"),
            "balancer with a pod's TorchServe key": post(self.nginx.url, key["inference"]["key"]),
            "hop without a key": post(f"http://127.0.0.1:{replica.hop_port}", None),
            "pod gateway without a key": post(pod_url, None),
            "balancer with the gateway key": post(self.nginx.url, self.nginx.gateway_key),
        }

    def stop(self) -> list:
        records = self.load.stop() if self.load else []
        if self.nginx:
            self.nginx.stop()
        for r in self.started:
            if r.ready is not None:
                r.ready.exception()  # let a start in progress finish before its pod goes
            down(r.config.pod_dir)
        self._pool.shutdown(wait=True)
        return records


def run(work_dir: Path, tags: dict[str, str], model: str = "realtime-classifier", old: str = "1.0",
        new: str = "2.0", hold: float = 3.0, rate: float = 50.0, concurrency: int = 3,
        roll_back: bool = True, pod_prefix: str = "rtserve-rollout") -> dict:
    """Two pods of ``old`` -> ``new`` (-> ``old``) behind nginx under load; the report."""
    rehearsal = PodRehearsal(Path(work_dir), model, hold, tags, pod_prefix)
    return run_rehearsal(Path(work_dir), Path(work_dir), model, old, new, replicas=2, hold=hold,
                         rate=rate, concurrency=concurrency, roll_back=roll_back,
                         rehearsal=rehearsal)


def main(argv: list[str] | None = None) -> int:
    """Run the pod rollout; print and save the report."""
    parser = common.parser(__doc__, "pod_rollout.json", {"old": "1.0", "new": "2.0"},
                           attach=False, model_store=False, run_root=False)
    parser.add_argument("--tags", default=None,
                        help="image tag per version, e.g. 1.0=1.0,2.0=2.0 (default: the versions)")
    parser.add_argument("--rate", type=float, default=50.0)
    parser.add_argument("--concurrency", type=int, default=3)
    parser.add_argument("--hold", type=float, default=3.0)
    parser.add_argument("--roll-back", action=argparse.BooleanOptionalAction, default=True,
                        help="roll back to --old after the roll to --new")
    parser.add_argument("--pod-prefix", default="rtserve-rollout", help="pods are <prefix>-r1, ...")
    parser.add_argument("--work-dir", type=Path, default=REPO / ".run" / "pod-rollout")
    args = parser.parse_args(argv)
    common.log_to_stdout()
    tags = dict(t.split("=", 1) for t in args.tags.split(",")) if args.tags \
        else {args.old: args.old, args.new: args.new}
    report = run(args.work_dir, tags, model=args.model, old=args.old, new=args.new, hold=args.hold,
                 rate=args.rate, concurrency=args.concurrency, roll_back=args.roll_back,
                 pod_prefix=args.pod_prefix)
    return finish(report, args.out)


if __name__ == "__main__":
    sys.exit(main())
