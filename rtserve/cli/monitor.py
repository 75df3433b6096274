"""``python -m rtserve monitor``: Prometheus and Alertmanager on loopback for a local server.

python -m rtserve monitor start --run-dir .run
python -m rtserve monitor stop --run-dir .run
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import yaml

from rtserve.cli.common import command, group, settings
from rtserve.observability.monitor import SHIPPED_CONFIG, Monitor, MonitorConfig, metrics_target, prometheus_config
from rtserve.settings import RunDir

logger = logging.getLogger(__name__)


def _monitor(args: argparse.Namespace):
    s = settings(args)
    run_dir = s.run_dir.resolve()
    cfg = MonitorConfig(
        dir=RunDir(run_dir).monitor,
        target=metrics_target(run_dir, s.torchserve_config),
        prometheus_port=args.prometheus_port,
        alertmanager_port=args.alertmanager_port,
        webhook=args.webhook,
    )
    return Monitor(cfg)


def cmd_start(args: argparse.Namespace) -> int:
    """Start Prometheus and Alertmanager scraping the server of --run-dir."""
    monitor = _monitor(args)
    monitor.start()
    cfg = monitor.cfg
    effective = prometheus_config(yaml.safe_load(SHIPPED_CONFIG.read_text()), cfg)
    print(
        f">> Prometheus   {cfg.prometheus_url}  scraping {cfg.target} every "
        f"{effective['global']['scrape_interval']}, rules: {', '.join(effective['rule_files'])}"
    )
    print(f">> Alertmanager {cfg.alertmanager_url}")
    print(f">> targets:  curl -s {cfg.prometheus_url}/api/v1/targets")
    print(f">> alerts:   curl -s {cfg.prometheus_url}/api/v1/alerts")
    print(f">> configs, data and logs in {cfg.dir}; stop with: make monitor-stop")
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    """Stop the Prometheus and Alertmanager `monitor start` started (by their PID files)."""
    stopped = _monitor(args).stop()
    print(f">> stopped: {', '.join(stopped)}" if stopped else ">> nothing was running")
    return 0


def add(groups: argparse._SubParsersAction) -> None:
    commands = group(groups, "monitor", __doc__)
    local = argparse.ArgumentParser(add_help=False)
    local.add_argument(
        "--run-dir", type=Path, help="the server's run directory (its config.properties names the target)"
    )
    local.add_argument("--prometheus-port", type=int, default=9090)
    local.add_argument("--alertmanager-port", type=int, default=9093)
    local.add_argument("--webhook", help="a URL Alertmanager posts alerts to")
    command(commands, "start", cmd_start, parents=(local,))
    command(commands, "stop", cmd_stop, parents=(local,))
