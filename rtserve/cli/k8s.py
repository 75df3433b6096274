"""``python -m rtserve k8s``: deploy an overlay to a cluster and verify the rollout (kubectl).

    python -m rtserve k8s deploy --overlay staging --image registry.example.com/ml/rtserve --version 2.0
    python -m rtserve k8s verify --overlay staging --image registry.example.com/ml/rtserve --version 2.0

    python -m rtserve k8s pod-info --namespace rtserve-local --token-file .run/pod/gateway-token
    python -m rtserve k8s pod-status --namespace rtserve-local
    python -m rtserve k8s pod-stop --namespace rtserve-local

``make k8s-deploy`` and ``make k8s-verify`` call these with the Makefile's variables; ``make pod``,
``make pod-status`` and ``make pod-stop`` the last three (:mod:`rtserve.k8s.pod`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rtserve.cli.common import command, group


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
    return p


def _target(args: argparse.Namespace):
    from rtserve.k8s.deploy import Target

    build = args.build_dir or Path("build/k8s") / args.overlay
    return Target(args.k8s_dir, args.overlay, args.namespace or f"rtserve-{args.overlay}", args.app,
                  args.image, args.version, args.model, build,
                  args.verify_build_dir or Path(f"{build}-verify"), args.rollout_timeout,
                  args.verify_timeout, args.verify_dir, args.verify_max_p99_ms)


def cmd_deploy(args: argparse.Namespace) -> int:
    """Apply OVERLAY with IMAGE:VERSION, wait for the rollout, verify it; undo it if that fails."""
    from rtserve.k8s.deploy import Kubectl, deploy

    deploy(_target(args), Kubectl(args.kubectl))
    return 0


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


def add(groups: argparse._SubParsersAction) -> None:
    commands = group(groups, "k8s", __doc__)
    command(commands, "deploy", cmd_deploy, parents=(options(),))
    command(commands, "verify", cmd_verify, parents=(options(),))
    command(commands, "pod-info", cmd_pod_info, parents=(pod_options(),))
    command(commands, "pod-status", cmd_pod_status, parents=(pod_options(),))
    command(commands, "pod-stop", cmd_pod_stop, parents=(pod_options(),))
