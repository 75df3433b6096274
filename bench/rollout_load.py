"""Version rollout under steady load: register -> promote -> rollback -> retire, scale 1 -> 4 -> 1.

Starts its own TorchServe (free loopback ports, archives from --model-store), keeps steady
concurrent prediction traffic on the model's default route, runs each management step with
``--hold`` seconds of traffic after it, then prints requests sent, failed, the versions seen in
each phase and the latency of each management call, and writes the report as JSON. Register and
promote run the checks `make register` and `make promote` run (the golden set, then the gate with
config/gate.yaml's thresholds), under the same load; the gate's decision is in the report.

    make bench-rollout                       # 1.0 -> 2.0 and back, about 40 s
    .venv/bin/python -m bench.rollout_load --hold 5 --rate 150
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path

from bench import common
from bench.common import phase_lines
from bench.loadgen import SteadyLoad, summarize
from rtserve.promotion.gate import GateConfig
from rtserve.promotion.history import HISTORY_FILE, History
from rtserve.promotion.rollout import Rollout, Verification
from rtserve.server.readiness import sample_payload
from rtserve.server.torchserve import TorchServe

logger = logging.getLogger(__name__)

#: The version each "after <step>" phase must see, given the old and new versions.
EXPECTED_AFTER = {
    "register": "old", "promote": "new", "rollback": "old", "retire": "old",
    "scale to 1": "old", "scale to 4": "old", "scale to 1 again": "old",
}


def run(server: TorchServe, model: str, new: str, hold: float, rate: float,
        concurrency: int, gate_config: Path | None = None) -> dict:
    """Drive the rollout steps under load on a ready ``server``; return the report.

    Raises:
        GateRefused: the gate refused ``new`` (its report is the message).
    """
    client = server.client(timeout=180.0)
    history = History(server.run_dir / HISTORY_FILE)
    # Through the golden-set check and the gate, as the CLI builds them (rtserve.cli.versions._rollout).
    verification = Verification(server.model_store, GateConfig.load(gate_config),
                                server.log_dir / "audit.log")
    rollout = Rollout(client, history, model, verification)
    old = rollout.default_version()
    recorded = len(history.events())
    url = f"{server.props['inference_address']}/predictions/{model}"
    load = SteadyLoad(url, sample_payload(), lambda: client.keys.get("inference"), rate=rate,
                      concurrency=concurrency, max_seconds=hold * 10 + 600)
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
    started = time.monotonic()
    load.start("baseline")
    try:
        time.sleep(hold)
        for name, step in steps:
            load.mark(f"during {name}")
            begun = time.perf_counter()
            step()
            calls[name] = time.perf_counter() - begun
            load.mark(f"after {name}")
            time.sleep(hold)
    finally:
        records = load.stop()
    elapsed = time.monotonic() - started
    phases = summarize(records)
    gates = [e for e in history.events()[recorded:] if e["action"] == "gate"]
    expected = {f"after {k}": (old if v == "old" else new) for k, v in EXPECTED_AFTER.items()}
    return {
        "model": model, "old": old, "new": new, "rate_target": rate, "concurrency": concurrency,
        "seconds": round(elapsed, 1), "requests": len(records),
        "achieved_rate": round(len(records) / elapsed, 1),
        "failed": sum(1 for r in records if r.status != 200),
        "retried": sum(1 for r in records if r.retried),
        "phases": [asdict(p) for p in phases],
        "expected_after": expected,
        "timeline_ok": all(set(p.versions) == {expected[p.phase]} for p in phases if p.phase in expected),
        "call_seconds": {k: round(v, 3) for k, v in calls.items()},
        "gate": gates[-1] if gates else None,
    }


def render(report: dict) -> str:
    """The report as a text table."""
    lines = [f"{report['requests']} requests in {report['seconds']} s "
             f"({report['achieved_rate']}/s, target {report['rate_target']}/s, "
             f"{report['concurrency']} concurrent); failed: {report['failed']} "
             f"(worker lost mid-request and resent once, as rtserve's client does: {report['retried']})",
             *phase_lines(report["phases"], 26)]
    lines.append("management calls (s): " + ", ".join(
        f"{k} {v}" for k, v in report["call_seconds"].items()))
    lines.append(f"version timeline as expected: {report['timeline_ok']}")
    if gate := report.get("gate"):
        acc, lat, limits = gate["accuracy"], gate["latency_ms"], gate["thresholds"]
        lines.append(
            f"gate {gate['candidate']} over {gate['default']}: {gate['outcome']}; accuracy "
            f"{acc['candidate']} vs {acc['default']} (max drop {limits['max_accuracy_drop']}), "
            f"agreement {gate['agreement']['value']} (min {limits['min_agreement']}), p99 "
            f"{lat['candidate']['p99']} vs {lat['default']['p99']} ms, ratio {lat['ratio']} "
            f"(max {limits['max_latency_ratio']})")
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
    return common.finish(report, args.out, render(report),
                         report["failed"] == 0 and report["timeline_ok"])


if __name__ == "__main__":
    sys.exit(main())
