"""Prometheus and Alertmanager on loopback (9090, 9093) for a server started by ``rtserve server start``.

Prometheus scrapes the server's metrics listener with the shipped rules; its config is the shipped one
(``deploy/monitoring/prometheus.yml``) with the Kubernetes discovery replaced by the one local target. Everything
(configs, data, logs, PID files) lives in ``RUN_DIR/monitor``; ``stop`` ends both processes by their PID files.
"""

from __future__ import annotations

import shutil
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from rtserve.errors import MonitorError
from rtserve.runtime.process import PidFile, spawn, tail, terminate, wait_until
from rtserve.server.properties import PUBLIC_METRICS_KEY, read_properties
from rtserve.settings import RunDir, Settings

#: The shipped Prometheus config and rules (``deploy/monitoring`` of the checkout).
MONITORING = Settings().monitoring_dir
SHIPPED_CONFIG = MONITORING / "prometheus.yml"
PROMETHEUS = ("prometheus",)
ALERTMANAGER = ("prometheus-alertmanager", "alertmanager")  # Debian's name, upstream's name


@dataclass(frozen=True)
class MonitorConfig:
    """What to run and where.

    Attributes:
        dir: configs, data, logs and PID files.
        target: ``host:port`` of the server's metrics listener.
        rules: rule files Prometheus loads (default: the shipped rules' files).
        prometheus_port, alertmanager_port: loopback ports.
        interval: scrape and evaluation interval (None: the shipped config's).
        webhook: a URL Alertmanager posts alerts to (None: alerts are only in its UI and API).
        group_wait, group_interval: Alertmanager's routing delays.
    """

    dir: Path
    target: str
    rules: tuple[Path, ...] = ()
    prometheus_port: int = 9090
    alertmanager_port: int = 9093
    interval: str | None = None
    webhook: str | None = None
    group_wait: str = "30s"
    group_interval: str = "5m"

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    @property
    def alertmanager_url(self) -> str:
        return f"http://127.0.0.1:{self.alertmanager_port}"


def prometheus_config(shipped: dict, cfg: MonitorConfig) -> dict:
    """The shipped scrape config made local: one static target, rules as absolute paths, and the local Alertmanager."""
    glob = dict(shipped.get("global") or {})
    if cfg.interval:
        glob.update(scrape_interval=cfg.interval, evaluation_interval=cfg.interval)
    rules = cfg.rules or tuple(MONITORING / r for r in shipped.get("rule_files", []))
    job = shipped["scrape_configs"][0]["job_name"]
    return {
        "global": glob,
        "rule_files": [str(Path(r).resolve()) for r in rules],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{cfg.alertmanager_port}"]}]}]},
        "scrape_configs": [
            {"job_name": job, "metrics_path": "/metrics", "static_configs": [{"targets": [cfg.target]}]}
        ],
    }


def alertmanager_config(cfg: MonitorConfig) -> dict:
    """One route to one receiver: a webhook when ``cfg.webhook`` is set."""
    receiver: dict = {"name": "rtserve"}
    if cfg.webhook:
        receiver["webhook_configs"] = [{"url": cfg.webhook, "send_resolved": True}]
    return {
        "route": {
            "receiver": "rtserve",
            "group_by": ["alertname", "model_name", "model_version"],
            "group_wait": cfg.group_wait,
            "group_interval": cfg.group_interval,
            "repeat_interval": "4h",
        },
        "receivers": [receiver],
    }


def find_binary(names: tuple[str, ...]) -> str:
    """The first of ``names`` on PATH.

    Raises:
        MonitorError: none is installed.
    """
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    raise MonitorError(f"{names[0]} is not installed: run `make monitor-deps` (Debian's packages)")


def metrics_target(run_dir: Path, default_config: Path) -> str:
    """``host:port`` of the metrics listener of the server started from ``run_dir``.

    Of ``default_config``, the settings' :attr:`~rtserve.settings.Settings.torchserve_config`, when none was.
    """
    effective = RunDir(run_dir).config
    if effective.is_file():
        props = read_properties(effective)
        address = props.get(PUBLIC_METRICS_KEY) or props["metrics_address"]
    else:
        address = read_properties(default_config)["metrics_address"]
    return address.split("://", 1)[-1].rstrip("/")


class Monitor:
    """Prometheus + Alertmanager for one :class:`MonitorConfig`."""

    NAMES = ("alertmanager", "prometheus")

    def __init__(self, cfg: MonitorConfig) -> None:
        self.cfg = cfg

    def _pid_file(self, name: str) -> PidFile:
        return PidFile(self.cfg.dir / f"{name}.pid")

    def pid(self, name: str) -> int | None:
        return self._pid_file(name).pid()

    def write_configs(self) -> tuple[Path, Path]:
        """Write prometheus.yml and alertmanager.yml into the monitor directory."""
        self.cfg.dir.mkdir(parents=True, exist_ok=True)
        shipped = yaml.safe_load(SHIPPED_CONFIG.read_text())
        prom = self.cfg.dir / "prometheus.yml"
        prom.write_text(yaml.safe_dump(prometheus_config(shipped, self.cfg), sort_keys=False))
        am = self.cfg.dir / "alertmanager.yml"
        am.write_text(yaml.safe_dump(alertmanager_config(self.cfg), sort_keys=False))
        return prom, am

    def commands(self, prom: Path, am: Path) -> dict[str, list[str]]:
        d = self.cfg.dir
        return {
            "alertmanager": [
                find_binary(ALERTMANAGER),
                f"--config.file={am}",
                f"--storage.path={d / 'alertmanager-data'}",
                f"--web.listen-address=127.0.0.1:{self.cfg.alertmanager_port}",
                "--cluster.listen-address=",
            ],  # no gossip port: one instance
            "prometheus": [
                find_binary(PROMETHEUS),
                f"--config.file={prom}",
                f"--storage.tsdb.path={d / 'prometheus-data'}",
                f"--web.listen-address=127.0.0.1:{self.cfg.prometheus_port}",
            ],
        }

    def start(self, timeout: float = 60.0) -> None:
        """Start both (Alertmanager first) and wait until both say they are ready.

        Raises:
            MonitorError: one is already running, a binary is missing, or one is not ready in time.
        """
        running = [n for n in self.NAMES if self.pid(n) is not None]
        if running:
            raise MonitorError(f"already running from {self.cfg.dir}: {', '.join(running)} (make monitor-stop)")
        commands = self.commands(*self.write_configs())
        for name in self.NAMES:
            spawn(commands[name], self.cfg.dir / f"{name}.log", self._pid_file(name))
        try:
            for name, url in (("alertmanager", self.cfg.alertmanager_url), ("prometheus", self.cfg.prometheus_url)):
                self._wait_ready(name, url, timeout)
        except MonitorError:
            self.stop()
            raise

    def _wait_ready(self, name: str, url: str, timeout: float) -> None:
        def ready() -> bool:
            if self.pid(name) is None:
                raise MonitorError(f"{name} exited:\n{self.log_tail(name)}")
            try:
                with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as resp:
                    return resp.status == 200
            except (OSError, urllib.error.URLError):
                return False

        if not wait_until(ready, timeout, poll=0.2):
            raise MonitorError(f"{name} not ready on {url} after {timeout:.0f} s:\n{self.log_tail(name)}")

    def log_tail(self, name: str, lines: int = 20) -> str:
        return tail(self.cfg.dir / f"{name}.log", lines)

    def stop(self, timeout: float = 10.0) -> list[str]:
        """SIGTERM each by its PID file (SIGKILL after ``timeout``); returns those stopped."""
        stopped = []
        for name in reversed(self.NAMES):
            pid = self.pid(name)
            if pid is not None:
                terminate(pid, timeout)
                stopped.append(name)
            self._pid_file(name).remove()
        return stopped
