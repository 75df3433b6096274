"""Live traffic on a real TorchServe: shadow a candidate, canary it, and gate promote on the evidence.

The split and the mirror are the frontend agent's (it follows RUN_DIR/live-routes.json and writes
RUN_DIR/live-log.jsonl); everything here goes through the make targets users run. One server for
the module: 1.0 the default, with these candidates registered beside it (real archives):

- 2.0: the demo's larger model (agrees with 1.0 on most requests);
- 3.2: a network whose class depends on the features only through a high-frequency sine of a
  random projection, so its answers are unrelated to their meaning: what a model trained on
  shuffled labels gives. Its agreement with 1.0 is chance (the sum over classes of the product
  of the two versions' class shares).

A first probe checks that the running agent follows the routes file: the agent is built from this
checkout, so a probe that sees no live line fails the module's tests, naming what the agent said.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
import yaml

from rtserve.model.data import LABELS, make_dataset
from rtserve.promotion.gate import DEFAULT_CONFIG
from rtserve.promotion.history import History
from rtserve.promotion.live.routes import Route, read_routes, set_route
from rtserve.promotion.live.watcher import watcher_pid
from rtserve.promotion.rollout import Rollout
from rtserve.runtime.process import alive, wait_until
from tests.conftest import MODEL_NAME, REPO, make_archive
from tests.helpers import (
    RandomAnswers,
    Reference,
    agreement,
    demo_eager,
    keep_only,
    random_archive,
    records,
    routes_applied,
    routes_lines,
)
from tests.integration.conftest import serve

pytestmark = pytest.mark.integration

#: Requests per shadow run (held-out rows, 4 in flight).
N = 300
#: Seconds to wait for the agent's lines.
WAIT_S = 30.0
#: Every row this module sent, by the x-request-id its caller received.
SENT: dict[str, list[float]] = {}


@pytest.fixture(scope="module")
def server(build_root, mar_v1, tmp_path_factory):
    make_archive(build_root, "2.0")
    with serve(tmp_path_factory.mktemp("run"), mar_v1) as ts:
        yield ts


@pytest.fixture(scope="module")
def rollout(server):
    ro = Rollout(server.client(timeout=120), History(server.files.history), MODEL_NAME)
    ro.register("2.0", workers=1)
    yield ro
    keep_only(ro)


@pytest.fixture(scope="module")
def rows() -> list[list[float]]:
    return make_dataset().x_test[:N].tolist()


def send(server, rows, keys=None, version=None) -> list[dict]:
    """POST each row (4 in flight) as a caller would: status, x-request-id, answering version."""
    url = f"{server.props['inference_address']}/predictions/{MODEL_NAME}" + (f"/{version}" if version else "")
    token = server.client().keys.get("inference")

    def one(i):
        headers = {"Authorization": f"Bearer {token}"}
        if keys is not None:
            headers["x-rtserve-key"] = keys[i]
        resp = requests.post(url, json={"features": rows[i]}, headers=headers, timeout=30)
        body = resp.json() if resp.headers.get("content-type", "").startswith("application/json") else {}
        return {
            "status": resp.status_code,
            "id": resp.headers.get("x-request-id"),
            "version": body.get("model_version") if isinstance(body, dict) else None,
        }

    with ThreadPoolExecutor(4) as pool:
        sent = list(pool.map(one, range(len(rows))))
    SENT.update((s["id"], row) for s, row in zip(sent, rows) if s["id"])
    return sent


def routes_count(server) -> int:
    """How many 'live routes' lines the agent has written (before a change of the routes)."""
    return len(routes_lines(server.run_dir))


def live_lines(server) -> list[dict]:
    path = server.files.live_log
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def wait_for_lines(server, ids, kind="shadow", timeout=WAIT_S) -> list[dict]:
    """The live log's ``kind`` lines for the callers' request ``ids``, once all are there."""
    ids = set(ids)
    deadline = time.monotonic() + timeout
    while True:
        found = [line for line in live_lines(server) if line["kind"] == kind and line["of"] in ids]
        if len(found) >= len(ids) or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def audit_lines(server) -> list[dict]:
    """The audit log's events (gate decisions, canary aborts)."""
    return [json.loads(line) for line in server.files.audit_log.read_text().splitlines()]


@pytest.fixture(scope="module")
def agent(server, rollout, rows):
    """The running frontend agent follows the routes file (a first probe: a 100% shadow to 2.0
    and a few requests must show up in the live log within 30 s, on a loaded machine too)."""
    files = server.files
    before = routes_count(server)
    set_route(
        files.live_routes,
        MODEL_NAME,
        files.live_log.resolve(),
        "shadow",
        Route("2.0", 100.0, f"{server.props['inference_address']}/predictions/{MODEL_NAME}/2.0"),
    )
    found = []
    try:
        if wait_until(lambda: routes_count(server) > before, 30.0, poll=0.05):  # the agent read the routes
            sent = send(server, rows[:3])
            found = wait_for_lines(server, [s["id"] for s in sent], timeout=30.0)
    finally:
        before = routes_count(server)
        set_route(files.live_routes, MODEL_NAME, files.live_log.resolve(), "shadow", None)
        if found:
            routes_applied(server.run_dir, before, expect="shadow none")
    if not found:
        launcher = (server.run_dir / "launcher.log").read_text()
        agent_said = [
            line.split(":")[0].removeprefix("[rtserve-agent] ")
            for line in launcher.splitlines()
            if line.startswith("[rtserve-agent]")
        ]
        pytest.fail(
            "the running frontend agent does not follow live routes: no line in "
            f"{files.live_log.name} within 30 s of 3 requests under a 100% shadow route "
            f"(its features: {agent_said})"
        )
    return server


@pytest.fixture(scope="module")
def random_candidate(agent, build_root, rollout, tmp_path_factory):
    """3.2, registered with one worker."""
    random_archive(build_root, tmp_path_factory.mktemp("random"), "3.2")
    rollout.register("3.2", workers=1)
    return "3.2"


def gate_config(tmp_path, name="gate.yaml", **live) -> Path:
    """config/gate.yaml with a short burst and the ``live`` sections changed by ``live``
    (``{"canary": {...}}``), written to ``tmp_path / name``."""
    raw = yaml.safe_load(DEFAULT_CONFIG.read_text())
    raw.update(burst_requests=50, warmup_requests=5)
    for section, values in live.items():
        raw["live"][section].update(values)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw))
    return path


def make(server, target: str, *extra: str) -> subprocess.CompletedProcess:
    props = server.props
    variables = [
        f"MODEL_STORE={server.model_store}",
        f"RUN_DIR={server.run_dir}",
        f"INFERENCE_URL={props['inference_address']}",
        f"MANAGEMENT_URL={props['management_address']}",
    ]
    return subprocess.run(
        ["make", "-s", target, *variables, *extra],
        cwd=REPO,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=300,
    )


def shadow_lines(server, version: str) -> list[dict]:
    return [line for line in live_lines(server) if line["kind"] == "shadow" and line["version"] == version]


def shadowed(server, version: str, rows) -> tuple[list[dict], dict]:
    """`make shadow` of ``version``, the rows sent, `make shadow-report`: (answers, saved report).
    The report counts every mirror of ``version`` in the live log: those before and this run's."""
    before = routes_count(server)
    started = make(server, "shadow", f"MODEL_VERSION={version}")
    assert started.returncode == 0, started.stdout
    routes_applied(server.run_dir, before, expect=f"shadow {version} at 100.0%")
    earlier = len(shadow_lines(server, version))
    sent = send(server, rows)
    assert [s["status"] for s in sent] == [200] * len(rows)
    assert {s["version"] for s in sent} == {"1.0"}  # callers only ever see the default
    found = wait_for_lines(server, [s["id"] for s in sent])
    assert len(found) == len(rows) and {line["version"] for line in found} == {version}
    report = make(server, "shadow-report", f"MODEL_VERSION={version}")
    assert report.returncode == 0, report.stdout
    assert f"shadow {MODEL_NAME}: candidate {version} against the default (1.0)" in report.stdout
    saved = json.loads(server.files.shadow_report.read_text())
    assert saved["mirrored"] == earlier + len(rows), (saved["mirrored"], earlier)  # no more, no less
    return sent, saved


def all_compared(report: dict) -> None:
    """Every mirrored request of the report is a compared pair: none dropped at the agent's
    in-flight cap (4 callers in flight, the candidate on the same server: far below 64), none
    without the default's record (the handler writes it before the caller's answer), none
    failed on either side. A mirror lost, or one that never had the default's answer, fails."""
    assert (report["dropped"], report["unmatched"]) == (0, 0), report
    assert report["errors"]["candidate"]["errors"] == 0 and report["errors"]["default"]["errors"] == 0
    assert report["compared"] == report["mirrored"], report


def assert_agreement_recomputed(server, report: dict, default: Reference, candidate: Reference) -> float:
    """The report's agreement equals the one the in-process models (the archives' own weights)
    give on the rows of its pairs, as this module sent them; returns it. A row whose two highest
    probabilities are within 1e-4 of each other (either model) may be classed otherwise by the
    served export: each such row is the tolerance of one request."""
    lines = shadow_lines(server, report["candidate"])
    rows = [SENT[line["of"]] for line in lines]
    assert len(rows) == report["compared"], (len(rows), report["compared"])
    same, ties = agreement(default, candidate, rows)
    print(
        f"agreement of {report['candidate']}: report {report['agreement']:.6f}, recomputed "
        f"{same}/{len(rows)} = {same / len(rows):.6f} ({ties} near-ties)"
    )
    # the report rounds to 6 decimals
    assert abs(report["agreement"] * len(rows) - same) <= ties + 1e-6 * len(rows), (report, same)
    return same / len(rows)


@pytest.fixture(scope="module")
def reference(mar_v1) -> Callable[[str], Reference]:
    """The deterministic model of a version (1.0, 2.0 or 3.2) in this process, checked against
    its archive's golden set (the served version's weights); each made once."""
    models = {
        "1.0": lambda: demo_eager("1.0"),
        "2.0": lambda: demo_eager("2.0"),
        "3.2": lambda: RandomAnswers(demo_eager("1.0")),
    }

    @functools.cache
    def of(version: str) -> Reference:
        return Reference.from_mar(mar_v1.parent / f"{MODEL_NAME}_{version}.mar", models[version]())

    return of


@pytest.fixture()
def canary_stopped(agent):
    yield
    make(agent, "canary-stop")
    make(agent, "shadow-stop")


def test_shadow_of_2_0_reports_its_agreement_and_ids_the_records_find(agent, rows, reference, canary_stopped):
    sent, report = shadowed(agent, "2.0", rows)
    assert report["mirrored"] == len(shadow_lines(agent, "2.0")) >= N
    all_compared(report)
    assert report["default"] == ["1.0"]
    assert_agreement_recomputed(agent, report, reference("1.0"), reference("2.0"))
    assert report["agreement"] >= 0.85  # the gate measured 94.5% on the golden sets
    assert sum(report["classes"]["default"].values()) == report["compared"]
    assert report["errors"]["candidate"]["errors"] == 0
    assert report["latency_ms"]["candidate"]["p99"] > 0 and report["latency_ms"]["default"]["p99"] > 0
    kept = {(line["request_id"], line["model_version"]): line for line in records(agent.files.records)}
    assert report["disagreements"] and report["ranked_by"] == "by the candidate's probability gap"
    for d in report["disagreements"]:  # both answers are records under the ids given
        assert kept[(d["of"], "1.0")]["label"] == d["default"]
        assert kept[(d["id"], "2.0")]["label"] == d["candidate"]
    assert [e["action"] for e in History(agent.files.history).events()][-1] == "shadow"


def test_shuffled_candidate_agrees_by_chance(agent, rows, random_candidate, reference, canary_stopped):
    _, report = shadowed(agent, random_candidate, rows)
    all_compared(report)
    assert_agreement_recomputed(agent, report, reference("1.0"), reference(random_candidate))
    shares = {who: {k: v / sum(c.values()) for k, v in c.items()} for who, c in report["classes"].items()}
    chance = sum(p * shares["candidate"].get(k, 0.0) for k, p in shares["default"].items())
    assert len(report["classes"]["candidate"]) == len(LABELS)
    assert abs(report["agreement"] - chance) < 0.1 and report["agreement"] < 0.6, (report, chance)


def aborts(server) -> list[dict]:
    return [e for e in History(server.files.history).events() if e["action"] == "canary-abort"]


def wait_aborted(server, before: int, timeout=WAIT_S) -> dict:
    """The canary abort after the ``before`` ones already recorded."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(found := aborts(server)) > before:
            return found[-1]
        time.sleep(0.2)
    raise AssertionError(f"no abort: {server.files.canary_log.read_text()}")


def test_canary_of_a_disagreeing_candidate_is_aborted(agent, rows, random_candidate, tmp_path, canary_stopped):
    config = gate_config(
        tmp_path,
        canary={
            "window_s": 30.0,
            "min_requests": 20,
            "min_agreement": 0.8,
            "max_error_rate": 0.5,
            "max_p99_ms": 10000.0,
        },
    )
    assert make(agent, "shadow", f"MODEL_VERSION={random_candidate}").returncode == 0
    before, lines = len(aborts(agent)), routes_count(agent)
    started = make(agent, "canary", f"MODEL_VERSION={random_candidate}", "PERCENT=20", f"GATE_CONFIG={config}")
    assert started.returncode == 0 and "watcher pid" in started.stdout, started.stdout
    routes_applied(agent.run_dir, lines, expect=f"canary {random_candidate} at 20.0%")
    sent = send(agent, rows, keys=[f"user-{i}" for i in range(len(rows))])
    assert [s["status"] for s in sent] == [200] * len(rows)  # wrong answers, not failures
    event = wait_aborted(agent, before)
    assert event["version"] == random_candidate and event["failures"][0].startswith("agreement:")
    assert read_routes(agent.files.live_routes).canary.percent == 0.0
    assert any(
        line.get("event") == "canary-abort" and line["failures"] == event["failures"] for line in audit_lines(agent)
    )
    assert "ABORTED canary 3.2" in agent.files.canary_log.read_text()
    routes_applied(agent.run_dir, lines, expect=f"canary {random_candidate} at 0.0%")
    after = send(agent, rows[:50], keys=[f"user-{i}" for i in range(50)])
    assert {s["version"] for s in after} == {"1.0"}


def test_canary_of_a_failing_candidate_is_aborted(agent, rows, rollout, tmp_path, canary_stopped):
    """2.0 loses its workers (TorchServe answers 503 for it) under steady keyed traffic: every
    failed request is one of the candidate's own answers, and none fails after the abort."""
    config = gate_config(
        tmp_path, canary={"window_s": 30.0, "min_requests": 10, "max_error_rate": 0.1, "max_p99_ms": 10000.0}
    )
    before, lines = len(aborts(agent)), routes_count(agent)
    started = make(agent, "canary", "MODEL_VERSION=2.0", "PERCENT=30", f"GATE_CONFIG={config}")
    assert started.returncode == 0, started.stdout
    rollout.client.scale(MODEL_NAME, 0, version="2.0")
    routes_applied(agent.run_dir, lines, expect="canary 2.0 at 30.0%")
    try:
        keys = [f"user-{i}" for i in range(len(rows))]
        rounds: list[tuple[float, list[dict]]] = []  # (when the round started, its answers)
        aborted_at, deadline = None, time.monotonic() + WAIT_S
        while aborted_at is None or rounds[-1][0] < aborted_at + 2:  # 2 s past the abort's routes
            assert time.monotonic() < deadline, f"no abort: {agent.files.canary_log.read_text()}"
            lo = 50 * len(rounds) % len(rows)
            rounds.append((time.time(), send(agent, rows[lo : lo + 50], keys=keys[lo : lo + 50])))
            if aborted_at is None and len(aborts(agent)) > before:
                # from when the agent follows the abort's routes (share 0)
                routes_applied(agent.run_dir, lines, expect="canary 2.0 at 0.0%")
                aborted_at = time.time()
        event = aborts(agent)[-1]
        assert event["version"] == "2.0" and event["failures"][0].startswith("error rate:")
        sent = [s for _, answers in rounds for s in answers]
        # a canary line's id is the x-request-id the caller received
        canary = {
            line["id"]: line for line in live_lines(agent) if line["kind"] == "canary" and line["version"] == "2.0"
        }
        failed = [s for s in sent if s["status"] != 200]
        assert failed
        for s in failed:  # each failure is the candidate's own answer, as the live log has it
            assert s["id"] in canary and canary[s["id"]]["status"] == s["status"], s
        candidate_errors = {s["id"] for s in sent if s["id"] in canary and canary[s["id"]]["status"] >= 400}
        assert {s["id"] for s in failed} == candidate_errors
        after = [s for t, answers in rounds if t >= aborted_at for s in answers]
        print(
            f"{len(sent)} requests: {len(failed)} failed, each a candidate answer "
            f"({sorted({s['status'] for s in failed})}); {len(after)} sent after the abort, "
            f"{sum(s['status'] != 200 for s in after)} failed"
        )
        assert after and {(s["status"], s["version"]) for s in after} == {(200, "1.0")}
    finally:
        rollout.client.scale(MODEL_NAME, 1, version="2.0")


def test_promote_takes_the_live_evidence(agent, rows, rollout, random_candidate, tmp_path, canary_stopped):
    strict = gate_config(
        tmp_path, shadow={"min_requests": 100, "min_agreement": 0.85}, promote={"require_shadow": True}
    )
    shadowed(agent, random_candidate, rows[:150])
    refused = make(agent, "promote", f"MODEL_VERSION={random_candidate}", f"GATE_CONFIG={strict}")
    assert refused.returncode != 0 and "FAILED live agreement: " in refused.stdout, refused.stdout
    assert rollout.default_version() == "1.0"
    gate = [e for e in History(agent.files.history).events() if e["action"] == "gate"][-1]
    assert gate["outcome"] == "refused" and gate["live"]["requests"] >= 100

    shadowed(agent, "2.0", rows[:150])
    unmet = gate_config(tmp_path, "unmet.yaml", shadow={"min_requests": 10**6}, promote={"require_shadow": True})
    few = make(agent, "promote", "MODEL_VERSION=2.0", f"GATE_CONFIG={unmet}")
    assert few.returncode != 0 and "FAILED live requests: " in few.stdout, few.stdout
    assert "FAILED accuracy" not in few.stdout and "FAILED agreement" not in few.stdout

    promoted = make(agent, "promote", "MODEL_VERSION=2.0", f"GATE_CONFIG={strict}")
    assert promoted.returncode == 0 and "default: 1.0 -> 2.0" in promoted.stdout, promoted.stdout
    assert read_routes(agent.files.live_routes).shadow is None  # 2.0 is the default: no shadow
    gate = [e for e in History(agent.files.history).events() if e["action"] == "gate"][-1]
    assert gate["outcome"] == "promoted" and gate["live"]["agreement"] >= 0.85
    assert make(agent, "rollback").returncode == 0 and rollout.default_version() == "1.0"


def test_stop_ends_the_canary_watcher_and_a_start_clears_the_live_routes(build_root, mar_v1, rows, tmp_path):
    """`make stop` and `python -m rtserve server stop` stop a running canary watcher (by its PID
    file); a start clears the stale routes file, live log and shadow report, so the restarted
    server (1.0 only, 2.0 no longer registered) never forwards to a version it does not have."""
    make_archive(build_root, "2.0")
    keys = [f"user-{i}" for i in range(10)]
    cli_stop = [sys.executable, "-m", "rtserve", "server", "stop", "--run-dir"]
    with serve(tmp_path / "run", mar_v1) as ts:
        files = ts.files

        def canary_of_2_0() -> int:
            Rollout(ts.client(timeout=120), History(files.history), MODEL_NAME).register("2.0", workers=1)
            before = routes_count(ts)
            started = make(ts, "canary", "MODEL_VERSION=2.0", "PERCENT=100")
            assert started.returncode == 0, started.stdout
            routes_applied(ts.run_dir, before, expect="canary 2.0 at 100.0%")
            assert {s["version"] for s in send(ts, rows[:10], keys=keys)} == {"2.0"}
            pid = watcher_pid(files.canary_pid)
            assert pid is not None and alive(pid)
            return pid

        def stopped_by(stop: subprocess.CompletedProcess, pid: int) -> None:
            assert stop.returncode == 0, stop.stdout
            assert f"canary watcher {pid} stopped" in stop.stdout, stop.stdout
            assert ts.pid() is None and not alive(pid) and not files.canary_pid.exists()

        pid = canary_of_2_0()
        stopped_by(make(ts, "stop"), pid)
        # what the old server left: a canary route to its 2.0, and its log
        assert read_routes(files.live_routes).canary.percent == 100.0 and files.live_log.exists()
        files.shadow_report.write_text("{}\n")
        ts.start()
        ts.wait_ready(120, [MODEL_NAME])
        for stale in (files.live_routes, files.live_log, files.shadow_report):
            assert not stale.exists(), stale
        # the new frontend's agent never had routes: it has nothing to follow, nor a line to write
        assert routes_count(ts) == 0
        after = send(ts, rows[:10], keys=keys)
        assert [(s["status"], s["version"]) for s in after] == [(200, "1.0")] * 10
        assert not files.live_log.exists()  # nothing forwarded

        pid = canary_of_2_0()
        stopped_by(
            subprocess.run(
                [*cli_stop, str(ts.run_dir)],
                cwd=REPO,
                text=True,
                timeout=120,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            ),
            pid,
        )
