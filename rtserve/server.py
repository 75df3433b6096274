"""Start, wait for and stop a TorchServe instance in its own run directory.

Used by ``make serve`` / ``make stop`` and by the integration tests, so tests exercise the
same start-up path users run. Each instance gets its own run directory holding its effective
``config.properties``, ``key_file.json``, ``logs/`` and a private temp directory (TorchServe
keeps its PID file and worker sockets there), so several instances can run side by side.

    python -m rtserve.server start --run-dir .run --models realtime-classifier=realtime-classifier_1.0.mar
    python -m rtserve.server stop --run-dir .run
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from rtserve.client import Client, TorchServeError
from rtserve.rollout import HISTORY_FILE

logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parent.parent
DEFAULT_CONFIG = REPO / "config.properties"
#: rtserve's log4j2 configuration for the frontend: access, model, metrics and error logs without
#: TorchServe's per-request DEBUG/INFO chatter (see the file's header).
DEFAULT_LOG_CONFIG = REPO / "config" / "log4j2.xml"
PID_FILE = ".model_server.pid"
#: A model whose workers died this often during start-up is not going to load: fail fast.
WORKER_DEATHS_FATAL = 4


class ServerError(RuntimeError):
    """TorchServe did not start, died, or did not become ready in time."""


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

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir).resolve()
        self.model_store = Path(self.model_store).resolve()

    @property
    def props(self) -> dict[str, str]:
        """The effective configuration: the base file, then the model store, then overrides."""
        props = read_properties(self.config)
        props["model_store"] = str(self.model_store)
        props.update(self.overrides)
        return props

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

    def _env(self) -> dict[str, str]:
        tmp = self.run_dir / "tmp"
        env = dict(os.environ)
        env.update(TMPDIR=str(tmp), TEMP=str(tmp), LOG_LOCATION=str(self.log_dir),
                   METRICS_LOCATION=str(self.log_dir))
        return env

    def pid(self) -> int | None:
        """The frontend's PID from this instance's private PID file, if it is running."""
        try:
            pid = int((self.run_dir / "tmp" / PID_FILE).read_text().strip())
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def start(self) -> None:
        """Write the effective config and launch TorchServe in the background.

        Raises:
            ServerError: this run directory already has a running server, or the launcher failed.
        """
        if self.pid() is not None:
            raise ServerError(f"TorchServe is already running from {self.run_dir} (pid {self.pid()})")
        shutil.rmtree(self.log_dir, ignore_errors=True)  # fresh logs: readiness reads them
        (self.run_dir / "tmp").mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.key_file.unlink(missing_ok=True)
        # A fresh server starts from its --models again: the old rollout history no longer applies.
        (self.run_dir / HISTORY_FILE).unlink(missing_ok=True)
        config = self.run_dir / "config.properties"
        write_properties(config, self.props)
        cmd = [str(Path(sys.executable).with_name("torchserve")), "--start", "--ncs",
               "--ts-config", str(config), "--model-store", str(self.model_store)]
        if self.log_config is not None:
            cmd += ["--log-config", str(Path(self.log_config).resolve())]
        if self.models:
            cmd += ["--models", *self.models]
        with open(self.run_dir / "launcher.log", "wb") as out:
            rc = subprocess.call(cmd, cwd=self.run_dir, env=self._env(), stdin=subprocess.DEVNULL,
                                 stdout=out, stderr=subprocess.STDOUT, timeout=60)
        if rc != 0:
            raise ServerError(f"torchserve --start exited {rc}:\n{self.log_tail()}")

    def wait_ready(self, timeout: float = 120.0, models: list[str] | None = None) -> float:
        """Poll until ``/ping`` is healthy and every model in ``models`` answers a prediction.

        Returns:
            Seconds waited.

        Raises:
            ServerError: the process died or the timeout passed (the log tail is in the message).
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
                        client.predict(pending[0], sample_payload())
                        pending.pop(0)
                    return time.monotonic() - started
            except (TorchServeError, OSError) as exc:
                last = str(exc)
            time.sleep(0.25)
        raise ServerError(f"TorchServe not ready after {timeout:.0f}s ({last}):\n{self.log_tail()}")

    def stop(self, timeout: float = 60.0) -> None:
        """Stop this instance (SIGTERM to its frontend PID, then SIGKILL after ``timeout``)."""
        pid = self.pid()
        if pid is None:
            return
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(pid):
            logger.warning("TorchServe pid %d ignored SIGTERM for %.0fs; killing it", pid, timeout)
            _kill_tree(pid)
        (self.run_dir / "tmp" / PID_FILE).unlink(missing_ok=True)
        self.key_file.unlink(missing_ok=True)

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


def workers_ready(client: Client, model: str, version: str | None = None) -> bool:
    """Whether the model's (default) version has at least ``minWorkers`` workers READY."""
    desc = client.describe(model, version)[0]
    ready = sum(1 for w in desc.get("workers", []) if w.get("status") == "READY")
    return ready >= max(1, int(desc.get("minWorkers", 1)))


def sample_payload(n_features: int = 32) -> dict:
    """A valid request body (the seed's payload shape) used for readiness checks."""
    return {"features": [0.0] * n_features}


def _alive(pid: int) -> bool:
    try:
        import psutil

        proc = psutil.Process(pid)
        return proc.status() != psutil.STATUS_ZOMBIE
    except Exception:  # noqa: BLE001 - gone, or not ours to inspect: not running for us
        return False


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
    """Command-line entry used by the Makefile."""
    parser = argparse.ArgumentParser(description="Start or stop a TorchServe instance.")
    parser.add_argument("action", choices=["start", "stop", "status"])
    parser.add_argument("--run-dir", type=Path, default=REPO / ".run")
    parser.add_argument("--model-store", type=Path, default=REPO / "model_store")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--models", nargs="*", default=[], help="NAME=FILE.mar to load at start")
    parser.add_argument("--timeout", type=float, default=120.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    server = TorchServe(args.run_dir, args.model_store, args.models, args.config)
    if args.action == "stop":
        pid = server.pid()
        server.stop()
        logger.info("TorchServe stopped (pid %s)." % pid if pid else "TorchServe is not running.")
        return 0
    if args.action == "status":
        pid = server.pid()
        logger.info("running (pid %d)" % pid if pid else "not running")
        return 0 if pid else 1
    try:
        server.start()
        waited = server.wait_ready(args.timeout, [m.split("=", 1)[0] for m in args.models])
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
