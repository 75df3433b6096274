"""Tuning runs: TorchServe variants of the shipped defaults, measured with the same harness.

Each variant changes the shipped ``model/model-config.yaml`` (top-level keys and ``handler:``
keys), ``config.properties`` (e.g. ``vmargs``) or the log configuration, gets its own archive
(built by the Makefile from a variant model config) and its own server, and is measured at each
concurrency exactly as ``bench.perf`` measures the shipped server. Variants run in the order
given, each ``--repeat`` times (interleaved, so that drifting load on a shared machine hits
them alike).

    .venv/bin/python -m bench.tune --list
    .venv/bin/python -m bench.tune shipped delay-5 logs-builtin --duration 5 --repeat 2
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import yaml

from bench.perf import MODEL, REPO, RESULTS, RtServe, _log_to_stdout, bench_server, logger, wrk_path
from rtserve.server.torchserve import DEFAULT_LOG_CONFIG

SHIPPED_LOG_CONFIG = DEFAULT_LOG_CONFIG

#: name -> (what it changes, model-config changes, config.properties overrides, log config)
#: A log config of "shipped" is rtserve/server/log4j2.xml, None is TorchServe's built-in one, and a dict
#: {logger: level} is the shipped file with those loggers' levels replaced.
VARIANTS: dict[str, tuple[str, dict, dict, object]] = {
    "shipped": ("the shipped defaults", {}, {}, "shipped"),
    # batching
    "delay-5": ("maxBatchDelay 5 ms (the seed's)", {"maxBatchDelay": 5}, {}, "shipped"),
    "delay-2": ("maxBatchDelay 2 ms", {"maxBatchDelay": 2}, {}, "shipped"),
    "delay-1": ("maxBatchDelay 1 ms", {"maxBatchDelay": 1}, {}, "shipped"),
    "delay-0": (
        "maxBatchDelay 0 in the archive: TorchServe reads it as unset, waits 100 ms",
        {"maxBatchDelay": 0},
        {},
        "shipped",
    ),
    "batch-8": ("batchSize 8", {"batchSize": 8}, {}, "shipped"),
    "batch-16": ("batchSize 16", {"batchSize": 16}, {}, "shipped"),
    "batch-64": ("batchSize 64", {"batchSize": 64}, {}, "shipped"),
    "batch-1": ("batchSize 1 (no batching)", {"batchSize": 1}, {}, "shipped"),
    # workers and threads
    "workers-1": ("1 worker", {"minWorkers": 1, "maxWorkers": 1}, {}, "shipped"),
    "workers-3": ("3 workers", {"minWorkers": 3, "maxWorkers": 3}, {}, "shipped"),
    "workers-1-threads-2": (
        "1 worker with 2 torch threads",
        {"minWorkers": 1, "maxWorkers": 1, "handler": {"num_threads": 2}},
        {},
        "shipped",
    ),
    # logging
    "logs-builtin": ("TorchServe's built-in log4j2 configuration", {}, {}, None),
    "logs-no-ts-metrics": ("shipped logs without ts_metrics.log", {}, {}, {"TS_METRICS": "off"}),
    "logs-no-access": ("shipped logs without access_log.log", {}, {}, {"ACCESS_LOG": "off"}),
    "metrics-log": (
        "metrics_mode=log: frontend metrics as 6 lines per request in ts_metrics.log",
        {},
        {"metrics_mode": "log"},
        "shipped",
    ),
    "netty-1": (
        "one Netty server and one client thread",
        {},
        {"number_of_netty_threads": "1", "netty_client_threads": "1"},
        "shipped",
    ),
    # JVM
    "jvm-default": ("no vmargs: JVM defaults (G1, heap up to 1/4 of RAM)", {}, {"vmargs": "-XX:+UseG1GC"}, "shipped"),
    "jvm-serial": ("SerialGC, 256 MiB heap", {}, {"vmargs": "-Xms64m -Xmx256m -XX:+UseSerialGC"}, "shipped"),
    "jvm-parallel": ("ParallelGC, 256 MiB heap", {}, {"vmargs": "-Xms64m -Xmx256m -XX:+UseParallelGC"}, "shipped"),
    "jvm-g1-256": ("G1, 256 MiB heap", {}, {"vmargs": "-Xms64m -Xmx256m -XX:+UseG1GC"}, "shipped"),
    "jvm-c1": (
        "C1 compiler only (TieredStopAtLevel=1)",
        {},
        {"vmargs": "-Xms64m -Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1"},
        "shipped",
    ),
}


def variant_model_config(changes: dict, out: Path) -> Path:
    """The shipped model config with ``changes`` applied (``handler:`` merged key by key)."""
    config = yaml.safe_load((REPO / "model" / "model-config.yaml").read_text())
    for key, value in changes.items():
        if key == "handler":
            config.setdefault("handler", {}).update(value)
        else:
            config[key] = value
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(yaml.safe_dump(config, sort_keys=False))
    return out


def variant_log_config(levels: dict, out: Path) -> Path:
    """The shipped log4j2.xml with some loggers' levels replaced."""
    import re

    text = SHIPPED_LOG_CONFIG.read_text()
    for name, level in levels.items():
        text, n = re.subn(rf'(<Logger name="{re.escape(name)}" level=")[a-z]+(")', rf"\g<1>{level}\g<2>", text)
        if n != 1:
            raise SystemExit(f"logger {name} not found in {SHIPPED_LOG_CONFIG}")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out


def build_archive(name: str, model_config: Path, version: str, work_dir: Path, demo_artifacts: Path) -> Path:
    """``make archive`` with the variant's model config into its own model store."""
    store = work_dir / name / "model_store"
    subprocess.run(
        [
            "make",
            "-s",
            "archive",
            f"MODEL_VERSION={version}",
            f"MODEL_STORE={store}",
            f"MODEL_CONFIG={model_config}",
            f"DEMO_ARTIFACTS={demo_artifacts}",
        ],
        cwd=REPO,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    return store


def main(argv: list[str] | None = None) -> int:
    """Build and measure the named variants; print a table and write JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variants", nargs="*")
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--concurrency", default="1,8,32,64")
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--soak", type=float, default=0.0)
    parser.add_argument("--server-warmup", type=float, default=10.0)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument(
        "--retry-busy", type=int, default=0, help="measure a point again when other processes disturbed it"
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        help="before each server, wait up to this many seconds for a quiet machine",
    )
    parser.add_argument("--version", default="1.0")
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=REPO / "build" / "tune",
        help="each variant's model config, log config, archive and run directory",
    )
    parser.add_argument(
        "--demo-artifacts",
        type=Path,
        default=REPO / "artifacts",
        help="where `make archive` finds (or trains) the demo's artifacts",
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "tune.json")
    args = parser.parse_args(argv)
    if args.list or not args.variants:
        for name, (what, *_rest) in VARIANTS.items():
            sys.stdout.write(f"{name:<22} {what}\n")
        return 0
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variant(s): {', '.join(unknown)} (see --list)")
    _log_to_stdout()
    wrk_path()
    concurrencies = tuple(int(c) for c in args.concurrency.split(","))
    args.work_dir.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="r", dir=args.work_dir))  # short: socket paths are in it
    stores = {}
    for name in args.variants:
        what, model_changes, props, logs = VARIANTS[name]
        config = variant_model_config(model_changes, args.work_dir / name / "model-config.yaml")
        stores[name] = build_archive(name, config, args.version, args.work_dir, args.demo_artifacts)
    runs = []
    for rep in range(args.repeat):
        for name in args.variants:
            what, model_changes, props, logs = VARIANTS[name]
            if isinstance(logs, dict):
                logs = variant_log_config(logs, args.work_dir / name / "log4j2.xml")
            server = RtServe(
                stores[name],
                root / f"{name}-{rep}",
                f"{MODEL}_{args.version}.mar",
                name=name,
                overrides=props,
                log_config=logs,
            )
            result = bench_server(
                server,
                concurrencies,
                args.duration,
                args.warmup,
                args.soak,
                args.wait_quiet,
                args.retry_busy,
                args.server_warmup,
            )
            runs.append({"variant": name, "what": what, "repeat": rep, **asdict(result)})
    lines = [
        f"{'variant':<22} {'run':>3} "
        + " ".join(f"{'c=' + str(c) + ' req/s':>11} {'p50':>6} {'p99':>6}" for c in concurrencies)
        + f" {'CPU ms/req@' + str(concurrencies[-1]):>14} {'cold s':>6} {'RSS':>5} {'others%':>7}"
    ]
    for run in sorted(runs, key=lambda r: (args.variants.index(r["variant"]), r["repeat"])):
        pts = {p["concurrency"]: p for p in run["points"]}
        lines.append(
            f"{run['variant']:<22} {run['repeat']:>3} "
            + " ".join(
                f"{pts[c]['rps']:>11.0f} {pts[c]['p50_ms']:>6.2f} {pts[c]['p99_ms']:>6.2f}" for c in concurrencies
            )
            + f" {pts[concurrencies[-1]]['cpu_ms_per_request']:>14.3f} {run['cold_start_s']:>6.1f}"
            f" {pts[concurrencies[-1]]['rss_mb']:>5.0f}"
            f" {max(p['others_cpu_pct'] for p in run['points']):>7.0f}"
        )
    sys.stdout.write("\n" + "\n".join(lines) + "\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "concurrency": list(concurrencies),
                "seconds": args.duration,
                "runs": runs,
            },
            indent=2,
        )
        + "\n"
    )
    logger.info("JSON: %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
