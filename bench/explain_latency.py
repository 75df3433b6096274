"""What one explanation costs, at the settings packed in an archive (``make bench-explain``).

Three bounded measurements, all on this machine and all traffic on 127.0.0.1:

1. compute: ``Explainer.explain`` for one held-out row, in-process, single torch thread (as a
   worker runs it), next to a prediction forward pass of a full batch of 32 and an
   explanation of ``explain_max_per_batch`` rows at once (the most one batch can add);
2. http: sequential requests to a real TorchServe started from the archive on free ports:
   ``/explanations`` vs ``/predictions`` (both include TorchServe's batching delay);
3. flood: steady ``/predictions`` (100/s from 2 clients, ``bench.loadgen.SteadyLoad``) alone,
   then while 8 more clients send ``/explanations`` back to back without back-off on 503, to
   show the per-batch ceiling keeps predictions moving.

    python -m bench.explain_latency --mar model_store/realtime-classifier_1.0.mar

Prints a table and writes ``bench/results/explain_latency.json``.
"""

from __future__ import annotations

import json
import logging
import statistics
import sys
import tempfile
import time
import zipfile
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import requests
import torch
import yaml

from bench import common
from bench.common import REPO
from bench.loadgen import SteadyLoad, summarize
from handler.config import HandlerConfig
from handler.explain import Explainer
from handler.model import ModelMetadata, load_program
from rtserve.model.data import make_dataset
from rtserve.server.torchserve import TorchServe

logger = logging.getLogger(__name__)


def summary(seconds: list[float]) -> dict:
    """Median, p99 and max in milliseconds (p99: nearest rank)."""
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, max(0, round(0.99 * len(ordered)) - 1))]
    return {
        "n": len(ordered),
        "median_ms": round(1000 * statistics.median(ordered), 3),
        "p99_ms": round(1000 * p99, 3),
        "max_ms": round(1000 * ordered[-1], 3),
    }


def timed(fn: Callable[[int], object], n: int, warmup: int) -> list[float]:
    """Run ``fn(i)`` ``warmup`` times untimed, then ``n`` times timed (seconds each)."""
    for i in range(warmup):
        fn(i)
    out = []
    for i in range(n):
        start = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - start)
    return out


def load_archive(mar: Path) -> tuple[Callable, ModelMetadata, HandlerConfig, str]:
    """Model (the exported program's forward), metadata, handler settings and version packed
    in a ``.mar``."""
    with zipfile.ZipFile(mar) as zf:
        manifest = json.loads(zf.read("MAR-INF/MANIFEST.json"))["model"]
        with tempfile.TemporaryDirectory() as tmp:
            for name in ("meta.json", manifest["serializedFile"]):
                (Path(tmp) / name).write_bytes(zf.read(name))
            meta = ModelMetadata.load(Path(tmp) / "meta.json")
            model = load_program(Path(tmp) / manifest["serializedFile"])
        config = HandlerConfig.from_model_yaml(yaml.safe_load(zf.read(manifest["configFile"])))
    return model, meta, config, manifest["modelVersion"]


def bench_compute(mar: Path, rows: torch.Tensor, n: int, warmup: int) -> dict:
    """In-process cost of the explainer and of a prediction batch, single-threaded."""
    model, meta, config, _ = load_archive(mar)
    torch.set_num_threads(config.num_threads)
    explainer = Explainer(
        model,
        meta.mean,
        meta.feature_names,
        meta.labels,
        baseline=config.explain_baseline,
        n_steps=config.explain_steps,
        internal_batch_size=config.explain_internal_batch_size,
    )
    z = rows
    with torch.inference_mode():
        targets = model(z).argmax(dim=1).tolist()
    k = config.explain_max_per_batch
    count = len(z)

    def one(i: int) -> None:
        explainer.explain(z[i % count : i % count + 1], [targets[i % count]])

    def ceiling(i: int) -> None:
        idx = [(i + j) % count for j in range(k)]
        explainer.explain(z[idx], [targets[j] for j in idx])

    def predict32(i: int) -> None:
        idx = [(i + j) % count for j in range(32)]
        with torch.inference_mode():
            torch.softmax(model(z[idx]), dim=1)

    deltas = [abs(e.convergence_delta) for e in explainer.explain(z, targets)]
    return {
        "settings": {
            "explain_steps": config.explain_steps,
            "explain_baseline": config.explain_baseline,
            "explain_internal_batch_size": config.explain_internal_batch_size,
            "explain_max_per_batch": k,
            "num_threads": config.num_threads,
        },
        "one_explanation": summary(timed(one, n, warmup)),
        f"explanations_at_ceiling_{k}": summary(timed(ceiling, max(1, n // 4), warmup)),
        "prediction_batch_32": summary(timed(predict32, n, warmup)),
        "abs_convergence_delta": {"median": statistics.median(deltas), "max": max(deltas)},
    }


def bench_http(
    server: TorchServe, model: str, rows: list[list[float]], n: int, warmup: int, flood_clients: int, hold: float
) -> dict:
    """Sequential requests to a ready TorchServe, then steady predictions before and during an
    explanation flood (``bench.loadgen.SteadyLoad``)."""
    client = server.client()
    session = requests.Session()

    def post(route: str, i: int) -> None:
        resp = session.post(
            common.predictions_url(server, model, route),
            data=json.dumps({"features": rows[i % len(rows)]}),
            headers={"Content-Type": "application/json", "Authorization": f"Bearer {client.keys.get('inference')}"},
            timeout=30,
        )
        if resp.status_code != 200:
            raise RuntimeError(f"{route}: {resp.status_code} {resp.text}")

    result = {
        "explanations": summary(timed(lambda i: post("explanations", i), n, warmup)),
        "predictions": summary(timed(lambda i: post("predictions", i), n, warmup)),
    }
    token = lambda: client.keys.get("inference")  # noqa: E731
    payload = {"features": rows[0]}
    steady = SteadyLoad(
        common.predictions_url(server, model), payload, token, rate=100, concurrency=2, max_seconds=hold * 2 + 60
    )
    flood = SteadyLoad(
        common.predictions_url(server, model, "explanations"),
        payload,
        token,
        rate=100_000,
        concurrency=flood_clients,
        max_seconds=hold + 60,
    )
    steady.start("predictions alone")
    try:
        time.sleep(hold)
        steady.mark("predictions during explanation flood")
        flood.start("flood")
        try:
            time.sleep(hold)
        finally:
            flood_records = flood.stop()
    finally:
        steady_records = steady.stop()
    for phase in summarize(steady_records):
        result[phase.phase.replace(" ", "_")] = {
            "n": phase.sent,
            "failed_first": phase.failed_first,
            "resent": phase.resent,
            "failed_after_resend": phase.failed_after_resend,
            "median_ms": phase.p50_ms,
            "p99_ms": phase.p99_ms,
            "errors": phase.errors,
        }
    statuses = Counter(r.status for r in flood_records)
    result["flood"] = {
        "clients": flood_clients,
        "seconds": hold,
        "explanations_answered_200": statuses.pop(200, 0),
        "explanations_refused_503": statuses.pop(503, 0),
        "other_statuses": dict(statuses),
    }
    return result


def main(argv: list[str] | None = None) -> int:
    """Run the three measurements and report them."""
    parser = common.parser(__doc__.split("\n\n")[0], "explain_latency.json", versions={}, model_store=False)
    parser.add_argument("--mar", type=Path, default=REPO / "model_store" / "realtime-classifier_1.0.mar")
    parser.add_argument("-n", type=int, default=300, help="timed repetitions per measurement")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument(
        "--flood-clients", type=int, default=8, help="threads sending explanations back to back, no back-off on 503"
    )
    parser.add_argument(
        "--hold", type=float, default=8.0, help="seconds of steady predictions before, and during, the flood"
    )
    parser.add_argument("--skip-http", action="store_true", help="only the in-process part")
    args = parser.parse_args(argv)
    common.log_to_stdout()
    if not args.mar.is_file():
        parser.error(f"{args.mar} not found: run `make archive` first")
    data = make_dataset().x_test[:256]
    report = {
        "mar": str(args.mar),
        "torch": torch.__version__,
        "compute": bench_compute(args.mar, data, args.n, args.warmup),
    }
    if not args.skip_http:
        args.model_store = args.mar.parent
        with common.serving(args, "bench-explain", [args.mar.name]) as server:
            report["http"] = bench_http(
                server, args.model, data.tolist(), args.n, args.warmup, args.flood_clients, args.hold
            )
    common.write_json(report, args.out)
    logger.info("settings: %s", report["compute"]["settings"])
    logger.info("%-44s %8s %10s %10s", "measurement", "n", "median ms", "p99 ms")
    for part in ("compute", "http"):
        for name, value in report.get(part, {}).items():
            if isinstance(value, dict) and "median_ms" in value:
                logger.info(
                    "%-44s %8d %10.3f %10.3f", f"{part}: {name}", value["n"], value["median_ms"], value["p99_ms"]
                )
    delta = report["compute"]["abs_convergence_delta"]
    logger.info("|convergence delta| on 256 held-out rows: median %.1e, max %.1e", delta["median"], delta["max"])
    flood = report.get("http", {}).get("flood")
    if flood:
        logger.info(
            "flood: %d clients for %.0f s: %d explanations answered, %d refused with 503, other statuses %s",
            flood["clients"],
            flood["seconds"],
            flood["explanations_answered_200"],
            flood["explanations_refused_503"],
            flood["other_statuses"] or "none",
        )
        failed = sum(v.get("failed_first", 0) for v in report["http"].values() if isinstance(v, dict))
        logger.info("failed predictions: %d", failed)  # on the first try, before any resend
    logger.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
