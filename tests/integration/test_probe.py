"""The container's entry point and its probes, against a real TorchServe on free ports.

The pod runs ``python -m rtserve server run --probes 0.0.0.0:8087``, which answers the kubelet's
HTTP probes (``GET /ready``, ``/live``); ``python -m rtserve probe`` runs the same checks once, as
a command. These tests run exactly those, with the cluster's ``config.properties``
(deploy/k8s/base) but loopback listeners on free ports, and keys that expire after 1.8 s so the
probes must renew them as they would after an hour in the cluster.

Where the machine allows a private mount namespace (root, as on CI), the server runs the way
the Deployment runs it: the root filesystem read-only, only the run directory and /tmp
writable (the pod's two emptyDirs), as the manifest's non-root UID.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
import yaml

from bench import probe_cost
from rtserve.runtime.logs import read_rotated
from rtserve.runtime.ports import free_ports
from rtserve.server.probe import loopback
from rtserve.server.properties import port_overrides, read_properties, write_properties
from rtserve.server.torchserve import TorchServe
from rtserve.settings import DRAIN_FILE
from tests.conftest import MODEL_NAME, REPO
from tests.helpers import bench_main

pytestmark = pytest.mark.integration

K8S_CONFIG = REPO / "deploy" / "k8s" / "base" / "config.properties"
#: Where the Dockerfile puts the repository's files in the image (WORKDIR /opt/rtserve).
IMAGE_ROOT = "/opt/rtserve/"


def pod_properties() -> dict[str, str]:
    """The pod's config.properties, with paths into the image mapped back to this checkout."""
    props = read_properties(K8S_CONFIG)
    return {k: str(REPO / v[len(IMAGE_ROOT) :]) if v.startswith(IMAGE_ROOT) else v for k, v in props.items()}


KEY_LIFETIME_MIN = "0.03"  # 1.8 seconds


def pod_security() -> dict:
    """The Deployment's container securityContext (runAsUser, readOnlyRootFilesystem, ...)."""
    manifest = yaml.safe_load((REPO / "deploy" / "k8s" / "base" / "deployment.yaml").read_text())
    return manifest["spec"]["template"]["spec"]["containers"][0]["securityContext"]


def can_sandbox() -> bool:
    """Whether a private mount namespace with a read-only root can be made here."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("setpriv"):
        return False
    probe_cmd = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        "mount -o remount,bind,ro / && ! test -w /",
    ]
    return subprocess.run(probe_cmd, capture_output=True, timeout=30).returncode == 0


class Pod:
    """``python -m rtserve server run`` as the container runs it, plus its probe commands."""

    def __init__(self, root: Path, config: Path, mar: Path, sandbox: bool) -> None:
        self.root = root
        self.run_dir = root / "run"
        self.tmp = root / "tmp"
        store = root / "model_store"
        for d in (self.run_dir, self.tmp, store):
            d.mkdir(parents=True)
        shutil.copy(mar, store / mar.name)
        self.sandbox = sandbox
        self.uid = pod_security()["runAsUser"]
        if sandbox:  # the emptyDirs belong to the pod's user (fsGroup in the cluster)
            for d in (self.run_dir, self.tmp):
                os.chown(d, self.uid, self.uid)
        self.env = dict(
            os.environ,
            RTSERVE_RUN_DIR=str(self.run_dir),
            RTSERVE_MODEL=MODEL_NAME,
            RTSERVE_CONFIG=str(config),
            RTSERVE_MODEL_STORE=str(store),
            RTSERVE_MODELS=f"{MODEL_NAME}={mar.name}",
            HOME=str(self.run_dir),
            PYTHONDONTWRITEBYTECODE="1",
            TMPDIR=str(self.tmp),
        )
        self.server = TorchServe(self.run_dir, store, config=config)
        self.proc: subprocess.Popen | None = None
        self.out = root / "runner.out"
        self.probes = f"127.0.0.1:{free_ports(1)[0]}"

    def start(self) -> None:
        cmd = [sys.executable, "-m", "rtserve", "server", "run", "--probes", self.probes]
        if self.sandbox:
            # Only the run directory and /tmp stay writable; then drop to the pod's user. It
            # keeps CAP_DAC_READ_SEARCH (read anything, write nothing extra) only because this
            # machine's Python lives under /root (mode 700); in the image it is world-readable.
            # A checkout under /tmp (CI may clone there) must stay visible: then the pod's tmp
            # stays at its own path (TMPDIR points there) instead of covering /tmp.
            tmp_bind = (
                f"mount --bind {self.tmp} {self.tmp}"
                if Path("/tmp") in REPO.resolve().parents
                else f"mount --bind {self.tmp} /tmp"
            )
            script = (
                f"mount --bind {self.run_dir} {self.run_dir} && {tmp_bind}"
                f" && mount -o remount,bind,ro / && exec setpriv --reuid {self.uid}"
                f" --regid {self.uid} --clear-groups --inh-caps +dac_read_search"
                f' --ambient-caps +dac_read_search "$@"'
            )
            cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "pod", *cmd]
        with open(self.out, "ab") as out:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def probe(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "rtserve", "probe", *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def http(self, path: str, timeout: float = 5.0) -> tuple[int, str]:
        """What the kubelet's HTTP probe of ``path`` gets from the entry point: (status, body)."""
        try:
            with urllib.request.urlopen(f"http://{self.probes}{path}", timeout=timeout) as answer:
                return answer.status, answer.read().decode().strip()
        except urllib.error.HTTPError as answer:
            return answer.code, answer.read().decode().strip()

    def wait_ready(self, timeout: float = 300.0) -> subprocess.CompletedProcess:
        # 300 s: on a busy machine (a fresh clone's three tiers) the warm-up took over 120 s
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"runner exited:\n{self.out.read_text()}"
            result = self.probe("ready")
            if result.returncode == 0:
                return result
            time.sleep(0.5)
        raise AssertionError(f"never ready: {result.stdout}\n{self.server.log_tail()}")

    def terminate(self, timeout: float = 30.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.server.stop()


@pytest.fixture(scope="module")
def pod(mar_v1):
    # Under the repository's build/ (world-readable), not pytest's private tmp: the pod's
    # non-root user must be able to read its config and archive.
    parent = REPO / "build" / "test-pods"
    parent.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(dir=parent))
    root.chmod(0o755)
    config = root / "config.properties"
    props = pod_properties()
    props.update(port_overrides(free_ports(6)), token_expiration_min=KEY_LIFETIME_MIN)
    write_properties(config, props)
    pod = Pod(root, config, mar_v1, sandbox=can_sandbox())
    pod.start()
    try:
        yield pod
    finally:
        pod.kill()
        shutil.rmtree(root, ignore_errors=True)


def test_loopback_rewrites_wildcard_listeners():
    assert loopback("http://0.0.0.0:8080") == "http://127.0.0.1:8080"
    assert loopback("http://127.0.0.1:8081/") == "http://127.0.0.1:8081"
    assert loopback("https://[::]:8443") == "https://127.0.0.1:8443"


def test_probes_before_the_server_wrote_anything(tmp_path):
    env = dict(os.environ, RTSERVE_RUN_DIR=str(tmp_path), RTSERVE_MODEL=MODEL_NAME)
    out = {}
    for check in ("ready", "live"):
        result = subprocess.run(
            [sys.executable, "-m", "rtserve", "probe", check],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert result.returncode == 1, result.stdout
        out[check] = result.stdout.strip()
    assert out["ready"] == "TorchServe has not written key_file.json yet"
    assert out["live"].startswith("no config yet:") and "config.properties" in out["live"]


def test_ready_means_the_model_answers_even_after_keys_expire(pod):
    first = pod.wait_ready()
    assert first.stdout.strip() == f"ready: {MODEL_NAME} 1.0 answers"
    # ready only after the start-up warm-up (keys last 1.8 s here: it renews them as it goes)
    warmed = re.search(rf"warmed up {MODEL_NAME}: (\d+) requests", pod.out.read_text())
    assert warmed and int(warmed.group(1)) > 0, pod.out.read_text()[-3000:]
    keys = (pod.run_dir / "key_file.json").read_text()
    time.sleep(2.0)  # every key has expired: the probes must renew them with the API key
    live = pod.probe("live")
    assert live.returncode == 0 and live.stdout.startswith("live: /ping 200"), live.stdout
    again = pod.probe("ready")
    assert again.returncode == 0, again.stdout
    assert (pod.run_dir / "key_file.json").read_text() != keys, "keys were not renewed"
    time.sleep(2.0)  # and the entry point's own probes renew them too
    assert pod.http("/ready") == (200, f"ready: {MODEL_NAME} 1.0 answers")
    assert pod.http("/live") == (200, "live: /ping 200")


def test_the_entry_point_answers_the_kubelets_probes_with_the_commands_verdicts(pod):
    """``--probes``: GET /ready and /live give the probe commands' verdicts, 200 or 503 (draining:
    503 at once), anything else a 404; each change of a verdict is one line of the pod's output."""
    pod.wait_ready()
    assert pod.http("/ready") == (200, f"ready: {MODEL_NAME} 1.0 answers")
    assert pod.http("/live") == (200, "live: /ping 200")
    assert pod.http("/metrics")[0] == 404
    (pod.run_dir / DRAIN_FILE).write_text("")
    try:
        assert pod.http("/ready") == (503, "draining: not accepting new requests")
        assert pod.http("/live")[0] == 200
    finally:
        (pod.run_dir / DRAIN_FILE).unlink()
    assert pod.http("/ready")[0] == 200
    out = pod.out.read_text(errors="replace")
    assert out.count("probe /ready: draining: not accepting new requests") == 1, out[-3000:]
    assert f"probe /ready: ready: {MODEL_NAME} 1.0 answers" in out


def test_server_runs_on_a_read_only_root_as_the_pods_user(pod):
    """What readOnlyRootFilesystem and runAsUser do to the pod, done here with a mount namespace."""
    if not pod.sandbox:
        pytest.skip("no private mount namespace here (needs root and unshare): not emulated")
    assert pod_security()["readOnlyRootFilesystem"] is True
    pod.wait_ready()
    frontend = psutil.Process(pod.server.pid())
    workers = frontend.children(recursive=True)
    assert workers, "no model workers"
    for proc in [frontend, *workers]:
        assert proc.uids().real == pod.uid, proc.cmdline()
        mounts = Path(f"/proc/{proc.pid}/mountinfo").read_text().splitlines()
        root_opts = next(line.split()[5] for line in mounts if line.split()[4] == "/")
        assert root_opts.split(",")[0] == "ro", (proc.pid, root_opts)
    written = {p.relative_to(pod.root).parts[0] for p in pod.root.rglob("*") if p.stat().st_uid == pod.uid}
    assert written <= {"run", "tmp"}, written
    assert (pod.run_dir / "key_file.json").stat().st_uid == pod.uid


def test_the_pods_output_has_ts_logs_lines_but_not_its_two_per_batch(pod):
    """The pod's main process sends ts_log.log's lines to the container's output as well (what
    kubectl logs shows), less the worker threads' two lines per batch; the file stays (the drain
    and the readiness check read it) and holds those too."""
    pod.wait_ready()
    per_batch = ("Looping backend response at", "Backend response time")
    ts_log = read_rotated(pod.run_dir / "logs" / "ts_log.log").splitlines()
    assert any(mark in line for line in ts_log for mark in per_batch)  # the warm-up's batches
    events = [line for line in ts_log if not any(mark in line for mark in per_batch)]
    out = pod.out.read_text(errors="replace").splitlines()
    assert events and set(events[:20]) <= set(out), (events[:20], out[-40:])
    assert not [line for line in out if any(mark in line for mark in per_batch)]


def test_ready_fails_for_a_model_that_is_not_served(pod):
    pod.wait_ready()
    result = pod.probe("ready", "--model", "no-such-model")
    assert result.returncode == 1
    assert "404" in result.stdout, result.stdout


def test_cli_in_the_pod_reads_the_pods_keys(pod):
    """`kubectl exec ... python -m rtserve client token` finds key_file.json through RTSERVE_RUN_DIR."""
    pod.wait_ready()
    result = subprocess.run(
        [sys.executable, "-m", "rtserve", "client", "token", "management"],
        cwd=REPO,
        env=pod.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    keys = json.loads((pod.run_dir / "key_file.json").read_text())
    assert result.stdout.strip() == keys["management"]["key"]


def test_live_fails_while_the_frontend_is_frozen(pod):
    """What the liveness probe sees of a hung frontend (SIGSTOP: it holds its ports, answers
    nothing): a failure within the probe's own timeout, so the kubelet restarts the container
    after the manifest's failureThreshold; and live again once it runs."""
    pod.wait_ready()
    frontend = pod.server.pid()
    os.kill(frontend, signal.SIGSTOP)
    try:
        started = time.monotonic()
        frozen = pod.probe("live")
        took = time.monotonic() - started
        started = time.monotonic()
        status, body = pod.http("/live", timeout=10)
        took_http = time.monotonic() - started
    finally:
        os.kill(frontend, signal.SIGCONT)
    assert frozen.returncode == 1 and frozen.stdout.startswith("frontend does not answer"), frozen.stdout
    assert took < 5 + 5, f"the probe took {took:.1f} s, past the manifest's timeoutSeconds (5)"
    assert status == 503 and body.startswith("frontend does not answer"), (status, body)
    assert took_http < 5, f"GET /live took {took_http:.1f} s, past the manifest's timeoutSeconds (5)"
    assert pod.probe("live").returncode == 0
    assert pod.http("/live")[0] == 200


def test_bench_probe_cost_main(pod, tmp_path):
    """make bench-probe's command line (bench/probe_cost.py), attached to this pod's server: the
    probes pass, and neither imports requests."""
    pod.wait_ready()
    rc, report = bench_main(probe_cost.main, tmp_path / "probe_cost.json", "--attach", pod.run_dir, "--runs", 1)
    assert rc == 0
    commands = report["commands"]
    assert commands["probe ready"]["output"] == f"ready: {MODEL_NAME} 1.0 answers"
    assert commands["probe live"]["output"] == "live: /ping 200"
    for name, measured in commands.items():
        assert measured["cpu_ms"] > 0 and measured["modules"] > 0 and not measured["requests"], name


def test_drain_waits_for_in_flight_requests_then_sigterm_stops_cleanly(pod):
    pod.wait_ready()
    client = TorchServe(pod.run_dir, pod.server.model_store, config=pod.run_dir / "config.properties").client()
    client.inference_url = loopback(client.inference_url)
    finished: list[float] = []
    stop = threading.Event()

    def traffic() -> None:  # requests keep arriving until a second into the drain (bounded: 60 s)
        hard_stop = time.monotonic() + 60
        while not stop.is_set() and time.monotonic() < hard_stop:
            assert client.predict(MODEL_NAME, {"features": [1.0] * 32})["model_version"] == "1.0"
            finished.append(time.monotonic())

    sender = threading.Thread(target=traffic)
    sender.start()
    started = time.monotonic()
    drain = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rtserve",
            "probe",
            "drain",
            "--propagation",
            "0.5",
            "--timeout",
            "20",
            "--quiet",
            "0.5",
        ],
        cwd=REPO,
        env=pod.env,
        stdout=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 20  # the drain writes its marker first thing
    while not (pod.run_dir / DRAIN_FILE).exists():
        assert drain.poll() is None, "the drain exited before it marked the pod draining"
        assert time.monotonic() < deadline, "no drain marker within 20 s"
        time.sleep(0.05)
    marked = time.monotonic()
    during = pod.probe("ready")
    assert during.returncode == 1 and during.stdout.strip() == "draining: not accepting new requests"
    assert pod.probe("live").returncode == 0
    # The sender stops a second after the marker at the earliest (the drain's propagation wait
    # is 0.5 s): on a loaded machine the drain's own start may take longer than a fixed window.
    time.sleep(max(0.0, marked + 1.0 - time.monotonic()))
    stop.set()
    out, _ = drain.communicate(timeout=60)
    drained = time.monotonic()
    sender.join()
    assert drain.returncode == 0, out
    seen = re.search(r"drained after [\d.]+s \((\d+) requests seen while draining\)", out)
    assert seen and int(seen.group(1)) > 0, out
    assert len(finished) > 10, "the sender made too few requests to prove anything"
    assert finished[-1] < drained, "drain returned while requests were still being answered"
    assert drained - started >= 0.5 + 0.5  # propagation, then a quiet half second

    frontend = pod.server.pid()
    assert pod.terminate() == 0
    assert pod.server.pid() is None and frontend is not None
    assert "TorchServe stopped" in pod.out.read_text()

    # A restarted container keeps its emptyDir; the old drain file must not keep it unready.
    assert (pod.run_dir / DRAIN_FILE).exists()
    pod.start()
    deadline = time.monotonic() + 60
    while (pod.run_dir / DRAIN_FILE).exists() or pod.server.pid() is None:
        assert time.monotonic() < deadline and pod.proc.poll() is None, pod.out.read_text()
        time.sleep(0.1)
    assert pod.terminate() == 0
