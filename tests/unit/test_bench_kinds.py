"""make bench-kinds' pure parts: the bodies it sends, how answers are compared, the targets and tables.

The bodies are checked against the handler's own parser (a named body and its PNG forms must give the
row back, the PNG within one pixel step), so the benchmark measures requests rtserve accepts; the
targets against hand-made figures, each side of its limit.
"""

from __future__ import annotations

import base64
import json
import math

import pytest

from bench import example_models, kinds
from handler.inputs import NamedInputs, specs_from_meta

pytestmark = pytest.mark.unit

IMAGE = {"name": "image", "dtype": "float32", "shape": [1, 2, 3], "image": {"scale": 16 / 255, "offset": 0.0}}
MIXED = [
    {"name": "measurements", "dtype": "float32", "shape": [4]},
    {"name": "category", "dtype": "int64", "shape": [2], "vocabulary": 5},
    {"name": "flags", "dtype": "bool", "shape": [1]},
]


def parsed(specs: list[dict], body: kinds.RequestBody) -> list[float]:
    """What rtserve's handler makes of ``body`` (as TorchServe hands it over: the raw bytes)."""
    named = NamedInputs(specs_from_meta(specs))
    return named.row(named.body({"body": body.data}), 1e6)


def test_nest_is_row_major():
    assert kinds.nest([1, 2, 3, 4, 5, 6], (1, 2, 3)) == [[[1, 2, 3], [4, 5, 6]]]
    assert kinds.nest([1, 2], (2,)) == [1, 2]


def test_a_named_body_gives_the_flat_row_back():
    row = [0.5, -1.0, 2.0, 3.5, 4.0, 1.0, 1.0]
    (body,) = kinds.request_bodies(MIXED, row)
    assert (body.name, body.content_type) == ("json", "application/json")
    assert json.loads(body.data) == {"measurements": [0.5, -1.0, 2.0, 3.5], "category": [4, 1], "flags": [True]}
    assert parsed(MIXED, body) == row


def test_a_features_model_sends_its_row_as_features():
    (body,) = kinds.request_bodies(None, [1.0, 2.5])
    assert json.loads(body.data) == {"features": [1.0, 2.5]}


def test_an_image_input_is_sent_as_array_base64_png_and_raw_png():
    row = [0.0, 1.0, 4.0, 8.0, 15.0, 16.0]
    bodies = kinds.request_bodies([IMAGE], row)
    assert [(b.name, b.content_type) for b in bodies] == [
        ("json", "application/json"),
        ("png-b64", "application/json"),
        ("png", "image/png"),
    ]
    assert parsed([IMAGE], bodies[0]) == row
    png = base64.b64decode(json.loads(bodies[1].data)["image"]["b64"])
    assert png == bodies[2].data and png.startswith(b"\x89PNG")
    for body in bodies[1:]:  # 8-bit pixels: each value within half a step of 16/255
        assert parsed([IMAGE], body) == pytest.approx(row, abs=8 / 255 + 1e-9)


def test_a_png_body_only_when_the_image_is_the_only_input():
    names = [b.name for b in kinds.request_bodies([IMAGE, MIXED[0]], [0.0] * 10)]
    assert names == ["json", "png-b64"]


def test_answers_differ_by_their_floats_and_not_at_all_otherwise():
    a = {"prediction": 3, "label": "3", "probabilities": [0.1, 0.9], "model_version": "1.0"}
    assert kinds.largest_difference(a, {**a, "probabilities": [0.1, 0.9 + 2e-6]}) == pytest.approx(2e-6)
    assert kinds.largest_difference(a, a) == 0.0
    for other in (
        {**a, "prediction": 4},
        {**a, "label": "4"},
        {**a, "probabilities": [0.1]},
        {k: v for k, v in a.items() if k != "label"},
        {**a, "prediction": 3.0},
    ):
        assert kinds.largest_difference(a, other) == math.inf, other
    assert kinds.largest_difference({"prediction": 151.25}, {"prediction": 151.25 + 1e-3}) == pytest.approx(1e-3)


def point(body: str, c: int, rps: float, p50: float, p99: float) -> dict:
    return {
        "body": body,
        "concurrency": c,
        "rps": rps,
        "p50_ms": p50,
        "p99_ms": p99,
        "errors": 0,
        "others_cpu_pct": 3.0,
    }


def servers(rt_c64: float, rt_c1_p50: float) -> list[dict]:
    """rtserve and two peers, each best at something, on two bodies."""
    return [
        {"name": "torchserve", "points": [point("json", 1, 900, rt_c1_p50, 4.0), point("json", 64, rt_c64, 7, 20)]},
        {
            "name": "fastapi-2w-async-program",
            "points": [point("json", 1, 1500, 0.5, 3.0), point("json", 64, 2000, 30, 60), point("png", 1, 1, 1, 1)],
        },
        {
            "name": "fastapi-2w-async-direct",
            "points": [point("json", 1, 1400, 0.45, 5.0), point("json", 64, 2500, 25, 70)],
        },
    ]


def test_the_best_peer_per_figure_and_the_ratios():
    by_c = kinds.body_results(servers(6000, 0.9), "json")
    assert by_c[64]["best"] == {
        "rps": 2500,
        "rps_from": "fastapi-2w-async-direct",
        "p50_ms": 25,
        "p50_ms_from": "fastapi-2w-async-direct",
        "p99_ms": 60,
        "p99_ms_from": "fastapi-2w-async-program",
    }
    assert (by_c[1]["best"]["p50_ms"], by_c[1]["best"]["p99_ms"]) == (0.45, 3.0)
    assert kinds.ratios(by_c) == {
        1: {"rps": 0.6, "p50_ms": 2.0, "p99_ms": 1.33},
        64: {"rps": 2.4, "p50_ms": 0.28, "p99_ms": 0.33},
    }
    assert "rtserve" not in kinds.body_results(servers(6000, 0.9), "png")[1]


@pytest.mark.parametrize(
    "rt_c64,rt_c1_p50,met",
    [(5000, 0.9, [True, True]), (4900, 0.91, [False, False]), (7000, 1.2, [True, False])],
)
def test_targets_are_marked_each_side_of_their_limit(rt_c64, rt_c1_p50, met):
    got = kinds.targets(kinds.body_results(servers(rt_c64, rt_c1_p50), "json"))
    assert [t["target"] for t in got] == ["c=64 throughput / best FastAPI", "c=1 p50 / best FastAPI"]
    assert [t["limit"] for t in got] == [">= 2", "<= 2"]
    assert [t["met"] for t in got] == met


def test_a_target_not_measured_is_said_so():
    only_c1 = [{**s, "points": [p for p in s["points"] if p["concurrency"] == 1]} for s in servers(1, 0.9)]
    got = kinds.targets(kinds.body_results(only_c1, "json"))
    assert [(t["measured"], t["met"]) for t in got] == [(None, None), (2.0, True)]
    assert kinds.mark(None) == "not measured"


def test_the_table_shows_every_server_the_ratios_and_the_marks():
    results = servers(4000, 0.9)
    by_c = kinds.body_results(results, "json")
    kind = {
        "name": "digits",
        "what": "a CNN",
        "check_rows": 5,
        "answers_check": {"fastapi-2w-async-program": 0.0, "fastapi-2w-async-direct": 1e-7},
        "bodies": [{"name": "json"}],
        "servers": results,
        "by_body": {"json": {"ratios": kinds.ratios(by_c), "targets": kinds.targets(by_c)}},
    }
    text = kinds.kind_table(kind, [1, 64])
    assert "largest difference 1e-07 (tolerance 1e-05)" in text
    assert "torchserve / best FastAPI" in text and "x1.60" in text
    assert "  [MISSED] json: c=64 throughput / best FastAPI 1.6 (target >= 2)" in text
    assert "  [met] json: c=1 p50 / best FastAPI 2.0 (target <= 2)" in text
    rows = [line.split()[:2] for line in text.splitlines()[3:6]]
    assert rows == [["json", "torchserve"], ["json", "fastapi-2w-async-program"], ["json", "fastapi-2w-async-direct"]]


def test_examples_absent_from_the_checkout_are_left_out(monkeypatch):
    table = (*example_models.EXAMPLES, example_models.Example("no-such-example", "absent"))
    monkeypatch.setattr(example_models, "EXAMPLES", table)
    found, absent = example_models.present()
    assert [e.name for e in absent] == [e.name for e in table if not e.module.is_file()]
    assert "no-such-example" in [e.name for e in absent] and "digits" in [e.name for e in found]
    assert example_models.Example("no-such-example", "").module.name == "no_such_example.py"
    with pytest.raises(ValueError, match="unknown example"):
        example_models.present(["nope"])


class FakeServer:
    """What :class:`bench.kinds.AnswerCheck` uses of a server: a name, a URL and a token."""

    def __init__(self, name: str) -> None:
        self.name, self.url = name, f"http://127.0.0.1:9/{name}"

    def token(self) -> str | None:
        return None


def test_each_server_must_answer_as_the_first_before_its_load(monkeypatch):
    import requests

    from bench.perf import BenchError

    answers = {"torchserve": 0.25, "fastapi-2w-async-program": 0.25 + 4e-6, "fastapi-2w-async-direct": 0.25 + 1e-3}
    sent = []

    class Answer:
        def __init__(self, value: float, status: int = 200) -> None:
            self.status_code, self.value, self.text = status, value, "refused"

        def json(self) -> dict:
            return {"prediction": self.value, "model_version": "1.0"}

    def post(url, data, headers, timeout):
        sent.append((url.rsplit("/", 1)[1], headers["Content-Type"]))
        name = url.rsplit("/", 1)[1]
        return Answer(answers.get(name, 0.0), 200 if name in answers else 400)

    monkeypatch.setattr(requests, "post", post)
    check = kinds.AnswerCheck([kinds.request_bodies([IMAGE], [1.0] * 6), kinds.request_bodies([IMAGE], [2.0] * 6)])
    check(FakeServer("torchserve"))
    check(FakeServer("fastapi-2w-async-program"))
    assert check.differences == {"fastapi-2w-async-program": pytest.approx(4e-6)}
    assert sent[:3] == [
        ("torchserve", "application/json"),
        ("torchserve", "application/json"),
        ("torchserve", "image/png"),
    ]
    assert len(sent) == 12  # 2 rows x 3 forms, each server
    with pytest.raises(
        BenchError, match=r"fastapi-2w-async-direct answers differently from rtserve \(largest difference 0.001"
    ):
        check(FakeServer("fastapi-2w-async-direct"))
    with pytest.raises(BenchError, match="fastapi-1w: a json check request answered 400: refused"):
        check(FakeServer("fastapi-1w"))
