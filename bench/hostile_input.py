"""Hostile input over HTTP, mixed into valid traffic, against a real TorchServe.

Builds a deterministic corpus of bad request bodies (not JSON, truncated, wrong types, nesting,
NaN/inf, huge numbers, unicode, enormous arrays, deep nesting, oversized bodies, binary junk),
interleaves it with valid requests, sends everything concurrently, and checks: every valid
request gets 200, every bad one the status its kind must get (:data:`EXPECTED`: 413 for a body
over ``max_request_size``, refused by TorchServe's frontend; 400 naming the problem for every
other kind, from the handler), and the backend workers' PIDs are unchanged at the end.

    make bench-hostile
    .venv/bin/python -m bench.hostile_input --bad 3000
"""

from __future__ import annotations

import functools
import json
import logging
import random
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import requests

from bench import common
from rtserve.server.torchserve import TorchServe

logger = logging.getLogger(__name__)
N = 32
JSON = "application/json"
#: The bad kinds :func:`_bad` makes.
KINDS = (
    "not-json",
    "truncated",
    "wrong-type",
    "missing-field",
    "wrong-length",
    "junk-element",
    "nan-inf",
    "huge-number",
    "unicode",
    "enormous-array",
    "deep-nesting",
    "oversized",
    "binary",
    "empty",
    "form-encoded",
    "nested-features",
)
#: The status each bad kind must get: any other (a 401, 404, 429, 5xx ...) is a regression.
EXPECTED = {kind: 413 if kind == "oversized" else 400 for kind in KINDS}


def _valid(rng: random.Random, n: int = N) -> list[float]:
    return [round(rng.uniform(-100, 100), 3) for _ in range(n)]


def _junk(rng: random.Random):
    return rng.choice([None, True, False, "1.0", "", "🙂", [], {}, [1.0], {"a": 1}, "NaN"])


def _bad(rng: random.Random, limit: int, n: int = N) -> tuple[str, bytes, str]:
    """One bad request for a model of ``n`` features: (kind, body, content type)."""
    kind = rng.choice(KINDS)
    valid = functools.partial(_valid, rng, n)
    good = json.dumps({"features": valid()})
    if kind == "not-json":
        body = rng.choice([b"hello", b"{features: [1,2]}", b"<xml/>", b"{'features': []}"])
    elif kind == "truncated":
        body = good[: rng.randint(1, len(good) - 1)].encode()
    elif kind == "wrong-type":
        body = json.dumps(rng.choice([[1, 2], "features", 3.5, None, True])).encode()
    elif kind == "missing-field":
        body = json.dumps({rng.choice(["feature", "Features", "x", ""]): valid()}).encode()
    elif kind == "wrong-length":
        body = json.dumps({"features": valid()[: rng.choice([0, 1, n - 1])] + [1.0] * rng.choice([0, 2])}).encode()
    elif kind == "junk-element":
        feats = valid()
        feats[rng.randrange(n)] = _junk(rng)
        body = json.dumps({"features": feats}).encode()
    elif kind == "nan-inf":
        feats = [str(v) for v in valid()]
        feats[rng.randrange(n)] = rng.choice(["NaN", "Infinity", "-Infinity", "1e999", "-1e400"])
        body = ('{"features": [' + ", ".join(feats) + "]}").encode()
    elif kind == "huge-number":
        feats = [str(v) for v in valid()]
        feats[rng.randrange(n)] = rng.choice(["1" + "0" * 400, "1e7", "-3.4e38", str(2**64)])
        body = ('{"features": [' + ", ".join(feats) + "]}").encode()
    elif kind == "unicode":
        body = json.dumps(
            {"features": ["\u202e" + chr(rng.randint(0x100, 0xD7FF))] * n}, ensure_ascii=rng.random() < 0.5
        ).encode()
    elif kind == "enormous-array":
        body = json.dumps({"features": [1.0] * rng.randint(n + 1, limit // 6)}).encode()
    elif kind == "deep-nesting":
        depth = rng.randint(1_000, limit // 2 - 10)
        body = ('{"features": ' + "[" * depth + "]" * depth + "}").encode()
    elif kind == "oversized":
        body = json.dumps({"features": valid(), "pad": "x" * (limit + rng.randint(1, 4096))}).encode()
    elif kind == "binary":
        body = bytes(rng.randrange(256) for _ in range(rng.randint(1, 512)))
    elif kind == "empty":
        body = b""
    elif kind == "form-encoded":
        return kind, good.encode(), "application/x-www-form-urlencoded"
    else:  # nested-features
        body = json.dumps({"features": [[v] for v in valid()]}).encode()
    return kind, body, JSON


def corpus(n_bad: int, seed: int = 0, limit: int = 65536, n: int = N) -> list[tuple[str, bytes, str, bool]]:
    """(kind, body, content type, is_valid): ``n_bad`` bad requests, each followed by a valid one.

    ``n`` is the model's feature count (the demo's by default).
    """
    rng = random.Random(seed)
    items = []
    for _ in range(n_bad):
        kind, body, ctype = _bad(rng, limit, n)
        items.append((kind, body, ctype, False))
        items.append(("valid", json.dumps({"features": _valid(rng, n)}).encode(), JSON, True))
    return items


def worker_pids(server: TorchServe, model: str) -> list[int]:
    """PIDs of the model's backend workers."""
    return sorted(w["pid"] for w in server.client().describe(model)[0]["workers"])


def run(server: TorchServe, model: str, n_bad: int, concurrency: int = 16, seed: int = 0, n: int = N) -> dict:
    """Send the corpus for a model of ``n`` features concurrently; return the report."""
    limit = server.request_limit(server.props)  # what the frontend runs with: raised for wide models
    items = corpus(n_bad, seed, limit, n)
    url = common.predictions_url(server, model)
    keys = server.client().keys
    pids_before = worker_pids(server, model)
    local = threading.local()

    def send(item):
        kind, body, ctype, valid = item
        if not hasattr(local, "session"):
            local.session = requests.Session()
        session = local.session
        try:
            resp = session.post(
                url,
                data=body,
                timeout=30,
                headers={"Content-Type": ctype, "Authorization": f"Bearer {keys.get('inference')}"},
            )
            return kind, valid, resp.status_code
        except requests.RequestException as exc:
            return kind, valid, f"{type(exc).__name__}"

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        results = list(pool.map(send, items))
    pids_after = worker_pids(server, model)
    statuses = Counter((k, s) for k, _, s in results)
    valid_failed = [(k, s) for k, v, s in results if v and s != 200]
    bad_wrong = [(k, s) for k, v, s in results if not v and s != EXPECTED[k]]
    return {
        "sent": len(results),
        "bad_sent": n_bad,
        "valid_sent": len(results) - n_bad,
        "valid_ok": sum(1 for _, v, s in results if v and s == 200),
        "valid_failed": len(valid_failed),
        "bad_expected_status": n_bad - len(bad_wrong),
        "bad_other_status": len(bad_wrong),
        "five_xx": sum(1 for _, _, s in results if isinstance(s, int) and s >= 500),
        "by_kind": {f"{k} -> {s}": n for (k, s), n in sorted(statuses.items(), key=str)},
        "worker_pids_unchanged": pids_before == pids_after,
        "examples_wrong_status": bad_wrong[:5] + valid_failed[:5],
    }


def main(argv: list[str] | None = None) -> int:
    """Start a server (or attach to one), send the corpus, print and save the report."""
    parser = common.parser(__doc__, "hostile_input.json")
    parser.add_argument("--bad", type=int, default=3000, help="number of bad requests")
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args(argv)
    common.log_to_stdout()
    with common.serving(args, "bench-hostile") as server:
        report = run(server, args.model, args.bad, args.concurrency)
    text = json.dumps({k: v for k, v in report.items() if k != "by_kind"}, indent=2)
    text += "".join(f"\n  {key:40} {n}" for key, n in report["by_kind"].items())
    ok = report["valid_failed"] == 0 and report["bad_other_status"] == 0 and report["worker_pids_unchanged"]
    return common.finish(report, args.out, text, ok)


if __name__ == "__main__":
    sys.exit(main())
