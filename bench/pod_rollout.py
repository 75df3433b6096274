"""A rollout and a rollback of the pod on the local cluster, under steady traffic through its Service.

`make pod` leaves the local overlay's two replicas serving; this sends steady load to the
Service (kube-proxy picks a pod per connection) and, one phase each, runs

    make k8s-deploy OVERLAY=local MODEL_VERSION=<new>   # rolling update, verification Job
    make k8s-rollback OVERLAY=local                     # kubectl rollout undo, then status

then prints each phase's requests, failures on the first try and the versions that answered
(Kubernetes does the surge, the readiness gating and the preStop drain; nothing here does).

    make pod && make pod-rollout      # 1.0 -> 2.0 -> 1.0, a few minutes
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from bench import common
from bench.loadgen import Counts, Record, SteadyLoad, summarize
from rtserve.k8s.deploy import Kubectl
from rtserve.k8s.pod import Deployed
from rtserve.server.readiness import sample_payload

logger = logging.getLogger(__name__)
REPO = Path(__file__).resolve().parent.parent


def make(*args: str, timeout: float = 1800) -> subprocess.CompletedProcess:
    """The project's Makefile (no variables inherited from an outer make), output captured."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    return subprocess.run(
        ["make", "--no-print-directory", *args],
        cwd=REPO,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
    )


def steps(new: str, make_vars: list[str]) -> list[tuple[str, list[list[str]]]]:
    """`make pod-rollout`'s phases: each a name and its commands."""
    return [
        (f"{new} rollout", [["make", "k8s-deploy", "OVERLAY=local", f"MODEL_VERSION={new}", *make_vars]]),
        ("k8s-rollback", [["make", "k8s-rollback", "OVERLAY=local", *make_vars]]),
    ]


#: The mark of a phase's requests once it ended and its old pods are gone (:func:`settle_after`).
SETTLED = "settled"
#: Seconds a phase waits for the old pods beyond their own grace period (deploy/k8s/base's
#: deployment.yaml says what fills it): the kubelet's kill and the API server's removal.
DRAIN_SLACK_S = 20.0


def settle_after(
    deployed: Deployed, load: SteadyLoad, phase: str, settle: float = 3.0, drain_wait: float | None = None
) -> None:
    """End ``phase`` under ``load``: wait until the old pods are gone, then mark the requests of
    the next ``settle`` seconds ``PHASE settled`` (:func:`settled`: what the callers got once
    the phase was over). The old pods must go within ``drain_wait`` (default: their grace period
    plus :data:`DRAIN_SLACK_S`): a client's keep-alive connection stays on an old pod until it
    drains (kube-proxy moves new connections only), so answers from the version rolled to may
    come only then; a pod still terminating after that raises :class:`RuntimeError` (the next
    phase would start on an unfinished one)."""
    began = time.monotonic()
    if drain_wait is None:
        drain_wait = deployed.grace_seconds() + DRAIN_SLACK_S
    while (left := deployed.terminating()) and time.monotonic() - began < drain_wait:
        time.sleep(0.5)
    if left:
        raise RuntimeError(f"{phase}: {', '.join(left)} still terminating {drain_wait:.0f} s after it ended")
    logger.info("%s: no old pod left after %.0f s", phase, time.monotonic() - began)
    load.mark(f"{phase} {SETTLED}")
    time.sleep(settle)


def settled(records: list[Record], phase: str, version: str) -> list[str]:
    """What is wrong with ``phase``'s end (:func:`settle_after`), or nothing: its settled
    requests must exist (the load still ran after the phase's last step) and each be answered
    200 by ``version`` (the rollout or rollback arrived for every caller)."""
    after = [r for r in records if r.phase == f"{phase} {SETTLED}"]
    if not after:
        return [f"{phase}: no request was sent after it ended (the load stopped before it)"]
    wrong = Counter((r.status, r.version) for r in after if (r.status, r.version) != (200, version))
    return [
        f"{phase}: {n} of the {len(after)} requests after it ended answered {s} by {v}, not 200 by {version}"
        for (s, v), n in sorted(wrong.items(), key=str)
    ]


def run(
    deployed: Deployed,
    phases: list[tuple[str, list[list[str]]]],
    model: str = common.MODEL,
    rate: float = 40.0,
    concurrency: int = 4,
    settle: float = 3.0,
) -> tuple[list[Record], dict[str, list[str]]]:
    """Steady load on the Service while each phase's commands run in turn (``make`` ones through
    :func:`make`); the load's records (phase ``baseline`` before the first) and each phase's
    output. A command that fails ends the run with its output, and so does a phase whose old
    pods do not go (:func:`settle_after`, which also marks each phase's settled requests)."""
    token = deployed.token()
    load = SteadyLoad(
        deployed.service_url() + f"/predictions/{model}",
        sample_payload(),
        lambda: token,
        rate=rate,
        concurrency=concurrency,
        max_seconds=3600,
        resend_worker_lost=False,
    ).start()
    outputs: dict[str, list[str]] = {}
    try:
        time.sleep(settle)
        for phase, commands in phases:
            load.mark(phase)
            began = time.monotonic()
            logger.info("%s: %s", phase, " && ".join(" ".join(c) for c in commands))
            outputs[phase] = []
            for cmd in commands:
                done = (
                    make(*cmd[1:])
                    if cmd[0] == "make"
                    else subprocess.run(cmd, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=1800)
                )
                outputs[phase].append(done.stdout)
                if done.returncode:
                    raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-4000:]}")
            logger.info("%s: done in %.0f s", phase, time.monotonic() - began)
            settle_after(deployed, load, phase, settle)
    finally:
        records = load.stop()
    return records, outputs


def report(records: list[Record]) -> dict:
    """Per phase: requests, first-try failures by status, versions answered, p50/p99."""
    return {
        p.phase: {
            "sent": p.sent,
            "failed_first": p.failed_first,
            "failed_first_by_status": p.failed_first_by_status,
            "versions": p.versions,
            "p50_ms": p.p50_ms,
            "p99_ms": p.p99_ms,
            "errors": p.errors,
        }
        for p in summarize(records)
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--kubectl", default="kubectl", help="the kubectl command, options included")
    parser.add_argument("--namespace", default="rtserve-local")
    parser.add_argument("--app", default="rtserve")
    parser.add_argument("--model", default=common.MODEL)
    parser.add_argument("--new", default="2.0", help="the version rolled out, then rolled back from")
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--make-var", action="append", default=[], help="a VAR=value for the make targets (repeatable)")
    parser.add_argument("--out", type=Path, default=common.RESULTS / "pod_rollout.json")
    args = parser.parse_args(argv)
    common.log_to_stdout()
    deployed = Deployed(Kubectl(args.kubectl, out=logger.info), args.namespace, args.app)
    serving = {p.version for p in deployed.pods()}
    if len(serving) != 1:
        parser.error(f"{args.namespace} serves {sorted(serving) or 'nothing'}: one version must serve first (make pod)")
    (before,) = serving
    phases = steps(args.new, args.make_var)
    records, _ = run(deployed, phases, args.model, args.rate, args.concurrency)
    wrong = settled(records, phases[0][0], args.new) + settled(records, phases[1][0], before)
    lines = [
        f"{name:<22} {p['sent']:>6} requests, {p['failed_first']} failed on the first try; "
        f"versions {p['versions']}; p50 {p['p50_ms']} ms, p99 {p['p99_ms']} ms"
        for name, p in report(records).items()
    ] + wrong
    return common.finish(
        report(records), args.out, "\n".join(lines), Counts.of(records).failed_first == 0 and not wrong
    )


if __name__ == "__main__":
    sys.exit(main())
