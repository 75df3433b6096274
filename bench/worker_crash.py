"""Worker crash under steady load: SIGKILL one backend worker, measure failures and recovery.

Starts its own TorchServe (free loopback ports, the archive from --model-store), keeps steady
prediction traffic, finds the workers' PIDs in the management API's describe output
(``workers[].pid``) and SIGKILLs one of them (that PID only). It reports requests sent, failed on
the first try (each with its status and body), resent and failed after resending (the load
resends a "Worker died." once, as rtserve's client does), the time until TorchServe had
restarted the worker (same worker id, new PID, every worker READY) and until latency was back to
the baseline, and whether the other workers kept serving meanwhile (their PIDs unchanged, 200s
during the outage).

Only requests in flight on the killed worker may fail on their first try: it holds at most one
batch, and the closed-loop load never has more than ``concurrency`` requests outstanding, so the
bound is ``min(batchSize, concurrency)``. TorchServe answers them ``507 Worker died.``: it reads
the exit status 137 (SIGKILL, also what the kernel's OOM killer sends) as out of memory (``500
Worker died.`` when it has not read the exit status yet). The run fails when more first tries
fail than the bound, when a failure is anything but such an answer, when a request still fails
after its resend or after recovery, or when the worker is not replaced.

    make bench-crash                          # about 25 s
    .venv/bin/python -m bench.worker_crash --baseline 5 --after 10 --rate 150
"""

from __future__ import annotations

import logging
import os
import signal
import statistics
import sys
import time
from dataclasses import asdict, dataclass

from bench import common
from bench.loadgen import Counts, Record, summarize
from rtserve.client.rest import Client
from rtserve.server.torchserve import TorchServe

logger = logging.getLogger(__name__)

#: Latency counts as back to baseline when a window's median is within this of the baseline's.
LATENCY_FACTOR = 1.5
LATENCY_SLACK_MS = 2.0
#: Width of the windows (by request start time) used for the latency timeline.
WINDOW_S = 0.5
#: TorchServe's answer for a request whose worker died (status 507 or 500, this message).
WORKER_DIED = '"message": "Worker died."'


def worker_died(status: int, error: str) -> bool:
    """Whether a failed try is TorchServe's explicit answer for the killed worker's batch."""
    return status in (500, 507) and WORKER_DIED in error


#: TorchServe's describe API knows two worker statuses: READY (its thread runs and the model is
#: loaded) and UNLOADING for every other state, so also for a worker whose new process is still
#: starting or loading the model (``ApiUtils`` in TorchServe 0.12.0).
READY = "READY"


def workers(client: Client, model: str) -> list[dict]:
    """The default version's workers as describe lists them: ``id``, ``pid``, ``status``."""
    return client.describe(model)[0].get("workers", [])


def new_process(worker: dict, victim: dict) -> bool:
    """Whether ``worker`` (the victim's id) runs a process other than the victim's."""
    pid = worker.get("pid")
    return isinstance(pid, int) and pid > 0 and pid != victim["pid"]


@dataclass
class Replacement:
    """How a killed worker came back, as describe showed it.

    Attributes:
        started_s: seconds until its worker id showed a new PID (its new process runs), or None.
        ready_s: seconds until that and ``count`` workers READY, or None (not within the timeout).
        workers: the last worker list seen.
    """

    started_s: float | None
    ready_s: float | None
    workers: list[dict]


def watch_replacement(client: Client, model: str, victim: dict, count: int, timeout: float) -> Replacement:
    """Poll until the victim's worker id runs under a new PID and ``count`` workers are READY."""
    started = time.monotonic()
    up: float | None = None
    seen: list[dict] = []
    while time.monotonic() - started < timeout:
        seen = workers(client, model)
        mine = [w for w in seen if w.get("id") == victim["id"]]
        if up is None and mine and all(new_process(w, victim) for w in mine):
            up = time.monotonic() - started
        ready = [w for w in seen if w.get("status") == READY]
        if (
            len(ready) >= count
            and victim["pid"] not in {w.get("pid") for w in seen}
            and any(w.get("id") == victim["id"] for w in ready)
        ):
            return Replacement(up, time.monotonic() - started, seen)
        time.sleep(0.05)
    return Replacement(up, None, seen)


def wait_replaced(
    client: Client, model: str, victim: dict, count: int, timeout: float
) -> tuple[float | None, list[dict]]:
    """:func:`watch_replacement`'s seconds until READY (None on timeout) and last worker list."""
    replacement = watch_replacement(client, model, victim, count, timeout)
    return replacement.ready_s, replacement.workers


def latency_recovered_at(records: list[Record], since: float, baseline_ms: float) -> float | None:
    """Start of the first window from ``since`` whose median latency is back near the baseline."""
    limit = max(baseline_ms * LATENCY_FACTOR, baseline_ms + LATENCY_SLACK_MS)
    later = sorted((r for r in records if r.start >= since and r.status == 200), key=lambda r: r.start)
    t = since
    while later and t <= later[-1].start:
        window = [r.latency * 1000 for r in later if t <= r.start < t + WINDOW_S]
        if len(window) >= 5 and statistics.median(window) <= limit:
            return t
        t += WINDOW_S
    return None


def run(
    server: TorchServe,
    model: str,
    baseline: float,
    after: float,
    rate: float,
    concurrency: int,
    recovery_timeout: float = 60.0,
) -> dict:
    """Kill one worker of ``model`` on a ready ``server`` under load; return the report."""
    client = server.client(timeout=10.0)
    desc = client.describe(model)[0]
    before = desc.get("workers", [])
    if len(before) < 2:
        raise RuntimeError(f"{model} needs at least 2 workers for this test, has {len(before)}")
    victim, others = before[0], before[1:]
    bound = min(int(desc.get("batchSize", 1)), concurrency)
    load = common.steady_load(server, model, rate, concurrency, baseline + after + recovery_timeout + 60)
    load.start("baseline")
    try:
        time.sleep(baseline)
        load.mark("worker down")
        killed_at = load.now()
        os.kill(int(victim["pid"]), signal.SIGKILL)
        watched = watch_replacement(client, model, victim, len(before), recovery_timeout)
        replaced_s, now = watched.ready_s, watched.workers
        load.mark("recovered")
        time.sleep(after)
    finally:
        records = load.stop()
    base = [r.latency * 1000 for r in records if r.phase == "baseline" and r.status == 200]
    baseline_ms = statistics.median(base) if base else 0.0
    latency_at = latency_recovered_at(records, killed_at + replaced_s, baseline_ms) if replaced_s is not None else None
    failures = [
        {
            "status": r.first_status,
            "error": r.first_error,
            "at_s": round(r.start - killed_at, 3),
            "resent": r.resent,
            "status_after_resend": r.status,
        }
        for r in records
        if r.failed_first
    ]
    down = [r for r in records if r.phase == "worker down"]
    others_now = {w.get("id"): w.get("pid") for w in now}
    return {
        "model": model,
        "rate_target": rate,
        "concurrency": concurrency,
        "batch_size": int(desc.get("batchSize", 1)),
        "workers": len(before),
        "requests": len(records),
        **vars(Counts.of(records)),
        "in_flight_bound": bound,
        "failures": failures,
        "failures_explicit": all(worker_died(f["status"], f["error"]) for f in failures),
        "killed": {"id": victim["id"], "pid": victim["pid"]},
        "replacement": next(
            (
                {"id": w.get("id"), "pid": w.get("pid"), "status": w.get("status")}
                for w in now
                if w.get("id") == victim["id"]
            ),
            None,
        ),
        "replacement_started_s": (round(watched.started_s, 2) if watched.started_s is not None else None),
        "worker_restarted_s": round(replaced_s, 2) if replaced_s is not None else None,
        "recovery_timeout_s": recovery_timeout,
        "latency_back_s": round(latency_at - killed_at, 2) if latency_at is not None else None,
        "full_capacity_s": (
            round(max(latency_at - killed_at, replaced_s), 2)
            if latency_at is not None and replaced_s is not None
            else None
        ),
        "baseline_p50_ms": round(baseline_ms, 2),
        "others_kept_serving": (
            all(others_now.get(w["id"]) == w["pid"] for w in others) and sum(1 for r in down if r.status == 200) > 0
        ),
        "ok_while_down": sum(1 for r in down if r.status == 200),
        "after_recovery": vars(Counts.of([r for r in records if r.phase == "recovered"])),
        "phases": [asdict(p) for p in summarize(records)],
    }


def not_ready(report: dict) -> str:
    """Why the run saw no recovery: no new process for the worker, or one still loading."""
    limit = report["recovery_timeout_s"]
    if report["replacement_started_s"] is None:
        return f"NOT REPLACED: no new process for worker {report['killed']['id']} within {limit} s"
    status = (report["replacement"] or {}).get("status")
    return (
        f"NOT READY within {limit} s: its new process runs, status {status} (TorchServe's "
        f"status for a worker that is not {READY}: still starting or loading the model)"
    )


def render(report: dict) -> str:
    """The report as text."""
    lines = [
        f"{report['requests']} requests ({report['rate_target']}/s target, "
        f"{report['concurrency']} concurrent, {report['workers']} workers, batch size "
        f"{report['batch_size']})",
        f"{Counts.read(report).text()} "
        f"(first-try bound: {report['in_flight_bound']} = min(batch size, concurrency); "
        f'each a 500/507 "Worker died.": {report["failures_explicit"]})',
        f"killed worker {report['killed']['id']} (pid {report['killed']['pid']}) with SIGKILL; "
        f"replacement: {report['replacement']}",
        f"replacement process running after: {report['replacement_started_s']} s; worker "
        f"restarted and all workers READY after: {report['worker_restarted_s']} s",
        *([not_ready(report)] if report["worker_restarted_s"] is None else []),
        f"latency back to baseline (p50 {report['baseline_p50_ms']} ms) after: "
        f"{report['latency_back_s']} s; full capacity after: {report['full_capacity_s']} s",
        f"other workers kept serving: {report['others_kept_serving']} "
        f"({report['ok_while_down']} OK while the worker was down)",
        f"after recovery: {report['after_recovery']['sent']} sent, "
        f"{report['after_recovery']['failed_first']} failed on the first try",
        *common.phase_lines(report["phases"], 14, versions=False),
    ]
    for f in report["failures"]:
        lines.append(
            f"  failed at {f['at_s']:+.3f} s from the kill: {f['error']!r}"
            + (f"; resent: {f['status_after_resend']}" if f["resent"] else "")
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Start a server (or attach to one), kill a worker under load, print and save the report."""
    parser = common.parser(__doc__, "worker_crash.json")
    parser.add_argument("--baseline", type=float, default=5.0, help="seconds of traffic before the kill")
    parser.add_argument("--after", type=float, default=10.0, help="seconds of traffic after recovery")
    parser.add_argument("--rate", type=float, default=150.0, help="target requests per second")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--recovery-timeout", type=float, default=60.0, help="seconds TorchServe gets to restart the worker"
    )
    args = parser.parse_args(argv)
    common.log_to_stdout()
    with common.serving(args, "bench-crash") as server:
        report = run(server, args.model, args.baseline, args.after, args.rate, args.concurrency, args.recovery_timeout)
    ok = (
        report["failed_first"] <= report["in_flight_bound"]
        and report["failures_explicit"]
        and report["failed_after_resend"] == 0
        and report["worker_restarted_s"] is not None
        and report["after_recovery"]["failed_first"] == 0
        and report["others_kept_serving"]
    )
    return common.finish(report, args.out, render(report), ok)


if __name__ == "__main__":
    sys.exit(main())
