"""Version rollout under steady load: register -> promote -> rollback -> retire, scale 1 -> 4 -> 1.

Starts its own TorchServe (free loopback ports, archives from --model-store), keeps steady
concurrent prediction traffic on the model's default route, runs each management step with
``--hold`` seconds of traffic after it, then prints requests sent, failed on the first try,
resent and failed after resending (the load resends a "Worker died." or "Worker scaled down."
once, as rtserve's client does), the versions seen in each phase and the latency of each
management call, and writes the report as JSON. Register and promote run the checks `make
register` and `make promote` run (the golden set, then the gate with config/gate.yaml's
thresholds), under the same load; the gate's decision is in the report.

No request may fail on its first try, but for TorchServe's scale-down race (docs/
versions-and-promotion.md, "Scaling down under traffic"): a request in flight while a scale-down
call runs may be answered "Worker scaled down." / "Worker died." (500 or 507) or, rarely, not at
all (a timeout), at most ``concurrency`` of them per call. Anything else fails the run.

    make bench-rollout                       # 1.0 -> 2.0 and back, about 40 s
    .venv/bin/python -m bench.rollout_load --hold 5 --rate 150
"""

from __future__ import annotations

import logging
import sys
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from bench import common
from bench.common import phase_lines
from bench.loadgen import Counts, Record, SteadyLoad, summarize
from rtserve.client.rest import worker_lost
from rtserve.promotion.gate import GateConfig
from rtserve.promotion.history import HISTORY_FILE, History
from rtserve.promotion.rollout import Rollout, Verification
from rtserve.server.readiness import sample_payload
from rtserve.server.torchserve import TorchServe

logger = logging.getLogger(__name__)

#: The version each "after <step>" phase must see, given the old and new versions.
EXPECTED_AFTER = {
    "register": "old",
    "promote": "new",
    "rollback": "old",
    "retire": "old",
    "scale to 1": "old",
    "scale to 4": "old",
    "scale to 1 again": "old",
}
#: The steps that remove workers: TorchServe may interrupt a batch (the scale-down race).
SCALE_DOWNS = ("scale to 1", "scale to 1 again")


def scale_down_race(record: Record, calls: dict[str, list[float]], concurrency: int) -> str | None:
    """The scale-down call whose race allows ``record``'s failed first try, or None.

    Allowed: the request was in flight while the call ran (started before it returned, answered
    after it began) and its first try was answered "Worker scaled down." / "Worker died." or not
    at all (a timeout; never a refused connect).
    """
    explained = worker_lost(record.first_status, record.first_error) or (
        record.first_status == 0 and not record.refused
    )
    if not explained:
        return None
    return next(
        (
            name
            for name in SCALE_DOWNS
            if name in calls and record.start <= calls[name][1] and record.start + record.latency >= calls[name][0]
        ),
        None,
    )


def run(
    server: TorchServe,
    model: str,
    new: str,
    hold: float,
    rate: float,
    concurrency: int,
    gate_config: Path | None = None,
) -> dict:
    """Drive the rollout steps under load on a ready ``server``; return the report.

    Raises:
        GateRefused: the gate refused ``new`` (its report is the message).
    """
    client = server.client(timeout=180.0)
    history = History(server.run_dir / HISTORY_FILE)
    # Through the golden-set check and the gate, as the CLI builds them (rtserve.cli.versions._rollout).
    verification = Verification(server.model_store, GateConfig.load(gate_config), server.log_dir / "audit.log")
    rollout = Rollout(client, history, model, verification)
    old = rollout.default_version()
    recorded = len(history.events())
    url = f"{server.props['inference_address']}/predictions/{model}"
    load = SteadyLoad(
        url,
        sample_payload(),
        lambda: client.keys.get("inference"),
        rate=rate,
        concurrency=concurrency,
        max_seconds=hold * 10 + 600,
    )
    steps = [
        ("register", lambda: rollout.register(new)),
        ("promote", lambda: rollout.promote(new)),
        ("rollback", rollout.rollback),
        ("retire", lambda: rollout.retire(new)),
        ("scale to 1", lambda: rollout.scale(1)),
        ("scale to 4", lambda: rollout.scale(4)),
        ("scale to 1 again", lambda: rollout.scale(1)),
    ]
    calls: dict[str, float] = {}
    windows: dict[str, list[float]] = {}  # each call's start and end, on the load's clock
    started = time.monotonic()
    load.start("baseline")
    try:
        time.sleep(hold)
        for name, step in steps:
            load.mark(f"during {name}")
            begun, started = load.now(), time.perf_counter()
            step()
            calls[name] = time.perf_counter() - started
            windows[name] = [begun, load.now()]
            load.mark(f"after {name}")
            time.sleep(hold)
    finally:
        records = load.stop()
    elapsed = time.monotonic() - started
    phases = summarize(records)
    gates = [e for e in history.events()[recorded:] if e["action"] == "gate"]
    expected = {f"after {k}": (old if v == "old" else new) for k, v in EXPECTED_AFTER.items()}
    failures = [
        {
            "phase": r.phase,
            "start_s": round(r.start, 3),
            "end_s": round(r.start + r.latency, 3),
            "status": r.first_status,
            "error": r.first_error,
            "resent": r.resent,
            "status_after_resend": r.status,
            "scale_down": scale_down_race(r, windows, concurrency),
        }
        for r in records
        if r.failed_first
    ]
    raced = Counter(f["scale_down"] for f in failures if f["scale_down"])
    return {
        "model": model,
        "old": old,
        "new": new,
        "rate_target": rate,
        "concurrency": concurrency,
        "seconds": round(elapsed, 1),
        "requests": len(records),
        "achieved_rate": round(len(records) / elapsed, 1),
        **vars(Counts.of(records)),
        "failures": failures,
        "scale_down_calls": {k: [round(t, 3) for t in windows[k]] for k in SCALE_DOWNS if k in windows},
        "failed_first_in_race": dict(raced),
        "failed_first_unexplained": sum(1 for f in failures if not f["scale_down"]),
        "race_within_bound": all(n <= concurrency for n in raced.values()),
        "phases": [asdict(p) for p in phases],
        "expected_after": expected,
        "timeline_ok": all(set(p.versions) == {expected[p.phase]} for p in phases if p.phase in expected),
        "call_seconds": {k: round(v, 3) for k, v in calls.items()},
        "gate": gates[-1] if gates else None,
    }


def render(report: dict) -> str:
    """The report as a text table."""
    lines = [
        f"{report['requests']} requests in {report['seconds']} s "
        f"({report['achieved_rate']}/s, target {report['rate_target']}/s, "
        f"{report['concurrency']} concurrent)",
        Counts.read(report).text(),
        f"first-try failures in flight during a scale-down call (allowed, at most "
        f"{report['concurrency']} per call): {report['failed_first_in_race'] or 0}; "
        f"any other: {report['failed_first_unexplained']}",
        *phase_lines(report["phases"], 26),
    ]
    lines += [
        f"  failed on the first try at {f['start_s']} s ({f['phase']}): {f['error']!r}"
        + (f"; resent: {f['status_after_resend']}" if f["resent"] else "")
        for f in report["failures"]
    ]
    lines.append("management calls (s): " + ", ".join(f"{k} {v}" for k, v in report["call_seconds"].items()))
    lines.append(f"version timeline as expected: {report['timeline_ok']}")
    if gate := report.get("gate"):
        acc, lat, limits = gate["accuracy"], gate["latency_ms"], gate["thresholds"]
        lines.append(
            f"gate {gate['candidate']} over {gate['default']}: {gate['outcome']}; accuracy "
            f"{acc['candidate']} vs {acc['default']} (max drop {limits['max_accuracy_drop']}), "
            f"agreement {gate['agreement']['value']} (min {limits['min_agreement']}), p99 "
            f"{lat['candidate']['p99']} vs {lat['default']['p99']} ms, ratio {lat['ratio']} "
            f"(max {limits['max_latency_ratio']})"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Start a server (or attach to one), run the rollout under load, print and save the report."""
    parser = common.parser(__doc__, "rollout_load.json", {"old": "1.0", "new": "2.0"})
    parser.add_argument("--hold", type=float, default=5.0, help="seconds of traffic after each step")
    parser.add_argument("--rate", type=float, default=150.0, help="target requests per second")
    parser.add_argument("--concurrency", type=int, default=4)
    args = parser.parse_args(argv)
    common.log_to_stdout()
    with common.serving(args, "bench-rollout", [f"{args.model}_{args.old}.mar"]) as server:
        report = run(server, args.model, args.new, args.hold, args.rate, args.concurrency)
    return common.finish(report, args.out, render(report), ok(report))


def ok(report: dict) -> bool:
    """The run's verdict: no first-try failure but the allowed scale-down race, within its
    bound, and each "after" phase answered by the expected version only."""
    return report["failed_first_unexplained"] == 0 and report["race_within_bound"] and report["timeline_ok"]


if __name__ == "__main__":
    sys.exit(main())
