"""The live evidence per output kind (rtserve.promotion.live.evidence): a regression's, a multi-label's and
an embedding's answers in the live log and the records, the shadow report, the promote evidence, the
canary's decision and its watcher, over synthetic lines as the agent and the handler write them (the
agent and the records are exercised on a real server in tests/integration/test_kinds.py)."""

from __future__ import annotations

import json
import threading
import time
import zipfile

import pytest

from rtserve.promotion.gate import CanaryThresholds, ShadowThresholds
from rtserve.promotion.history import History
from rtserve.promotion.kinds import Compare, KindThresholds
from rtserve.promotion.live.evidence import (
    Answer,
    archive_compare,
    canary_check,
    compare_for,
    parse_answer_line,
    parse_live_line,
    promote_evidence,
    save_shadow_report,
    shadow_report,
)
from rtserve.promotion.live.routes import Route, read_routes, set_route
from rtserve.promotion.live.watcher import Watch, watch

pytestmark = pytest.mark.unit

NOW = 1_800_000_000_000.0
TAGS = ["urgent", "billing", "spam"]
#: A regression whose targets' spread is 10: answers agree within 2.5.
REGRESSION = Compare("regression", scale=(10.0,))
MULTI = Compare("multi_label", labels=tuple(TAGS))
EMBEDDING = Compare("embedding")
CANARY = CanaryThresholds(window_s=10.0, min_requests=20, max_error_rate=0.1, max_p99_ms=100.0, min_agreement=0.8)


def body_of(kind: str, value, version: str) -> dict:
    """The handler's answer to ``{"features": [...]}`` (handler.protocols.output_document)."""
    if kind == "regression":
        return {"prediction": value, "model_version": version}
    if kind == "multi_label":
        return {
            "labels": value,
            "probabilities": {t: 0.9 if t in value else 0.1 for t in TAGS},
            "model_version": version,
        }
    return {"embedding": value, "model_version": version}


def live_line(kind: str, n: int, value, route="shadow", status=200, at=NOW, version="2.0") -> str:
    """A live-log line as the agent writes it; the body is the candidate's answer."""
    return json.dumps(
        {
            "kind": route,
            "of": f"req-{n}",
            "id": f"cand-{n}",
            "version": version,
            "status": status,
            "ms": 5.0,
            "at": at,
            "body": json.dumps(body_of(kind, value, version)) if status == 200 else '{"code": 503}',
        }
    )


def record_line(kind: str, n: int, value, version="1.0", rejected=False) -> str:
    """The handler's record of the default's answer (handler.records.Recorder: not a classifier's
    record names its kind and carries the answer as sent; a rejection names no kind)."""
    head = {
        "request_id": f"req-{n}",
        "time": "2026-12-01T12:00:00.000Z",
        "model": "m",
        "model_version": version,
        "route": "predictions",
        "status": 400 if rejected else 200,
        "event": "rejected" if rejected else "prediction",
        "batch": "1-1",
        "batch_size": 1,
        "handler_ms": 2.0,
    }
    if rejected:
        return json.dumps({**head, "reason": "wrong_length", "answer": {"error": "..."}})
    return json.dumps({**head, "kind": kind, "answer": body_of(kind, value, version)})


def lines_of(texts, kind):
    return [parse_live_line(t, kind) for t in texts]


def answers_of(texts) -> dict[str, Answer]:
    return {a.request_id: a for a in map(parse_answer_line, texts) if a is not None}


def test_answers_of_each_kind_parse_from_the_live_log_and_the_records():
    line = parse_live_line(live_line("regression", 1, 151.5), "regression")
    assert line.value == (151.5,) and line.label is None and line.probabilities is None
    assert parse_live_line(live_line("regression", 1, [1.0, 2.0]), "regression").value == (1.0, 2.0)
    assert parse_live_line(live_line("multi_label", 1, ["spam", "urgent"]), "multi_label").value == {"spam", "urgent"}
    assert parse_live_line(live_line("embedding", 1, [0.5, 0.25]), "embedding").value == (0.5, 0.25)
    # read as a classifier's (the kind unknown), a regression's answer carries no class
    assert parse_live_line(live_line("regression", 1, 151.5)).value is None
    assert parse_live_line(live_line("regression", 1, 1.0, status=503), "regression").value is None
    assert parse_answer_line(record_line("regression", 3, 99.0)) == Answer(
        "req-3", "1.0", None, 2.0, "regression", (99.0,)
    )
    assert parse_answer_line(record_line("multi_label", 3, ["billing"])).value == frozenset({"billing"})
    assert parse_answer_line(record_line("regression", 3, None, rejected=True)).rejected
    several = json.loads(record_line("regression", 4, 1.0))
    several["answer"] = {"predictions": [{"prediction": 1.0}, {"prediction": 2.0}]}
    assert parse_answer_line(json.dumps(several)) is None  # several rows: not one answer to compare
    several["answer"] = {"predictions": [{"prediction": 1.0, "model_version": "1.0"}]}
    assert parse_answer_line(json.dumps(several)).value == (1.0,)  # KServe v1, one instance


def test_a_regression_shadow_report_ranks_by_the_largest_difference():
    defaults = [100.0 + n for n in range(20)]
    candidate = list(defaults)
    candidate[3] += 2.4  # within 2.5: agrees
    candidate[5] += 2.6  # just out
    candidate[7] -= 30.0  # the largest
    lines = lines_of([live_line("regression", n, v) for n, v in enumerate(candidate)], "regression")
    audit = answers_of([record_line("regression", n, v) for n, v in enumerate(defaults)])
    report = shadow_report("m", lines, audit, "2.0", compare=REGRESSION)
    assert (report.compared, report.agreement, report.kind) == (20, 0.9, "regression")
    assert [(d["of"], d["default"], d["candidate"], d["gap"]) for d in report.disagreements] == [
        ("req-7", 107.0, 77.0, 3.0),
        ("req-5", 105.0, 107.6, 0.26),
    ]
    assert report.ranked_by == "by the largest absolute difference, in target standard deviations"
    assert report.comparison["tolerance"] == [2.5]
    assert report.comparison["mean_abs_difference"] == [pytest.approx((2.4 + 30 + 2.6) / 20)]
    assert report.classes == {"default": {}, "candidate": {}}
    text = report.text()
    assert "shadow m: candidate 2.0 against the default (1.0) (regression)" in text
    assert (
        "agreement: 90.00% of 20 requests both versions answered: the default's value to within 0.25 "
        "target standard deviations"
    ) in text
    assert "a pair agrees when each value is within 0.25 target standard deviations (2.5 in target units)" in text
    assert "req-7: default 107.0, candidate 77.0 gap 3.000 (candidate's id cand-7)" in text
    saved = report.json()
    assert saved["kind"] == "regression" and saved["comparison"]["agreeing"].startswith("the default's value")

    figures, failures = promote_evidence(ShadowThresholds(min_requests=10, min_agreement=0.95), report)
    assert figures["agreement"] == 0.9
    assert failures == [
        "live agreement: the candidate gave the default's value to within 0.25 target standard "
        "deviations on 0.9000 of 20 mirrored requests (at least 0.95 required)"
    ]


def test_a_multi_label_shadow_report_agrees_per_label_decision():
    defaults = [["urgent"], ["billing", "spam"], [], ["spam"]] * 5
    candidate = [list(d) for d in defaults]
    candidate[1] = ["billing"]  # one decision differs
    candidate[5] = []  # two
    lines = lines_of([live_line("multi_label", n, v) for n, v in enumerate(candidate)], "multi_label")
    audit = answers_of([record_line("multi_label", n, v) for n, v in enumerate(defaults)])
    report = shadow_report("m", lines, audit, "2.0", compare=MULTI)
    assert report.agreement == pytest.approx(1 - 3 / 60, abs=1e-6)  # 3 of 20 x 3 label decisions
    assert [(d["of"], d["default"], d["candidate"], d["gap"]) for d in report.disagreements] == [
        ("req-5", ["billing", "spam"], [], 2.0),
        ("req-1", ["billing", "spam"], ["billing"], 1.0),
    ]
    assert report.classes["default"] == {"urgent": 5, "billing": 5, "spam": 10}
    assert report.classes["candidate"] == {"urgent": 5, "billing": 4, "spam": 8}
    assert report.comparison["decisions"] == 60
    text = report.text()
    assert "labels on, default: billing 5 (25.00%), spam 10 (50.00%), urgent 5 (25.00%)" in text
    assert "by the number of labels decided differently" in text


def test_an_embedding_shadow_report_ranks_by_the_lowest_cosine():
    defaults = [[1.0, 0.0, 0.0]] * 10
    candidate = [[1.0, 0.1, 0.0]] * 10  # cosine 0.995
    candidate[4] = [1.0, 1.0, 0.0]  # cosine 0.707
    candidate[6] = [0.0, 1.0, 0.0]  # cosine 0
    lines = lines_of([live_line("embedding", n, v) for n, v in enumerate(candidate)], "embedding")
    audit = answers_of([record_line("embedding", n, v) for n, v in enumerate(defaults)])
    report = shadow_report("m", lines, audit, "2.0", compare=EMBEDDING)
    assert report.agreement == 0.8
    assert [(d["of"], d["gap"]) for d in report.disagreements] == [("req-6", 1.0), ("req-4", 0.292893)]
    assert report.disagreements[0]["default"] is None  # a vector is not listed: its cosine is
    assert report.comparison["mean_cosine"] == pytest.approx((8 * 0.995037 + 0.707107) / 10, abs=1e-6)
    assert "req-4: cosine 0.7071 (candidate's id cand-4)" in report.text()


def test_a_default_of_another_kind_is_not_compared():
    """A regression candidate shadowing a classifier default: every pair is unmatched, none compared."""
    lines = lines_of([live_line("regression", n, 1.0) for n in range(5)], "regression")

    def classified(n: int) -> str:
        record = json.loads(record_line("regression", n, 1.0))
        del record["kind"]
        return json.dumps({**record, "class": 0, "label": "low", "answer": {"prediction": 0, "label": "low"}})

    audit = answers_of([classified(n) for n in range(4)] + [record_line("regression", 4, None, rejected=True)])
    assert {a.kind for a in audit.values()} == {"classification"}
    report = shadow_report("m", lines, audit, "2.0", compare=REGRESSION)
    assert (report.compared, report.unmatched, report.agreement) == (0, 4, None)
    assert report.errors["default"]["errors"] == 1  # a rejection is the default's error, whatever its kind


def test_the_canary_judges_a_regressions_agreement():
    def decide(far):
        shadow = [live_line("regression", n, 10.0 if n < far else 1.0, at=NOW) for n in range(20)]  # 1.0: agrees
        audit = [record_line("regression", n, 0.0) for n in range(20)]
        return canary_check(CANARY, lines_of(shadow, "regression"), answers_of(audit), "2.0", NOW, REGRESSION)

    assert decide(4).breaches == [] and decide(4).agreement == 0.8  # at the limit
    assert decide(5).breaches == [
        "agreement: the default's value to within 0.25 target standard deviations on 75.00% of 20 shadow "
        "requests (at least 80.00%)"
    ]
    # the same lines judged as a classifier's: no class, nothing compared
    shadow = [live_line("regression", n, 10.0, at=NOW) for n in range(20)]
    audit = [record_line("regression", n, 0.0) for n in range(20)]
    assert canary_check(CANARY, lines_of(shadow, "classification"), answers_of(audit), "2.0", NOW).shadow_pairs == 0


def mar(tmp_path, output, golden) -> str:
    path = tmp_path / "m_2.0.mar"
    meta = {"version": "2.0", "labels": [], "feature_names": ["x"], "golden": golden, "outputs": [output]}
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("meta.json", json.dumps(meta))
        zf.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": "m", "modelVersion": "2.0"}}))
    return path


def test_the_comparison_comes_from_the_candidates_archive(tmp_path):
    golden = {"features": [[0.0], [1.0]], "labels": [90.0, 110.0], "outputs": [[95.0], [105.0]]}
    archive = mar(tmp_path, {"name": "y", "kind": "regression", "width": 1}, golden)
    thresholds = KindThresholds(agreement_tolerance=0.1)
    compare, labels = archive_compare(archive, thresholds)
    assert (compare.kind, compare.scale, compare.tolerance(), labels) == ("regression", (10.0,), (1.0,), [])
    assert compare_for(tmp_path / "missing.mar") == Compare()

    live_log, records = tmp_path / "live-log.jsonl", tmp_path / "records.jsonl"
    live_log.write_text("".join(live_line("regression", n, 100.0 + n / 2) + "\n" for n in range(4)))
    records.write_text("".join(record_line("regression", n, 100.0) + "\n" for n in range(4)))
    found = save_shadow_report("m", "2.0", live_log, records, archive, tmp_path / "report.json", thresholds)
    assert (found.kind, found.compared, found.agreement) == ("regression", 4, 0.75)  # 1.5 is out of 1.0
    assert json.loads((tmp_path / "report.json").read_text())["comparison"]["tolerance"] == [1.0]


def test_the_watcher_aborts_a_regression_canary_on_its_agreement(tmp_path):
    routes, live_log = tmp_path / "live-routes.json", tmp_path / "live-log.jsonl"
    set_route(routes, "m", live_log, "canary", Route("2.0", 10.0, "http://127.0.0.1:1/predictions/m/2.0", "k"))
    live_log.write_text("")
    records = tmp_path / "records.jsonl"
    records.write_text("")
    history = History(tmp_path / "history.jsonl")
    w = Watch("m", "2.0", routes, live_log, records, tmp_path / "audit.log", history, CANARY, compare=REGRESSION)
    result = {}
    thread = threading.Thread(target=lambda: result.update(event=watch(w, lambda _: None, poll_s=0.01)))
    thread.start()
    try:
        time.sleep(0.1)
        now = time.time() * 1000
        with open(records, "a") as f:
            f.write("".join(record_line("regression", n, 0.0) + "\n" for n in range(20)))
        with open(live_log, "a") as f:
            f.write("".join(live_line("regression", n, 10.0 if n < 10 else 1.0, at=now) + "\n" for n in range(20)))
        thread.join(10)
    finally:
        if thread.is_alive():  # it saw no breach: stop it (a canary without a share ends the watcher)
            set_route(routes, "m", live_log, "canary", None)
            thread.join(10)
    assert result["event"] is not None, "the watcher did not abort the canary"
    assert result["event"]["failures"] == [
        "agreement: the default's value to within 0.25 target standard deviations on 50.00% of 20 shadow "
        "requests (at least 80.00%)"
    ]
    assert read_routes(routes).canary.percent == 0.0
