"""The pod's main process (``python -m rtserve server run``): TorchServe in the foreground and, when
the pod has a gateway (``$RTSERVE_GATEWAY_DIR``), the key sync that feeds it.

Composed here, above both, so that :mod:`rtserve.server` never imports the gateway's pieces
(:mod:`rtserve.gateway.nginx`), which only import the server's.
"""

from __future__ import annotations

from rtserve.gateway.nginx import key_sync
from rtserve.server.torchserve import TorchServe, run_foreground
from rtserve.settings import Settings


def run(settings: Settings, stop_timeout: float = 15.0) -> int:
    """Run the server of ``settings`` until SIGTERM (:func:`~rtserve.server.torchserve.run_foreground`)
    with the gateway's key sync every second, when the pod has a gateway.

    Returns:
        The process exit status.
    """
    server = TorchServe(settings.run_dir, settings.model_store, list(settings.models),
                        settings.torchserve_config, settings=settings)
    keysync = key_sync(settings)  # the pod's nginx gateway, if it has one
    return run_foreground(server, stop_timeout, on_poll=keysync.sync if keysync else None)
