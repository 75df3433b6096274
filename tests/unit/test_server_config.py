"""rtserve.server.torchserve's effective config: the agent (greedy batching, OIP model routes, live
routes) and the private ports of the metrics exporter and the OIP model routes."""

from __future__ import annotations

import pytest

from rtserve.errors import ServerError
from rtserve.server import torchserve as srv
from rtserve.server.properties import GREEDY_KEY, OIP_KEY, PUBLIC_METRICS_KEY, routes_file
from rtserve.server.torchserve import TorchServe
from rtserve.settings import Settings

pytestmark = pytest.mark.unit


def instance(tmp_path, **overrides) -> TorchServe:
    return TorchServe(tmp_path / "run", tmp_path / "store", overrides=overrides)


def test_agent_is_added_to_vmargs_once_and_metrics_and_oip_get_private_ports(tmp_path):
    server = instance(tmp_path)
    props = server.effective_props(41234, 41236)
    assert props["vmargs"].endswith(
        f" -javaagent:{Settings.from_env().agent_jar}=oip=http://127.0.0.1:41236,"
        f"routes={tmp_path.resolve()}/run/live-routes.json,"
        f"live-log-bytes={server.budget.shares().live_log}"
    )
    assert routes_file(tmp_path / "run") == tmp_path.resolve() / "run" / "live-routes.json"
    assert props["vmargs"].count("-javaagent") == 1
    assert props["metrics_address"] == "http://127.0.0.1:41234"
    assert props[PUBLIC_METRICS_KEY] == "http://127.0.0.1:8082"
    assert props[OIP_KEY] == "http://127.0.0.1:41236"
    # read back from the effective file (as stop/drain do), clients see the public address
    path = tmp_path / "effective.properties"
    srv.write_properties(path, props)
    again = TorchServe(tmp_path / "run", tmp_path / "store", config=path)
    assert again.props["metrics_address"] == "http://127.0.0.1:8082"
    assert again.effective_props(41235, 41237)["vmargs"].count("-javaagent") == 1


def test_greedy_off_still_loads_the_agent_for_the_oip_routes(tmp_path):
    server = instance(tmp_path, **{GREEDY_KEY: "false"})
    props = server.effective_props(41234, 41236)
    assert props["vmargs"].endswith(
        f" -javaagent:{Settings.from_env().agent_jar}=oip=http://127.0.0.1:41236,greedy=off,"
        f"routes={routes_file(tmp_path / 'run')},live-log-bytes={server.budget.shares().live_log}"
    )


def test_bad_greedy_value_and_missing_agent_are_refused(tmp_path, monkeypatch):
    with pytest.raises(ServerError, match=f"{GREEDY_KEY} must be true or false, not 'yes'"):
        instance(tmp_path, **{GREEDY_KEY: "yes"}).effective_props(41234, 41236)
    comma = TorchServe(tmp_path / "a,b", tmp_path / "store")
    with pytest.raises(ServerError, match=r"a,b has a comma in its path: the agent's options cannot carry it"):
        comma.effective_props(41234, 41236)
    monkeypatch.setenv("RTSERVE_AGENT_JAR", str(tmp_path / "missing.jar"))
    with pytest.raises(ServerError, match="make agent"):
        TorchServe(tmp_path / "run", tmp_path / "store", settings=Settings.from_env()).effective_props(41234, 41236)


def test_a_run_directory_too_deep_for_worker_sockets_is_refused_before_anything_starts(tmp_path):
    """TorchServe's workers listen on $TMPDIR/.ts.sock.<port> (TMPDIR is RUN_DIR/tmp); a longer
    path than a Unix socket allows used to show only as workers dying at start."""
    deep = tmp_path / ("d" * (srv.MAX_SOCKET_PATH - len(str(tmp_path.resolve())) - 10))
    server = TorchServe(deep, tmp_path / "store")
    with pytest.raises(
        ServerError,
        match=r"too deep for TorchServe's worker sockets: .*/tmp/"
        r"\.ts\.sock\.65535 has 1\d\d bytes, a Unix socket path at most 107",
    ):
        server.start()
    assert not (deep / "config.properties").exists() and not (deep / "logs").exists()


def test_the_probes_and_the_oip_routes_do_not_import_torch():
    """The kubelet runs `python -m rtserve probe` every few seconds in the container: without
    torch it starts in a fraction of the time and memory (with it, about 200 MB each, and
    probes left running under load once ran a pod out of memory). The OIP routes run beside every
    server: without torch it holds about 30 MB, with it 500 MB."""
    import subprocess
    import sys
    from pathlib import Path

    code = (
        "import sys, rtserve.cli, rtserve.server.probe, rtserve.server.torchserve, "
        "rtserve.server.oip; print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    ).stdout
    assert out.strip() == "[]", out


def test_a_bad_warm_up_setting_fails_the_start_before_anything_runs(tmp_path):
    server = TorchServe(tmp_path / "run", tmp_path, overrides={"rtserve_warmup_seconds": "soon"})
    with pytest.raises(ServerError, match="rtserve_warmup_seconds a number"):
        server.start()
    assert not (tmp_path / "run").exists()


def test_the_log_tail_leaves_out_the_two_lines_per_batch(tmp_path):
    """A failed start or warm-up logs this tail to the pod's output, which carries ts_log.log's
    events but never its per-batch lines (tests/integration/test_probe.py)."""
    server = instance(tmp_path)
    server.log_dir.mkdir(parents=True)
    batch = (
        "2026-12-02T09:49:49,179 [INFO ] W-29816-realtime-classifier_1.0 org.pytorch.serve.wlm."
        "WorkerThread - Looping backend response at: 1796204989191\n"
        "2026-12-02T09:49:49,183 [INFO ] W-29816-realtime-classifier_1.0 org.pytorch.serve.wlm."
        "WorkerThread - Backend response time: 4\n"
    )
    event = "2026-12-02T09:49:50,001 [WARN ] pool-3-thread-1 org.pytorch.serve.wlm.ModelManager - event\n"
    (server.log_dir / "ts_log.log").write_text(batch * 30 + event + batch * 30)
    tail = server.log_tail()
    assert event.strip() in tail
    assert "Looping backend" not in tail and "Backend response time" not in tail


def archive(store, name: str, n_features: int) -> str:
    """A .mar holding only what the request limit reads (manifest and meta.json)."""
    import json
    import zipfile

    store.mkdir(parents=True, exist_ok=True)
    meta = {"version": "1.0", "labels": ["a", "b"], "feature_names": [f"x{i}" for i in range(n_features)]}
    with zipfile.ZipFile(store / f"{name}.mar", "w") as zf:
        zf.writestr("MAR-INF/MANIFEST.json", json.dumps({"model": {"modelName": name, "modelVersion": "1.0"}}))
        zf.writestr("meta.json", json.dumps(meta))
    return f"{name}={name}.mar"


def test_the_request_limit_grows_to_the_widest_model_loaded(tmp_path):
    from handler.inputs import largest_body

    store = tmp_path / "store"
    small = TorchServe(tmp_path / "run", store, models=[archive(store, "demo", 32)])
    assert small.effective_props(41234, 41236)["max_request_size"] == "65536"  # the config's: the demo fits
    assert largest_body(32, 64) < 65536
    wide = TorchServe(
        tmp_path / "run", store, models=[archive(store, "demo", 32), archive(store, "image", 3 * 32 * 32)]
    )
    assert wide.effective_props(41234, 41236)["max_request_size"] == str(largest_body(3 * 32 * 32, 64))
    broken = TorchServe(tmp_path / "run", store, models=["gone=gone.mar"])
    assert broken.effective_props(41234, 41236)["max_request_size"] == "65536"
