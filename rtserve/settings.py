"""Where rtserve finds its files and keeps its state: resolved once into one typed :class:`Settings`.

Every ``RTSERVE_*`` variable is read here and nowhere else (docs/configuration.md lists them with their defaults); an
empty variable counts as unset. ``HOME`` is the checkout holding this package (``/opt/rtserve`` in the image); files
shipped inside the package are read as package resources (:func:`resource`), not through ``HOME``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from rtserve.errors import SettingsError

#: The checkout holding this package: HOME.
PACKAGE_HOME = Path(__file__).resolve().parent.parent
#: The model the probes ask when none is named.
DEFAULT_MODEL = "realtime-classifier"
#: Where the pod's gateway tokens are mounted (the Secret rtserve-gateway-tokens).
DEFAULT_GATEWAY_TOKENS = Path("/etc/rtserve-gateway-tokens/tokens")

#: The files a server keeps in its run directory (see :class:`RunDir`, which names every one).
EFFECTIVE_CONFIG = "config.properties"
#: TorchServe's token keys (it writes them into its working directory, the run directory).
TORCHSERVE_KEY_FILE = "key_file.json"
#: This start's warm-up key (mode 0600; TorchServe's workers get it in their environment, see
#: :data:`handler.warmup.KEY_ENV`; :mod:`rtserve.server.warmup`).
WARMUP_KEY_FILE = "warmup_key"
#: Created by a drain: readiness is false while it exists (:mod:`rtserve.server.drain`).
DRAIN_FILE = "draining"
#: Written once the server answered and was warmed up since its start
#: (:mod:`rtserve.server.warmup`); the pod's readiness probe passes only when it exists.
WARM_FILE = "warm"
#: The rollout history (:mod:`rtserve.promotion.history`): cleared when a server starts there.
HISTORY_FILE = "rollout-history.jsonl"
#: Live traffic (:mod:`rtserve.promotion.live`): the routes the frontend's agent re-reads (shadow,
#: canary), the agent's log of the candidate's answers, the canary watcher's PID file and output,
#: the last shadow report. (The server passes the routes file to the agent:
#: ``rtserve.server.properties.routes_file``.)
LIVE_ROUTES_FILE = "live-routes.json"
LIVE_LOG_FILE = "live-log.jsonl"
CANARY_PID_FILE = "canary-watcher.pid"
#: What the canary watcher's command line holds (``python -m rtserve live watch ...``): a PID
#: recorded in CANARY_PID_FILE counts only while its process still runs the watcher.
CANARY_WATCHER_MARKS = (b"rtserve", b"watch")
CANARY_LOG_FILE = "canary-watcher.log"
SHADOW_REPORT_FILE = "shadow-report.json"
#: The records spool (kept across restarts: the shipper ships what a killed server left).
RECORDS_DIR = "records"
#: TorchServe's log files (rtserve/server/log4j2.xml names them), in ``logs/``.
ACCESS_LOG = "access_log.log"
MODEL_LOG = "model_log.log"
TS_LOG = "ts_log.log"
TS_METRICS_LOG = "ts_metrics.log"
TORCHSERVE_LOGS = (ACCESS_LOG, MODEL_LOG, TS_LOG, TS_METRICS_LOG, "model_metrics.log")


#: A Kubernetes quantity's suffixes, as multiples of a byte (case matters: ``M`` is mega).
QUANTITY_UNITS = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
_SIZE = re.compile(r"^\s*(?P<number>[0-9]+(?:\.[0-9]*)?)\s*(?P<unit>[A-Za-z]*)\s*$")


def byte_size(text: str, where: str, units: Mapping[str, int] = QUANTITY_UNITS, ignore_case: bool = False) -> int:
    """A size in bytes from ``text``: a number (decimals allowed) and one of ``units``.

    Args:
        text: e.g. ``1Gi``, ``48Mi``, ``512MB``, ``1048576``.
        where: the setting's name, for the error.
        units: suffix -> bytes (``""``: plain bytes).
        ignore_case: suffixes match whatever their case.

    Raises:
        SettingsError: ``text`` is not a positive size in those units (the message names ``where``).
    """
    from decimal import Decimal, InvalidOperation  # here: every probe's start-up would pay for it

    table = {k.lower(): v for k, v in units.items()} if ignore_case else dict(units)
    found = _SIZE.match(text or "")
    unit = found.group("unit") if found else ""
    factor = table.get(unit.lower() if ignore_case else unit) if found else None
    try:
        size = int(Decimal(found.group("number")) * factor) if factor else 0
    except InvalidOperation:
        size = 0
    if size <= 0:
        shown = ", ".join(u for u in units if u) or "none"
        raise SettingsError(
            f"{where}: {text!r} is not a size in bytes: a positive number, then nothing (bytes) or one of {shown}"
        )
    return size


def resource(package: str, name: str) -> Path:
    """A file shipped inside an rtserve package, as a path (the package is a directory on disk).

    Raises:
        SettingsError: the package has no such file.
    """
    import importlib.resources  # here: every probe's start-up would pay for it

    path = Path(str(importlib.resources.files(package) / name))
    if not path.is_file():
        raise SettingsError(f"{package} ships no {name} ({path} is missing)")
    return path


@dataclass(frozen=True)
class RunDir:
    """What lives in a server's run directory, by name (one place for every file name)."""

    path: Path

    @property
    def config(self) -> Path:
        """The effective ``config.properties`` the server was started with."""
        return self.path / EFFECTIVE_CONFIG

    @property
    def key_file(self) -> Path:
        """TorchServe's token keys."""
        return self.path / TORCHSERVE_KEY_FILE

    @property
    def warmup_key(self) -> Path:
        """This start's warm-up key (mode 0600)."""
        return self.path / WARMUP_KEY_FILE

    @property
    def tmp(self) -> Path:
        """The frontend's private temp directory (its PID file, the workers' sockets)."""
        return self.path / "tmp"

    @property
    def frontend_pid(self) -> Path:
        """The frontend's PID file (TorchServe writes it into its temp directory)."""
        return self.tmp / ".model_server.pid"

    @property
    def metrics(self) -> Path:
        """The workers' metrics files when neither ``RTSERVE_METRICS_DIR`` nor shared memory is there."""
        return self.path / "metrics"

    @property
    def launcher_log(self) -> Path:
        """The ``torchserve`` launcher's output (a background start)."""
        return self.path / "launcher.log"

    @property
    def logs(self) -> Path:
        """TorchServe's logs (and the metrics exporter's)."""
        return self.path / "logs"

    @property
    def torchserve_logs(self) -> tuple[Path, ...]:
        """TorchServe's log files (:data:`TORCHSERVE_LOGS`), each rolled to one backup ``NAME.1``."""
        return tuple(self.logs / name for name in TORCHSERVE_LOGS)

    @property
    def access_log(self) -> Path:
        """The frontend's access log: one line per request."""
        return self.logs / ACCESS_LOG

    @property
    def ts_log(self) -> Path:
        """The frontend's own log (workers' states, batches)."""
        return self.logs / TS_LOG

    @property
    def ts_metrics_log(self) -> Path:
        """The frontend's metrics log (one line per accepted inference request)."""
        return self.logs / TS_METRICS_LOG

    @property
    def model_log(self) -> Path:
        """The workers' output."""
        return self.logs / MODEL_LOG

    @property
    def exporter_pid(self) -> Path:
        """The metrics exporter's PID (:mod:`rtserve.observability.exporter`)."""
        return self.path / "metrics-exporter.pid"

    @property
    def exporter_log(self) -> Path:
        """The metrics exporter's output."""
        return self.logs / "metrics_exporter.log"

    @property
    def oip_pid(self) -> Path:
        """The OIP model routes' PID (:mod:`rtserve.server.oip`)."""
        return self.path / "oip-routes.pid"

    @property
    def oip_log(self) -> Path:
        """The OIP model routes' output."""
        return self.logs / "oip_routes.log"

    @property
    def shipper_pid(self) -> Path:
        """The records shipper's PID (:mod:`rtserve.records.shipper`)."""
        return self.path / "records-shipper.pid"

    @property
    def shipper_log(self) -> Path:
        """The records shipper's output."""
        return self.logs / "records_shipper.log"

    @property
    def output_files(self) -> tuple[Path, ...]:
        """The processes' output files the metrics exporter caps.

        The launcher's, the three sidecars' and the canary watcher's.
        """
        return (self.launcher_log, self.exporter_log, self.oip_log, self.shipper_log, self.canary_log)

    @property
    def audit_log(self) -> Path:
        """The audit trail: the handler's per-request lines and the gate's decisions."""
        return self.logs / "audit.log"

    @property
    def records(self) -> Path:
        """The records spool: one JSON line per answered or rejected request (:mod:`handler.records`).

        The server's shipper sends them to the store.
        """
        return self.path / RECORDS_DIR

    @property
    def drain_marker(self) -> Path:
        """Present while the server drains."""
        return self.path / DRAIN_FILE

    @property
    def warm(self) -> Path:
        """Present once this start's warm-up is done."""
        return self.path / WARM_FILE

    @property
    def monitor(self) -> Path:
        """``make monitor``'s Prometheus and Alertmanager: configs, data, logs, PID files."""
        return self.path / "monitor"

    @property
    def cassandra(self) -> Path:
        """``make cassandra``'s local records store node (the Makefile's CASSANDRA_RUN_DIR).

        ``--records-store auto`` looks for it there.
        """
        return self.path / "cassandra"

    @property
    def history(self) -> Path:
        """The rollout history (default-version changes and gate decisions)."""
        return self.path / HISTORY_FILE

    @property
    def live_routes(self) -> Path:
        """The shadow and canary routes the frontend's agent follows."""
        return self.path / LIVE_ROUTES_FILE

    @property
    def live_log(self) -> Path:
        """One JSON line per request the agent mirrored (shadow) or forwarded (canary)."""
        return self.path / LIVE_LOG_FILE

    @property
    def canary_pid(self) -> Path:
        """The canary watcher's PID, while it runs."""
        return self.path / CANARY_PID_FILE

    @property
    def canary_log(self) -> Path:
        """The canary watcher's output."""
        return self.path / CANARY_LOG_FILE

    @property
    def shadow_report(self) -> Path:
        """The last ``make shadow-report`` (JSON)."""
        return self.path / SHADOW_REPORT_FILE


def _path(environ: Mapping[str, str], name: str) -> Path | None:
    value = environ.get(name, "").strip()
    return Path(value) if value else None


@dataclass(frozen=True)
class Settings:
    """rtserve's settings for one process: see the module's table for each variable.

    Build it once where a command starts (:meth:`from_env`, with the command line's values as
    overrides) and hand it down; nothing else reads the environment.
    """

    home: Path = PACKAGE_HOME
    run_dir: Path = PACKAGE_HOME / ".run"
    model_store: Path = PACKAGE_HOME / "model_store"
    #: ``RTSERVE_CONFIG`` or ``--config``; None: not given (see :attr:`torchserve_config`).
    config: Path | None = None
    models: tuple[str, ...] = ()
    model: str = DEFAULT_MODEL
    agent_jar: Path = PACKAGE_HOME / "build" / "agent" / "rtserve-agent.jar"
    metrics_dir: Path | None = None
    gateway_dir: Path | None = None
    gateway_tokens: Path = DEFAULT_GATEWAY_TOKENS
    live_routes_source: Path | None = None
    log_location: Path | None = None
    records_store: str | None = None
    #: ``RTSERVE_RUN_VOLUME_LIMIT`` in bytes; None: not in a pod with a sized run volume.
    run_volume_limit: int | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """The settings from ``environ`` (default ``os.environ``), then ``overrides``.

        A None override is ignored: an option the command line did not get.

        Raises:
            SettingsError: an override names no setting, ``models`` holds an entry that is
                not ``NAME=FILE.mar``, or ``RTSERVE_RUN_VOLUME_LIMIT`` is not a quantity.
        """
        env = os.environ if environ is None else environ
        limit = env.get("RTSERVE_RUN_VOLUME_LIMIT", "").strip()
        home = Path(overrides.pop("home", None) or PACKAGE_HOME).resolve()
        values: dict[str, Any] = {
            "run_dir": _path(env, "RTSERVE_RUN_DIR") or home / ".run",
            "model_store": _path(env, "RTSERVE_MODEL_STORE") or home / "model_store",
            "config": _path(env, "RTSERVE_CONFIG"),
            "models": tuple(env.get("RTSERVE_MODELS", "").split()),
            "model": env.get("RTSERVE_MODEL", "").strip() or DEFAULT_MODEL,
            "agent_jar": _path(env, "RTSERVE_AGENT_JAR") or home / "build" / "agent" / "rtserve-agent.jar",
            "metrics_dir": _path(env, "RTSERVE_METRICS_DIR"),
            "gateway_dir": _path(env, "RTSERVE_GATEWAY_DIR"),
            "gateway_tokens": _path(env, "RTSERVE_GATEWAY_TOKENS") or DEFAULT_GATEWAY_TOKENS,
            "live_routes_source": _path(env, "RTSERVE_LIVE_ROUTES"),
            "log_location": _path(env, "LOG_LOCATION"),
            "records_store": env.get("RTSERVE_RECORDS_STORE", "").strip() or None,
            "run_volume_limit": byte_size(limit, "RTSERVE_RUN_VOLUME_LIMIT") if limit else None,
        }
        return cls(home=home, **values).but(**overrides)

    def but(self, **changes: Any) -> Settings:
        """These settings with some values replaced (a None change is ignored).

        Raises:
            SettingsError: a change names no setting, or ``models`` holds an entry that is not
                ``NAME=FILE.mar``.
        """
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise SettingsError(f"no such setting: {', '.join(sorted(unknown))}")
        changes = {k: v for k, v in changes.items() if v is not None}
        for name in (
            "home",
            "run_dir",
            "model_store",
            "config",
            "agent_jar",
            "metrics_dir",
            "gateway_dir",
            "gateway_tokens",
            "live_routes_source",
            "log_location",
        ):
            if name in changes:
                changes[name] = Path(changes[name])
        if "models" in changes:
            changes["models"] = tuple(changes["models"])
        settings = replace(self, **changes)
        bad = [m for m in settings.models if m.startswith("=")]
        if bad:
            raise SettingsError(f"RTSERVE_MODELS / --models: {bad[0]!r} is not NAME=FILE.mar")
        return settings

    @property
    def torchserve_config(self) -> Path:
        """The ``config.properties`` a server starts from: :attr:`config`, else the checkout's."""
        return self.config or self.home / "config.properties"

    # -- files of the checkout (under HOME) -----------------------------------------------------
    @property
    def gate_config(self) -> Path:
        """The promotion gate's thresholds (``config/gate.yaml``)."""
        return self.home / "config" / "gate.yaml"

    @property
    def model_config(self) -> Path:
        """The demo's model config (``model/model-config.yaml``), packed into its archives."""
        return self.home / "model" / "model-config.yaml"

    @property
    def monitoring_dir(self) -> Path:
        """The shipped Prometheus config and alerting rules (``deploy/monitoring``)."""
        return self.home / "deploy" / "monitoring"

    @property
    def build_dir(self) -> Path:
        """Build outputs (``build/``: the agent, generated gRPC stubs, bench run directories)."""
        return self.home / "build"

    @property
    def run(self) -> RunDir:
        """The run directory's files."""
        return RunDir(self.run_dir)


#: The frontend's log configuration rtserve ships (access, model, metrics and error logs without
#: TorchServe's per-request chatter; see the file's header): a resource of rtserve.server.
def log_config() -> Path:
    """Rtserve's log4j2 configuration for TorchServe's frontend (a package resource)."""
    return resource("rtserve.server", "log4j2.xml")
