"""The pod's main process (``python -m rtserve server run``): TorchServe in the foreground and, when
the pod has a gateway (``$RTSERVE_GATEWAY_DIR``), the key sync that feeds it; when it mounts live
routes (``$RTSERVE_LIVE_ROUTES``), the copy of them that the frontend's agent follows.

Composed here, above both, so that :mod:`rtserve.server` never imports the gateway's pieces
(:mod:`rtserve.gateway.nginx`) nor the promotion's (:mod:`rtserve.promotion.live`), which only
import the server's.
"""

from __future__ import annotations

import logging
from typing import Callable

from rtserve.gateway.nginx import closing, draining, key_sync
from rtserve.promotion.live import RoutesSync
from rtserve.server.torchserve import TorchServe, run_foreground
from rtserve.settings import Settings

logger = logging.getLogger(__name__)


def syncs(settings: Settings) -> list[Callable[[], object]]:
    """What the pod keeps in step every second: the gateway's keys (when the pod has a gateway)
    and the live routes (when it mounts them: the ConfigMap rtserve-live-routes)."""
    found: list[Callable[[], object]] = []
    keysync = key_sync(settings)  # the pod's nginx gateway, if it has one
    if keysync is not None:
        # A restarted container keeps the shared directory: a drain's flags go.
        closing(keysync.gateway_dir, False)
        draining(keysync.gateway_dir, False)
        found.append(keysync.sync)
    if settings.live_routes_source is not None:
        found.append(RoutesSync(settings.live_routes_source, settings.run.live_routes,
                                logger.info).sync)
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


def run(settings: Settings, stop_timeout: float = 15.0) -> int:
    """Run the server of ``settings`` until SIGTERM (:func:`~rtserve.server.torchserve.run_foreground`)
    with the pod's syncs (:func:`syncs`) every second.

    Returns:
        The process exit status.
    """
    server = TorchServe(settings.run_dir, settings.model_store, list(settings.models),
                        settings.torchserve_config, settings=settings)
    return run_foreground(server, stop_timeout, on_poll=each(syncs(settings)))
