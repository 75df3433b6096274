"""Shadow and canary on one running TorchServe (``python -m rtserve live``, ``make shadow``, ...).

The candidate must be registered with a ready worker; the routes file, the live log, the records, the
rollout history and the watcher's files are the run directory's.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path

from rtserve.client.rest import Client
from rtserve.errors import LiveError
from rtserve.promotion.gate import GateConfig
from rtserve.promotion.history import History
from rtserve.promotion.live.evidence import ShadowReport, compare_for, latest_shadow_version, save_shadow_report
from rtserve.promotion.live.routes import KEY_HEADER, Route, Routes, checked_percent, read_routes, set_route
from rtserve.promotion.live.watcher import CanaryStarted, Watch, run_watcher, start_watcher, stop_watcher, watcher_pid
from rtserve.promotion.rollout import Rollout, archive_name
from rtserve.server.disk import audit_cap
from rtserve.settings import RunDir, Settings


@dataclass(frozen=True)
class ServerLive:
    """One server's live traffic.

    Attributes:
        settings: the server's settings (its run directory and model store).
        client: a client of its APIs (the candidate's status).
        inference: its inference API's URL (the candidate's routes point there).
        gate_config: the gate's thresholds (``live.canary``).
    """

    settings: Settings
    client: Client
    inference: str
    gate_config: Path

    @property
    def run(self) -> RunDir:
        return self.settings.run

    @property
    def history(self) -> History:
        return History(self.run.history)

    def candidate_url(self, model: str, version: str) -> str:
        """The candidate's URL on this server, once it is registered, has a ready worker and is not the default.

        Raises:
            LiveError: it is not.
            RolloutError: ``version`` is not a plain name.
        """
        archive_name(model, version)  # a plain name
        status = {s.version: s for s in Rollout(self.client, self.history, model).status()}
        found = status.get(version)
        if found is None:
            raise LiveError(
                f"{model} {version} is not registered (registered: "
                f"{', '.join(sorted(status))}); `make register MODEL_VERSION={version}` "
                "first; nothing changed"
            )
        if found.default:
            raise LiveError(f"{model} {version} is the default: shadow or canary another version; nothing changed")
        if found.workers_ready == 0:
            raise LiveError(
                f"{model} {version} has no ready worker (`make scale WORKERS=1 VERSION={version}`); nothing changed"
            )
        return f"{self.inference.rstrip('/')}/predictions/{model}/{version}"

    def route(self, kind: str) -> Route | None:
        """The ``shadow`` or ``canary`` route now (None: none)."""
        routes = read_routes(self.run.live_routes)
        return getattr(routes, kind) if routes else None

    def set_route(self, model: str, kind: str, route: Route | None) -> Routes:
        """Set (None: turn off) the ``shadow`` or ``canary`` route, keeping the other."""
        return set_route(self.run.live_routes, model, self.run.live_log.resolve(), kind, route)

    def shadow(self, model: str, version: str, percent: float) -> float:
        """Mirror ``percent`` of live requests to the registered candidate ``version``; returns the share.

        Callers see the default only.

        Raises:
            LiveError: ``percent`` is not in (0, 100], or the candidate cannot take it.
        """
        percent = checked_percent(percent)
        self.set_route(model, "shadow", Route(version, percent, self.candidate_url(model, version)))
        self.history.append({"action": "shadow", "model": model, "version": version, "percent": percent})
        return percent

    def shadow_stop(self, model: str) -> Route | None:
        """Stop mirroring (the canary, if any, is kept); the route stopped (None: none was on)."""
        route = self.route("shadow")
        if route is None:
            return None
        self.set_route(model, "shadow", None)
        self.history.append({"action": "shadow-stop", "model": model, "version": route.version})
        return route

    def shadow_report(self, model: str, version: str | None = None) -> ShadowReport:
        """The shadow report of ``version``, saved as the run directory's ``shadow-report.json``.

        ``version`` defaults to the shadow route's, else the live log's last shadow line's.

        Raises:
            LiveError: there is no shadow to report on.
            GateError: the gate's config is invalid (its per-kind thresholds compare the answers).
        """
        route = self.route("shadow")
        version = version or (route.version if route else None) or latest_shadow_version(self.run.live_log)
        if version is None:
            raise LiveError(
                f"no shadow to report on: no shadow route and no shadow line in "
                f"{self.run.live_log} (`make shadow MODEL_VERSION=...` first)"
            )
        return save_shadow_report(
            model,
            version,
            self.run.live_log,
            self.run.records,
            self.settings.model_store / archive_name(model, version),
            self.run.shadow_report,
            GateConfig.load(self.gate_config).kinds,
        )

    def canary(self, model: str, version: str, percent: float) -> CanaryStarted:
        """Send a sticky ``percent`` of live requests (per :data:`KEY_HEADER`) to the candidate ``version``.

        A watcher (started unless one runs) aborts it on a breach.

        Raises:
            GateError: the gate's config is invalid (before anything changes).
            LiveError: ``percent`` is not in (0, 100], the candidate cannot take it, or the
                canary of another version is watched.
        """
        config = GateConfig.load(self.gate_config)  # a bad file fails here, not later
        percent = checked_percent(percent)
        url = self.candidate_url(model, version)
        running = watcher_pid(self.run.canary_pid)
        current = self.route("canary")
        if running and current is not None and current.version != version:
            raise LiveError(
                f"the canary of {current.version} is watched (pid {running}): `make canary-stop` first; nothing changed"
            )
        self.set_route(model, "canary", Route(version, percent, url, KEY_HEADER))
        self.history.append({"action": "canary", "model": model, "version": version, "percent": percent})
        if running:
            return CanaryStarted(running, False, config.live.canary.window_s)
        argv = [
            sys.executable,
            "-m",
            "rtserve",
            "live",
            "--run-dir",
            str(self.run.path.resolve()),
            "--gate-config",
            str(self.gate_config.resolve()),
            "watch",
            model,
            version,
        ]
        return CanaryStarted(start_watcher(argv, self.run), True, config.live.canary.window_s)

    def stop_watcher(self) -> int | None:
        """Stop the canary watcher (by its PID file); its PID (None: none ran)."""
        return stop_watcher(self.run.canary_pid)

    def canary_stop(self, model: str) -> Route | None:
        """Set the canary's share to 0; the route as it was (None: no canary had a share)."""
        route = self.route("canary")
        if route is None or route.percent == 0:
            return None
        self.set_route(model, "canary", replace(route, percent=0.0))
        self.history.append(
            {"action": "canary-stop", "model": model, "version": route.version, "percent": route.percent}
        )
        return route

    def watch(self, model: str, version: str) -> dict | None:
        """Run the canary watcher of ``version`` here (``make canary`` starts it in the background).

        Returns the abort's event, if it aborted.
        """
        config = GateConfig.load(self.gate_config)
        return run_watcher(
            Watch(
                model,
                version,
                self.run.live_routes,
                self.run.live_log,
                self.run.records,
                self.run.audit_log,
                self.history,
                config.live.canary,
                audit_bytes=audit_cap(self.run.path),
                compare=compare_for(self.settings.model_store / archive_name(model, version), config.kinds),
            ),
            self.run.canary_pid,
        )
