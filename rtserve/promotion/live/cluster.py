"""Shadow and canary in a cluster (``make k8s-shadow``, ``k8s-canary``, ..., ``k8s-deploy``'s live evidence).

:class:`ClusterLive` composes the kubectl side (:mod:`.kubectl`) with the routes, the evidence and the watcher,
as :mod:`.local` does on one server; :mod:`rtserve.cli.k8s` maps its flags to :class:`ClusterOptions`.
The routes go to this machine's state directory first, then out with a new ``revision``; the canary
watcher runs here, on copies of the pods' logs.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from rtserve.errors import DeployError, LiveError
from rtserve.k8s.deploy import Kubectl, Target
from rtserve.promotion.gate import GateConfig
from rtserve.promotion.history import History
from rtserve.promotion.live.evidence import (
    ShadowReport,
    compare_for,
    latest_shadow_version,
    promote_evidence,
    save_shadow_report,
)
from rtserve.promotion.live.kubectl import POD_RUN, POD_TOKEN_FILE, Cluster, LogCopy, candidate_target, candidate_url
from rtserve.promotion.live.routes import KEY_HEADER, Route, Routes, checked_percent, read_routes, update_routes
from rtserve.promotion.live.watcher import CanaryStarted, Watch, run_watcher, start_watcher, stop_watcher, watcher_pid
from rtserve.promotion.rollout import archive_name, who_runs
from rtserve.settings import RunDir, Settings

logger = logging.getLogger(__name__)


#: How often the cluster's canary watcher reads the pods' logs (a kubectl exec per pod each time).
WATCH_POLL_S = 2.0


@dataclass(frozen=True)
class ClusterOptions:
    """The live commands' options (the Makefile's cluster variables); None: the default each names.

    Attributes:
        overlay: deploy/k8s/overlays/<overlay>; namespace: default ``rtserve-<overlay>``.
        image: the image name the overlay uses; app: the default's Deployment; model: the model.
        k8s_dir: the kustomize tree; build_dir: default ``build/k8s/<overlay>``.
        candidate_dir: the candidate's kustomization (default: the overlay's ``candidate/`` if it
            has one, else ``<k8s_dir>/candidate``).
        state_dir: this machine's copies: routes, the pods' logs, the watcher's PID file and log,
            the history (default ``<build_dir>-live``).
        kubectl: the kubectl command, options included; rollout_timeout: the candidate's.
        gate_config: the gate's thresholds (default: the checkout's ``config/gate.yaml``; the CLI passes the settings').
        model_store: where a shadow report finds the candidate's archive (its label order).
    """

    overlay: str
    image: str = "registry.example.com/ml/rtserve"
    namespace: str | None = None
    app: str = "rtserve"
    model: str = "realtime-classifier"
    k8s_dir: Path = Path("deploy/k8s")
    build_dir: Path | None = None
    candidate_dir: Path | None = None
    state_dir: Path | None = None
    kubectl: str = "kubectl"
    rollout_timeout: str = "15m"
    gate_config: Path | None = None
    model_store: Path | None = None

    def argv(self) -> list[str]:
        """These options as given (paths made absolute), for the watcher's command line."""
        out = []
        for name in (
            "overlay",
            "image",
            "namespace",
            "app",
            "model",
            "k8s_dir",
            "build_dir",
            "candidate_dir",
            "state_dir",
            "kubectl",
            "rollout_timeout",
        ):
            value = getattr(self, name)
            if value is not None:
                out += [f"--{name.replace('_', '-')}", str(Path(value).resolve()) if isinstance(value, Path) else value]
        return out


class ClusterLive:
    """Shadow and canary in one namespace.

    Its pods and candidate through kubectl (:class:`~.kubectl.Cluster`), the candidate's deploy target,
    and this machine's state directory (named as a run directory's files).
    """

    def __init__(self, options: ClusterOptions, version: str = "") -> None:
        o = options
        self.options = o
        self.namespace = o.namespace or f"rtserve-{o.overlay}"
        build = o.build_dir or Path("build/k8s") / o.overlay
        overlay_own = o.k8s_dir / "overlays" / o.overlay / "candidate"
        source = o.candidate_dir or (
            overlay_own if (overlay_own / "kustomization.yaml").is_file() else o.k8s_dir / "candidate"
        )
        self.target = candidate_target(
            Target(
                o.k8s_dir,
                o.overlay,
                self.namespace,
                o.app,
                o.image,
                version,
                o.model,
                build,
                Path(f"{build}-verify"),
                o.rollout_timeout,
            ),
            source,
        )
        self.cluster = Cluster(Kubectl(o.kubectl), self.namespace, o.app)
        self.state = RunDir(o.state_dir or Path(f"{build}-live"))

    @property
    def history(self) -> History:
        return History(self.state.history)

    def archive(self, version: str) -> Path:
        """The candidate's archive in the model store (its label order ranks a report)."""
        store = self.options.model_store or Settings().model_store
        return store / archive_name(self.options.model, version)

    def routes(self) -> Routes | None:
        return read_routes(self.state.live_routes)

    def publish(self, routes: Routes) -> Routes:
        """Send ``routes`` (as written to the state's routes file) to the cluster, with a new revision.

        :class:`~rtserve.promotion.live.routes.RoutesSync` never goes back to an older revision.
        """
        routes = update_routes(
            self.state.live_routes, lambda r: replace(r, revision=max(r.revision + 1, int(time.time() * 1000)))
        )
        text = self.state.live_routes.read_text()
        pods = self.cluster.publish(text, self.state.path / "live-routes-configmap.json")
        logger.info(
            "routes: ConfigMap rtserve-live-routes and %d default pod(s) (%s): %s",
            len(pods),
            ", ".join(pods) or "none ready",
            describe(routes),
        )
        return routes

    def set(self, **changed: Route | None) -> Routes:
        """Set the ``shadow`` and/or ``canary`` route (None: off) and publish the routes."""

        def change(routes: Routes | None) -> Routes:
            routes = routes or Routes(self.options.model, str(POD_RUN.live_log))
            return replace(
                routes, model=self.options.model, log=str(POD_RUN.live_log), token_file=POD_TOKEN_FILE, **changed
            )

        return self.publish(update_routes(self.state.live_routes, change))

    def candidate(self, version: str) -> str:
        """Deploy the candidate ``version`` (kept when it already runs it); its URL.

        Raises:
            LiveError: the canary of another version is watched.
            RolloutError: ``version`` is not a plain name.
        """
        archive_name(self.options.model, version)  # a plain name
        running = self.cluster.candidate_version()
        if running not in (None, version) and self.watched():
            raise LiveError(
                f"the canary of {running} is watched (pid {self.watched()}): "
                "`make k8s-live-stop` first; nothing changed"
            )
        self.cluster.apply_candidate(replace(self.target, version=version))
        return candidate_url(self.namespace, self.options.model, version)

    def pull_logs(self) -> LogCopy:
        """Copy what every default pod's live log and records hold into the state's ``report/``, afresh.

        Returns the copy (:class:`~.kubectl.LogCopy`).
        """
        into = self.state.path / "report"
        copy = LogCopy(into / "live-log.jsonl", into / "records.jsonl").fresh()
        lines = copy.pull(self.cluster)
        logger.info("read %d lines of the live logs and records of %d default pod(s)", lines, len(copy.offsets))
        return copy

    def watched(self) -> int | None:
        """The PID of this state's canary watcher while it runs."""
        return watcher_pid(self.state.canary_pid)

    def shadow_report(self, version: str | None = None) -> ShadowReport:
        """The shadow report of ``version`` over the default pods' live logs and records now, saved in the state.

        ``version`` defaults to the shadow route's, else the pods' last shadow line's.

        Raises:
            LiveError: there is no shadow to report on.
        """
        copy = self.pull_logs()
        route = self.routes() and self.routes().shadow
        version = version or (route.version if route else None) or latest_shadow_version(copy.live_log)
        if version is None:
            raise LiveError(
                "no shadow to report on: no shadow route and no shadow line in the pods' "
                "live logs (`make k8s-shadow MODEL_VERSION=...` first)"
            )
        kinds = GateConfig.load(self.options.gate_config or Settings().gate_config).kinds
        return save_shadow_report(
            self.options.model,
            version,
            copy.live_log,
            copy.records,
            self.archive(version),
            self.state.shadow_report,
            kinds,
        )

    def watch(self, version: str) -> list[str] | None:
        """Run the canary watcher of ``version`` here until it aborts or sees the canary stopped.

        ``make k8s-canary`` starts it in the background. Returns, after an abort, the pods whose audit
        logs record it too (None: no abort).
        """
        config = GateConfig.load(self.options.gate_config or Settings().gate_config)
        copy = LogCopy(self.state.live_log, self.state.path / "records.jsonl", from_end=True)
        w = Watch(
            self.options.model,
            version,
            self.state.live_routes,
            self.state.live_log,
            copy.records,
            self.state.audit_log,
            self.history,
            config.live.canary,
            pull=lambda: copy.pull(self.cluster),
            publish=self.publish,
            compare=compare_for(self.archive(version), config.kinds),
        )
        event = run_watcher(w, self.state.canary_pid, poll_s=WATCH_POLL_S)
        return None if event is None else self.cluster.audit(event)  # the pods' own audit trails

    def stop_watcher(self) -> int | None:
        """Stop the canary's watcher; its PID (None: none ran)."""
        return stop_watcher(self.state.canary_pid)

    def stop(self) -> Routes | None:
        """Turn the shadow and canary off in every default pod and delete the candidate; the routes before."""
        before = self.routes()
        self.set(shadow=None, canary=None)
        self.cluster.delete_candidate()
        self.history.append(
            {
                "action": "k8s-live-stop",
                "model": self.options.model,
                "namespace": self.namespace,
                "was": describe(before),
            }
        )
        return before


def shadow(options: ClusterOptions, version: str, percent: float) -> ClusterLive:
    """Deploy the candidate ``version`` beside the default and mirror ``percent`` of its requests to it.

    ``make k8s-shadow``; returns the namespace's :class:`ClusterLive`.

    Raises:
        LiveError: ``percent`` is not in (0, 100], or the canary of another version is watched.
        DeployError: the candidate did not roll out.
    """
    percent = checked_percent(percent)
    live = ClusterLive(options, version)
    url = live.candidate(version)
    live.set(shadow=Route(version, percent, url))
    live.history.append(
        {
            "action": "k8s-shadow",
            "model": options.model,
            "version": version,
            "percent": percent,
            "namespace": live.namespace,
        }
    )
    return live


def canary(options: ClusterOptions, version: str, percent: float) -> tuple[ClusterLive, CanaryStarted]:
    """Make the candidate ``version`` answer a sticky ``percent`` of the default pods' requests.

    ``make k8s-canary``: a watcher on this machine (started unless one runs) aborts it on a breach of
    the gate's ``live.canary`` thresholds.

    Raises:
        GateError: the gate's config is invalid (before anything changes).
        LiveError: ``percent`` is not in (0, 100], or the canary of another version is watched.
        DeployError: the candidate did not roll out.
    """
    gate = (options.gate_config or Settings().gate_config).resolve()
    config = GateConfig.load(gate)  # a bad file fails here, not in the watcher
    percent = checked_percent(percent)
    live = ClusterLive(options, version)
    url = live.candidate(version)
    running = live.watched()
    live.set(canary=Route(version, percent, url, KEY_HEADER))
    live.history.append(
        {
            "action": "k8s-canary",
            "model": options.model,
            "version": version,
            "percent": percent,
            "namespace": live.namespace,
        }
    )
    if running:
        return live, CanaryStarted(running, False, config.live.canary.window_s)
    argv = [sys.executable, "-m", "rtserve", "k8s", "watch", version, "--gate-config", str(gate), *options.argv()]
    return live, CanaryStarted(start_watcher(argv, live.state), True, config.live.canary.window_s)


def describe(routes: Routes | None) -> str:
    """The routes in a few words (``shadow 2.0 at 100%, canary 2.0 at 10%``, or ``none``)."""
    parts = [
        f"{kind} {r.version} at {r.percent:g}%"
        for kind in ("shadow", "canary")
        if (r := getattr(routes, kind)) is not None
    ]
    return ", ".join(parts) or "none"


def deploy_evidence(
    options: ClusterOptions,
    version: str,
    force: bool,
    reason: str | None,
    shown: Callable[[ShadowReport, Path], object],
) -> tuple[ClusterLive, dict] | None:
    """``make k8s-deploy``'s live evidence, when the gate's ``live.promote.require_shadow`` asks for it.

    The shadow report of ``version`` over the default pods' logs now (``shown`` gets it and where it was
    saved), checked against ``live.shadow``. Returns None when the gate does not require it, else (the
    :class:`ClusterLive` whose history records it, the event); the event is recorded at once when the
    evidence fails and ``force`` overrides it.

    Raises:
        DeployError: the evidence fails (naming the live figure) and no ``force``; or ``force``
            without a ``reason``. Nothing is applied then.
    """
    config = GateConfig.load(options.gate_config or Settings().gate_config)
    if not config.live.require_shadow:
        return None
    if force and not (reason or "").strip():
        raise DeployError('a forced deploy needs a reason (REASON="..."); nothing applied')
    live = ClusterLive(replace(options, candidate_dir=None))
    copy = live.pull_logs()
    found = save_shadow_report(
        options.model,
        version,
        copy.live_log,
        copy.records,
        live.archive(version),
        live.state.shadow_report,
        config.kinds,
    )
    shown(found, live.state.shadow_report)
    figures, failures = promote_evidence(config.live.shadow, found)
    event = {
        "action": "k8s-promote",
        "model": options.model,
        "version": version,
        "namespace": live.namespace,
        "live": figures,
        "failures": failures,
    }
    if failures and not force:
        live.history.append({**event, "outcome": "refused"})
        raise DeployError(
            "live evidence: " + "; ".join(failures) + " (gate: live.promote.require_shadow; "
            "FORCE=1 REASON=... overrides); nothing applied"
        )
    if failures:
        event.update(forced_by=who_runs(), reason=reason)
        live.history.append({**event, "outcome": "forced"})
        logger.info("live evidence refused %s %s, forced by %s: %s", options.model, version, event["forced_by"], reason)
    else:
        logger.info(
            "live evidence: %d mirrored requests, agreement %.4f (at least %d and %g required)",
            figures["requests"],
            figures["agreement"],
            figures["min_requests"],
            figures["min_agreement"],
        )
    return live, event
