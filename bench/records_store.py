"""The records' store on one local Apache Cassandra node: its start, its memory, and the records
per second it takes through ``Store.write``.

One run starts a fresh node (:mod:`rtserve.records.local`, in a temporary run directory, on free
loopback ports), then measures:

1. **Start.** The cold first start on an empty data directory (JVM, system keyspaces, a CQL
   session, the records' schema created), then a stop (a drain) and a restart on the same data.
2. **Memory.** The node's resident set (RSS) idle, ``--idle`` seconds after the restart, and
   after the writes.
3. **Writes.** ``--records`` records of about 600 bytes (the worker's line: keys, answer, batch,
   30 inputs), written ``--batch`` at a time, once by ``Store.write`` (unlogged batches grouped by
   partition, what rtserve ships: ``batches``) and once as concurrent single-row inserts of the
   same statements (``execute_concurrent``, the alternative: ``single``), each on records of its
   own, alternating ``--rounds`` times; records/s (records over wall time), the client's CPU
   (this process, the driver's threads included) and the node's, per record.
4. **The shipper.** ``--records`` records as the worker writes them (``handler.records.Recorder``
   on parsed batches of 32 demo-sized requests) in a spool, shipped by ``python -m rtserve records
   ship`` as the server runs it (its own process): records/s until its checkpoint covers the
   spool, and the shipper's CPU per record (parsing the lines, the driver) and the node's.

Output: a table on stdout and JSON (default ``bench/results/records_store.json``).

    make bench-records-store
    .venv/bin/python -m bench.records_store --libs ~/.cache/rtserve/cassandra/5.0.6/libs --records 5000
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psutil
from cassandra.concurrent import execute_concurrent

from rtserve.records import local
from rtserve.records.node import Layout
from rtserve.records.record import Record, format_time, parse_line
from rtserve.records.store import CONCURRENCY, Store

REPO = Path(__file__).resolve().parent.parent
OUT = REPO / "bench" / "results" / "records_store.json"


def make_records(count: int, model: str, seed: int = 0) -> list[Record]:
    """``count`` records of ``model`` as the worker writes them (about 600 bytes each), 5 ms apart
    and ending now."""
    rng = random.Random(seed)
    now = datetime.now(UTC)
    found = []
    for i in range(count):
        doc = {
            "request_id": uuid.UUID(int=rng.getrandbits(128)).hex,
            "time": format_time(now - timedelta(milliseconds=5 * (count - i))),
            "model": model,
            "model_version": "1.0",
            "route": "predictions",
            "status": 200,
            "answer": {"class": 1, "label": "malignant", "probabilities": [round(rng.random(), 6) for _ in range(2)]},
            "batch": {"size": 8, "index": i % 8},
            "handler_ms": round(rng.uniform(0.5, 3), 3),
            "inputs": [round(rng.uniform(-3, 3), 6) for _ in range(30)],
        }
        found.append(parse_line(json.dumps(doc, separators=(",", ":"))))
    return found


def write_single(store: Store, records: list[Record]) -> None:
    """The alternative to ``Store.write``: each of the same inserts as a request of its own."""
    statements = [(row, None) for group in store._grouped(records).values() for _, row in group]
    for ok, result in execute_concurrent(
        store._session, statements, concurrency=2 * CONCURRENCY, raise_on_first_error=False
    ):
        if not ok:
            raise result


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def measure(
    store: Store, node: psutil.Process, write: Callable[[Store, list[Record]], None], records: list[Record], batch: int
) -> dict[str, float]:
    """Write ``records`` ``batch`` at a time; records/s and CPU per record (client, node)."""
    client = psutil.Process()
    wall, mine, theirs = time.perf_counter(), cpu_seconds(client), cpu_seconds(node)
    for i in range(0, len(records), batch):
        write(store, records[i : i + batch])
    wall = time.perf_counter() - wall
    mine, theirs = cpu_seconds(client) - mine, cpu_seconds(node) - theirs
    return {
        "records": len(records),
        "seconds": round(wall, 2),
        "records_per_s": round(len(records) / wall),
        "client_cpu_us_per_record": round(mine / len(records) * 1e6, 1),
        "node_cpu_us_per_record": round(theirs / len(records) * 1e6, 1),
    }


def rss_mib(pid: int) -> int:
    return round((local.rss_bytes(pid) or 0) / 2**20)


def run(args: argparse.Namespace, run_dir: Path) -> dict:
    layout = Layout(run_dir, args.libs.resolve(), local.resolve_ports(run_dir, {}), heap=args.heap)
    report: dict = {
        "heap": args.heap,
        "records": args.records,
        "batch": args.batch,
        "record_bytes": round(sum(len(r.line) for r in make_records(100, "m")) / 100),
    }
    begin = time.monotonic()
    took = local.start(layout, fresh=True)
    report["cold_start_s"] = {"total": round(time.monotonic() - begin, 1), **{k: round(v, 1) for k, v in took.items()}}
    try:
        print(f"cold start: {report['cold_start_s']}", flush=True)
        report["stop_s"] = round(_timed(lambda: local.stop(run_dir)), 1)
        begin = time.monotonic()
        took = local.start(layout)
        report["restart_s"] = {"total": round(time.monotonic() - begin, 1), **{k: round(v, 1) for k, v in took.items()}}
        print(f"restart: {report['restart_s']}", flush=True)
        pid = local.pid(run_dir)
        time.sleep(args.idle)
        report["rss_idle_mib"] = rss_mib(pid)
        node = psutil.Process(pid)
        with Store.connect([layout.address], timeout=30.0) as store:
            measure(store, node, Store.write, make_records(2000, "warm-up", seed=99), args.batch)
            ways = {"batches": Store.write, "single": write_single}
            report["rounds"] = {name: [] for name in ways}
            for round_no in range(args.rounds):
                for name, write in ways.items():
                    records = make_records(args.records, f"{name}-{round_no}", seed=round_no)
                    found = measure(store, node, write, records, args.batch)
                    report["rounds"][name].append(found)
                    print(f"{name:8} round {round_no + 1}: {found}", flush=True)
            report["shipper"] = ship(layout.address, node, args.records, run_dir.parent / "spool")
            print(f"shipper: {report['shipper']}", flush=True)
        report["rss_after_writes_mib"] = rss_mib(pid)
    finally:
        local.stop(run_dir)
    report["best"] = {name: max(rounds, key=lambda r: r["records_per_s"]) for name, rounds in report["rounds"].items()}
    return report


def worker_spool(spool: Path, count: int, features: int = 32) -> int:
    """``count`` records written into ``spool`` by the worker's own writer, as batches of 32
    requests of ``features`` numbers each; returns the bytes written."""
    from handler.records import Recorder, Spool
    from handler.schema import parse_batch

    rng = random.Random(7)
    recorder = Recorder(Spool(str(spool), 1 << 40), "realtime-classifier", "1.0", ["low", "medium", "high"])
    for start in range(0, count, 32):
        rows = [
            {"body": {"features": [round(rng.uniform(-100, 100), 3) for _ in range(features)]}}
            for _ in range(min(32, count - start))
        ]
        batch = parse_batch(rows, features)
        batch.classes = [rng.randrange(3) for _ in rows]
        batch.routes = ["predictions"] * len(rows)
        answers = [
            json.dumps(
                {
                    "prediction": c,
                    "label": "x",
                    "probabilities": [rng.random() for _ in range(3)],
                    "model_version": "1.0",
                }
            )
            for c in batch.classes
        ]
        ids = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in rows]
        recorder.write(recorder.lines(batch, rows, answers, ids, batch.routes, 0.001))
    recorder.close()
    return sum(p.stat().st_size for p in spool.iterdir())


def ship(address: str, node: psutil.Process, count: int, spool: Path) -> dict:
    """Ship ``count`` worker-written records with ``python -m rtserve records ship`` (a process of
    its own, as the server runs it) until its checkpoint covers the spool."""
    import os
    import sys

    from rtserve.records.spool import load_checkpoint, segments
    from rtserve.runtime.process import spawn, terminate

    spool.mkdir(parents=True, exist_ok=True)
    size = worker_spool(spool, count)
    sizes = {s.name: s.size for s in segments(spool)}
    theirs = cpu_seconds(node)
    begin = time.perf_counter()
    proc = spawn(
        [
            sys.executable,
            "-m",
            "rtserve",
            "records",
            "ship",
            "--spool",
            str(spool),
            "--budget",
            str(4 * size),
            "--store",
            address,
        ],
        Path(os.devnull),
        cwd=REPO,
    )
    shipper = psutil.Process(proc.pid)
    first = None  # (seconds, shipper CPU, bytes shipped) at the first checkpoint: past the start-up
    try:
        while (done := load_checkpoint(spool)) != sizes:
            if proc.poll() is not None:
                raise RuntimeError(f"the shipper exited {proc.returncode}")
            if done and first is None:
                first = (time.perf_counter(), cpu_seconds(shipper), sum(done.values()))
            mine = cpu_seconds(shipper)
            time.sleep(0.05)
        end = time.perf_counter()
        theirs = cpu_seconds(node) - theirs
    finally:
        terminate(proc.pid, 30)
    wall = end - begin
    steady = (count * (1 - first[2] / size), end - first[0], mine - first[1]) if first else None
    return {
        "records": count,
        "bytes_per_record": round(size / count),
        "seconds": round(wall, 2),
        "records_per_s": round(count / wall),
        "steady_records_per_s": round(steady[0] / steady[1]) if steady else None,
        "shipper_cpu_us_per_record": round(steady[2] / steady[0] * 1e6, 1) if steady else None,
        "node_cpu_us_per_record": round(theirs / count * 1e6, 1),
    }


def _timed(step: Callable[[], object]) -> float:
    begin = time.monotonic()
    step()
    return time.monotonic() - begin


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--libs", type=Path, required=True, help="the jars make cassandra-deps assembles")
    p.add_argument("--heap", default="512m")
    p.add_argument("--records", type=int, default=20000, help="records per round and way")
    p.add_argument("--batch", type=int, default=500, help="records per Store.write call")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--idle", type=float, default=10.0, help="seconds idle before the RSS is read")
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    with tempfile.TemporaryDirectory(prefix="records-bench-") as tmp:
        report = run(args, Path(tmp) / "cassandra")
    best = report["best"]
    print(
        f"\nApache Cassandra 5.0.6, one node, heap {report['heap']}, on {psutil.cpu_count()} cores "
        f"(load average {psutil.getloadavg()[0]:.1f})"
    )
    print(
        f"  cold start (schema included): {report['cold_start_s']['total']} s; "
        f"restart: {report['restart_s']['total']} s; stop: {report['stop_s']} s"
    )
    print(f"  RSS idle: {report['rss_idle_mib']} MiB; after the writes: {report['rss_after_writes_mib']} MiB")
    for name, found in best.items():
        print(
            f"  {name:8} {found['records_per_s']:>6} records/s ({report['record_bytes']} B each, "
            f"{report['batch']} per call); CPU per record: client {found['client_cpu_us_per_record']} us, "
            f"node {found['node_cpu_us_per_record']} us"
        )
    shipped = report["shipper"]
    print(
        f"  shipper  {shipped['records_per_s']:>6} records/s ({shipped['bytes_per_record']} B each, as the "
        f"worker writes them; {shipped['steady_records_per_s']} past its start-up); CPU per record past "
        f"its start-up: shipper {shipped['shipper_cpu_us_per_record']} us "
        f"(about {round(1e6 / shipped['shipper_cpu_us_per_record']):,} records/s per core), node "
        f"{shipped['node_cpu_us_per_record']} us"
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"  (all rounds: {args.out})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
