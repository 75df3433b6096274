"""SIGINT and SIGTERM end a test session as Ctrl-C does, so that its fixtures tear down (a
cluster, a broker or a TorchServe stopped by its fixture) instead of being left running.

`make test` runs the cluster and stream tiers in the background (``&`` in a non-interactive
shell), which starts them with SIGINT ignored, and its trap stops them with SIGTERM, which would
end Python at once, past every ``finally``. Registered by tests/conftest.py.
"""

from __future__ import annotations

import signal
import threading


def _interrupt(signum: int, _frame) -> None:
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def install() -> None:
    """SIGINT back to Python's Ctrl-C, and SIGTERM the same (in the main thread only)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, _interrupt)


def pytest_configure(config) -> None:
    install()
