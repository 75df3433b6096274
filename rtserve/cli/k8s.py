"""``python -m rtserve k8s``: deploy an overlay to a cluster and verify the rollout (kubectl).

    python -m rtserve k8s deploy --overlay staging --image registry.example.com/ml/rtserve --version 2.0
    python -m rtserve k8s verify --overlay staging --image registry.example.com/ml/rtserve --version 2.0

    python -m rtserve k8s pod-info --namespace rtserve-local --token-file .run/pod/gateway-token
    python -m rtserve k8s pod-status --namespace rtserve-local
    python -m rtserve k8s pod-stop --namespace rtserve-local

    python -m rtserve k8s shadow 2.0 --percent 100 --overlay local --image registry.example.com/ml/rtserve
    python -m rtserve k8s shadow-report --overlay local
    python -m rtserve k8s canary 2.0 --percent 10 --overlay local --image registry.example.com/ml/rtserve
    python -m rtserve k8s live-stop --overlay local

``make k8s-deploy`` and ``make k8s-verify`` call these with the Makefile's variables; ``make pod``,
``make pod-status`` and ``make pod-stop`` the pod-* ones (:mod:`rtserve.k8s.pod`); ``make
k8s-shadow``, ``k8s-shadow-report``, ``k8s-canary`` and ``k8s-live-stop`` the last four
(:mod:`rtserve.k8s.live`; the canary's watcher is ``watch``, which ``canary`` starts).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from rtserve.cli.common import command, group

logger = logging.getLogger(__name__)


def options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--overlay", required=True, help="deploy/k8s/overlays/<OVERLAY>")
    p.add_argument("--image", required=True, help="the image name the overlay uses (IMG)")
    p.add_argument("--version", required=True, help="the image tag: the model version")
    p.add_argument("--namespace", help="default: rtserve-<OVERLAY>")
    p.add_argument("--app", default="rtserve", help="the Deployment's name (K8S_APP)")
    p.add_argument("--model", default="realtime-classifier", help="the model (in the change cause)")
    p.add_argument("--k8s-dir", type=Path, default=Path("deploy/k8s"))
    p.add_argument("--build-dir", type=Path, help="default: build/k8s/<OVERLAY>")
    p.add_argument("--verify-build-dir", type=Path, help="default: BUILD_DIR-verify")
    p.add_argument("--verify-dir", type=Path, help="the Job's kustomization (default: the overlay's "
                                                   "verify/ if it has one, else K8S_DIR/verify)")
    p.add_argument("--kubectl", default="kubectl",
                   help="the kubectl command, options included (e.g. 'kubectl --kubeconfig FILE')")
    p.add_argument("--rollout-timeout", default="15m")
    p.add_argument("--verify-timeout", type=int, default=300, help="seconds")
    p.add_argument("--verify-max-p99-ms", type=float,
                   help="a stricter p99 bound for the verification than the image's gate.yaml")
    p.add_argument("--gate-config", type=Path,
                   help="with live.promote.require_shadow, deploy asks the shadow's evidence first "
                        "(default: config/gate.yaml)")
    p.add_argument("--state-dir", type=Path, help="the live commands' copies (K8S_LIVE_DIR; default: "
                                                  "BUILD_DIR-live): the evidence's history goes there")
    p.add_argument("--model-store", type=Path, help="where the candidate's archive gives its labels")
    p.add_argument("--force", action="store_true", help="deploy though the live evidence fails (with --reason)")
    p.add_argument("--reason", help="why a refused version is forced (recorded)")
    p.add_argument("--local-volumes", action="store_true",
                   help="this machine is the node (make cluster): make the directories of the "
                        "overlay's local PersistentVolumes before the apply")
    return p


def _target(args: argparse.Namespace):
    from rtserve.k8s.deploy import Target

    build = args.build_dir or Path("build/k8s") / args.overlay
    return Target(args.k8s_dir, args.overlay, args.namespace or f"rtserve-{args.overlay}", args.app,
                  args.image, args.version, args.model, build,
                  args.verify_build_dir or Path(f"{build}-verify"), args.rollout_timeout,
                  args.verify_timeout, args.verify_dir, args.verify_max_p99_ms,
                  args.local_volumes)


def cmd_deploy(args: argparse.Namespace) -> int:
    """Apply OVERLAY with IMAGE:VERSION, wait for the rollout, verify it; undo it if that fails.
    With the gate's live.promote.require_shadow, the shadow's evidence comes first."""
    from rtserve.k8s.deploy import Kubectl, deploy

    evidence = live_evidence(args)
    deploy(_target(args), Kubectl(args.kubectl))
    if evidence is not None:
        evidence[0].history.append({**evidence[1], "outcome": "deployed"})
    return 0


def live_evidence(args: argparse.Namespace):
    """With the gate's ``live.promote.require_shadow``: the shadow report of ``args.version``
    over the default pods' logs now (as `make k8s-shadow-report` reads them), checked against
    ``live.shadow``; None when the gate does not require it. Else (the :class:`Live` whose
    history records it, the event); the event is recorded there at once when the evidence
    fails and ``--force`` overrides it.

    Raises:
        GateRefused-like :class:`DeployError`: the evidence fails (naming the live figure) and
            no ``--force``; or ``--force`` without a reason. Nothing is applied then.
    """
    from rtserve.cli.live import report
    from rtserve.errors import DeployError
    from rtserve.promotion.gate import GateConfig
    from rtserve.promotion.live import promote_evidence
    from rtserve.promotion.rollout import who_runs
    from rtserve.settings import Settings

    config = GateConfig.load(args.gate_config or Settings.from_env().gate_config)
    if not config.live.require_shadow:
        return None
    if args.force and not (args.reason or "").strip():
        raise DeployError("a forced deploy needs a reason (REASON=\"...\"); nothing applied")
    live = Live(argparse.Namespace(**{**vars(args), "candidate_dir": None}))
    copy = live.pull_logs()
    store = args.model_store or Settings.from_env().model_store
    found = report(args.model, args.version, copy.live_log, copy.records, store, live.state.shadow_report,
                   False)
    figures, failures = promote_evidence(config.live.shadow, found)
    event = {"action": "k8s-promote", "model": args.model, "version": args.version,
             "namespace": live.namespace, "live": figures, "failures": failures}
    if failures and not args.force:
        live.history.append({**event, "outcome": "refused"})
        raise DeployError("live evidence: " + "; ".join(failures) + " (gate: live.promote.require_shadow; "
                          "FORCE=1 REASON=... overrides); nothing applied")
    if failures:
        event.update(forced_by=who_runs(), reason=args.reason)
        live.history.append({**event, "outcome": "forced"})
        logger.info("live evidence refused %s %s, forced by %s: %s", args.model, args.version,
                    event["forced_by"], args.reason)
    else:
        logger.info("live evidence: %d mirrored requests, agreement %.4f (at least %d and %g required)",
                    figures["requests"], figures["agreement"], figures["min_requests"], figures["min_agreement"])
    return live, event


def cmd_verify(args: argparse.Namespace) -> int:
    """Run the verification Job (IMAGE:VERSION) against OVERLAY's Service: golden set + p99."""
    from rtserve.k8s.deploy import Kubectl, verify

    verify(_target(args), Kubectl(args.kubectl))
    return 0


def pod_options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--namespace", default="rtserve-local")
    p.add_argument("--app", default="rtserve", help="the Deployment's name (K8S_APP)")
    p.add_argument("--model", default="realtime-classifier")
    p.add_argument("--kubectl", default="kubectl",
                   help="the kubectl command, options included (e.g. 'kubectl --kubeconfig FILE')")
    p.add_argument("--token-file", type=Path, default=Path(".run/pod/gateway-token"),
                   help="pod-info writes the gateway token here (mode 0600)")
    return p


def _deployed(args: argparse.Namespace):
    from rtserve.k8s.deploy import Kubectl
    from rtserve.k8s.pod import Deployed

    return Deployed(Kubectl(args.kubectl), args.namespace, args.app)


def cmd_pod_info(args: argparse.Namespace) -> int:
    """Where and how to call the Deployment's pods (after `make k8s-deploy`); saves the token."""
    from rtserve.k8s.pod import info

    print("\n".join(info(_deployed(args), args.model, args.token_file)))
    return 0


def cmd_pod_status(args: argparse.Namespace) -> int:
    """The Deployment's pods: phase, readiness, version, restarts, address."""
    from rtserve.k8s.pod import status

    print("\n".join(status(_deployed(args))))
    return 0


def cmd_pod_stop(args: argparse.Namespace) -> int:
    """Delete the Deployment (preStop drains each pod), then its namespace."""
    from rtserve.k8s.pod import stop

    print("\n".join(stop(_deployed(args))))
    return 0


def live_options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--overlay", required=True, help="deploy/k8s/overlays/<OVERLAY>")
    p.add_argument("--image", default="registry.example.com/ml/rtserve",
                   help="the image name the overlay uses (IMG)")
    p.add_argument("--namespace", help="default: rtserve-<OVERLAY>")
    p.add_argument("--app", default="rtserve", help="the default's Deployment (K8S_APP)")
    p.add_argument("--model", default="realtime-classifier")
    p.add_argument("--k8s-dir", type=Path, default=Path("deploy/k8s"))
    p.add_argument("--build-dir", type=Path, help="default: build/k8s/<OVERLAY>")
    p.add_argument("--candidate-dir", type=Path,
                   help="the candidate's kustomization (default: the overlay's candidate/ if it "
                        "has one, else K8S_DIR/candidate)")
    p.add_argument("--state-dir", type=Path,
                   help="this machine's copies: routes, the pods' logs, the watcher's PID file and "
                        "log, the history (default: BUILD_DIR-live)")
    p.add_argument("--kubectl", default="kubectl",
                   help="the kubectl command, options included (e.g. 'kubectl --kubeconfig FILE')")
    p.add_argument("--rollout-timeout", default="15m")
    p.add_argument("--gate-config", type=Path, help="the canary's thresholds (default: config/gate.yaml)")
    p.add_argument("--model-store", type=Path, help="where shadow-report finds the candidate's "
                                                    "archive (its label order ranks the disagreements)")
    return p


class Live:
    """What the live commands share: the cluster (:class:`rtserve.k8s.live.Cluster`), the
    candidate's deploy target, this machine's state directory (named as a run directory's files)."""

    def __init__(self, args: argparse.Namespace, version: str = "") -> None:
        from rtserve.k8s.deploy import Kubectl, Target
        from rtserve.k8s.live import Cluster, candidate_target
        from rtserve.settings import RunDir

        self.args = args
        self.namespace = args.namespace or f"rtserve-{args.overlay}"
        build = args.build_dir or Path("build/k8s") / args.overlay
        overlay_own = args.k8s_dir / "overlays" / args.overlay / "candidate"
        source = args.candidate_dir or (overlay_own if (overlay_own / "kustomization.yaml").is_file()
                                        else args.k8s_dir / "candidate")
        self.target = candidate_target(
            Target(args.k8s_dir, args.overlay, self.namespace, args.app, args.image, version,
                   args.model, build, Path(f"{build}-verify"), args.rollout_timeout), source)
        self.cluster = Cluster(Kubectl(args.kubectl), self.namespace, args.app)
        self.state = RunDir(args.state_dir or Path(f"{build}-live"))

    @property
    def history(self):
        from rtserve.promotion.history import History

        return History(self.state.history)

    def routes(self):
        from rtserve.promotion.live import read_routes

        return read_routes(self.state.live_routes)

    def publish(self, routes):
        """``routes`` (as written to the state's routes file) to the cluster, with a new revision
        (:class:`rtserve.promotion.live.RoutesSync` never goes back to an older one)."""
        import time
        from dataclasses import replace

        from rtserve.promotion.live import update_routes

        routes = update_routes(self.state.live_routes, lambda r: replace(
            r, revision=max(r.revision + 1, int(time.time() * 1000))))
        text = self.state.live_routes.read_text()
        pods = self.cluster.publish(text, self.state.path / "live-routes-configmap.json")
        logger.info("routes: ConfigMap rtserve-live-routes and %d default pod(s) (%s): %s",
                    len(pods), ", ".join(pods) or "none ready", _describe(routes))
        return routes

    def set(self, **changed):
        """Set the ``shadow`` and/or ``canary`` route (None: off) and publish the routes."""
        from dataclasses import replace

        from rtserve.k8s.live import POD_RUN, POD_TOKEN_FILE
        from rtserve.promotion.live import Routes, update_routes

        def change(routes):
            routes = routes or Routes(self.args.model, str(POD_RUN.live_log))
            return replace(routes, model=self.args.model, log=str(POD_RUN.live_log),
                           token_file=POD_TOKEN_FILE, **changed)

        return self.publish(update_routes(self.state.live_routes, change))

    def candidate(self, version: str) -> str:
        """Deploy the candidate ``version`` (kept when it already runs it); its URL."""
        from dataclasses import replace

        from rtserve.errors import LiveError
        from rtserve.k8s.live import candidate_url
        from rtserve.promotion.rollout import archive_name

        archive_name(self.args.model, version)  # a plain name
        running = self.cluster.candidate_version()
        if running not in (None, version) and self._watched():
            raise LiveError(f"the canary of {running} is watched (pid {self._watched()}): "
                            "`make k8s-live-stop` first; nothing changed")
        self.cluster.apply_candidate(replace(self.target, version=version))
        return candidate_url(self.namespace, self.args.model, version)

    def pull_logs(self):
        """Copy what every default pod's live log and records hold into the state's ``report/``
        (afresh); the copy (:class:`rtserve.k8s.live.LogCopy`)."""
        from rtserve.k8s.live import LogCopy

        into = self.state.path / "report"
        copy = LogCopy(into / "live-log.jsonl", into / "records.jsonl").fresh()
        lines = copy.pull(self.cluster)
        logger.info("read %d lines of the live logs and records of %d default pod(s)", lines, len(copy.offsets))
        return copy

    def _watched(self) -> int | None:
        from rtserve.promotion.live import watcher_pid

        return watcher_pid(self.state.canary_pid)


def _describe(routes) -> str:
    parts = [f"{kind} {r.version} at {r.percent:g}%" for kind in ("shadow", "canary")
             if (r := getattr(routes, kind)) is not None]
    return ", ".join(parts) or "none"


def _live_percent(percent: float) -> float:
    from rtserve.errors import LiveError

    if not 0 < percent <= 100:
        raise LiveError(f"--percent must be in (0, 100], got {percent:g}; nothing changed")
    return float(percent)


def cmd_shadow(args: argparse.Namespace) -> int:
    """Deploy the candidate VERSION beside the default and mirror PERCENT of the default pods'
    requests to it (callers see the default only)."""
    from rtserve.promotion.live import Route

    percent = _live_percent(args.percent)
    live = Live(args, args.version)
    url = live.candidate(args.version)
    live.set(shadow=Route(args.version, percent, url))
    live.history.append({"action": "k8s-shadow", "model": args.model, "version": args.version,
                         "percent": percent, "namespace": live.namespace})
    logger.info("shadow: %g%% of %s's requests in %s mirrored to %s; `make k8s-shadow-report` "
                "compares the answers", percent, args.model, live.namespace, args.version)
    return 0


def cmd_shadow_report(args: argparse.Namespace) -> int:
    """Read the default pods' live logs and records and compare the shadow's answers with theirs."""
    from rtserve.cli.live import report
    from rtserve.errors import LiveError
    from rtserve.promotion.live import latest_shadow_version
    from rtserve.settings import Settings

    live = Live(args)
    copy = live.pull_logs()
    route = live.routes() and live.routes().shadow
    version = args.version or (route.version if route else None) or latest_shadow_version(copy.live_log)
    if version is None:
        raise LiveError("no shadow to report on: no shadow route and no shadow line in the pods' "
                        "live logs (`make k8s-shadow MODEL_VERSION=...` first)")
    store = args.model_store or Settings.from_env().model_store
    report(args.model, version, copy.live_log, copy.records, store, live.state.shadow_report,
           args.json)
    return 0


def cmd_canary(args: argparse.Namespace) -> int:
    """The candidate VERSION answers a sticky PERCENT of the default pods' requests; a watcher
    on this machine aborts it on a breach of the gate's live.canary thresholds."""
    import sys

    from rtserve.cli.live import start_watcher
    from rtserve.promotion.gate import GateConfig
    from rtserve.promotion.live import KEY_HEADER, Route
    from rtserve.settings import Settings

    gate = (args.gate_config or Settings.from_env().gate_config).resolve()
    config = GateConfig.load(gate)  # a bad file fails here, not in the watcher
    percent = _live_percent(args.percent)
    live = Live(args, args.version)
    url = live.candidate(args.version)
    running = live._watched()
    live.set(canary=Route(args.version, percent, url, KEY_HEADER))
    live.history.append({"action": "k8s-canary", "model": args.model, "version": args.version,
                         "percent": percent, "namespace": live.namespace})
    if running:
        logger.info("canary %s: share now %g%% (watcher pid %d)", args.version, percent, running)
        return 0
    argv = [sys.executable, "-m", "rtserve", "k8s", "watch", args.version, "--gate-config", str(gate),
            *_passed(args)]
    pid = start_watcher(argv, live.state)
    logger.info("canary: %g%% of %s's requests (sticky per %s) answered by %s; watcher pid %d "
                "(log %s) aborts when, over %g s, the error rate, p99 or agreement breaches "
                "the gate's live.canary", percent, args.model, KEY_HEADER, args.version, pid,
                live.state.canary_log, config.live.canary.window_s)
    return 0


def _passed(args: argparse.Namespace) -> list[str]:
    """The live options as given, for the watcher's command line."""
    out = []
    for name in ("overlay", "image", "namespace", "app", "model", "k8s_dir", "build_dir",
                 "candidate_dir", "state_dir", "kubectl", "rollout_timeout"):
        value = getattr(args, name)
        if value is not None:
            out += [f"--{name.replace('_', '-')}", str(Path(value).resolve()) if isinstance(value, Path) else value]
    return out


def cmd_watch(args: argparse.Namespace) -> int:
    """The cluster's canary watcher (`make k8s-canary` starts it in the background)."""
    from rtserve.cli.live import run_watcher
    from rtserve.k8s.live import LogCopy
    from rtserve.promotion.gate import GateConfig
    from rtserve.promotion.live import Watch
    from rtserve.settings import Settings

    live = Live(args, args.version)
    config = GateConfig.load(args.gate_config or Settings.from_env().gate_config)
    copy = LogCopy(live.state.live_log, live.state.path / "records.jsonl", from_end=True)
    w = Watch(args.model, args.version, live.state.live_routes, live.state.live_log, copy.records,
              live.state.audit_log, live.history, config.live.canary,
              pull=lambda: copy.pull(live.cluster), publish=live.publish)
    event = run_watcher(w, live.state.canary_pid, poll_s=WATCH_POLL_S)
    if event is not None:  # the pods' own audit trails show it too
        pods = live.cluster.audit(event)
        logger.info("abort recorded in the audit log of %s", ", ".join(pods) or "no pod")
    return 0


#: How often the cluster's canary watcher reads the pods' logs (a kubectl exec per pod each time).
WATCH_POLL_S = 2.0


def cmd_live_stop(args: argparse.Namespace) -> int:
    """Stop the canary's watcher, turn the shadow and canary off in every default pod, and
    delete the candidate."""
    from rtserve.promotion.live import stop_watcher

    live = Live(args)
    pid = stop_watcher(live.state.canary_pid)
    if pid is not None:
        logger.info("canary watcher %d stopped", pid)
    before = live.routes()
    live.set(shadow=None, canary=None)
    live.cluster.delete_candidate()
    live.history.append({"action": "k8s-live-stop", "model": args.model, "namespace": live.namespace,
                         "was": _describe(before)})
    logger.info("live routes off (were: %s); candidate deleted", _describe(before))
    return 0


def add(groups: argparse._SubParsersAction) -> None:
    commands = group(groups, "k8s", __doc__)
    command(commands, "deploy", cmd_deploy, parents=(options(),))
    command(commands, "verify", cmd_verify, parents=(options(),))
    command(commands, "pod-info", cmd_pod_info, parents=(pod_options(),))
    command(commands, "pod-status", cmd_pod_status, parents=(pod_options(),))
    command(commands, "pod-stop", cmd_pod_stop, parents=(pod_options(),))
    version = (["version"], {"help": "the candidate: the image tag (model version)"})
    command(commands, "shadow", cmd_shadow, version,
            (["--percent"], {"type": float, "default": 100.0, "help": "share mirrored (default 100)"}),
            parents=(live_options(),))
    command(commands, "shadow-report", cmd_shadow_report,
            (["--version"], {"help": "the candidate (default: the shadow route's)"}),
            (["--json"], {"action": "store_true", "help": "print the JSON instead of the text"}),
            parents=(live_options(),))
    command(commands, "canary", cmd_canary, version,
            (["--percent"], {"type": float, "required": True, "help": "share answered by the candidate"}),
            parents=(live_options(),))
    command(commands, "watch", cmd_watch, version, parents=(live_options(),))
    command(commands, "live-stop", cmd_live_stop, parents=(live_options(),))
