"""``python -m rtserve gateway``: the pod's nginx gateway (rtserve.gateway).

python -m rtserve gateway conf            # the pod's nginx.conf (deploy/k8s/base/gateway-nginx.conf)
python -m rtserve gateway sync            # write the map files once, reload nginx if needed
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from rtserve.cli.common import command, group, settings
from rtserve.gateway.nginx import POD, UPSTREAM_KEY, key_sync, render_nginx_conf

logger = logging.getLogger(__name__)


def cmd_conf(args: argparse.Namespace) -> int:
    """Print the pod's nginx.conf."""
    sys.stdout.write(render_nginx_conf(POD))
    return 0


def cmd_sync(args: argparse.Namespace) -> int:
    """Write the gateway's map files once (reload nginx if it runs)."""
    keysync = key_sync(settings(args))
    if keysync is None:
        logger.error("RTSERVE_GATEWAY_DIR is not set: no gateway in this container")
        return 1
    keysync.sync()
    return 0 if (keysync.gateway_dir / UPSTREAM_KEY).exists() else 1


def add(groups: argparse._SubParsersAction) -> None:
    commands = group(groups, "gateway", __doc__)
    run_dir = (["--run-dir"], {"type": Path, "help": "default: $RTSERVE_RUN_DIR or .run"})
    command(commands, "conf", cmd_conf)
    command(commands, "sync", cmd_sync, run_dir)
