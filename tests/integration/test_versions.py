"""Model versions on a real TorchServe: register, promote, rollback, retire, scale, and bad calls."""

from __future__ import annotations

import os
import subprocess
from collections import Counter

import pytest

from bench import rollout_load
from rtserve.client.rest import AuthError, Client, NotFound, Refused, TorchServeError
from rtserve.promotion.gate import GateConfig
from rtserve.promotion.history import HISTORY_FILE, History
from rtserve.promotion.rollout import Rollout, RolloutError
from rtserve.server.readiness import sample_payload
from tests.conftest import MODEL_NAME, REPO, make_archive
from tests.helpers import bench_main, keep_only
from tests.integration.conftest import serve

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def store(build_root, mar_v1):
    """Archives 1.0 and 2.0, plus a corrupt file and an archive whose handler cannot load."""
    make_archive(build_root, "2.0")
    bad_config = build_root / "bad-model-config.yaml"
    bad_config.write_text("minWorkers: 1\nmaxWorkers: 1\nhandler:\n  no_such_setting: 1\n")
    make_archive(build_root, "9.0", MODEL_CONFIG=str(bad_config))
    (mar_v1.parent / f"{MODEL_NAME}_8.0.mar").write_bytes(os.urandom(4096))
    return mar_v1.parent


@pytest.fixture()
def rollout(server, store):
    history = History(server.run_dir / HISTORY_FILE)
    history.path.unlink(missing_ok=True)
    ro = Rollout(server.client(timeout=120), history, MODEL_NAME)
    yield ro
    keep_only(ro)  # leave the module's server as the fixture made it


def served_versions(client: Client, n: int = 6, version: str | None = None) -> set[str]:
    return {client.predict(MODEL_NAME, sample_payload(), version)["model_version"] for _ in range(n)}


def snapshot(ro: Rollout) -> list[tuple]:
    return [(s.version, s.default, s.workers) for s in ro.status()]


def test_register_promote_rollback_retire(rollout):
    client = rollout.client
    rollout.register("2.0")
    status = {s.version: s for s in rollout.status()}
    assert set(status) == {"1.0", "2.0"} and status["1.0"].default and not status["2.0"].default
    assert status["2.0"].workers_ready == status["2.0"].min_workers > 0
    assert served_versions(client) == {"1.0"}
    assert served_versions(client, version="2.0") == {"2.0"}
    with pytest.raises(Refused, match="Cannot remove default version"):
        client.unregister(MODEL_NAME, "1.0")  # TorchServe's own guard, below Rollout.retire's

    assert rollout.promote("2.0") == "1.0"
    assert served_versions(client) == {"2.0"}
    assert served_versions(client, version="1.0") == {"1.0"}

    assert rollout.rollback() == ("2.0", "1.0")
    assert served_versions(client) == {"1.0"}
    assert [(e["action"], e["from"], e["to"]) for e in rollout.history.events()] == [
        ("promote", "1.0", "2.0"),
        ("rollback", "2.0", "1.0"),
    ]

    rollout.retire("2.0")
    assert rollout.versions() == ["1.0"]
    with pytest.raises(NotFound):
        client.predict(MODEL_NAME, sample_payload(), "2.0")


def test_scale_waits_for_workers(rollout):
    rollout.scale(3)
    assert [(s.workers_ready, s.min_workers) for s in rollout.status()] == [(3, 3)]
    rollout.scale(2)
    assert [(s.workers, s.min_workers) for s in rollout.status()] == [(2, 2)]


@pytest.mark.parametrize(
    "call,error,message",
    [
        (lambda ro: ro.promote("2.0"), RolloutError, "realtime-classifier 2.0 is not registered"),
        (lambda ro: ro.promote("1.0"), RolloutError, "1.0 is already the default"),
        (lambda ro: ro.rollback(), RolloutError, "no previous default recorded for realtime-classifier"),
        (lambda ro: ro.retire("1.0"), RolloutError, "is the default: promote another version"),
        (lambda ro: ro.retire("3.0"), RolloutError, "realtime-classifier 3.0 is not registered"),
        (lambda ro: ro.register("1.0"), RolloutError, "realtime-classifier 1.0 is already registered"),
        (lambda ro: ro.register("../etc"), RolloutError, "invalid version '../etc'"),
        (lambda ro: ro.register("5.0"), NotFound, "Model not found at: realtime-classifier_5.0.mar"),
        (lambda ro: ro.register("8.0"), TorchServeError, "the file is not a valid model archive"),
        (lambda ro: ro.register("9.0"), TorchServeError, "the archive's handler failed to load"),
        (lambda ro: ro.scale(0), RolloutError, "workers must be in [1, 64]"),
        (lambda ro: ro.scale(2, "7.0"), RolloutError, "realtime-classifier 7.0 is not registered"),
        (lambda ro: ro.client.set_default(MODEL_NAME, "4.0"), NotFound, "Model version 4.0 does not exist"),
    ],
)
def test_bad_management_calls_are_clear_and_change_nothing(rollout, call, error, message):
    before = snapshot(rollout)
    with pytest.raises(error) as info:
        call(rollout)
    assert message in str(info.value)
    assert snapshot(rollout) == before
    assert served_versions(rollout.client, 2) == {"1.0"}


def test_wrong_token_is_refused_and_changes_nothing(rollout, server, tmp_path):
    before = snapshot(rollout)
    bad_keys = tmp_path / "key_file.json"
    bad_keys.write_text('{"management": {"key": "wrong"}, "inference": {"key": "wrong"}}')
    intruder = Client(
        server.props["inference_address"], server.props["management_address"], key_file=bad_keys, retries=0
    )
    with pytest.raises(AuthError, match="token missing, wrong or expired"):
        Rollout(intruder, rollout.history, MODEL_NAME).register("2.0")
    with pytest.raises(AuthError):
        intruder.set_default(MODEL_NAME, "1.0")
    assert snapshot(rollout) == before


def test_model_api_disabled_gives_clear_error(store, tmp_path):
    with serve(tmp_path / "run", store / f"{MODEL_NAME}_1.0.mar", overrides_extra={"enable_model_api": "false"}) as ts:
        ro = Rollout(ts.client(timeout=60), History(tmp_path / "h.json"), MODEL_NAME)
        with pytest.raises(Refused, match="the model API is disabled on this server"):
            ro.register("2.0")
        assert ro.versions() == ["1.0"]


def test_make_targets_drive_a_rollout(server, store, build_root):
    """The user path: make register / promote / models / rollback / retire against a live server."""
    props = server.props
    variables = [
        f"MODEL_STORE={store}",
        f"DEMO_ARTIFACTS={build_root / 'artifacts'}",
        f"RUN_DIR={server.run_dir}",
        f"INFERENCE_URL={props['inference_address']}",
        f"MANAGEMENT_URL={props['management_address']}",
        "MODEL_VERSION=2.0",
    ]

    def make(*targets: str) -> str:
        done = subprocess.run(
            ["make", "-s", *targets, *variables],
            cwd=REPO,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=300,
        )
        assert done.returncode == 0, done.stdout
        return done.stdout

    try:
        assert "registered with" in make("register")
        assert "default: 1.0 -> 2.0" in make("promote")
        table = make("models").splitlines()
        assert table[0].split()[:3] == ["MODEL", "VERSION", "DEFAULT"]
        assert [line.split()[:3] for line in table[1:]] == [[MODEL_NAME, "1.0", "2/2"], [MODEL_NAME, "2.0", "yes"]]
        assert "rolled back: 2.0 -> 1.0" in make("rollback")
        assert "unregistered" in make("retire")
    finally:
        ro = Rollout(server.client(), History(server.run_dir / HISTORY_FILE), MODEL_NAME)
        if "2.0" in ro.versions():
            ro.client.set_default(MODEL_NAME, "1.0")
            ro.client.unregister(MODEL_NAME, "2.0")
    assert served_versions(server.client(), 2) == {"1.0"}


def test_rollout_under_load_fails_no_first_try_outside_the_scale_down_race(server, store, tmp_path):
    """A short run of bench/rollout_load.py's main: register checks 2.0's golden set and promote runs
    the gate (config/gate.yaml) under the load; versions switch as expected, and no request fails
    on its first try (before any resend), except as TorchServe's scale-down race allows."""
    rc, report = bench_main(
        rollout_load.main,
        tmp_path / "report.json",
        "--attach",
        server.run_dir,
        "--new",
        "2.0",
        "--hold",
        1.0,
        "--rate",
        60,
        "--concurrency",
        3,
    )
    gate = report["gate"]
    assert gate is not None, "promote did not run the gate"
    assert (gate["default"], gate["candidate"], gate["outcome"]) == ("1.0", "2.0", "promoted"), gate
    assert gate["failures"] == [] and gate["thresholds"] == GateConfig.load().thresholds()
    assert gate["accuracy"]["rows"] > 0 and gate["latency_ms"]["requests"] == GateConfig.load().burst_requests
    assert report["timeline_ok"], report
    assert report["requests"] > 200
    assert "gate 2.0 over 1.0: promoted" in rollout_load.render(report)
    # Register, the gate, promote, rollback and retire fail no request, counted on the first try.
    # TorchServe 0.12 can interrupt a worker's batch when a scale-down call removes the worker:
    # its requests are answered "Worker scaled down." / "Worker died." (which rtserve's client
    # resends) or, rarely, not at all (docs/versions-and-promotion.md, "Scaling down under
    # traffic"). Allowed only for a request in flight while a scale-down call ran, and at most
    # the 3 requests in flight per call.
    calls = report["scale_down_calls"]
    assert set(calls) == {"scale to 1", "scale to 1 again"}
    raced = Counter()
    for failure in report["failures"]:
        call = next(
            (
                name
                for name, (begun, ended) in calls.items()
                if failure["start_s"] <= ended and failure["end_s"] >= begun
            ),
            None,
        )
        assert call is not None, f"a first try failed outside a scale-down call: {failure}"
        lost = failure["status"] in (500, 507) and any(
            m in failure["error"] for m in ('"Worker scaled down."', '"Worker died."')
        )
        assert lost or (failure["status"] == 0 and "timed out" in failure["error"]), failure
        assert failure["resent"] == lost, failure
        raced[call] += 1
    assert all(n <= 3 for n in raced.values()), raced
    assert rc == 0, report
