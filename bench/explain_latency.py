"""What one explanation costs, at the settings packed in an archive (``make bench-explain``).

Three bounded measurements, all on this machine and all traffic on 127.0.0.1:

1. compute: ``Explainer.explain`` for one held-out row, in-process, single torch thread (as a
   worker runs it), next to a prediction forward pass of a full batch of 32 and an
   explanation of ``explain_max_per_batch`` rows at once (the most one batch can add);
2. http: sequential requests to a real TorchServe started from the archive on free ports:
   ``/explanations`` vs ``/predictions`` (both include TorchServe's batching delay);
3. flood: sequential ``/predictions`` while other clients keep ``/explanations`` busy, to show
   the per-batch ceiling keeps predictions moving.

    python -m bench.explain_latency --mar model_store/realtime-classifier_1.0.mar

Prints a table and writes ``bench/results/explain_latency.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import statistics
import sys
import tempfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Callable

import requests
import torch
import yaml

from handler.config import HandlerConfig
from handler.explain import Explainer
from handler.model import ModelMetadata, load_model
from handler.schema import Normalizer
from rtserve.data import make_dataset
from rtserve.server import TorchServe, free_ports, port_overrides

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent


def summary(seconds: list[float]) -> dict:
    """Median, p99 and max in milliseconds (p99: nearest rank)."""
    ordered = sorted(seconds)
    p99 = ordered[min(len(ordered) - 1, max(0, round(0.99 * len(ordered)) - 1))]
    return {"n": len(ordered), "median_ms": round(1000 * statistics.median(ordered), 3),
            "p99_ms": round(1000 * p99, 3), "max_ms": round(1000 * ordered[-1], 3)}


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


def load_archive(mar: Path) -> tuple[torch.nn.Module, ModelMetadata, HandlerConfig, str]:
    """Model, metadata, handler settings and version packed in a ``.mar``."""
    with zipfile.ZipFile(mar) as zf:
        manifest = json.loads(zf.read("MAR-INF/MANIFEST.json"))["model"]
        weights = io.BytesIO(zf.read(manifest["serializedFile"]))
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "meta.json").write_bytes(zf.read("meta.json"))
            meta = ModelMetadata.load(Path(tmp) / "meta.json")
        config = HandlerConfig.from_model_yaml(yaml.safe_load(zf.read(manifest["configFile"])))
    return load_model(weights, meta), meta, config, manifest["modelVersion"]


def bench_compute(mar: Path, rows: torch.Tensor, n: int, warmup: int) -> dict:
    """In-process cost of the explainer and of a prediction batch, single-threaded."""
    model, meta, config, _ = load_archive(mar)
    torch.set_num_threads(config.num_threads)
    explainer = Explainer(model, meta.mean, meta.std, meta.feature_names, meta.labels,
                          baseline=config.explain_baseline, n_steps=config.explain_steps,
                          internal_batch_size=config.explain_internal_batch_size)
    z = Normalizer(meta.mean, meta.std)(rows)
    with torch.inference_mode():
        targets = model(z).argmax(dim=1).tolist()
    k = config.explain_max_per_batch
    count = len(z)

    def one(i: int) -> None:
        explainer.explain(z[i % count: i % count + 1], [targets[i % count]])

    def ceiling(i: int) -> None:
        idx = [(i + j) % count for j in range(k)]
        explainer.explain(z[idx], [targets[j] for j in idx])

    def predict32(i: int) -> None:
        idx = [(i + j) % count for j in range(32)]
        with torch.inference_mode():
            torch.softmax(model(z[idx]), dim=1)

    deltas = [abs(e.convergence_delta) for e in explainer.explain(z, targets)]
    return {
        "settings": {"explain_steps": config.explain_steps,
                     "explain_baseline": config.explain_baseline,
                     "explain_internal_batch_size": config.explain_internal_batch_size,
                     "explain_max_per_batch": k, "num_threads": config.num_threads},
        "one_explanation": summary(timed(one, n, warmup)),
        f"explanations_at_ceiling_{k}": summary(timed(ceiling, max(1, n // 4), warmup)),
        "prediction_batch_32": summary(timed(predict32, n, warmup)),
        "abs_convergence_delta": {"median": statistics.median(deltas), "max": max(deltas)},
    }


def bench_http(mar: Path, rows: list[list[float]], n: int, warmup: int, flood_clients: int) -> dict:
    """Sequential requests to a real TorchServe, then predictions under an explanation flood."""
    run_dir = Path(tempfile.mkdtemp(prefix="bench-explain-"))
    server = TorchServe(run_dir, mar.parent, [f"realtime-classifier={mar.name}"],
                        overrides=port_overrides(free_ports(6)))
    server.start()
    try:
        server.wait_ready(timeout=120, models=["realtime-classifier"])
        base = server.props["inference_address"]
        session = requests.Session()

        key = server.client().keys.get("inference")

        def post(route: str, i: int, http: requests.Session = session) -> int:
            resp = http.post(f"{base}/{route}/realtime-classifier",
                             data=json.dumps({"features": rows[i % len(rows)]}),
                             headers={"Content-Type": "application/json",
                                      "Authorization": f"Bearer {key}"}, timeout=30)
            if resp.status_code != 200 and not (route == "explanations" and resp.status_code == 503):
                raise RuntimeError(f"{route}: {resp.status_code} {resp.text}")
            return resp.status_code

        result = {
            "explanations": summary(timed(lambda i: post("explanations", i), n, warmup)),
            "predictions": summary(timed(lambda i: post("predictions", i), n, warmup)),
        }
        stop = threading.Event()
        sent = [0] * flood_clients
        refused = [0] * flood_clients

        def flood(worker: int) -> None:
            """Explanations back to back, no back-off on 503 (a hostile client)."""
            http = requests.Session()
            while not stop.is_set():
                if post("explanations", worker + sent[worker], http) == 503:
                    refused[worker] += 1
                sent[worker] += 1

        threads = [threading.Thread(target=flood, args=(w,)) for w in range(flood_clients)]
        for t in threads:
            t.start()
        try:
            under_flood = timed(lambda i: post("predictions", i), n, warmup)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=60)
        result["predictions_during_explanation_flood"] = {
            **summary(under_flood), "flood_clients": flood_clients,
            "explanations_sent_meanwhile": sum(sent),
            "explanations_refused_503": sum(refused)}
        return result
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    """Run the three measurements and report them."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mar", type=Path, default=REPO / "model_store" / "realtime-classifier_1.0.mar")
    parser.add_argument("-n", type=int, default=300, help="timed repetitions per measurement")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--flood-clients", type=int, default=8)
    parser.add_argument("--skip-http", action="store_true", help="only the in-process part")
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "explain_latency.json")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    if not args.mar.is_file():
        parser.error(f"{args.mar} not found: run `make archive` first")
    data = make_dataset().x_test[:256]
    report = {"mar": str(args.mar), "torch": torch.__version__,
              "compute": bench_compute(args.mar, data, args.n, args.warmup)}
    if not args.skip_http:
        report["http"] = bench_http(args.mar, data.tolist(), args.n, args.warmup,
                                    args.flood_clients)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    logger.info("settings: %s", report["compute"]["settings"])
    logger.info("%-44s %8s %10s %10s", "measurement", "n", "median ms", "p99 ms")
    for part in ("compute", "http"):
        for name, value in report.get(part, {}).items():
            if isinstance(value, dict) and "median_ms" in value:
                logger.info("%-44s %8d %10.3f %10.3f", f"{part}: {name}", value["n"],
                            value["median_ms"], value["p99_ms"])
    delta = report["compute"]["abs_convergence_delta"]
    logger.info("|convergence delta| on 256 held-out rows: median %.1e, max %.1e",
                delta["median"], delta["max"])
    flood = report.get("http", {}).get("predictions_during_explanation_flood")
    if flood:
        logger.info("flood: %d clients sent %d explanations meanwhile, %d refused with 503",
                    flood["flood_clients"], flood["explanations_sent_meanwhile"],
                    flood["explanations_refused_503"])
    logger.info("wrote %s", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
