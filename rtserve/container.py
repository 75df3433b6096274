"""The pod's main process (``python -m rtserve server run``): TorchServe in the foreground, plus its side loops.

With ``$RTSERVE_GATEWAY_DIR`` set it runs the gateway's key sync; with ``$RTSERVE_LIVE_ROUTES`` set, the copy of the
live routes the frontend's agent follows. Composed here, above both, so that :mod:`rtserve.server` never imports
:mod:`rtserve.gateway.nginx` nor :mod:`rtserve.promotion.live` (which import the server's pieces).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from rtserve.gateway.nginx import closing, draining, key_sync
from rtserve.promotion.live.routes import RoutesSync
from rtserve.server import probe
from rtserve.server.torchserve import TorchServe, run_foreground
from rtserve.settings import Settings

logger = logging.getLogger(__name__)


def syncs(settings: Settings) -> list[Callable[[], object]]:
    """What the pod keeps in step every second: the gateway's keys (when the pod has a gateway) and the live routes.

    When it mounts them: the ConfigMap rtserve-live-routes.
    """
    found: list[Callable[[], object]] = []
    keysync = key_sync(settings)  # the pod's nginx gateway, if it has one
    if keysync is not None:
        # A restarted container keeps the shared directory: a drain's flags go.
        closing(keysync.gateway_dir, False)
        draining(keysync.gateway_dir, False)
        found.append(keysync.sync)
    if settings.live_routes_source is not None:
        found.append(RoutesSync(settings.live_routes_source, settings.run.live_routes, logger.info).sync)
    return found


def each(hooks: list[Callable[[], object]]) -> Callable[[], None] | None:
    """One ``on_poll`` that runs every hook; one that fails does not keep the others from running."""
    if not hooks:
        return None

    def run_all() -> None:
        for hook in hooks:
            try:
                hook()
            except Exception:  # noqa: BLE001 - the server keeps running; the log says why
                logger.exception("%s failed", getattr(hook, "__qualname__", hook))

    return run_all


def run(settings: Settings, stop_timeout: float = 15.0, probes: str | None = None) -> int:
    """Run the server of ``settings`` until SIGTERM, with the pod's syncs (:func:`syncs`) every second.

    The server runs through :func:`~rtserve.server.torchserve.run_foreground`; with ``probes`` (``HOST:PORT``)
    this process answers the kubelet's HTTP probes there (:func:`rtserve.server.probe.serve`).

    Returns:
        The process exit status.
    """
    server = TorchServe(
        settings.run_dir, settings.model_store, list(settings.models), settings.torchserve_config, settings=settings
    )
    if probes:
        probe.serve(probes, settings.run_dir, settings.model)
        logger.info("answering the kubelet's probes on %s (/ready, /live)", probes)
    return run_foreground(server, stop_timeout, on_poll=each(syncs(settings)))
