"""Live traffic (rtserve.promotion.live): the live: thresholds, the routes file, the shadow report,
the canary's decision and its watcher, over synthetic live-log lines and records (no server:
the agent that writes the live log is exercised in tests/integration/test_live.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import yaml

from rtserve.errors import GateError, LiveError
from rtserve.promotion.gate import DEFAULT_CONFIG, CanaryThresholds, GateConfig, ShadowThresholds
from rtserve.promotion.history import History
from rtserve.promotion.live.evidence import (
    Answer,
    canary_check,
    parse_answer_line,
    parse_live_line,
    promote_evidence,
    shadow_report,
)
from rtserve.promotion.live.routes import Route, Routes, drop_version, read_routes, set_route, write_routes
from rtserve.promotion.live.watcher import Watch, watch
from rtserve.runtime.logs import LogFollower
from tests.conftest import REPO

pytestmark = pytest.mark.unit

LIVE = GateConfig.load().live
LABELS = ["low", "medium", "high"]
CANARY = CanaryThresholds(window_s=10.0, min_requests=20, max_error_rate=0.1, max_p99_ms=100.0, min_agreement=0.8)
NOW = 1_800_000_000_000.0


def live_line(kind="shadow", n=0, label="low", status=200, ms=5.0, at=NOW, version="2.0", probabilities=None) -> str:
    """A live-log line as the agent writes it; the body is the candidate's answer."""
    body = {
        "prediction": LABELS.index(label),
        "label": label,
        "model_version": version,
        "probabilities": probabilities or [0.8 if x == label else 0.1 for x in LABELS],
    }
    line = {
        "kind": kind,
        "of": f"req-{n}",
        "id": f"cand-{n}",
        "version": version,
        "status": status,
        "ms": ms,
        "at": at,
        "body": json.dumps(body) if status == 200 else '{"code": 503}',
    }
    if status == 0:
        line.update(body="", error="connect timed out")
    return json.dumps(line)


def record_line(n=0, label="low", version="1.0", handler_ms=2.0) -> str:
    """The handler's record of the default's answer to request ``req-n`` (handler.records)."""
    head = {
        "request_id": f"req-{n}",
        "time": "2026-12-01T12:00:00.000Z",
        "model": "m",
        "model_version": version,
        "route": "predictions",
        "status": 400 if label is None else 200,
        "event": "rejected" if label is None else "prediction",
        "batch": "1-1",
        "batch_size": 1,
        "handler_ms": handler_ms,
    }
    if label is None:
        return json.dumps({**head, "reason": "wrong_length", "answer": {"error": "..."}})
    return json.dumps(
        {
            **head,
            "class": LABELS.index(label),
            "label": label,
            "answer": {"prediction": LABELS.index(label), "label": label},
            "inputs": {"f32": "AAAAAA==", "shape": [1]},
        }
    )


def parsed(texts, parse):
    return [parse(t) for t in texts]


def answers_of(texts) -> dict[str, Answer]:
    return {a.request_id: a for a in parsed(texts, parse_answer_line)}


# -- config ------------------------------------------------------------------------------------------
def test_live_section_is_typed_and_checked_at_load(tmp_path):
    assert LIVE.shadow == ShadowThresholds(500, 0.9) and LIVE.require_shadow is False
    assert LIVE.canary.window_s == 60.0 and LIVE.canary.min_requests == 50
    raw = yaml.safe_load(DEFAULT_CONFIG.read_text())
    bad = tmp_path / "gate.yaml"

    def refused(change, message):
        copy = json.loads(json.dumps(raw))
        change(copy)
        bad.write_text(yaml.safe_dump(copy))
        with pytest.raises(GateError, match=message):
            GateConfig.load(bad)

    refused(lambda c: c.pop("live"), r"missing \['live'\]")
    refused(lambda c: c["live"].pop("canary"), r"live: expected .* missing \['canary'\]")
    refused(lambda c: c["live"]["canary"].update(window=1), r"live.canary: .* unknown \['window'\]")
    refused(
        lambda c: c["live"]["shadow"].update(min_requests=True),
        r"live.shadow.min_requests must be an integer of at least 1, got True",
    )
    refused(lambda c: c["live"]["shadow"].update(min_requests=0.5), "min_requests must be an integer")
    refused(
        lambda c: c["live"]["shadow"].update(min_agreement=1.5),
        r"live.shadow.min_agreement must be a number in \[0, 1\], got 1.5",
    )
    refused(lambda c: c["live"]["canary"].update(window_s=0), "window_s must be a finite number above 0")
    refused(lambda c: c["live"]["canary"].update(max_p99_ms=float("inf")), "max_p99_ms must be a finite")
    refused(lambda c: c["live"]["canary"].update(max_error_rate=-0.1), "max_error_rate must be")
    refused(
        lambda c: c["live"]["promote"].update(require_shadow="yes"),
        "live.promote.require_shadow must be true or false, got 'yes'",
    )
    refused(lambda c: c.update(live=[]), r"live: expected the keys")


# -- routes file -------------------------------------------------------------------------------------
def test_routes_file_round_trip_and_partial_changes(tmp_path):
    path = tmp_path / "live-routes.json"
    assert read_routes(path) is None
    shadow = Route("2.0", 100.0, "http://127.0.0.1:1/predictions/m/2.0")
    set_route(path, "m", "/abs/live-log.jsonl", "shadow", shadow)
    assert json.loads(path.read_text()) == {
        "model": "m",
        "shadow": {"version": "2.0", "percent": 100.0, "url": "http://127.0.0.1:1/predictions/m/2.0"},
        "canary": None,
        "log": "/abs/live-log.jsonl",
        "token_file": None,
    }
    canary = Route("2.0", 10.0, shadow.url, "x-rtserve-key")
    set_route(path, "m", "/abs/live-log.jsonl", "canary", canary)
    routes = read_routes(path)
    assert routes.shadow == shadow and routes.canary == canary  # the shadow was kept
    assert json.loads(path.read_text())["canary"]["key_header"] == "x-rtserve-key"
    set_route(path, "m", "/abs/live-log.jsonl", "shadow", None)
    assert read_routes(path).shadow is None and read_routes(path).canary == canary
    assert drop_version(path, "3.0") == [] and drop_version(path, "2.0") == ["canary"]
    assert read_routes(path) == Routes("m", "/abs/live-log.jsonl")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["live-routes.json", "live-routes.json.lock"]


def test_bad_routes_file_is_named(tmp_path):
    path = tmp_path / "live-routes.json"
    path.write_text("{not json")
    with pytest.raises(LiveError, match="live-routes.json: not JSON"):
        read_routes(path)
    write_routes(path, Routes("m", "/l"))
    raw = json.loads(path.read_text())
    raw["shadow"] = {"version": "2.0", "percent": 250, "url": "u"}
    path.write_text(json.dumps(raw))
    with pytest.raises(LiveError, match=r"not a routes file \(ValueError: percent must be a number in \[0, 100\]"):
        read_routes(path)


# -- parsing -----------------------------------------------------------------------------------------
def test_live_lines_and_records_parse():
    line = parse_live_line(live_line(label="high", ms=7.5))
    assert (line.kind, line.of, line.id, line.version, line.status, line.ms, line.label) == (
        "shadow",
        "req-0",
        "cand-0",
        "2.0",
        200,
        7.5,
        "high",
    )
    assert line.probabilities == (0.1, 0.1, 0.8) and not line.failed and line.answered
    unanswered = parse_live_line(live_line(status=0))
    assert unanswered.failed and not unanswered.answered and unanswered.error == "connect timed out"
    assert parse_live_line(live_line(status=503)).failed and parse_live_line(live_line(status=503)).label is None
    dropped = parse_live_line(live_line(status=-1))
    assert not dropped.failed and not dropped.answered
    for torn in ('{"kind":"shadow","of":"x"', '{"kind":"other","of":"x","version":"2","status":1,"at":1}', "[]"):
        assert parse_live_line(torn) is None
    assert parse_answer_line(record_line(3, "medium")) == Answer("req-3", "1.0", "medium", 2.0)
    assert parse_answer_line(record_line(3, None)).rejected
    assert parse_answer_line('{"event":"gate","action":"gate"}') is None


def test_the_watchers_follower_returns_only_complete_new_lines(tmp_path):
    path = tmp_path / "log"
    tail = LogFollower(path)
    assert tail.lines() == []
    path.write_text('{"a":1}\n{"b"')
    assert tail.lines() == ['{"a":1}']
    with open(path, "a") as f:
        f.write(":2}\n")
    assert tail.lines() == ['{"b":2}'] and tail.lines() == []
    path.write_text("new\n")  # replaced by a shorter file: read from its start
    assert tail.lines() == ["new"]


# -- shadow report -----------------------------------------------------------------------------------
def test_shadow_report_figures():
    answers = ["low", "low", "medium", "high"] * 5  # the default's classes for req-0 .. req-19
    candidate = list(answers)
    candidate[2] = "low"  # two disagreements: one the candidate was sure of, one it was not
    candidate[3] = "medium"
    lines = [live_line(n=n, label=c, ms=10.0 + n) for n, c in enumerate(candidate)]
    lines[2] = live_line(n=2, label="low", probabilities=[0.9, 0.05, 0.05], ms=12.0)
    lines[3] = live_line(n=3, label="medium", probabilities=[0.1, 0.5, 0.4], ms=13.0)
    lines += [
        live_line(n=20, status=503, ms=1.0),
        live_line(n=21, status=0),
        live_line(n=22, status=-1),
        live_line(n=23, label="low"),
        live_line(n=24, version="3.0"),
    ]  # another candidate: not counted
    audit = [record_line(n, a, handler_ms=1.0 + n) for n, a in enumerate(answers)]
    audit += [record_line(20, "low"), record_line(21, None)]  # req-23: no default answer
    report = shadow_report("m", parsed(lines, parse_live_line), answers_of(audit), "2.0", candidate_labels=LABELS)
    assert (report.mirrored, report.dropped, report.compared, report.unmatched) == (24, 1, 20, 1)
    assert report.agreement == 0.9 and report.default == ["1.0"]
    assert report.classes["default"] == {"low": 11, "medium": 5, "high": 5}
    assert report.classes["candidate"] == {"low": 12, "medium": 5, "high": 4}
    assert report.errors["candidate"] == {
        "errors": 2,
        "requests": 23,
        "rate": round(2 / 23, 6),
        "what": "5xx answers and no answer (status 0)",
    }
    assert report.errors["default"]["errors"] == 1 and report.errors["default"]["requests"] == 22
    assert report.latency_ms["candidate"]["p50"] == 18.0  # answered lines (the 503 too), not 0 or -1
    assert report.latency_ms["default"]["p99"] == 20.0
    assert [d["of"] for d in report.disagreements] == ["req-2", "req-3"]
    assert report.disagreements[0] == {
        "of": "req-2",
        "id": "cand-2",
        "default": "medium",
        "candidate": "low",
        "gap": 0.85,
    }
    assert report.disagreements[1]["gap"] == pytest.approx(0.1)
    assert report.ranked_by == "by the candidate's probability gap"
    text = report.text()
    assert "agreement: 90.00% of 20 requests" in text and "req-2: default medium, candidate low" in text
    assert "the frontend's round trip to the candidate" in text and "(its record)" in text
    unranked = shadow_report("m", parsed(lines, parse_live_line), answers_of(audit), "2.0")
    assert unranked.ranked_by == "in log order" and [d["gap"] for d in unranked.disagreements] == [None, None]
    only = shadow_report("m", parsed(lines, parse_live_line), answers_of(audit), "2.0", default="0.9")
    assert only.compared == 0 and only.agreement is None and only.unmatched == 23


def test_an_answer_too_long_for_the_live_log_counts_as_truncated_not_compared():
    """The agent writes an answer it cannot keep whole as ``"body": "", "truncated": true``
    (agent/src/rtserve/agent/LiveLog.java): counted in ``truncated``, never a disagreement, an
    error or a line that is not a live-log line."""

    def truncated(n: int) -> str:
        line = json.loads(live_line(n=n, label="high"))
        return json.dumps({**line, "body": "", "truncated": True})

    assert parse_live_line(live_line()).truncated is False
    line = parse_live_line(truncated(0))
    assert line.truncated and line.answered and not line.failed and line.label is None
    lines = [live_line(n=n, label="low") for n in range(6)] + [truncated(n) for n in range(6, 10)]
    audit = [record_line(n, "low") for n in range(10)]
    report = shadow_report("m", parsed(lines, parse_live_line), answers_of(audit), "2.0", skipped_lines=0)
    assert (report.mirrored, report.compared, report.truncated, report.dropped, report.unmatched) == (10, 6, 4, 0, 0)
    assert report.agreement == 1.0 and report.disagreements == []
    assert report.errors["candidate"]["errors"] == 0 and report.skipped_lines == 0
    assert report.latency_ms["candidate"]["requests"] == 10  # its time is known
    assert report.json()["truncated"] == 4
    assert (
        "(4 of the candidate's answers were too long for the live log to keep whole: not compared)"
    ) in report.text()
    assert "too long" not in shadow_report("m", parsed(lines[:6], parse_live_line), answers_of(audit), "2.0").text()


def test_promote_evidence_names_the_live_figure():
    thresholds = ShadowThresholds(min_requests=10, min_agreement=0.9)
    lines = [live_line(n=n, label="low" if n < 9 else "high") for n in range(10)]
    audit = answers_of([record_line(n, "low") for n in range(10)])

    def report(k):
        return shadow_report("m", parsed(lines[:k], parse_live_line), audit, "2.0")

    assert promote_evidence(thresholds, None)[1][0].startswith("live requests: the shadow report has 0")
    figures, failures = promote_evidence(thresholds, report(9))
    assert figures["requests"] == 9 and failures[0].startswith("live requests: ")
    figures, failures = promote_evidence(thresholds, report(10))
    assert figures["agreement"] == 0.9 and failures == []  # at the limit: passes
    lines[0] = live_line(n=0, label="medium")
    figures, failures = promote_evidence(thresholds, report(10))
    assert failures == [
        "live agreement: the candidate gave the default's class on 0.8000 of 10 "
        "mirrored requests (at least 0.9 required)"
    ]


# -- canary ------------------------------------------------------------------------------------------
def canary_lines(n, failed=0, ms=5.0, at=NOW, start=0):
    return [live_line("canary", start + i, status=503 if i < failed else 200, ms=ms, at=at) for i in range(n)]


def decide(texts, audit=(), now=NOW):
    return canary_check(CANARY, parsed(texts, parse_live_line), answers_of(audit), "2.0", now)


def test_canary_waits_for_enough_requests_and_passes_at_the_limits():
    assert decide(canary_lines(19, failed=19, ms=1000.0)).breaches == []  # below min_requests
    at_limit = decide(canary_lines(20, failed=2, ms=100.0))  # 10% errors, p99 100 ms: allowed
    assert at_limit.breaches == [] and at_limit.error_rate == 0.1 and at_limit.p99_ms == 100.0
    assert "canary 2.0, last 10 s: 20 answers, errors 2 (10.00%)" in at_limit.text()


def test_canary_breaches_each_figure():
    errors = decide(canary_lines(20, failed=3))
    assert errors.breaches == ["error rate: 3 of 20 canary requests failed (15.00%, at most 10.00%)"]
    unanswered = [live_line("canary", i, status=0) for i in range(20)]
    assert decide(unanswered).breaches[0].startswith("error rate: 20 of 20")
    slow = decide(canary_lines(20, ms=150.0))
    assert slow.breaches == ["p99: 150.00 ms over 20 canary answers (at most 100 ms)"]
    shadow = [live_line("shadow", 100 + i, label="high" if i < 5 else "low") for i in range(20)]
    audit = [record_line(100 + i, "low") for i in range(20)]
    wrong = decide(shadow, audit)  # no canary line needed: the shadow pairs alone
    assert wrong.breaches == ["agreement: the default's class on 75.00% of 20 shadow requests (at least 80.00%)"]
    assert decide(shadow[4:], audit).breaches == []  # 16 pairs: not enough yet


def test_canary_window_forgets_old_lines():
    old = canary_lines(20, failed=20, at=NOW - 10_001)
    fresh = canary_lines(20, start=100)
    assert decide(old + fresh).breaches == [] and decide(old + fresh).requests == 20
    other = [live_line("canary", i, status=503, version="3.0") for i in range(20)]
    assert decide(other).requests == 0


# -- the watcher ----------------------------------------------------------------------------------
def watch_files(tmp_path, percent=10.0) -> Watch:
    routes = tmp_path / "live-routes.json"
    set_route(
        routes,
        "m",
        tmp_path / "live-log.jsonl",
        "canary",
        Route("2.0", percent, "http://127.0.0.1:1/predictions/m/2.0", "x-rtserve-key"),
    )
    (tmp_path / "live-log.jsonl").write_text(live_line("canary", 999, status=503) + "\n")  # before: ignored
    return Watch(
        "m",
        "2.0",
        routes,
        tmp_path / "live-log.jsonl",
        tmp_path / "records",
        tmp_path / "audit.log",
        History(tmp_path / "history.jsonl"),
        CANARY,
    )


def run_watch(w: Watch) -> tuple[threading.Thread, dict, list[str]]:
    result, said = {}, []
    thread = threading.Thread(target=lambda: result.update(event=watch(w, said.append, poll_s=0.01)))
    thread.start()
    return thread, result, said


def test_watcher_aborts_on_a_breach_and_records_it(tmp_path):
    w = watch_files(tmp_path)
    thread, result, said = run_watch(w)
    time.sleep(0.1)
    now = time.time() * 1000
    with open(w.live_log, "a") as f:
        f.write("".join(line + "\n" for line in canary_lines(15, at=now)))
        f.write("".join(line + "\n" for line in canary_lines(5, failed=5, at=now, start=50)))
    thread.join(10)
    assert not thread.is_alive()
    event = result["event"]
    assert event["failures"] == ["error rate: 5 of 20 canary requests failed (25.00%, at most 10.00%)"]
    assert read_routes(w.routes).canary.percent == 0.0
    assert [e["action"] for e in w.history.events()] == ["canary-abort"]
    assert w.history.events()[0]["percent"] == 10.0 and w.history.events()[0]["figures"]["requests"] == 20
    audit = [json.loads(line) for line in w.audit_log.read_text().splitlines()]
    assert audit == [w.history.events()[0]] and audit[0]["event"] == "canary-abort"
    assert any(s.startswith("ABORTED canary 2.0") for s in said)
    assert "  FAILED error rate: 5 of 20 canary requests failed (25.00%, at most 10.00%)" in said


def test_watcher_ends_when_the_canary_is_stopped(tmp_path):
    w = watch_files(tmp_path)
    thread, result, said = run_watch(w)
    time.sleep(0.1)
    set_route(w.routes, "m", w.live_log, "canary", None)
    thread.join(10)
    assert not thread.is_alive() and result["event"] is None
    assert said[-1] == "canary 2.0 stopped (its share is 0 or its route is gone)"
    assert w.history.events() == []


# -- the watcher's process: started, found and stopped through rtserve.runtime.process ----------------
#: A stand-in for `python -m rtserve live ... watch m 2.0` (its command line holds the watcher's marks):
#: it ends on SIGTERM through its finally, which forgets its PID file as run_watcher does.
WATCHER = (
    "import sys, time\n"
    "from rtserve.runtime.process import exit_on_sigterm, remove_own_pid_file\n"
    "from rtserve.settings import CANARY_WATCHER_MARKS\n"
    "exit_on_sigterm()\n"
    "try:\n    time.sleep(60)\nfinally:\n    remove_own_pid_file(sys.argv[1], CANARY_WATCHER_MARKS)\n"
)


def test_the_watcher_is_started_found_and_stopped_by_its_pid_file(tmp_path):
    from rtserve.promotion.live.watcher import start_watcher, stop_watcher, watcher_pid
    from rtserve.runtime.process import alive
    from rtserve.settings import RunDir

    run = RunDir(tmp_path / "run")
    pid = start_watcher([sys.executable, "-c", WATCHER, str(run.canary_pid), "rtserve", "watch"], run)
    try:
        assert run.canary_log.exists() and watcher_pid(run.canary_pid) == pid
        time.sleep(0.5)  # its SIGTERM handler is set
        assert stop_watcher(run.canary_pid, timeout=10) == pid
        assert not alive(pid) and not run.canary_pid.exists() and watcher_pid(run.canary_pid) is None
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_pid_file_naming_another_process_is_neither_the_watcher_nor_removed_by_it(tmp_path):
    from rtserve.promotion.live.watcher import watcher_pid
    from rtserve.runtime.process import remove_own_pid_file

    pid_file = tmp_path / "canary-watcher.pid"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        pid_file.write_text(f"{other.pid}\n")  # alive, but its command line lacks the marks
        assert watcher_pid(pid_file) is None
        remove_own_pid_file(pid_file)  # another process's file stays
        assert pid_file.exists()
    finally:
        other.kill()
        other.wait()
    pid_file.write_text(f"{os.getpid()}\n")
    remove_own_pid_file(pid_file)  # no marks asked: this process's own file goes
    assert not pid_file.exists()


# -- the command line over a run directory's files ---------------------------------------------------
def test_shadow_report_command_prints_and_saves(tmp_path):
    run = tmp_path / "run"
    (run / "records").mkdir(parents=True)
    # the live log rotated once (its disk budget): the report reads the backup, then the file
    (run / "live-log.jsonl.1").write_text(
        "".join(live_line(n=n, label="low" if n else "high") + "\n" for n in range(2))
    )
    (run / "live-log.jsonl").write_text("".join(live_line(n=n) + "\n" for n in range(2, 4)) + "torn")
    # the default's answers: its records, in two segments of the spool
    (run / "records" / "00000000000000000001-7.jsonl").write_text(record_line(0, "low") + "\n")
    (run / "records" / "00000000000000000002-7.jsonl").write_text(
        "".join(record_line(n, "low") + "\n" for n in range(1, 4))
    )
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "rtserve",
            "live",
            "--run-dir",
            str(run),
            "--model-store",
            str(tmp_path),
            "shadow-report",
            "m",
        ],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout
    assert "shadow m: candidate 2.0 against the default (1.0)" in done.stdout
    assert "agreement: 75.00% of 4 requests" in done.stdout and "req-0: default low, candidate high" in done.stdout
    saved = json.loads((run / "shadow-report.json").read_text())
    assert saved["mirrored"] == 4 and saved["agreement"] == 0.75 and saved["ranked_by"] == "in log order"
    empty = subprocess.run(
        [sys.executable, "-m", "rtserve", "live", "--run-dir", str(tmp_path / "none"), "shadow-report", "m"],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=60,
    )
    assert empty.returncode == 1 and empty.stdout.startswith("error: no shadow to report on")
