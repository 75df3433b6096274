"""Start, wait for and stop a TorchServe instance in its own run directory.

The one start-up path of ``make serve``, the tests and the pod. Each instance's run directory holds its effective
``config.properties``, ``key_file.json``, ``logs/`` and a private temp directory, so several can run side by side.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path

from handler.inputs import DEFAULT_MAX_INSTANCES, largest_body
from handler.records import SPOOL_DIR_ENV
from handler.warmup import KEY_ENV
from rtserve.client.rest import Client, TorchServeError
from rtserve.errors import ArchiveError, DiskBudgetError, PortInUseError, ServerError, WrongAnswers
from rtserve.model.archive import read_archive
from rtserve.runtime.logs import backup, read_rotated
from rtserve.runtime.ports import free_ports
from rtserve.runtime.process import PidFile, last_lines, spawn, stop_recorded, tail, terminate, wait_until
from rtserve.server import drain as draining
from rtserve.server.disk import BUDGET_KEY, CONSOLE_ENV, DiskBudget
from rtserve.server.drain import DrainReport
from rtserve.server.properties import (  # noqa: F401 - GREEDY_KEY re-exported
    GREEDY_KEY,
    OIP_KEY,
    PUBLIC_METRICS_KEY,
    RECORDS_KEYSPACE_KEY,
    RECORDS_STORE_KEY,
    RECORDS_TTL_KEY,
    configured,
    effective_props,
    greedy,
    read_properties,
    write_properties,
)
from rtserve.server.readiness import probe_prediction, workers_ready
from rtserve.server.startup import bind_failure, exit_reason, listener_ports
from rtserve.server.warmup import Rows, WarmupConfig, WarmupError, WarmupReport, new_key, warm_up
from rtserve.settings import CANARY_WATCHER_MARKS, PACKAGE_HOME, RunDir, Settings, log_config

logger = logging.getLogger(__name__)

#: TorchServe's own ``max_request_size`` (6.5 MB) where the config sets none, and its key.
TORCHSERVE_MAX_REQUEST, MAX_REQUEST_KEY = 6553500, "max_request_size"
#: The config.properties a server starts from unless told otherwise (the checkout's).
DEFAULT_CONFIG = PACKAGE_HOME / "config.properties"
#: rtserve's log4j2 configuration for the frontend: access, model, metrics and error logs without
#: TorchServe's per-request DEBUG/INFO chatter (see the file's header; a package resource).
DEFAULT_LOG_CONFIG = log_config()
#: The longest Unix socket path (sun_path is 108 bytes with its NUL): each worker listens on
#: ``$TMPDIR/.ts.sock.<port>``, and TorchServe's workers die at start when it is longer.
MAX_SOCKET_PATH = 107
#: The workers' metrics files (PROMETHEUS_MULTIPROC_DIR) live in shared memory when the machine
#: (or container) has it: every metric update is a write into a memory-mapped file, and on a disk
#: file system a page written back to disk faults on its next write (prometheus_client's docs
#: advise a tmpfs too). Otherwise, and with RTSERVE_METRICS_DIR unset, RUN_DIR/metrics.
SHARED_MEMORY = Path("/dev/shm")
#: A model whose workers died this often during start-up is not going to load: fail fast.
WORKER_DEATHS_FATAL = 4
#: Seconds the records shipper has to ship what is left when the server stops.
SHIPPER_STOP_SECONDS = 20.0


def records_options(props: dict[str, str]) -> list[str]:
    """The shipper's store options from the server's settings (none without a store)."""
    store = props.get(RECORDS_STORE_KEY, "").strip()
    if not store:
        return ["--stop-seconds", str(SHIPPER_STOP_SECONDS)]
    return [
        "--store",
        store,
        "--keyspace",
        props.get(RECORDS_KEYSPACE_KEY, "").strip() or "rtserve",
        "--ttl-days",
        props.get(RECORDS_TTL_KEY, "").strip() or "30",
        "--stop-seconds",
        str(SHIPPER_STOP_SECONDS),
    ]


@dataclass(frozen=True)
class Sidecar:
    """A Python process rtserve runs beside the frontend, started after its effective config and stopped with it.

    It runs in its own session, its output and PID in files of the run directory; ``python -m rtserve server run``
    starts it again if it exits.

    Attributes:
        name: for log lines.
        command: run as ``python -m rtserve <command>``.
        pid_file: its PID file, of the server's :class:`~rtserve.settings.RunDir`.
        log: its output file, of the server's :class:`~rtserve.settings.RunDir`.
        args: its arguments, from the server and its effective config.
    """

    name: str
    command: tuple[str, ...]
    pid_file: Callable[[RunDir], Path]
    log: Callable[[RunDir], Path]
    args: Callable[[TorchServe, dict[str, str]], list[str]]
    #: It writes metrics into the workers' multiprocess directory (PROMETHEUS_MULTIPROC_DIR).
    multiproc: bool = False
    #: Seconds it gets to stop after SIGTERM before SIGKILL.
    stop_timeout: float = 5.0


#: The metrics exporter (rtserve.observability.exporter) on the public metrics address:
#: TorchServe's metrics and the workers' own; it also keeps the workers' metrics directory and
#: the output files within the disk budget.
EXPORTER = Sidecar(
    "the metrics exporter",
    ("server", "exporter"),
    attrgetter("exporter_pid"),
    attrgetter("exporter_log"),
    lambda ts, effective: [
        "--listen",
        effective[PUBLIC_METRICS_KEY],
        "--upstream",
        effective["metrics_address"],
        "--dir",
        str(ts.metrics_dir),
        "--access-log",
        str(ts.files.access_log),
        "--warmup-requests",
        str(ts.warmup_skip),
        "--output-bytes",
        str(ts.budget.shares().output_file),
        "--outputs",
        *map(str, ts.output_files),
    ],
)
#: The OIP model metadata and readiness routes (rtserve.server.oip) the agent sends to it.
OIP_ROUTES = Sidecar(
    "the OIP model routes",
    ("server", "oip"),
    attrgetter("oip_pid"),
    attrgetter("oip_log"),
    lambda ts, effective: [
        "--listen",
        effective[OIP_KEY],
        "--run-dir",
        str(ts.run_dir),
        "--model-store",
        str(ts.model_store),
        "--models",
        *ts.models,
    ],
)
#: The records shipper (rtserve.records.shipper): the spool's records to the store, when one is
#: set (``rtserve_records_store``), else it only makes room in the spool. On SIGTERM it ships
#: what is left; the server stops it after TorchServe, so nothing is added meanwhile.
SHIPPER = Sidecar(
    "the records shipper",
    ("records", "ship"),
    attrgetter("shipper_pid"),
    attrgetter("shipper_log"),
    lambda ts, effective: [
        "--spool",
        str(ts.files.records),
        "--budget",
        str(ts.budget.shares().spool),
        *records_options(effective),
    ],
    multiproc=True,
    stop_timeout=SHIPPER_STOP_SECONDS + 5.0,
)
SIDECARS = (EXPORTER, OIP_ROUTES, SHIPPER)


@dataclass
class TorchServe:
    """One TorchServe instance, started from ``config`` with ``overrides``, living in ``run_dir``."""

    run_dir: Path
    model_store: Path
    models: list[str] = field(default_factory=list)
    #: The config.properties to start from (default: the checkout's, :data:`DEFAULT_CONFIG`).
    config: Path | None = None
    overrides: dict[str, str] = field(default_factory=dict)
    #: Passed as ``torchserve --log-config``; None keeps TorchServe's built-in configuration.
    log_config: Path | None = DEFAULT_LOG_CONFIG
    #: The checkout, the agent, the workers' metrics files, the records store, the run volume's
    #: limit: built by the caller (a command: ``Settings.from_env()``); else the checkout's defaults.
    settings: Settings = field(default_factory=Settings)
    #: How many warm-up lines of the access log the exporter leaves out of the request-duration
    #: histogram: the start's (:meth:`start`); 0 for an exporter started again later.
    warmup_skip: int = field(default=0, init=False, repr=False)
    #: What each model's warm-up of the last start did (its report), by model name.
    warmed: dict[str, WarmupReport] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir).resolve()
        self.model_store = Path(self.model_store).resolve()
        self.config = Path(self.config) if self.config else self.settings.home / "config.properties"
        self.files = RunDir(self.run_dir)
        self._pid_file = PidFile(self.files.frontend_pid)

    @property
    def props(self) -> dict[str, str]:
        """The effective configuration: the base file, then the model store, then overrides.

        ``$RTSERVE_RECORDS_STORE`` first: the pod's ConfigMap.
        """
        store = self.settings.records_store
        overrides = {RECORDS_STORE_KEY: store, **self.overrides} if store else self.overrides
        return configured(self.config, self.model_store, overrides)

    @property
    def greedy(self) -> bool:
        """Whether the frontend runs with rtserve's greedy-batching agent (``rtserve_greedy_batching``).

        Raises:
            ServerError: the setting is neither ``true`` nor ``false``.
        """
        return greedy(self.props)

    def effective_props(self, private_metrics_port: int, oip_port: int) -> dict[str, str]:
        """What the frontend is started with.

        :func:`rtserve.server.properties.effective_props` of :attr:`props`, with the agent of :attr:`settings`.

        Raises:
            ServerError: the agent was not built.
        """
        props = effective_props(
            self.props,
            private_metrics_port,
            oip_port,
            self.settings.agent_jar,
            self.run_dir,
            self.budget.shares().live_log,
        )
        props[BUDGET_KEY] = str(self.budget.total)  # resolved: what later commands read back
        props[MAX_REQUEST_KEY] = str(self.request_limit(props))
        return props

    def request_limit(self, props: dict[str, str]) -> int:
        """``max_request_size``: the configured one, raised to what the largest model loaded at start needs.

        A model's need follows from its signature (:func:`handler.inputs.largest_body`: its numbers per
        row, ``handler.max_instances`` rows), so a model with large inputs (images, long sequences) is
        not refused whole by a limit sized for the demo. An archive that cannot be read is left to
        the frontend, which refuses it by name.
        """
        limit = int(props.get(MAX_REQUEST_KEY, TORCHSERVE_MAX_REQUEST))
        for spec in self.models:
            if "=" not in spec:
                continue
            try:
                width = read_archive(self.model_store / spec.split("=", 1)[1]).n_features
            except ArchiveError:
                continue
            limit = max(limit, largest_body(width, DEFAULT_MAX_INSTANCES))
        return limit

    @property
    def budget(self) -> DiskBudget:
        """The disk budget of this server's files (:mod:`rtserve.server.disk`).

        Raises:
            DiskBudgetError: ``rtserve_disk_budget`` or ``RTSERVE_RUN_VOLUME_LIMIT`` is not a
                size, or the budget is too small.
        """
        return DiskBudget.resolve(self.props, self.settings)

    @property
    def output_files(self) -> list[Path]:
        """The processes' output files the exporter caps.

        :attr:`RunDir.output_files`: the launcher's, each sidecar's, the canary watcher's.
        """
        return list(self.files.output_files)

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
        return self.files.key_file

    @property
    def log_dir(self) -> Path:
        """TorchServe's logs (ts_log.log, model_log.log, access_log.log, ...)."""
        return self.files.logs

    def client(self, **kwargs) -> Client:
        """A client for this instance's APIs, reading its key file."""
        props = self.props
        return Client(
            props["inference_address"],
            props["management_address"],
            key_file=self.key_file,
            metrics_url=props.get("metrics_address"),
            **kwargs,
        )

    @property
    def metrics_dir(self) -> Path:
        """The workers' metrics files (``PROMETHEUS_MULTIPROC_DIR``).

        ``$RTSERVE_METRICS_DIR``, else a directory of this run directory's own in shared memory, else
        ``RUN_DIR/metrics``.
        """
        if self.settings.metrics_dir is not None:
            return self.settings.metrics_dir
        if SHARED_MEMORY.is_dir() and os.access(SHARED_MEMORY, os.W_OK):
            digest = hashlib.sha256(str(self.run_dir).encode()).hexdigest()[:16]
            return SHARED_MEMORY / f"rtserve-metrics-{os.getuid()}-{digest}"
        return self.files.metrics

    def _env(self, warmup_key: str, console: bool = False) -> dict[str, str]:
        tmp = self.files.tmp
        env = dict(os.environ)  # the child's environment: this one's, then the server's values
        env.update(
            TMPDIR=str(tmp),
            TEMP=str(tmp),
            LOG_LOCATION=str(self.log_dir),
            METRICS_LOCATION=str(self.log_dir),
            PROMETHEUS_MULTIPROC_DIR=str(self.metrics_dir),
        )
        env.update(self.budget.env())  # the log files' roll size, the records spool's share
        env[SPOOL_DIR_ENV] = str(self.files.records)
        env[CONSOLE_ENV] = "INFO" if console else "OFF"
        env[KEY_ENV] = warmup_key
        return env

    def sidecar_pid(self, sidecar: Sidecar) -> int | None:
        """A sidecar's PID, if it is running."""
        return PidFile(sidecar.pid_file(self.files)).pid()

    def exporter_pid(self) -> int | None:
        """The metrics exporter's PID, if it is running."""
        return self.sidecar_pid(EXPORTER)

    def start_sidecar(self, sidecar: Sidecar) -> None:
        """Start ``sidecar`` with this instance's effective config, in its own session."""
        effective = read_properties(self.files.config)
        env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(self.metrics_dir)} if sidecar.multiproc else None
        spawn(
            [sys.executable, "-m", "rtserve", *sidecar.command, *sidecar.args(self, effective)],
            sidecar.log(self.files),
            PidFile(sidecar.pid_file(self.files)),
            cwd=PACKAGE_HOME,
            env=env,
        )

    def start_sidecars(self) -> None:
        """Start every sidecar (:data:`SIDECARS`)."""
        for sidecar in SIDECARS:
            self.start_sidecar(sidecar)

    def stop_sidecars(self) -> None:
        """SIGTERM every sidecar (SIGKILL after its ``stop_timeout``)."""
        for sidecar in SIDECARS:
            pid = self.sidecar_pid(sidecar)
            if pid is not None:
                terminate(pid, sidecar.stop_timeout)
            PidFile(sidecar.pid_file(self.files)).remove()

    def stop_canary_watcher(self) -> None:
        """Stop the canary watcher of this run directory, if one runs (by its PID file, :attr:`RunDir.canary_pid`).

        It watches this server's live log only.
        """
        pid = stop_recorded(self.files.canary_pid, CANARY_WATCHER_MARKS, timeout=5.0)
        if pid is not None:
            logger.info("canary watcher %d stopped", pid)

    def pid(self) -> int | None:
        """The frontend's PID from this instance's private PID file, if it is running."""
        return self._pid_file.pid()

    def start(self, console: bool = False) -> None:
        """Write the effective config and launch TorchServe in the background.

        Args:
            console: TorchServe's console output goes to this process's stdout/stderr (what a
                container runtime collects) instead of ``launcher.log`` in the run directory,
                and ts_log.log's lines go there too (less the two per batch).

        Raises:
            ServerError: this run directory already has a running server, a warm-up setting is
                invalid, or the launcher failed.
            DiskBudgetError: the disk budget is not a size, is too small, or cannot hold the
                archives unpacked.
        """
        warmup = self.warmup  # checked before anything starts
        self.budget.check_tmp([self.model_store / m.split("=", 1)[1] for m in self.models if "=" in m])
        if self.pid() is not None:
            raise ServerError(f"TorchServe is already running from {self.run_dir} (pid {self.pid()})")
        socket_path = f"{(self.run_dir / 'tmp').resolve()}/.ts.sock.65535"
        if len(socket_path.encode()) > MAX_SOCKET_PATH:
            raise ServerError(
                f"the run directory {self.run_dir} is too deep for TorchServe's worker sockets: "
                f"{socket_path} has {len(socket_path.encode())} bytes, a Unix socket path at most "
                f"{MAX_SOCKET_PATH}; choose a shorter run directory"
            )
        shutil.rmtree(self.log_dir, ignore_errors=True)  # fresh logs: readiness reads them
        shutil.rmtree(self.metrics_dir, ignore_errors=True)  # and fresh counters
        self.stop_sidecars()
        self.files.tmp.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_dir.mkdir(parents=True, exist_ok=True)
        self.key_file.unlink(missing_ok=True)
        # A fresh server starts from its --models again: the old rollout history no longer applies,
        # nor do the old live routes (a candidate it may not have), their log and report, nor a
        # canary watcher left behind.
        self.files.history.unlink(missing_ok=True)
        self.stop_canary_watcher()
        for stale in (self.files.live_routes, self.files.live_log, self.files.shadow_report):
            stale.unlink(missing_ok=True)
        draining.clear(self.run_dir)  # nor is it draining
        self.files.warm.unlink(missing_ok=True)  # nor warmed up
        warmup_key = new_key()
        fd = os.open(self.files.warmup_key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(warmup_key)
        config = self.files.config
        # the private metrics and OIP listeners on ports no configured listener uses
        private = free_ports(2, exclude=listener_ports(self.props))
        write_properties(config, self.effective_props(*private))
        # the exporter leaves the start's warm-up lines out of the request-duration histogram
        self.warmup_skip = warmup.requests * len(self.models)
        self.start_sidecars()
        cmd = [
            torchserve_binary(),
            "--start",
            "--ncs",
            "--ts-config",
            str(config),
            "--model-store",
            str(self.model_store),
        ]
        if self.log_config is not None:
            cmd += ["--log-config", str(Path(self.log_config).resolve())]
        if self.models:
            cmd += ["--models", *self.models]
        if console:
            rc = subprocess.call(
                cmd, cwd=self.run_dir, env=self._env(warmup_key, console=True), stdin=subprocess.DEVNULL, timeout=60
            )
        else:
            launcher = self.files.launcher_log
            for old in (launcher, backup(launcher)):
                old.unlink(missing_ok=True)
            # appended to (O_APPEND), so that the exporter's copy-truncate leaves no hole
            with open(launcher, "ab") as out:
                rc = subprocess.call(
                    cmd,
                    cwd=self.run_dir,
                    env=self._env(warmup_key),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=60,
                )
        if rc != 0:
            self.stop_sidecars()
            raise ServerError(f"torchserve --start exited {rc}:\n{self.log_tail()}")

    def wait_ready(self, timeout: float = 120.0, models: list[str] | None = None) -> float:
        """Poll until ``/ping`` is healthy and every model in ``models`` answers a prediction, then warm up.

        Once per start, each model is warmed up (:mod:`rtserve.server.warmup`) and the server marked warm
        (``RUN_DIR/warm``, which the pod's readiness probe waits for).

        Returns:
            Seconds waited.

        Raises:
            ServerError: the process died (:meth:`start_failure`), the timeout passed (the log
                tail is in the message) or a warm-up answer was wrong.
        """
        started = time.monotonic()
        client = self.client(timeout=5.0, retries=0)
        pending = list(models or [])
        last = ["no answer yet"]

        def ready() -> bool:
            if self.pid() is None and time.monotonic() - started > 5:
                raise self.start_failure()
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
                    return True
            except (TorchServeError, OSError) as exc:
                last[0] = str(exc)
            return False

        if wait_until(ready, timeout, poll=0.25):
            return time.monotonic() - started
        raise ServerError(f"TorchServe not ready after {timeout:.0f}s ({last[0]}):\n{self.log_tail()}")

    def start_failure(self) -> ServerError:
        """The error for a frontend that exited during start-up, with the log tail.

        It says why when the output does (:func:`rtserve.server.startup.exit_reason`).

        Returns:
            A :class:`PortInUseError` when a listener's port was taken, else a
            :class:`ServerError`.
        """
        output = read_rotated(self.files.launcher_log)
        try:
            props = read_properties(self.files.config)
        except OSError:
            props = {}
        reason = exit_reason(output, props)
        message = f"TorchServe exited during start-up{': ' + reason if reason else ''}\n{self.log_tail()}"
        failure = bind_failure(output)
        if failure is not None and failure.in_use:
            return PortInUseError(message, failure.address, failure.port)
        return ServerError(message)

    def _warm_up(self, client: Client, models: list[str]) -> None:
        """Warm up ``models`` unless this start already was; then write ``RUN_DIR/warm``.

        Raises:
            ServerError: a warm-up answer was wrong, or a setting is invalid.
        """
        warm = self.files.warm
        if warm.exists():
            return
        config = self.warmup
        try:
            key = self.files.warmup_key.read_text().strip()
        except OSError:  # a server this code did not start: its workers have no key either
            key = ""
        archives = dict(m.split("=", 1) for m in self.models if "=" in m)
        for model in models if key and config.requests else []:
            if model not in archives:
                logger.info("%s: no archive given at start, so no golden rows: not warmed up", model)
                continue
            try:
                report = warm_up(client, model, key, Rows.from_mar(self.model_store / archives[model]), config)
            except WrongAnswers:
                raise
            except (WarmupError, TorchServeError, OSError) as exc:
                raise ServerError(f"warm-up of {model} failed: {exc}\n{self.log_tail()}") from exc
            self.warmed[model] = report
            logger.info(
                "warmed up %s: %d requests (%d connections) in %.2fs",
                model,
                report.requests,
                report.connections,
                report.seconds,
            )
        warm.write_text(f"{time.time():.3f}\n")

    @property
    def draining(self) -> bool:
        """Whether this instance is draining.

        The marker ``RUN_DIR/draining`` exists, and a readiness check must then say not ready (see
        :mod:`rtserve.server.drain`).
        """
        return draining.is_draining(self.run_dir)

    def drain(self, timeout: float = 30.0, quiet: float = 1.0, min_wait: float = 0.0) -> DrainReport:
        """Mark this instance not ready, then wait until no request arrives, is queued or runs.

        See :func:`rtserve.server.drain.wait_idle` for the arguments. The process keeps running.

        Raises:
            ServerError: the instance is not running.
        """
        pid = self.pid()
        if pid is None:
            raise ServerError(f"no TorchServe running from {self.run_dir}: nothing to drain")
        return draining.drain(
            self.client(timeout=5.0, retries=1),
            self.run_dir,
            self.log_dir,
            pid,
            timeout=timeout,
            quiet=quiet,
            min_wait=min_wait,
        )

    def stop(self, timeout: float = 60.0, drain: bool = False) -> DrainReport | None:
        """Stop this instance (SIGTERM to its frontend PID, then SIGKILL after ``timeout``).

        With ``drain``, first :meth:`drain` with its defaults (in-flight and queued requests
        finish; TorchServe's own SIGTERM drops them) and return its report.
        """
        pid = self.pid()
        if pid is None:
            self.stop_sidecars()
            self.stop_canary_watcher()
            return None
        report = self.drain() if drain else None
        if terminate(pid, timeout, tree=True, poll=0.1):
            logger.warning("TorchServe pid %d ignored SIGTERM for %.0fs; killed it", pid, timeout)
        self._pid_file.remove()
        self.key_file.unlink(missing_ok=True)
        self.stop_sidecars()
        self.stop_canary_watcher()
        if self.metrics_dir.parent == SHARED_MEMORY:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)  # memory, not a record
        return report

    def worker_deaths(self) -> int:
        """How many times a backend worker died (in what model_log.log and its backup hold)."""
        return read_rotated(self.files.model_log).count("Backend worker process died")

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the launcher output and TorchServe's main logs (with their backups).

        Less ts_log.log's two lines per batch: they would fill the tail, and a pod's output (where the foreground
        runner logs this tail) leaves them out too.
        """
        parts = []
        launcher = self.files.launcher_log
        if launcher.exists():
            parts.append("--- launcher.log ---\n" + tail(launcher, lines))
        for path in (self.files.ts_log, self.files.model_log):
            text = read_rotated(path)
            if path == self.files.ts_log:
                text = draining.without_batch_lines(text)
            if text:
                parts.append(f"--- {path.relative_to(self.run_dir)} ---\n" + last_lines(text, lines))
        return "\n".join(parts) or "(no logs)"


def torchserve_binary() -> str:
    """The ``torchserve`` launcher of this interpreter's environment.

    Beside ``sys.executable`` (a virtualenv's bin/, as in the image), else the one on ``PATH``.

    Raises:
        ServerError: neither exists.
    """
    beside = Path(sys.executable).with_name("torchserve")
    if beside.is_file():
        return str(beside)
    found = shutil.which("torchserve")
    if found is None:
        raise ServerError(
            f"no torchserve beside {sys.executable} nor on PATH: install "
            "requirements.txt into this interpreter's environment"
        )
    return found


def run_foreground(
    server: TorchServe, stop_timeout: float = 15.0, poll: float = 1.0, on_poll: Callable[[], object] | None = None
) -> int:
    """Run TorchServe until SIGTERM/SIGINT, then stop it gracefully (a container's main process).

    ``torchserve --foreground`` is unfit for a container: the launcher dies on SIGTERM without
    stopping Java, and as PID 1 it ignores SIGTERM altogether. This starts TorchServe, forwards
    the first SIGTERM/SIGINT as :meth:`TorchServe.stop` (SIGTERM to the frontend, SIGKILL after
    ``stop_timeout``) and returns 0; it returns 1 if TorchServe exits on its own, so the
    container restarts. ``on_poll`` runs after the start and then every ``poll`` seconds (the
    pod's gateway key sync, :meth:`rtserve.gateway.nginx.KeySync.sync`); its errors are logged.
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
    except (ServerError, DiskBudgetError) as exc:
        logger.error("%s", exc)
        return 1
    logger.info("TorchServe started (pid %s) from %s", server.pid(), server.run_dir)
    wrong = threading.Event()
    threading.Thread(
        target=_ready_in_background, args=(server, stopping, wrong), daemon=True, name="rtserve-warm-up"
    ).start()
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
    return 1 if wrong.is_set() else 0


def _ready_in_background(
    server: TorchServe, stopping: threading.Event, wrong: threading.Event | None = None, pause: float = 5.0
) -> None:
    """:meth:`TorchServe.wait_ready` (with the warm-up) for a server run in the foreground, tried again on failure.

    It is tried until it succeeds or the server is stopping. Wrong answers
    to the golden rows are not tried again: ``wrong`` and ``stopping`` are set, and the process
    exits 1 (a container restarts, and a rollout sees it fail).
    """
    while not stopping.is_set():
        try:
            waited = server.wait_ready(models=server.model_names)
        except WrongAnswers as exc:
            logger.error("%s: stopping (a wrong build never becomes ready)", exc)
            if wrong is not None:
                wrong.set()
            stopping.set()
            return
        except ServerError as exc:
            logger.error("not ready yet (trying again in %.0fs): %s", pause, exc)
            stopping.wait(pause)
            continue
        logger.info("TorchServe ready and warmed up (waited %.1fs)", waited)
        return
