"""``make k8s-deploy`` and ``make k8s-verify``: apply an overlay's rollout, verify it, undo it if verification fails.

The kustomizations are pure functions (:func:`deploy_kustomization`, :func:`verify_kustomization`);
:class:`Kubectl` runs and prints each command; :func:`deploy` and :func:`verify` are the ordered steps.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rtserve.errors import DeployError
from rtserve.k8s import volumes

#: The Job's conditions that end the wait (``status: "True"``).
JOB_CONDITIONS = 'jsonpath={.status.conditions[?(@.status=="True")].type}'
#: Why a Job failed, from its Failed condition (``DeadlineExceeded``: its pod was deleted unfinished).
_FAILED = '.status.conditions[?(@.type=="Failed")]'
JOB_FAILURE = f"jsonpath={{{_FAILED}.reason}}: {{{_FAILED}.message}}"
#: A pod of the new revision whose container has restarted this often has failed (its start-up
#: checks, the warm-up's answers among them, made it exit): the rollout is given up at once
#: rather than after the progress deadline.
CRASH_RESTARTS = 1
#: Seconds between two looks at the cluster while waiting (a rollout's progress, pods ready or
#: gone). Each look is a kubectl run: about 0.13 CPU-s with the API server's share, so a look
#: every 0.25 s takes half a core from the pods being waited for on a 2-core node.
POLL_SECONDS = 2


@dataclass(frozen=True)
class Target:
    """Where and what to deploy (the Makefile's cluster variables).

    Attributes:
        k8s_dir: the kustomize tree (``deploy/k8s``): ``overlays/<name>`` and ``verify``.
        overlay: the overlay to apply; namespace: its namespace; app: the Deployment's name.
        image: the image name the overlay uses; version: the tag (the model version) to deploy.
        model: the model's name (in the change cause).
        build_dir: where the deploy kustomization and its rendered manifests are written.
        verify_build_dir: the same for the verification Job.
        verify_source: the verification Job's kustomization (default: :attr:`verify_dir`).
        rollout_timeout: ``kubectl rollout status --timeout`` (e.g. ``15m``).
        verify_timeout: seconds to wait for the Job's result.
        local_volumes: the overlay's ``local`` PersistentVolumes are on this machine (``make
            cluster``'s node): their directories are made before the apply
            (:mod:`rtserve.k8s.volumes`).
    """

    k8s_dir: Path
    overlay: str
    namespace: str
    app: str
    image: str
    version: str
    model: str
    build_dir: Path
    verify_build_dir: Path
    rollout_timeout: str = "15m"
    verify_timeout: int = 300
    verify_source: Path | None = None
    #: A stricter p99 bound (ms) for this rollout's verification than the image's gate.yaml.
    verify_max_p99_ms: float | None = None
    local_volumes: bool = False

    @property
    def overlay_dir(self) -> Path:
        return self.k8s_dir / "overlays" / self.overlay

    @property
    def verify_dir(self) -> Path:
        """The verification Job's kustomization directory.

        ``verify_source``, else the overlay's own ``verify/`` when it has one (the local overlay's: its images
        taken from the node), else ``k8s_dir/verify``.
        """
        if self.verify_source is not None:
            return self.verify_source
        own = self.overlay_dir / "verify"
        return own if (own / "kustomization.yaml").is_file() else self.k8s_dir / "verify"

    @property
    def tagged(self) -> str:
        return f"{self.image}:{self.version}"


def relative(path: Path, start: Path) -> str:
    """``path`` relative to ``start`` (as ``realpath -m --relative-to`` writes it)."""
    return os.path.relpath(os.path.realpath(path), os.path.realpath(start))


def deploy_kustomization(t: Target) -> str:
    """The kustomization that applies the overlay with this rollout's image and change cause."""
    return (
        "\n".join(
            [
                "# Written by make k8s-deploy: the overlay with this rollout's image and change cause.",
                "apiVersion: kustomize.config.k8s.io/v1beta1",
                "kind: Kustomization",
                "resources:",
                f"  - {relative(t.overlay_dir, t.build_dir)}",
                "images:",
                f"  - name: {t.image}",
                f'    newTag: "{t.version}"',
                "patches:",
                "  - patch: |-",
                "      apiVersion: apps/v1",
                "      kind: Deployment",
                "      metadata:",
                f"        name: {t.app}",
                "        annotations:",
                f'          kubernetes.io/change-cause: "{t.model} {t.version} ({t.tagged}) by make k8s-deploy"',
            ]
        )
        + "\n"
    )


def standalone_kustomization(t: Target, source: Path, build_dir: Path, what: str) -> str:
    """The kustomization that renders ``source`` with the rollout's namespace and image tag.

    ``source`` is applied on its own, beside the overlay's objects (the verification Job, a candidate).
    """
    return (
        "\n".join(
            [
                f"# Written by {what}.",
                "apiVersion: kustomize.config.k8s.io/v1beta1",
                "kind: Kustomization",
                f"namespace: {t.namespace}",
                "resources:",
                f"  - {relative(source, build_dir)}",
                "images:",
                f"  - name: {t.image}",
                f'    newTag: "{t.version}"',
            ]
        )
        + "\n"
    )


def verify_kustomization(t: Target) -> str:
    """The kustomization of the verification Job for this rollout (its namespace and image)."""
    text = standalone_kustomization(
        t, t.verify_dir, t.verify_build_dir, "make k8s-verify: the verification Job for this rollout"
    )
    if t.verify_max_p99_ms is None:
        return text
    return (
        text
        + "\n".join(
            [
                "patches:",
                "  - target:",
                "      kind: Job",
                "    patch: |-",
                "      - op: add",
                "        path: /spec/template/spec/containers/0/args/-",
                f'        value: "--max-p99-ms={t.verify_max_p99_ms:g}"',
            ]
        )
        + "\n"
    )


def seconds(duration: str) -> float:
    """Seconds in a kubectl duration such as ``15m``, ``90s``, ``1h30m`` or ``120``."""
    parts = re.findall(r"(\d+(?:\.\d+)?)([hms]?)", duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise DeployError(f"not a duration: {duration!r} (e.g. 15m, 90s)")
    return sum(float(n) * {"h": 3600, "m": 60, "s": 1, "": 1}[u] for n, u in parts)


def crashed_container(pods: dict, template_hash: str) -> tuple[str, str, str] | None:
    """The first failed container of a pod of the revision ``template_hash``: (pod, container, why), or None.

    Failed: it exited with an error and restarted :data:`CRASH_RESTARTS` times. ``pods`` is
    ``kubectl get pods -o json``'s output.
    """
    for pod in pods.get("items", []):
        if pod["metadata"].get("labels", {}).get("pod-template-hash") != template_hash:
            continue
        statuses = pod.get("status", {})
        for c in statuses.get("containerStatuses", []) + statuses.get("initContainerStatuses", []):
            last = (c.get("lastState") or {}).get("terminated") or {}
            if c.get("restartCount", 0) >= CRASH_RESTARTS and last.get("exitCode", 0) != 0:
                name = pod["metadata"]["name"]
                return (
                    name,
                    c["name"],
                    (
                        f"container {c['name']} of pod {name} exited "
                        f"{last.get('exitCode')} ({last.get('reason', 'Error')}) "
                        f"and restarted {c['restartCount']} time(s)"
                    ),
                )
    return None


def crashed(pods: dict, template_hash: str) -> str | None:
    """Why a pod of the revision ``template_hash`` has failed (:func:`crashed_container`), or None."""
    found = crashed_container(pods, template_hash)
    return found[2] if found else None


def uses_image(manifests: str, tagged: str) -> bool:
    """Whether the rendered manifests run ``tagged`` (an ``image:`` line naming exactly it)."""
    return re.search(rf"(?m)^ *image: {re.escape(tagged)}$", manifests) is not None


def job_result(conditions: str) -> str | None:
    """``Complete`` or ``Failed`` once the Job's true conditions say so, else None."""
    for result in ("Complete", "Failed"):
        if result in conditions:
            return result
    return None


class Kubectl:
    """Runs ``kubectl`` (or a stand-in): each command printed first, its output passed through unless captured.

    ``command`` is a command line, options included (the local cluster's is
    ``.../kubectl --kubeconfig build/cluster/admin.kubeconfig``).
    """

    def __init__(self, command: str = "kubectl", out: Callable[[str], None] | None = None) -> None:
        self.command = shlex.split(command)
        if not self.command:
            raise DeployError("no kubectl command given (KUBECTL is empty)")
        self.binary = self.command[0]
        self.out = out or say

    def shown(self, *args: str) -> str:
        """``kubectl args`` as a shell would run it (the command's options included)."""
        return shlex.join([*self.command, *args])

    def __call__(
        self, *args: str, capture: bool = False, into: Path | None = None, quiet: bool = False, errors: bool = True
    ) -> str:
        """Run ``kubectl args``; returns its stdout when ``capture`` (written to ``into`` when given).

        ``quiet``: the command is not printed (the polls of a wait); ``errors``: its stderr is shown (else kept
        out: an expected refusal, such as a lookup of what may not exist yet).

        Raises:
            DeployError: it exited non-zero (its stderr was shown), or cannot be run.
        """
        cmd = [*self.command, *args]
        if not quiet:
            self.out(self.shown(*args) + (f" > {into}" if into else ""))
        try:
            done = subprocess.run(
                cmd,
                stdout=subprocess.PIPE if capture or into else None,
                stderr=None if errors else subprocess.DEVNULL,
                text=True,
            )
        except OSError as exc:
            raise DeployError(f"cannot run {self.binary}: {exc}") from exc
        if done.returncode != 0:
            raise DeployError(f"{shlex.join(cmd)} exited {done.returncode}")
        if into is not None:
            into.write_text(done.stdout)
        return done.stdout or ""


def say(line: str) -> None:
    """Print a line now (before the output of the next command)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def render(kubectl: Kubectl, build_dir: Path, kustomization: str) -> Path:
    """Write ``kustomization`` into a fresh ``build_dir`` and render it; returns the manifests' path."""
    shutil.rmtree(build_dir, ignore_errors=True)
    build_dir.mkdir(parents=True)
    (build_dir / "kustomization.yaml").write_text(kustomization)
    manifests = build_dir / "manifests.yaml"
    kubectl("kustomize", str(build_dir), into=manifests)
    return manifests


def verify(t: Target, kubectl: Kubectl, sleep: Callable[[float], None] = time.sleep) -> None:
    """Run the verification Job against the overlay's Service and wait for its result.

    Raises:
        DeployError: the Job failed or gave no result within ``verify_timeout`` (its log shown).
    """
    manifests = render(kubectl, t.verify_build_dir, verify_kustomization(t))
    job = f"job/{t.app}-verify"
    kubectl("-n", t.namespace, "delete", job, "--ignore-not-found", "--wait=true")
    kubectl("apply", "-f", str(manifests))
    result = None
    for _ in range(t.verify_timeout // 2):
        result = job_result(kubectl("-n", t.namespace, "get", job, "-o", JOB_CONDITIONS, capture=True))
        if result:
            break
        sleep(2)
    try:
        kubectl("-n", t.namespace, "logs", job)
    except DeployError:
        pass  # no log to show: the result says why
    if result != "Complete":
        why = result or f"no result in {t.verify_timeout} s"
        if result == "Failed":
            reason = _best_effort(kubectl, "-n", t.namespace, "get", job, "-o", JOB_FAILURE)
            why = f"Failed: {reason}" if reason.strip(": ") else why
        why_stuck(t, kubectl)
        raise DeployError(f"verification of {t.tagged} on {t.overlay} failed ({why})")
    say(f">> {t.tagged} verified on {t.overlay}")


def deploy(t: Target, kubectl: Kubectl, sleep: Callable[[float], None] = time.sleep) -> None:
    """Apply the overlay with this rollout's image, wait for the rollout, verify it; undo it if either fails.

    With ``local_volumes``, the local volumes' directories are made first. The undo is waited for too.

    Raises:
        DeployError: no such overlay, the overlay does not use the image, a local volume's
            directory cannot be made, the rollout did not finish, or the verification failed
            (then after the undo).
    """
    if not t.overlay_dir.is_dir():
        have = " ".join(sorted(p.name for p in (t.k8s_dir / "overlays").glob("*")))
        raise DeployError(f"no overlay {t.overlay_dir} (have: {have})")
    manifests = render(kubectl, t.build_dir, deploy_kustomization(t))
    if not uses_image(manifests.read_text(), t.tagged):
        raise DeployError(f"the {t.overlay} overlay's image is not {t.image} (set IMG to the overlay's image name)")
    if t.local_volumes:
        volumes.prepare(kubectl, volumes.local_volumes(manifests.read_text()), say)
    before = revision(kubectl, t)
    kubectl("apply", "-f", str(manifests))
    deployment = f"deployment/{t.app}"
    status = ("-n", t.namespace, "rollout", "status", deployment, f"--timeout={t.rollout_timeout}")
    try:
        wait_rollout(t, kubectl, sleep)
    except DeployError as exc:
        say(f">> {exc}")
        why_stuck(t, kubectl)
        if not _undoable(kubectl, t, before):
            raise DeployError(
                f"the rollout of {t.tagged} to {t.overlay} failed, and there is no "
                f"earlier revision of this apply to roll back to"
            ) from exc
        say(f">> the rollout of {t.tagged} to {t.overlay} failed: rolling back")
        kubectl("-n", t.namespace, "rollout", "undo", deployment)
        kubectl(*status)
        raise DeployError(f"the rollout of {t.tagged} to {t.overlay} failed and was rolled back") from exc
    try:
        verify(t, kubectl, sleep)
    except DeployError as exc:
        say(f">> {exc}")
        if not _undoable(kubectl, t, before):
            raise DeployError(
                f"{t.tagged} failed its verification on {t.overlay}, and there is no "
                f"earlier revision of this apply to roll back to (its first "
                f"revision, or an apply that changed nothing)"
            ) from exc
        say(f">> {t.tagged} failed its verification on {t.overlay}: rolling back")
        kubectl("-n", t.namespace, "rollout", "undo", deployment)
        kubectl(*status)
        raise DeployError(f"{t.tagged} failed its verification on {t.overlay} and was rolled back") from exc


def wait_rollout(
    t: Target,
    kubectl: Kubectl,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Wait until the Deployment's rollout completes.

    Raises:
        DeployError: a pod of the new revision failed (:func:`crashed`, with the end of its
            log), the progress deadline passed, or ``rollout_timeout`` did.
    """
    deployment = f"deployment/{t.app}"
    deadline, said = clock() + seconds(t.rollout_timeout), ""
    say(
        kubectl.shown("-n", t.namespace, "rollout", "status", deployment, f"--timeout={t.rollout_timeout}")
        + " (and the new pods' restarts)"
    )
    while True:
        done = kubectl(
            "-n", t.namespace, "rollout", "status", deployment, "--watch=false", capture=True, quiet=True
        ).rstrip()
        if done != said:
            say(done)
            said = done
        if "successfully rolled out" in done:
            return
        revision = json.loads(kubectl("-n", t.namespace, "get", deployment, "-o", "json", capture=True, quiet=True))
        new = _newest_replicaset(kubectl, t, revision)
        if new:
            pods = json.loads(
                kubectl(
                    "-n",
                    t.namespace,
                    "get",
                    "pods",
                    "-l",
                    f"pod-template-hash={new}",
                    "-o",
                    "json",
                    capture=True,
                    quiet=True,
                )
            )
            found = crashed_container(pods, new)
            if found:
                pod, container, why = found
                try:
                    kubectl("-n", t.namespace, "logs", pod, "-c", container, "--previous", "--tail=15")
                except DeployError:
                    pass  # no earlier log kept: the reason says enough
                raise DeployError(f"{t.tagged} on {t.overlay}: {why}")
        if clock() > deadline:
            raise DeployError(f"the rollout of {t.tagged} to {t.overlay} did not finish within {t.rollout_timeout}")
        sleep(POLL_SECONDS)


def why_stuck(t: Target, kubectl: Kubectl, events: int = 12) -> None:
    """Print what a failed rollout leaves to read: the namespace's pods and its latest warning events.

    Events newest last (failed probes, scheduling, evictions). Best effort: a lookup that fails is skipped, the
    rollout's own error stays the one raised.
    """
    try:
        kubectl("-n", t.namespace, "get", "pods", "-o", "wide", quiet=True)
        warnings = kubectl(
            "-n",
            t.namespace,
            "get",
            "events",
            "--field-selector",
            "type=Warning",
            "--sort-by=.lastTimestamp",
            "-o",
            "custom-columns=LAST:.lastTimestamp,COUNT:.count,OBJECT:.involvedObject.name,"
            "REASON:.reason,MESSAGE:.message",
            capture=True,
            quiet=True,
        ).splitlines()
    except DeployError:
        return
    if len(warnings) > 1:
        say(f">> the namespace's last {min(events, len(warnings) - 1)} warning events:")
        say("\n".join([warnings[0], *warnings[1:][-events:]]))


def _best_effort(kubectl: Kubectl, *args: str) -> str:
    """What ``kubectl args`` prints, or "" where it fails (a lookup for a message, never the error raised)."""
    try:
        return kubectl(*args, capture=True, quiet=True).strip()
    except DeployError:
        return ""


def revision(kubectl: Kubectl, t: Target) -> str | None:
    """The Deployment's current revision number (``deployment.kubernetes.io/revision``), or None if none yet."""
    try:
        return (
            kubectl(
                "-n",
                t.namespace,
                "get",
                f"deployment/{t.app}",
                "-o",
                r"jsonpath={.metadata.annotations.deployment\.kubernetes\.io/revision}",
                capture=True,
                quiet=True,
                errors=False,
            ).strip()
            or None
        )
    except DeployError:
        return None


def _undoable(kubectl: Kubectl, t: Target, before: str | None) -> bool:
    """Whether ``rollout undo`` returns to what ran before this apply.

    True when there was a Deployment and the apply made a new revision of it.
    """
    return before is not None and revision(kubectl, t) not in (None, before)


def _newest_replicaset(kubectl: Kubectl, t: Target, deployment: dict) -> str | None:
    """The ``pod-template-hash`` of the Deployment's current revision (its newest ReplicaSet)."""
    revision = deployment["metadata"].get("annotations", {}).get("deployment.kubernetes.io/revision")
    selector = ",".join(f"{k}={v}" for k, v in deployment["spec"]["selector"]["matchLabels"].items())
    sets = json.loads(
        kubectl("-n", t.namespace, "get", "replicasets", "-l", selector, "-o", "json", capture=True, quiet=True)
    )
    for rs in sets.get("items", []):
        meta = rs["metadata"]
        if meta.get("annotations", {}).get("deployment.kubernetes.io/revision") == revision:
            return meta.get("labels", {}).get("pod-template-hash")
    return None
