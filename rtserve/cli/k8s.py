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

``make k8s-deploy``, ``make pod``, ``make k8s-shadow``, ... call these; ``canary`` starts ``watch``, its watcher.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from rtserve.cli.common import command, group
from rtserve.cli.live import show_report
from rtserve.k8s.deploy import Kubectl, Target, deploy, verify
from rtserve.k8s.pod import Deployed, info, status, stop
from rtserve.promotion.live import cluster
from rtserve.promotion.live.cluster import ClusterLive, ClusterOptions, describe
from rtserve.promotion.live.routes import KEY_HEADER
from rtserve.settings import Settings

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
    p.add_argument(
        "--verify-dir",
        type=Path,
        help="the Job's kustomization (default: the overlay's verify/ if it has one, else K8S_DIR/verify)",
    )
    p.add_argument(
        "--kubectl", default="kubectl", help="the kubectl command, options included (e.g. 'kubectl --kubeconfig FILE')"
    )
    p.add_argument("--rollout-timeout", default="15m")
    p.add_argument("--verify-timeout", type=int, default=300, help="seconds")
    p.add_argument(
        "--verify-max-p99-ms", type=float, help="a stricter p99 bound for the verification than the image's gate.yaml"
    )
    p.add_argument(
        "--gate-config",
        type=Path,
        help="with live.promote.require_shadow, deploy asks the shadow's evidence first (default: config/gate.yaml)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        help="the live commands' copies (K8S_LIVE_DIR; default: BUILD_DIR-live): the evidence's history goes there",
    )
    p.add_argument("--model-store", type=Path, help="where the candidate's archive gives its labels")
    p.add_argument("--force", action="store_true", help="deploy though the live evidence fails (with --reason)")
    p.add_argument("--reason", help="why a refused version is forced (recorded)")
    p.add_argument(
        "--local-volumes",
        action="store_true",
        help="this machine is the node (make cluster): make the directories of the "
        "overlay's local PersistentVolumes before the apply",
    )
    return p


def _target(args: argparse.Namespace) -> Target:
    build = args.build_dir or Path("build/k8s") / args.overlay
    return Target(
        args.k8s_dir,
        args.overlay,
        args.namespace or f"rtserve-{args.overlay}",
        args.app,
        args.image,
        args.version,
        args.model,
        build,
        args.verify_build_dir or Path(f"{build}-verify"),
        args.rollout_timeout,
        args.verify_timeout,
        args.verify_dir,
        args.verify_max_p99_ms,
        args.local_volumes,
    )


def cmd_deploy(args: argparse.Namespace) -> int:
    """Apply OVERLAY with IMAGE:VERSION, wait for the rollout, verify it; undo it if that fails.

    With the gate's live.promote.require_shadow, the shadow's evidence comes first.
    """
    evidence = cluster.deploy_evidence(
        live_options(args),
        args.version,
        args.force,
        args.reason,
        lambda found, saved_to: show_report(found, saved_to, False),
    )
    deploy(_target(args), Kubectl(args.kubectl))
    if evidence is not None:
        evidence[0].history.append({**evidence[1], "outcome": "deployed"})
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Run the verification Job (IMAGE:VERSION) against OVERLAY's Service: golden set + p99."""
    verify(_target(args), Kubectl(args.kubectl))
    return 0


def pod_options() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--namespace", default="rtserve-local")
    p.add_argument("--app", default="rtserve", help="the Deployment's name (K8S_APP)")
    p.add_argument("--model", default="realtime-classifier")
    p.add_argument(
        "--kubectl", default="kubectl", help="the kubectl command, options included (e.g. 'kubectl --kubeconfig FILE')"
    )
    p.add_argument(
        "--token-file",
        type=Path,
        default=Path(".run/pod/gateway-token"),
        help="pod-info writes the gateway token here (mode 0600)",
    )
    return p


def _deployed(args: argparse.Namespace) -> Deployed:
    return Deployed(Kubectl(args.kubectl), args.namespace, args.app)


def cmd_pod_info(args: argparse.Namespace) -> int:
    """Where and how to call the Deployment's pods (after `make k8s-deploy`); saves the token."""
    print("\n".join(info(_deployed(args), args.model, args.token_file)))
    return 0


def cmd_pod_status(args: argparse.Namespace) -> int:
    """The Deployment's pods: phase, readiness, version, restarts, address."""
    print("\n".join(status(_deployed(args))))
    return 0


def cmd_pod_stop(args: argparse.Namespace) -> int:
    """Delete the Deployment (preStop drains each pod), then its namespace."""
    print("\n".join(stop(_deployed(args))))
    return 0


def live_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--overlay", required=True, help="deploy/k8s/overlays/<OVERLAY>")
    p.add_argument("--image", default="registry.example.com/ml/rtserve", help="the image name the overlay uses (IMG)")
    p.add_argument("--namespace", help="default: rtserve-<OVERLAY>")
    p.add_argument("--app", default="rtserve", help="the default's Deployment (K8S_APP)")
    p.add_argument("--model", default="realtime-classifier")
    p.add_argument("--k8s-dir", type=Path, default=Path("deploy/k8s"))
    p.add_argument("--build-dir", type=Path, help="default: build/k8s/<OVERLAY>")
    p.add_argument(
        "--candidate-dir",
        type=Path,
        help="the candidate's kustomization (default: the overlay's candidate/ if it has one, else K8S_DIR/candidate)",
    )
    p.add_argument(
        "--state-dir",
        type=Path,
        help="this machine's copies: routes, the pods' logs, the watcher's PID file and "
        "log, the history (default: BUILD_DIR-live)",
    )
    p.add_argument(
        "--kubectl", default="kubectl", help="the kubectl command, options included (e.g. 'kubectl --kubeconfig FILE')"
    )
    p.add_argument("--rollout-timeout", default="15m")
    p.add_argument("--gate-config", type=Path, help="the canary's thresholds (default: config/gate.yaml)")
    p.add_argument(
        "--model-store",
        type=Path,
        help="where shadow-report finds the candidate's archive (its label order ranks the disagreements)",
    )
    return p


def live_options(args: argparse.Namespace) -> ClusterOptions:
    """The live options of a live command (or of ``deploy``, whose evidence reads the pods).

    The gate's thresholds and the model store default to the environment's settings.
    """
    defaults = Settings.from_env()
    return ClusterOptions(
        overlay=args.overlay,
        image=args.image,
        namespace=args.namespace,
        app=args.app,
        model=args.model,
        k8s_dir=args.k8s_dir,
        build_dir=args.build_dir,
        candidate_dir=getattr(args, "candidate_dir", None),
        state_dir=args.state_dir,
        kubectl=args.kubectl,
        rollout_timeout=args.rollout_timeout,
        gate_config=args.gate_config or defaults.gate_config,
        model_store=args.model_store or defaults.model_store,
    )


def cmd_shadow(args: argparse.Namespace) -> int:
    """Deploy the candidate VERSION beside the default and mirror PERCENT of the default pods' requests to it.

    Callers see the default only.
    """
    live = cluster.shadow(live_options(args), args.version, args.percent)
    logger.info(
        "shadow: %g%% of %s's requests in %s mirrored to %s; `make k8s-shadow-report` compares the answers",
        args.percent,
        args.model,
        live.namespace,
        args.version,
    )
    return 0


def cmd_shadow_report(args: argparse.Namespace) -> int:
    """Read the default pods' live logs and records and compare the shadow's answers with theirs."""
    live = ClusterLive(live_options(args))
    show_report(live.shadow_report(args.version), live.state.shadow_report, args.json)
    return 0


def cmd_canary(args: argparse.Namespace) -> int:
    """Deploy the candidate VERSION to answer a sticky PERCENT of the default pods' requests.

    A watcher on this machine aborts it on a breach of the gate's live.canary thresholds.
    """
    live, started = cluster.canary(live_options(args), args.version, args.percent)
    if not started.started:
        logger.info("canary %s: share now %g%% (watcher pid %d)", args.version, args.percent, started.pid)
        return 0
    logger.info(
        "canary: %g%% of %s's requests (sticky per %s) answered by %s; watcher pid %d "
        "(log %s) aborts when, over %g s, the error rate, p99 or agreement breaches "
        "the gate's live.canary",
        args.percent,
        args.model,
        KEY_HEADER,
        args.version,
        started.pid,
        live.state.canary_log,
        started.window_s,
    )
    return 0


def cmd_watch(args: argparse.Namespace) -> int:
    """The cluster's canary watcher (`make k8s-canary` starts it in the background)."""
    pods = ClusterLive(live_options(args), args.version).watch(args.version)
    if pods is not None:
        logger.info("abort recorded in the audit log of %s", ", ".join(pods) or "no pod")
    return 0


def cmd_live_stop(args: argparse.Namespace) -> int:
    """Stop the canary's watcher, turn the shadow and canary off in every default pod, and delete the candidate."""
    live = ClusterLive(live_options(args))
    pid = live.stop_watcher()
    if pid is not None:
        logger.info("canary watcher %d stopped", pid)
    before = live.stop()
    logger.info("live routes off (were: %s); candidate deleted", describe(before))
    return 0


def add(groups: argparse._SubParsersAction) -> None:
    commands = group(groups, "k8s", __doc__)
    command(commands, "deploy", cmd_deploy, parents=(options(),))
    command(commands, "verify", cmd_verify, parents=(options(),))
    command(commands, "pod-info", cmd_pod_info, parents=(pod_options(),))
    command(commands, "pod-status", cmd_pod_status, parents=(pod_options(),))
    command(commands, "pod-stop", cmd_pod_stop, parents=(pod_options(),))
    version = (["version"], {"help": "the candidate: the image tag (model version)"})
    command(
        commands,
        "shadow",
        cmd_shadow,
        version,
        (["--percent"], {"type": float, "default": 100.0, "help": "share mirrored (default 100)"}),
        parents=(live_parser(),),
    )
    command(
        commands,
        "shadow-report",
        cmd_shadow_report,
        (["--version"], {"help": "the candidate (default: the shadow route's)"}),
        (["--json"], {"action": "store_true", "help": "print the JSON instead of the text"}),
        parents=(live_parser(),),
    )
    command(
        commands,
        "canary",
        cmd_canary,
        version,
        (["--percent"], {"type": float, "required": True, "help": "share answered by the candidate"}),
        parents=(live_parser(),),
    )
    command(commands, "watch", cmd_watch, version, parents=(live_parser(),))
    command(commands, "live-stop", cmd_live_stop, parents=(live_parser(),))
