"""Each example model kind: rtserve against the best tuned FastAPI serving the same exported program.

For every example of :data:`bench.example_models.EXAMPLES` in the checkout (``make bench-kinds``
runs ``make examples`` first): rtserve as shipped with the example's archive, then the tuned peer
(``bench/fastapi_seed.py``) in each program form (``program``, ``direct``) on the same artifact
directory, each started, warmed up and measured by :func:`bench.perf.bench_server` (``wrk``, closed
loop). Right after its start, each server answers a few golden rows in every body form; a peer
whose answers differ from rtserve's by more than :data:`ANSWER_TOLERANCE` stops the run. Per body
form (the JSON a user sends; for an image input also its base64 PNG and, alone, the raw PNG):
c=1 p50 and p99, c=64 throughput and p99, rtserve over the best peer, :data:`TARGETS` met or missed.

    make bench-kinds                                          # about 6 minutes on 2 cores
    .venv/bin/python -m bench.kinds --quick --kinds digits    # one kind, short points
"""

from __future__ import annotations

import base64
import json
import math
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import common
from bench.common import REPO
from bench.example_models import VERSION, Example, present

#: Largest difference between a peer's and rtserve's numbers in one answer.
ANSWER_TOLERANCE = 1e-5
#: The peer's forms of the exported program (``bench.fastapi_seed.FORMS`` less the demo's eager module).
PEER_FORMS = ("program", "direct")
#: rtserve's name in the results (``bench.perf.ratios`` compares it with every ``fastapi-*``).
RTSERVE = "torchserve"
JSON_TYPE, PNG_TYPE = "application/json", "image/png"
#: The issue's targets per body form, rtserve over the best FastAPI peer: (concurrency, figure,
#: "most" or "least", the multiple).
TARGETS = ((64, "rps", "least", 2.0), (1, "p50_ms", "most", 2.0))
FIGURES = {"rps": "throughput", "p50_ms": "p50", "p99_ms": "p99"}


@dataclass(frozen=True)
class RequestBody:
    """One body form of one row: its name in the tables, its bytes and its Content-Type."""

    name: str
    data: bytes
    content_type: str = JSON_TYPE


# --------------------------------------------------------------------------- bodies (pure)


def nest(values: list, shape: tuple[int, ...]) -> list:
    """A flat list as nested lists of ``shape`` (row-major)."""
    if len(shape) == 1:
        return list(values)
    step = math.prod(shape[1:])
    return [nest(values[i * step : (i + 1) * step], shape[1:]) for i in range(shape[0])]


def named_body(specs: list[dict], row: list[float]) -> dict:
    """A flat row (the program's input, as the golden set holds it) as the named JSON body a user
    sends: each input's numbers in its shape, ids as integers and flags as booleans; a sequence
    without its trailing padding."""
    from handler.inputs import specs_from_meta

    body, start = {}, 0
    for spec in specs_from_meta(specs):
        values = row[start : start + spec.width]
        start += spec.width
        if spec.dtype == "int64":
            values = [int(round(v)) for v in values]
        elif spec.dtype == "bool":
            values = [bool(v) for v in values]
        shape = spec.padded_shape
        if spec.sequence:
            positions = [values[i : i + spec.inner] for i in range(0, len(values), spec.inner)]
            used = [i for i, p in enumerate(positions) if any(v != spec.padding for v in p)]
            length = used[-1] + 1 if used else 1
            values, shape = values[: length * spec.inner], (length, *spec.shape[1:])
        body[spec.name] = nest(values, tuple(shape))
    return body


def image_bytes(spec: dict, values: list[float]) -> bytes:
    """One image input's numbers as the 8-bit PNG a client sends: pixel ``(v - offset) / scale``
    rounded into [0, 255], channels first in ``values``."""
    from io import BytesIO

    from PIL import Image

    channels, height, width = spec["shape"]
    scale, offset = spec["image"]["scale"], spec["image"]["offset"]
    pixels = [min(255, max(0, round((v - offset) / scale))) for v in values]
    plane = height * width
    interleaved = [pixels[c * plane + i] for i in range(plane) for c in range(channels)]
    buf = BytesIO()
    Image.frombytes("L" if channels == 1 else "RGB", (width, height), bytes(interleaved)).save(buf, "PNG")
    return buf.getvalue()


def request_bodies(specs: list[dict] | None, row: list[float]) -> list[RequestBody]:
    """Every body form of one flat row, in order: ``json`` (named inputs, or ``{"features": row}``
    for a model of one float input), then for image inputs ``png-b64`` (each image as
    ``{"b64": PNG}`` in the JSON) and, for a model whose one input is an image, ``png`` (the raw
    bytes)."""
    if not specs:
        return [RequestBody("json", json.dumps({"features": row}).encode())]
    body = named_body(specs, row)
    out = [RequestBody("json", json.dumps(body).encode())]
    images, start = {}, 0
    for spec in specs:
        width = math.prod(spec["shape"])
        if spec.get("image") is not None:
            images[spec["name"]] = image_bytes(spec, row[start : start + width])
        start += width
    if images:
        b64 = {**body, **{name: {"b64": base64.b64encode(png).decode()} for name, png in images.items()}}
        out.append(RequestBody("png-b64", json.dumps(b64).encode()))
    if len(specs) == 1 and images:
        out.append(RequestBody("png", next(iter(images.values())), PNG_TYPE))
    return out


# --------------------------------------------------------------------------- answers (pure)


def largest_difference(a: Any, b: Any) -> float:
    """The largest absolute difference between two JSON answers' float values; infinity when they
    differ in anything else (keys, lengths, strings, integers such as a predicted class)."""
    if isinstance(a, float) and isinstance(b, float):
        return abs(a - b) if math.isfinite(a) and math.isfinite(b) else (0.0 if a == b else math.inf)
    if type(a) is not type(b):
        return math.inf
    if isinstance(a, dict):
        if a.keys() != b.keys():
            return math.inf
        return max((largest_difference(a[k], b[k]) for k in a), default=0.0)
    if isinstance(a, list):
        if len(a) != len(b):
            return math.inf
        return max((largest_difference(x, y) for x, y in zip(a, b)), default=0.0)
    return 0.0 if a == b else math.inf


# --------------------------------------------------------------------------- targets and tables (pure)


def body_results(servers: list[dict], body: str) -> dict:
    """Per concurrency, rtserve's figures for one body form and the best peer's (each figure from
    whichever peer did best): ``{c: {"rtserve": {...}, "best": {...}}}``."""
    out: dict[int, dict] = {}
    for server in servers:
        for p in server["points"]:
            if p["body"] != body:
                continue
            entry = out.setdefault(p["concurrency"], {})
            figures = {"rps": p["rps"], "p50_ms": p["p50_ms"], "p99_ms": p["p99_ms"], "errors": p["errors"]}
            if server["name"] == RTSERVE:
                entry["rtserve"] = figures
                continue
            best = entry.setdefault("best", {"rps": 0.0, "p50_ms": math.inf, "p99_ms": math.inf})
            for key in FIGURES:
                better = figures[key] > best[key] if key == "rps" else figures[key] < best[key]
                if better:
                    best[key], best[f"{key}_from"] = figures[key], server["name"]
    return out


def ratios(by_c: dict) -> dict:
    """rtserve over the best peer, per concurrency and figure (where both were measured)."""
    return {
        c: {key: round(e["rtserve"][key] / e["best"][key], 2) for key in FIGURES if e["best"].get(key)}
        for c, e in by_c.items()
        if "rtserve" in e and "best" in e
    }


def targets(by_c: dict) -> list[dict]:
    """:data:`TARGETS` for one body form: each with its measured ratio (rounded to 2 decimals, as
    shown and judged), its limit and whether it is met (None when a concurrency it needs was not
    measured)."""
    rat = ratios(by_c)
    out = []
    for c, key, bound, multiple in TARGETS:
        measured = rat.get(c, {}).get(key)
        met = None if measured is None else (measured >= multiple if bound == "least" else measured <= multiple)
        out.append(
            {
                "target": f"c={c} {FIGURES[key]} / best FastAPI",
                "measured": measured,
                "limit": f"{'>=' if bound == 'least' else '<='} {multiple:g}",
                "met": met,
            }
        )
    return out


def mark(met: bool | None) -> str:
    """A target's mark in the tables."""
    return {True: "met", False: "MISSED", None: "not measured"}[met]


def kind_table(kind: dict, concurrencies: list[int]) -> str:
    """One kind's table: every server's figures per body form, rtserve over the best peer, the targets."""
    head = (
        f"{'body':<8} {'server':<26}"
        + "".join(f" {f'c={c} req/s':>11} {f'c={c} p50 ms':>11} {f'c={c} p99 ms':>11}" for c in concurrencies)
        + f" {'others %':>8}"
    )
    lines = [
        f"== {kind['name']}: {kind['what']}",
        f"   answers on {kind['check_rows']} golden rows x {len(kind['bodies'])} body forms, "
        f"peers against rtserve: largest difference {max(kind['answers_check'].values(), default=0.0):g} "
        f"(tolerance {ANSWER_TOLERANCE:g})",
        head,
    ]
    for body in kind["bodies"]:
        for server in kind["servers"]:
            by_c = {p["concurrency"]: p for p in server["points"] if p["body"] == body["name"]}
            cells = "".join(
                f" {by_c[c]['rps']:>11,.0f} {by_c[c]['p50_ms']:>11.2f} {by_c[c]['p99_ms']:>11.2f}"
                if c in by_c
                else f" {'':>11} {'':>11} {'':>11}"
                for c in concurrencies
            )
            errors = sum(p["errors"] for p in by_c.values())
            others = max((p["others_cpu_pct"] for p in by_c.values()), default=0.0)
            lines.append(
                f"{body['name']:<8} {server['name']:<26}{cells} {others:>8.0f}"
                + (f"  errors {errors}" if errors else "")
            )
        rat = kind["by_body"][body["name"]]["ratios"]
        cells = "".join(
            "".join(
                f" {'x' + format(rat[c][key], '.2f') if key in rat.get(c, {}) else '':>11}"
                for key in ("rps", "p50_ms", "p99_ms")
            )
            for c in concurrencies
        )
        lines.append(f"{body['name']:<8} {RTSERVE + ' / best FastAPI':<26}{cells}")
    for body in kind["bodies"]:
        for t in kind["by_body"][body["name"]]["targets"]:
            lines.append(f"  [{mark(t['met'])}] {body['name']}: {t['target']} {t['measured']} (target {t['limit']})")
    return "\n".join(lines)


def report_text(report: dict) -> str:
    """The whole run's tables: one per kind, then the kinds left out."""
    cs = report["method"]["concurrency"]
    parts = [kind_table(kind, cs) for kind in report["kinds"]]
    parts += [f"(skipped {s['name']}: {s['why']})" for s in report["skipped"]]
    method = report["method"]
    parts.append(
        f"{len(report['kinds'])} kind(s) in {method['run_s']:.0f} s: wrk closed loop, {method['seconds']:g} s "
        f"per point after {method['warmup_s']:g} s, on {report['machine']['cpus']} cores"
    )
    return "\n\n".join(parts)


# --------------------------------------------------------------------------- the run


class AnswerCheck:
    """Called on each started server before its load: its answers to every check body, compared
    with the first server's (rtserve's) within :data:`ANSWER_TOLERANCE`."""

    def __init__(self, bodies: list[list[RequestBody]]) -> None:
        self.bodies = bodies
        self.reference: list[Any] | None = None
        self.differences: dict[str, float] = {}

    def __call__(self, server) -> None:  # noqa: ANN001 - a bench.perf.Server
        """Post every check body to ``server``; keep its answers (the first server) or compare them.

        Raises:
            BenchError: a request failed, or the answers differ from the reference's.
        """
        import requests

        from bench.perf import BenchError

        token = server.token()
        answers = []
        for body in (b for row in self.bodies for b in row):
            headers = {"Content-Type": body.content_type, **({"Authorization": f"Bearer {token}"} if token else {})}
            resp = requests.post(server.url, data=body.data, headers=headers, timeout=30)
            if resp.status_code != 200:
                raise BenchError(f"{server.name}: a {body.name} check request answered {resp.status_code}: {resp.text}")
            answers.append(resp.json())
        if self.reference is None:
            self.reference = answers
            return
        diff = max(largest_difference(a, b) for a, b in zip(self.reference, answers))
        self.differences[server.name] = diff
        if not diff <= ANSWER_TOLERANCE:
            worst = max(range(len(answers)), key=lambda i: largest_difference(self.reference[i], answers[i]))
            raise BenchError(
                f"{server.name} answers differently from rtserve (largest difference {diff:g}, tolerance "
                f"{ANSWER_TOLERANCE:g}): {answers[worst]} against {self.reference[worst]}"
            )


def run_kind(example: Example, args, settings, run_root: Path) -> dict:  # noqa: ANN001 - argparse, Settings
    """Check and measure one example: rtserve, then the peer in each form."""
    from bench.fastapi_seed import check_forms
    from bench.perf import Body, FastAPISeed, RtServe, bench_server, logger
    from handler.model import ModelMetadata

    model_dir = example.artifacts(args.artifacts, args.version)
    mar = args.model_store / example.archive(args.version)
    for path in (model_dir / "meta.json", mar):
        if not path.is_file():
            raise SystemExit(f"{path} is missing: make examples (or make example EXAMPLE_NAME={example.name})")
    meta = ModelMetadata.load(model_dir / "meta.json")
    rows = meta.golden["features"][: args.check_rows]
    check = AnswerCheck([request_bodies(meta.inputs, row) for row in rows])
    work = run_root / example.name
    work.mkdir(parents=True)
    loads = []
    for body in request_bodies(meta.inputs, rows[0]):
        path = work / f"{body.name}.body"
        path.write_bytes(body.data)
        loads.append(Body(body.name, path, body.content_type))
    forms = check_forms(model_dir, args.forms)
    logger.info("== %s (%s): program forms agree on the golden rows: %s", example.name, example.what, forms)
    servers = [RtServe(args.model_store, work / "ts", mar.name, model=example.name, body=loads[0], settings=settings)]
    servers += [
        FastAPISeed(2, model_dir, work, True, form, f"fastapi-2w-async-{form}", body=loads[0]) for form in args.forms
    ]
    results = [
        asdict(
            bench_server(
                server,
                args.concurrency,
                args.duration,
                args.warmup,
                retries=args.retry_busy,
                server_warmup=args.server_warmup,
                bodies=loads,
                check=check,
            )
        )
        for server in servers
    ]
    by_body = {}
    for body in loads:
        by_c = body_results(results, body.name)
        by_body[body.name] = {"by_concurrency": by_c, "ratios": ratios(by_c), "targets": targets(by_c)}
    return {
        "name": example.name,
        "what": example.what,
        "kind": meta.kind,
        "inputs": meta.inputs or [{"name": "features", "dtype": "float32", "shape": [meta.n_features]}],
        "program_forms_max_abs_diff": forms,
        "check_rows": len(rows),
        "answers_check": check.differences,
        "bodies": [{"name": b.name, "content_type": b.content_type, "bytes": b.path.stat().st_size} for b in loads],
        "servers": results,
        "by_body": by_body,
    }


def main(argv: list[str] | None = None) -> int:
    """Measure every example kind present; print the tables, write JSON and text."""
    parser = common.parser(__doc__, "kinds.json", versions={"version": VERSION}, attach=False, model=False)
    parser.add_argument("--kinds", help="comma-separated example names (default: every one present)")
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts", help="make's DEMO_ARTIFACTS")
    parser.add_argument("--concurrency", default="1,64")
    parser.add_argument("--duration", type=float, default=3.0, help="measured seconds per point")
    parser.add_argument("--warmup", type=float, default=1.0, help="excluded seconds before each point")
    parser.add_argument(
        "--server-warmup",
        type=float,
        default=8.0,
        help="excluded seconds at the highest concurrency after each start (then half as long at the lowest)",
    )
    parser.add_argument(
        "--retry-busy", type=int, default=1, help="measure a point disturbed by other processes again (at most N times)"
    )
    parser.add_argument("--forms", default=",".join(PEER_FORMS), help="the peer's program forms, each a server")
    parser.add_argument("--check-rows", type=int, default=5, help="golden rows each server must answer alike")
    parser.add_argument("--quick", action="store_true", help="2 s points, 4 s server warm-up, no retries")
    args = parser.parse_args(argv)
    if args.quick:
        args.duration, args.server_warmup, args.retry_busy = 2.0, 4.0, 0
    args.concurrency = tuple(int(c) for c in args.concurrency.split(","))
    args.forms = tuple(args.forms.split(","))
    args.artifacts, args.model_store = args.artifacts.resolve(), args.model_store.resolve()
    try:
        examples, absent = present(args.kinds.split(",") if args.kinds else None)
    except ValueError as exc:
        raise SystemExit(str(exc)) from exc
    from bench.perf import _log_to_stdout, machine, wrk_path
    from rtserve.settings import Settings

    _log_to_stdout()
    wrk_path()
    settings = Settings.from_env()
    args.run_root.mkdir(parents=True, exist_ok=True)
    run_root = Path(tempfile.mkdtemp(prefix="kinds-", dir=args.run_root))  # short: TorchServe's socket paths
    started = time.monotonic()
    try:
        kinds = [run_kind(example, args, settings, run_root) for example in examples]
    finally:
        shutil.rmtree(run_root, ignore_errors=True)

    report = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "method": {
            "client": "wrk -t1 (closed loop), loopback",
            "concurrency": list(args.concurrency),
            "seconds": args.duration,
            "warmup_s": args.warmup,
            "server_warmup_s": args.server_warmup,
            "peer": "bench/fastapi_seed.py tuned: uvicorn 2 workers, uvloop, httptools, async endpoint, "
            f"1 torch thread each, forms {', '.join(args.forms)}",
            "answer_tolerance": ANSWER_TOLERANCE,
            "targets": [
                f"c={c} {FIGURES[key]} {'>=' if bound == 'least' else '<='} {m:g}x best FastAPI"
                for c, key, bound, m in TARGETS
            ],
            "run_s": round(time.monotonic() - started, 1),
        },
        "kinds": kinds,
        "skipped": [{"name": e.name, "why": f"{e.module.relative_to(REPO)} is not in this checkout"} for e in absent],
    }
    text = report_text(report)
    sys.stdout.write("\n" + text + "\n")
    common.write_json(report, args.out)
    args.out.with_suffix(".txt").write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
