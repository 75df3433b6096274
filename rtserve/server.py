"""Start, wait for and stop a TorchServe instance in its own run directory.

Used by ``make serve`` / ``make stop`` and by the integration tests, so tests exercise the
same start-up path users run. Each instance gets its own run directory holding its effective
``config.properties``, ``key_file.json``, ``logs/`` and a private temp directory (TorchServe
keeps its PID file and worker sockets there), so several instances can run side by side.

    python -m rtserve.server start --run-dir .run --models realtime-classifier=realtime-classifier_1.0.mar
    python -m rtserve.server stop --run-dir .run [--drain]
    python -m rtserve.server drain --run-dir .run      # not ready, wait until idle (preStop)
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from handler.warmup import KEY_ENV
from rtserve import drain as draining
from rtserve import gateway
from rtserve.client import Client, TorchServeError
from rtserve.drain import DRAIN_FILE, DrainReport  # noqa: F401 - DRAIN_FILE re-exported
from rtserve.rollout import HISTORY_FILE
from rtserve.warmup import (KEY_FILE, WARM_FILE, Rows, WarmupConfig, WarmupError, new_key,
                            warm_up)

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "config.properties"
#: rtserve's log4j2 configuration for the frontend: access, model, metrics and error logs without
#: TorchServe's per-request DEBUG/INFO chatter (see the file's header).
DEFAULT_LOG_CONFIG = REPO / "config" / "log4j2.xml"
PID_FILE = ".model_server.pid"
#: The longest Unix socket path (sun_path is 108 bytes with its NUL): each worker listens on
#: ``$TMPDIR/.ts.sock.<port>``, and TorchServe's workers die at start when it is longer.
MAX_SOCKET_PATH = 107
#: rtserve's Java agent for the frontend (agent/, built by ``make agent``): greedy batching and
#: the Open Inference Protocol's model metadata and readiness routes.
AGENT_JAR = Path(os.environ.get("RTSERVE_AGENT_JAR", REPO / "build" / "agent" / "rtserve-agent.jar"))
#: The config.properties key that switches greedy batching off (``false``); on by default.
GREEDY_KEY = "rtserve_greedy_batching"
#: In an effective config: the metrics address clients scrape (rtserve.metrics listens there;
#: ``metrics_address`` is then TorchServe's own, private listener).
PUBLIC_METRICS_KEY = "rtserve_metrics_address"
#: In an effective config: where rtserve.oip answers the OIP model metadata and readiness routes
#: (a free loopback port; the agent sends those routes there from the inference port).
OIP_KEY = "rtserve_oip_address"
#: The workers' metrics files (PROMETHEUS_MULTIPROC_DIR) live in shared memory when the machine
#: (or container) has it: every metric update is a write into a memory-mapped file, and on a disk
#: file system a page written back to disk faults on its next write (prometheus_client's docs
#: advise a tmpfs too). Otherwise, and with RTSERVE_METRICS_DIR unset, RUN_DIR/metrics.
SHARED_MEMORY = Path("/dev/shm")
METRICS_DIR = "metrics"
#: Created in the run directory by ``python -m rtserve.probe drain``: readiness is false from then.
#: A model whose workers died this often during start-up is not going to load: fail fast.
WORKER_DEATHS_FATAL = 4


class ServerError(RuntimeError):
    """TorchServe did not start, died, or did not become ready in time."""


@dataclass(frozen=True)
class Sidecar:
    """A Python process rtserve runs beside the frontend, started after the effective config is
    written (in its own session, output in ``logs/<log>``, PID in ``RUN_DIR/<pid_file>``) and
    stopped with it; ``rtserve.server run`` starts it again if it exits.

    Attributes:
        name: for log lines.
        module: run as ``python -m <module>``.
        args: its arguments, from the server and its effective config.
    """

    name: str
    module: str
    pid_file: str
    log: str
    args: Callable[["TorchServe", dict[str, str]], list[str]]


#: rtserve.metrics: the public metrics address (TorchServe's metrics and the workers' own).
EXPORTER = Sidecar(
    "the metrics exporter", "rtserve.metrics", "metrics-exporter.pid", "metrics_exporter.log",
    lambda ts, effective: ["--listen", effective[PUBLIC_METRICS_KEY],
                           "--upstream", effective["metrics_address"], "--dir", str(ts.metrics_dir),
                           "--access-log", str(ts.log_dir / "access_log.log"),
                           "--warmup-requests", str(ts.warmup_skip)])
#: rtserve.oip: the OIP model metadata and readiness routes the agent sends to it.
OIP_ROUTES = Sidecar(
    "the OIP model routes", "rtserve.oip", "oip-routes.pid", "oip_routes.log",
    lambda ts, effective: ["--listen", effective[OIP_KEY], "--run-dir", str(ts.run_dir),
                           "--model-store", str(ts.model_store), "--models", *ts.models])
SIDECARS = (EXPORTER, OIP_ROUTES)


def free_ports(count: int) -> list[int]:
    """Reserve ``count`` distinct free loopback TCP ports (released just before use)."""
    socks, ports = [], []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
            ports.append(s.getsockname()[1])
    finally:
        for s in socks:
            s.close()
    return ports


def read_properties(path: str | Path) -> dict[str, str]:
    """Read a Java-style properties file (``key=value`` lines, ``#`` comments)."""
    props: dict[str, str] = {}
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, value = line.split("=", 1)
            props[key.strip()] = value.strip()
    return props


def write_properties(path: str | Path, props: dict[str, str]) -> None:
    """Write ``props`` as a properties file."""
    Path(path).write_text("".join(f"{k}={v}\n" for k, v in props.items()))


def port_overrides(ports: list[int]) -> dict[str, str]:
    """Config overrides that move all six listeners (three HTTP, two gRPC, workers) to ``ports``."""
    inference, management, metrics, grpc_inf, grpc_mgmt, worker = ports
    return {
        "inference_address": f"http://127.0.0.1:{inference}",
        "management_address": f"http://127.0.0.1:{management}",
        "metrics_address": f"http://127.0.0.1:{metrics}",
        "grpc_inference_port": str(grpc_inf),
        "grpc_management_port": str(grpc_mgmt),
        "initial_worker_port": str(worker),
    }


@dataclass
class TorchServe:
    """One TorchServe instance, started from ``config`` with ``overrides``, living in ``run_dir``."""

    run_dir: Path
    model_store: Path
    models: list[str] = field(default_factory=list)
    config: Path = DEFAULT_CONFIG
    overrides: dict[str, str] = field(default_factory=dict)
    #: Passed as ``torchserve --log-config``; None keeps TorchServe's built-in configuration.
    log_config: Path | None = DEFAULT_LOG_CONFIG
    #: How many warm-up lines of the access log the exporter leaves out of the request-duration
    #: histogram: the start's (:meth:`start`); 0 for an exporter started again later.
    warmup_skip: int = field(default=0, init=False, repr=False)

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir).resolve()
        self.model_store = Path(self.model_store).resolve()

    @property
    def props(self) -> dict[str, str]:
        """The effective configuration: the base file, then the model store, then overrides."""
        props = read_properties(self.config)
        props["model_store"] = str(self.model_store)
        metrics_config = props.get("metrics_config")
        if metrics_config and not Path(metrics_config).is_absolute():
            props["metrics_config"] = str((Path(self.config).resolve().parent / metrics_config))
        props.update(self.overrides)
        if PUBLIC_METRICS_KEY in props:  # read back from an effective config
            props["metrics_address"] = props.pop(PUBLIC_METRICS_KEY)
        return props

    @property
    def greedy(self) -> bool:
        """Whether the frontend runs with rtserve's greedy-batching agent (``rtserve_greedy_batching``).

        Raises:
            ServerError: the setting is neither ``true`` nor ``false``.
        """
        value = self.props.get(GREEDY_KEY, "true").strip().lower()
        if value not in ("true", "false"):
            raise ServerError(f"{GREEDY_KEY} must be true or false, not {value!r}")
        return value == "true"

    def effective_props(self, private_metrics_port: int, oip_port: int) -> dict[str, str]:
        """What the frontend is started with: :attr:`props`, with TorchServe's metrics listener
        moved to ``private_metrics_port`` on loopback (:mod:`rtserve.metrics` serves the
        configured address), :mod:`rtserve.oip` on ``oip_port``, and the agent in ``vmargs``:
        it sends the OIP model routes there and, unless ``rtserve_greedy_batching=false``, makes
        batching greedy (no wait for further requests of a batch). ``vmargs`` that load an agent
        already are left as they are.

        Raises:
            ServerError: the agent was not built.
        """
        props = self.props
        greedy = self.greedy
        props[PUBLIC_METRICS_KEY] = props["metrics_address"]
        props["metrics_address"] = f"http://127.0.0.1:{private_metrics_port}"
        props[OIP_KEY] = f"http://127.0.0.1:{oip_port}"
        if "-javaagent:" not in props.get("vmargs", ""):
            if not AGENT_JAR.is_file():
                raise ServerError(f"{AGENT_JAR} is missing (greedy batching, the OIP model "
                                  "routes): build it with `make agent`")
            options = ",".join([f"oip={props[OIP_KEY]}"] + ([] if greedy else ["greedy=off"]))
            props["vmargs"] = f"{props.get('vmargs', '')} -javaagent:{AGENT_JAR}={options}".strip()
        return props

    @property
    def model_names(self) -> list[str]:
        """The names of the models loaded at start (``NAME=FILE.mar`` -> ``NAME``)."""
        return [m.split("=", 1)[0] for m in self.models]

    @property
    def warmup(self) -> WarmupConfig:
        """The warm-up :meth:`wait_ready` gives each model (``rtserve_warmup_*`` settings).

        Raises:
            ServerError: a setting is invalid.
        """
        try:
            return WarmupConfig.from_props(self.props)
        except WarmupError as exc:
            raise ServerError(str(exc)) from exc

    @property
    def key_file(self) -> Path:
        """Where TorchServe writes its token keys (its working directory)."""
        return self.run_dir / "key_file.json"

    @property
    def log_dir(self) -> Path:
        """TorchServe's logs (ts_log.log, model_log.log, access_log.log, ...)."""
        return self.run_dir / "logs"

    def client(self, **kwargs) -> Client:
        """A client for this instance's APIs, reading its key file."""
        props = self.props
        return Client(
            props["inference_address"], props["management_address"],
            key_file=self.key_file, metrics_url=props.get("metrics_address"), **kwargs,
        )

    @property
    def metrics_dir(self) -> Path:
        """The workers' metrics files (``PROMETHEUS_MULTIPROC_DIR``): ``$RTSERVE_METRICS_DIR``,
        else a directory of this run directory's own in shared memory, else ``RUN_DIR/metrics``."""
        if os.environ.get("RTSERVE_METRICS_DIR"):
            return Path(os.environ["RTSERVE_METRICS_DIR"])
        if SHARED_MEMORY.is_dir() and os.access(SHARED_MEMORY, os.W_OK):
            digest = hashlib.sha256(str(self.run_dir).encode()).hexdigest()[:16]
            return SHARED_MEMORY / f"rtserve-metrics-{os.getuid()}-{digest}"
        return self.run_dir / METRICS_DIR

    def _env(self, warmup_key: str) -> dict[str, str]:
        tmp = self.run_dir / "tmp"
        env = dict(os.environ)
        env.update(TMPDIR=str(tmp), TEMP=str(tmp), LOG_LOCATION=str(self.log_dir),
                   METRICS_LOCATION=str(self.log_dir), PROMETHEUS_MULTIPROC_DIR=str(self.metrics_dir))
        env[KEY_ENV] = warmup_key
        return env

    def sidecar_pid(self, sidecar: Sidecar) -> int | None:
        """A sidecar's PID, if it is running."""
        try:
            pid = int((self.run_dir / sidecar.pid_file).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def exporter_pid(self) -> int | None:
        """The metrics exporter's PID, if it is running."""
        return self.sidecar_pid(EXPORTER)

    def start_sidecar(self, sidecar: Sidecar) -> None:
        """Start ``sidecar`` with this instance's effective config, in its own session."""
        effective = read_properties(self.run_dir / "config.properties")
        with open(self.log_dir / sidecar.log, "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", sidecar.module, *sidecar.args(self, effective)],
                cwd=REPO, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        (self.run_dir / sidecar.pid_file).write_text(str(proc.pid))

    def start_sidecars(self) -> None:
        """Start every sidecar (:data:`SIDECARS`)."""
        for sidecar in SIDECARS:
            self.start_sidecar(sidecar)

    def stop_sidecars(self, timeout: float = 5.0) -> None:
        """SIGTERM every sidecar (SIGKILL after ``timeout``)."""
        for sidecar in SIDECARS:
            pid = self.sidecar_pid(sidecar)
            if pid is not None:
                terminate(pid, timeout)
            (self.run_dir / sidecar.pid_file).unlink(missing_ok=True)

    def pid(self) -> int | None:
        """The frontend's PID from this instance's private PID file, if it is running."""
        try:
            pid = int((self.run_dir / "tmp" / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def start(self, console: bool = False) -> None:
        """Write the effective config and launch TorchServe in the background.

        Args:
            console: TorchServe's console output goes to this process's stdout/stderr (what a
                container runtime collects) instead of ``launcher.log`` in the run directory.

        Raises:
            ServerError: this run directory already has a running server, a warm-up setting is
                invalid, or the launcher failed.
        """
        warmup = self.warmup  # checked before anything starts
        if self.pid() is not None:
            raise ServerError(f"TorchServe is already running from {self.run_dir} (pid {self.pid()})")
        socket_path = f"{(self.run_dir / 'tmp').resolve()}/.ts.sock.65535"
        if len(socket_path.encode()) > MAX_SOCKET_PATH:
            raise ServerError(
                f"the run directory {self.run_dir} is too deep for TorchServe's worker sockets: "
                f"{socket_path} has {len(socket_path.encode())} bytes, a Unix socket path at most "
                f"{MAX_SOCKET_PATH}; choose a shorter run directory")
        shutil.rmtree(self.log_dir, ignore_errors=True)  # fresh logs: readiness reads them
        shutil.rmtree(self.metrics_dir, ignore_errors=True)  # and fresh counters
        self.stop_sidecars()
        (self.run_dir / "tmp").mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_dir.mkdir(parents=True, exist_ok=True)
        self.key_file.unlink(missing_ok=True)
        # A fresh server starts from its --models again: the old rollout history no longer applies.
        (self.run_dir / HISTORY_FILE).unlink(missing_ok=True)
        draining.clear(self.run_dir)  # nor is it draining
        (self.run_dir / WARM_FILE).unlink(missing_ok=True)  # nor warmed up
        warmup_key = new_key()
        fd = os.open(self.run_dir / KEY_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(warmup_key)
        config = self.run_dir / "config.properties"
        write_properties(config, self.effective_props(*free_ports(2)))
        # the exporter leaves the start's warm-up lines out of the request-duration histogram
        self.warmup_skip = warmup.requests * len(self.models)
        self.start_sidecars()
        cmd = [torchserve_binary(), "--start", "--ncs",
               "--ts-config", str(config), "--model-store", str(self.model_store)]
        if self.log_config is not None:
            cmd += ["--log-config", str(Path(self.log_config).resolve())]
        if self.models:
            cmd += ["--models", *self.models]
        if console:
            rc = subprocess.call(cmd, cwd=self.run_dir, env=self._env(warmup_key),
                                 stdin=subprocess.DEVNULL, timeout=60)
        else:
            with open(self.run_dir / "launcher.log", "wb") as out:
                rc = subprocess.call(cmd, cwd=self.run_dir, env=self._env(warmup_key),
                                     stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, timeout=60)
        if rc != 0:
            self.stop_sidecars()
            raise ServerError(f"torchserve --start exited {rc}:\n{self.log_tail()}")

    def wait_ready(self, timeout: float = 120.0, models: list[str] | None = None) -> float:
        """Poll until ``/ping`` is healthy and every model in ``models`` answers a prediction,
        then, once per start, warm each one up (:mod:`rtserve.warmup`) and mark the server
        warm (``RUN_DIR/warm``, which the pod's readiness probe waits for).

        Returns:
            Seconds waited.

        Raises:
            ServerError: the process died, the timeout passed (the log tail is in the message)
                or a warm-up answer was wrong.
        """
        started = time.monotonic()
        deadline = started + timeout
        client = self.client(timeout=5.0, retries=0)
        pending = list(models or [])
        last = "no answer yet"
        while time.monotonic() < deadline:
            if self.pid() is None and time.monotonic() - started > 5:
                raise ServerError(f"TorchServe exited during start-up:\n{self.log_tail()}")
            if self.worker_deaths() >= WORKER_DEATHS_FATAL:
                raise ServerError(f"model workers keep dying while loading:\n{self.log_tail()}")
            try:
                if self.key_file.exists() and client.ping():
                    while pending:
                        if not workers_ready(client, pending[0]):
                            raise TorchServeError(f"{pending[0]}: workers still starting")
                        probe_prediction(client, pending[0])
                        pending.pop(0)
                    self._warm_up(client, models or [])
                    return time.monotonic() - started
            except (TorchServeError, OSError) as exc:
                last = str(exc)
            time.sleep(0.25)
        raise ServerError(f"TorchServe not ready after {timeout:.0f}s ({last}):\n{self.log_tail()}")

    def _warm_up(self, client: Client, models: list[str]) -> None:
        """Warm up ``models`` unless this start already was; then write ``RUN_DIR/warm``.

        Raises:
            ServerError: a warm-up answer was wrong, or a setting is invalid.
        """
        warm = self.run_dir / WARM_FILE
        if warm.exists():
            return
        config = self.warmup
        try:
            key = (self.run_dir / KEY_FILE).read_text().strip()
        except OSError:  # a server this code did not start: its workers have no key either
            key = ""
        archives = dict(m.split("=", 1) for m in self.models if "=" in m)
        for model in models if key and config.requests else []:
            if model not in archives:
                logger.info("%s: no archive given at start, so no golden rows: not warmed up", model)
                continue
            try:
                report = warm_up(client, model, key, Rows.from_mar(self.model_store / archives[model]),
                                 config)
            except (WarmupError, TorchServeError, OSError) as exc:
                raise ServerError(f"warm-up of {model} failed: {exc}\n{self.log_tail()}") from exc
            logger.info("warmed up %s: %d requests (%d connections) in %.2fs", model,
                        report.requests, report.connections, report.seconds)
        warm.write_text(f"{time.time():.3f}\n")

    @property
    def draining(self) -> bool:
        """Whether this instance is draining: the marker ``RUN_DIR/draining`` exists, and a
        readiness check must then say not ready (see :mod:`rtserve.drain`)."""
        return draining.is_draining(self.run_dir)

    def drain(self, timeout: float = 30.0, quiet: float = 1.0, min_wait: float = 0.0) -> DrainReport:
        """Mark this instance not ready, then wait until no request arrives, is queued or runs.

        See :func:`rtserve.drain.wait_idle` for the arguments. The process keeps running.

        Raises:
            ServerError: the instance is not running.
        """
        pid = self.pid()
        if pid is None:
            raise ServerError(f"no TorchServe running from {self.run_dir}: nothing to drain")
        return draining.drain(self.client(timeout=5.0, retries=1), self.run_dir, self.log_dir,
                              pid, timeout=timeout, quiet=quiet, min_wait=min_wait)

    def stop(self, timeout: float = 60.0, drain: bool = False) -> DrainReport | None:
        """Stop this instance (SIGTERM to its frontend PID, then SIGKILL after ``timeout``).

        With ``drain``, first :meth:`drain` with its defaults (in-flight and queued requests
        finish; TorchServe's own SIGTERM drops them) and return its report.
        """
        pid = self.pid()
        if pid is None:
            self.stop_sidecars()
            return None
        report = self.drain() if drain else None
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            logger.warning("TorchServe pid %d ignored SIGTERM for %.0fs; killing it", pid, timeout)
            _kill_tree(pid)
        (self.run_dir / "tmp" / PID_FILE).unlink(missing_ok=True)
        self.key_file.unlink(missing_ok=True)
        self.stop_sidecars()
        if self.metrics_dir.parent == SHARED_MEMORY:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)  # memory, not a record
        return report

    def worker_deaths(self) -> int:
        """How many times a backend worker died so far (from model_log.log)."""
        path = self.log_dir / "model_log.log"
        try:
            return path.read_text(errors="replace").count("Backend worker process died")
        except OSError:
            return 0

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the launcher output and TorchServe's main log."""
        parts = []
        for path in (self.run_dir / "launcher.log", self.log_dir / "ts_log.log",
                     self.log_dir / "model_log.log"):
            if path.exists():
                text = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {path.relative_to(self.run_dir)} ---\n" + "\n".join(text))
        return "\n".join(parts) or "(no logs)"


def torchserve_binary() -> str:
    """The ``torchserve`` launcher of this interpreter's environment: beside ``sys.executable``
    (a virtualenv's bin/, as in the image), else the one on ``PATH``.

    Raises:
        ServerError: neither exists.
    """
    beside = Path(sys.executable).with_name("torchserve")
    if beside.is_file():
        return str(beside)
    found = shutil.which("torchserve")
    if found is None:
        raise ServerError(f"no torchserve beside {sys.executable} nor on PATH: install "
                          "requirements.txt into this interpreter's environment")
    return found


def workers_ready(client: Client, model: str, version: str | None = None) -> bool:
    """Whether the model's (default) version has at least ``minWorkers`` workers READY."""
    desc = client.describe(model, version)[0]
    ready = sum(1 for w in desc.get("workers", []) if w.get("status") == "READY")
    return ready >= max(1, int(desc.get("minWorkers", 1)))


def sample_payload(n_features: int = 32) -> dict:
    """A valid request body (the demo's payload shape) used for readiness checks."""
    return {"features": [0.0] * n_features}


#: How the handler names a model's feature count when a request has the wrong one.
_EXPECTED_COUNT = re.compile(r"'features' must have exactly (\d+) numbers")


def probe_prediction(client: Client, model: str) -> dict:
    """One prediction of all-zero features from ``model``, whatever its feature count: the
    demo's 32 first; a model with another count answers 400 naming it, and gets that many.

    Raises:
        TorchServeError: the model did not answer a prediction.
    """
    try:
        return client.predict(model, sample_payload())
    except TorchServeError as exc:
        found = _EXPECTED_COUNT.search(str(exc)) if exc.status == 400 else None
        if found is None:
            raise
        return client.predict(model, sample_payload(int(found.group(1))))


def run_foreground(server: TorchServe, stop_timeout: float = 15.0, poll: float = 1.0,
                   on_poll: Callable[[], object] | None = None) -> int:
    """Run TorchServe until SIGTERM/SIGINT, then stop it gracefully (a container's main process).

    ``torchserve --foreground`` is unfit for a container: the launcher dies on SIGTERM without
    stopping Java, and as PID 1 it ignores SIGTERM altogether. This starts TorchServe, forwards
    the first SIGTERM/SIGINT as :meth:`TorchServe.stop` (SIGTERM to the frontend, SIGKILL after
    ``stop_timeout``) and returns 0; it returns 1 if TorchServe exits on its own, so the
    container restarts. ``on_poll`` runs after the start and then every ``poll`` seconds (the
    pod's gateway key sync, :meth:`rtserve.gateway.KeySync.sync`); its errors are logged.
    Beside it, a thread waits for the models to answer and warms them up
    (:meth:`TorchServe.wait_ready`): the pod's readiness probe passes only after that.

    Returns:
        The process exit status.
    """
    stopping = threading.Event()

    def _on_signal(signum: int, _frame) -> None:
        logger.info("received signal %d: stopping TorchServe", signum)
        stopping.set()

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGINT, _on_signal)
    # A restarted container (e.g. after a failed liveness probe, which runs preStop too) keeps
    # its emptyDir: start() clears the previous drain marker, or it would never be ready again.
    try:
        server.start(console=True)
    except ServerError as exc:
        logger.error("%s", exc)
        return 1
    logger.info("TorchServe started (pid %s) from %s", server.pid(), server.run_dir)
    threading.Thread(target=_ready_in_background, args=(server, stopping), daemon=True,
                     name="rtserve-warm-up").start()
    while True:
        if on_poll is not None:
            try:
                on_poll()
            except Exception:  # noqa: BLE001 - the server keeps running; the log says why
                logger.exception("gateway key sync failed")
        if stopping.wait(poll):
            break
        if server.pid() is None:
            logger.error("TorchServe exited on its own:\n%s", server.log_tail())
            server.stop_sidecars()
            return 1
        for sidecar in SIDECARS:
            if server.sidecar_pid(sidecar) is None:
                logger.error("%s exited: starting it again", sidecar.name)
                server.warmup_skip = 0  # an exporter started again reads the log from its end
                server.start_sidecar(sidecar)
    server.stop(stop_timeout)
    logger.info("TorchServe stopped")
    return 0


def _ready_in_background(server: TorchServe, stopping: threading.Event, pause: float = 5.0) -> None:
    """:meth:`TorchServe.wait_ready` (with the warm-up) for a server run in the foreground,
    tried again after each failure until it succeeds or the server is stopping."""
    while not stopping.is_set():
        try:
            waited = server.wait_ready(models=server.model_names)
        except ServerError as exc:
            logger.error("not ready yet (trying again in %.0fs): %s", pause, exc)
            stopping.wait(pause)
            continue
        logger.info("TorchServe ready and warmed up (waited %.1fs)", waited)
        return


def _alive(pid: int) -> bool:
    try:
        import psutil

        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE
    except Exception:  # noqa: BLE001 - gone, or not ours to inspect: not running for us
        return False


def terminate(pid: int, timeout: float) -> None:
    """SIGTERM ``pid``; SIGKILL it if it is still alive after ``timeout`` seconds."""
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)


def _kill_tree(pid: int) -> None:
    import psutil

    try:
        parent = psutil.Process(pid)
        for child in parent.children(recursive=True):
            child.kill()
        parent.kill()
    except psutil.Error:
        pass


def main(argv: list[str] | None = None) -> int:
    """Command-line entry used by the Makefile, the container (``run``) and preStop (``drain``)."""
    parser = argparse.ArgumentParser(description="Start, run, drain or stop a TorchServe instance.")
    parser.add_argument("action", choices=["start", "stop", "status", "drain", "run"],
                        help="run: stay in the foreground until SIGTERM (container entry point)")
    parser.add_argument("--run-dir", type=Path,
                        default=Path(os.environ.get("RTSERVE_RUN_DIR", REPO / ".run")))
    parser.add_argument("--model-store", type=Path,
                        default=Path(os.environ.get("RTSERVE_MODEL_STORE", REPO / "model_store")))
    parser.add_argument("--config", type=Path, default=os.environ.get("RTSERVE_CONFIG"),
                        help="default: config.properties (start, run); the run dir's copy (others)")
    parser.add_argument("--models", nargs="*", default=os.environ.get("RTSERVE_MODELS", "").split(),
                        help="NAME=FILE.mar to load at start (default: $RTSERVE_MODELS)")
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--stop-timeout", type=float, default=15.0,
                        help="run: seconds TorchServe gets to stop after SIGTERM before SIGKILL")
    parser.add_argument("--drain", action="store_true",
                        help="stop: drain first (not ready, wait until idle), then SIGTERM")
    parser.add_argument("--drain-timeout", type=float, default=30.0,
                        help="drain: give up waiting after this many seconds")
    parser.add_argument("--quiet", type=float, default=1.0,
                        help="drain: seconds with no arrival, queued or running request")
    parser.add_argument("--min-wait", type=float, default=0.0,
                        help="drain: wait at least this long (readiness propagation)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    config = args.config
    if config is None:
        # A running instance is reached through the effective config it was started with.
        effective = args.run_dir / "config.properties"
        starting = args.action in ("start", "run")
        config = effective if not starting and effective.exists() else DEFAULT_CONFIG
    server = TorchServe(args.run_dir, args.model_store, args.models, Path(config))
    if args.action == "run":
        keysync = gateway.from_env(args.run_dir)  # the pod's nginx gateway, if it has one
        return run_foreground(server, args.stop_timeout, on_poll=keysync.sync if keysync else None)
    if args.action in ("stop", "drain"):
        pid = server.pid()
        if pid is None:
            logger.info("TorchServe is not running.")
            return 0
        report = server.drain(args.drain_timeout, args.quiet, args.min_wait) \
            if args.action == "drain" or args.drain else None
        if args.action == "stop":
            server.stop()
            logger.info("TorchServe stopped (pid %s).", pid)
        return 0 if report is None or report.drained else 1
    if args.action == "status":
        pid = server.pid()
        logger.info("running (pid %d)%s" % (pid, ", draining" if server.draining else "")
                    if pid else "not running")
        return 0 if pid else 1
    try:
        server.start()
        waited = server.wait_ready(args.timeout, server.model_names)
    except ServerError as exc:
        logger.error("%s", exc)
        server.stop()
        return 1
    props = server.props
    logger.info("TorchServe ready in %.1fs (pid %d), logs in %s", waited, server.pid(), server.log_dir)
    logger.info("  inference:  %s", props["inference_address"])
    logger.info("  management: %s", props["management_address"])
    logger.info("  metrics:    %s", props["metrics_address"])
    logger.info("  keys:       %s", server.key_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
