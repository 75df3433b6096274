"""The kubectl side of shadow and canary in a cluster: :class:`Cluster` and :class:`LogCopy`.

The candidate is its own Deployment and Service ``rtserve-candidate``. The routes go to the ConfigMap
``rtserve-live-routes`` and, not to wait up to a minute for the kubelet, straight into each default pod.
The pods' live logs and records are copied here, only what they gained, for the report and the watcher.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path

from handler.audit import event_line
from rtserve.errors import DeployError
from rtserve.k8s.deploy import Kubectl, Target, render, say, standalone_kustomization, wait_rollout
from rtserve.k8s.pod import Deployed
from rtserve.settings import RunDir

#: The candidate's Deployment and Service (deploy/k8s/candidate).
CANDIDATE = "rtserve-candidate"
#: The label of every object of the candidate (what make k8s-live-stop deletes).
CANDIDATE_SELECTOR = "app.kubernetes.io/component=candidate"
#: The ConfigMap the default pods mount at /etc/rtserve-live (deploy/k8s/base/deployment.yaml).
ROUTES_CONFIGMAP = "rtserve-live-routes"
ROUTES_KEY = "routes.json"
#: The rtserve container's run directory (the ``run`` emptyDir) and the Secret's tokens file.
POD_RUN = RunDir(Path("/home/model-server/run"))
POD_TOKEN_FILE = "/etc/rtserve-gateway-tokens/tokens"
#: The inference port of the candidate's Service (its gateway).
PORT = 8080

#: Run in a pod: for each (file, inode, offset) argument triple, the complete lines the file gained
#: since that byte offset of that file, as JSON [[inode, end, text], ...]: when the file is another
#: now (rotated to its backup ``NAME.1``), the rest of the old one (the backup), then the new one's;
#: inode 0 is a first read (the backup, then the file); offset -1: none, only where the file ends.
READ_SCRIPT = """
import json, os, sys
def opened(name):
    try:
        return open(name, "rb")
    except FileNotFoundError:
        return None
out, args = [], sys.argv[1:]
for path, ino, offset in zip(args[0::3], map(int, args[1::3]), map(int, args[2::3])):
    new, old, data = opened(path), opened(path + ".1"), b""
    now = os.fstat(new.fileno()) if new else None
    if offset < 0 or (now and now.st_ino == ino):
        offset = (now.st_size if offset < 0 else offset if offset <= now.st_size else 0) if now else 0
    else:
        if old:
            was = os.fstat(old.fileno()).st_ino
            old.seek(offset if was == ino else 0)
            data = old.read()
            data += b"\\n" if data and not data.endswith(b"\\n") else b""
            ino, offset = (0, 0) if new else (was, old.tell())
        offset = 0 if new else offset
    if new:
        new.seek(offset)
        rest = new.read()
        rest = rest[:rest.rfind(b"\\n") + 1]
        data, offset = data + rest, offset + len(rest)
    out.append([now.st_ino if now else ino if old else 0, offset, data.decode("utf-8", "replace")])
json.dump(out, sys.stdout)
"""
#: Run in a pod: the complete records its spool (argv[1], ``RUN_DIR/records``) gained since the
#: segment offsets of argv[2] (JSON {segment: offset}; ``null``: a first read, from the segments'
#: ends when argv[3] is ``end``), as JSON [offsets, text]; each record is cut before its
#: ``answer`` (what the report reads comes first: ids, version, class, label, handler time), so a
#: pod's whole spool crosses the wire in a fraction of its size.
RECORDS_SCRIPT = """
import json, os, sys
from pathlib import Path
from rtserve.runtime.logs import complete_lines
spool, known, from_end = Path(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3] == "end"
try:
    names = sorted(n for n in os.listdir(spool) if n.endswith(".jsonl") and not n.startswith("."))
except FileNotFoundError:
    names = []
offsets, text = {}, []
for name in names:
    if known is None and from_end:
        offsets[name] = (spool / name).stat().st_size
        continue
    lines, offsets[name] = complete_lines(spool / name, (known or {}).get(name, 0))
    for line in lines:
        cut = line.find(b',"answer":')
        text.append((line[:cut] + b"}" if cut > 0 else line).decode("utf-8", "replace"))
json.dump([offsets, "".join(t + "\\n" for t in text)], sys.stdout)
"""
#: Run in a pod: append argv[2] (an audit event's line) to argv[1] (the pod's audit log,
#: ``RUN_DIR/logs/audit.log``) within the audit log's cap of the pod's budget.
APPEND_SCRIPT = """
import json, sys
from pathlib import Path
from handler.audit import append_event
from rtserve.server.disk import audit_cap
path = Path(sys.argv[1])
append_event(path, json.loads(sys.argv[2]), audit_cap(path.parent.parent))
"""
#: Run in a pod: write argv[2] to argv[1] at once (a temporary file renamed over it).
#: What the frontend's agent prints (to the container's log) each time it reads its routes file.
AGENT_READ_LINE = "[rtserve-agent] live routes:"
#: Seconds :meth:`Cluster.publish` waits for each written pod's agent to read the new routes.
AGENT_READ_S = 15.0

WRITE_SCRIPT = """
import os, sys
path, text = sys.argv[1:3]
with open(path + ".tmp", "w") as f:
    f.write(text)
os.replace(path + ".tmp", path)
"""


def candidate_url(namespace: str, model: str, version: str) -> str:
    """Where the default pods send the candidate's share: its Service's cluster DNS name.

    The version is in the path, so the candidate's own frontend never routes it again.
    """
    return f"http://{CANDIDATE}.{namespace}.svc:{PORT}/predictions/{model}/{version}"


def candidate_target(t: Target, source: Path) -> Target:
    """The deploy target of the candidate: its Deployment, build directory and kustomization.

    ``source`` is the overlay's own candidate/ or deploy/k8s/candidate.
    """
    return replace(t, app=CANDIDATE, build_dir=Path(f"{t.build_dir}-candidate"), verify_source=source)


def candidate_kustomization(t: Target) -> str:
    """The kustomization of the candidate (``t`` from :func:`candidate_target`)."""
    return standalone_kustomization(
        t, t.verify_dir, t.build_dir, f"make k8s-shadow/k8s-canary: the candidate {t.version}"
    )


def configmap(namespace: str, text: str) -> dict:
    """The ConfigMap of the routes ``text``."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": ROUTES_CONFIGMAP,
            "namespace": namespace,
            "labels": {
                "app.kubernetes.io/name": "rtserve",
                "app.kubernetes.io/part-of": "rtserve",
                "app.kubernetes.io/component": "live-routes",
            },
        },
        "data": {ROUTES_KEY: text},
    }


def parse_read(output: str, files: int) -> list[tuple[int, int, str]]:
    """:data:`READ_SCRIPT`'s output: (inode, end, text) per file.

    Raises:
        DeployError: it is not that.
    """
    try:
        found = [(int(a), int(b), str(text)) for a, b, text in json.loads(output)]
    except (ValueError, TypeError) as exc:
        raise DeployError(f"not what the log reader prints: {output[:200]!r} ({exc})") from exc
    if len(found) != files:
        raise DeployError(f"the log reader answered for {len(found)} files, not {files}")
    return found


def parse_records(output: str) -> tuple[dict[str, int], str]:
    """:data:`RECORDS_SCRIPT`'s output: the segments' offsets, and the records' text.

    Raises:
        DeployError: it is not that.
    """
    try:
        offsets, text = json.loads(output)
        return {str(k): int(v) for k, v in offsets.items()}, str(text)
    except (ValueError, TypeError, AttributeError) as exc:
        raise DeployError(f"not what the records reader prints: {output[:200]!r} ({exc})") from exc


@dataclass
class LogCopy:
    """Appends what each default pod's live log and records gained to ``live_log`` and ``records`` here.

    One file each for all pods; a pod is known by its uid.

    Args:
        from_end: a pod seen for the first time is read from the end its files have then (the
            canary watcher looks only forward); else from their start (the shadow report).
    """

    live_log: Path
    records: Path
    from_end: bool = False
    #: pod uid -> where its live log was read up to (inode, byte offset: it rotates to one
    #: backup), and each segment of its records spool.
    offsets: dict[str, tuple[tuple[int, int], dict[str, int]]] = field(default_factory=dict)

    def pull(self, cluster: Cluster) -> int:
        """Read every ready default pod's new lines; returns how many lines were appended.

        A pod that cannot be read now (ending, restarting) is read at the next pull.
        """
        appended = 0
        for pod in cluster.pods():
            live_at, segments = self.offsets.get(pod.uid, ((0, -1) if self.from_end else (0, 0), None))
            try:
                [(live_ino, live_end, live)] = parse_read(
                    cluster.exec(pod.name, "python", "-c", READ_SCRIPT, str(POD_RUN.live_log), *map(str, live_at)), 1
                )
                segments, records = parse_records(
                    cluster.exec(
                        pod.name,
                        "python",
                        "-c",
                        RECORDS_SCRIPT,
                        str(POD_RUN.records),
                        json.dumps(segments),
                        "end" if self.from_end else "start",
                    )
                )
            except DeployError:
                continue
            for path, text in ((self.live_log, live), (self.records, records)):
                if text:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    with open(path, "a", encoding="utf-8") as f:
                        f.write(text)
                    appended += text.count("\n")
            self.offsets[pod.uid] = ((live_ino, live_end), segments)
        return appended

    def fresh(self) -> LogCopy:
        """Empty the local files and forget the offsets (a report over everything)."""
        for path in (self.live_log, self.records):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("")
        self.offsets.clear()
        return self


class Cluster:
    """The overlay's default pods and candidate in ``namespace``, through ``kubectl``."""

    def __init__(self, kubectl: Kubectl, namespace: str, app: str = "rtserve") -> None:
        self.kubectl, self.namespace = kubectl, namespace
        self.deployed = Deployed(kubectl, namespace, app)

    def pods(self, running: bool = False):
        """The default pods that are ready (the candidate's carry another name label).

        With ``running``, also those whose rtserve container runs but is not ready yet.
        """
        return [p for p in self.deployed.pods() if p.ready or (running and p.running)]

    def exec(self, pod: str, *cmd: str) -> str:
        return self.deployed.exec(pod, "rtserve", *cmd)

    def apply_candidate(self, t: Target) -> None:
        """Apply the candidate (``t`` from :func:`candidate_target`) and wait for its rollout.

        Raises:
            DeployError: it did not roll out (a pod failed, or ``rollout_timeout`` passed).
        """
        manifests = render(self.kubectl, t.build_dir, candidate_kustomization(t))
        self.kubectl("apply", "-f", str(manifests))
        wait_rollout(t, self.kubectl)
        say(f">> candidate {t.tagged} ready: {candidate_url(self.namespace, '<model>', t.version)}")

    def candidate_version(self) -> str | None:
        """The image tag the candidate's Deployment runs, or None when there is none."""
        try:
            image = self.kubectl(
                "-n",
                self.namespace,
                "get",
                f"deployment/{CANDIDATE}",
                "-o",
                "jsonpath={.spec.template.spec.containers[?(@.name=='rtserve')].image}",
                capture=True,
                quiet=True,
                errors=False,
            ).strip()
        except DeployError:
            return None
        return image.rsplit(":", 1)[-1] if image else None

    def delete_candidate(self) -> None:
        """Delete every object of the candidate (its pod drains within its grace period)."""
        self.kubectl(
            "-n",
            self.namespace,
            "delete",
            "deployment,service,networkpolicy,configmap,serviceaccount",
            "-l",
            CANDIDATE_SELECTOR,
            "--ignore-not-found",
            "--wait=true",
        )

    def in_each_pod(self, script: str, path: str, text: str, missed: str, pods=None) -> list[str]:
        """Run ``python -c script path text`` in each default pod whose rtserve container runs.

        Ready or still starting: one that turns ready later must not serve older routes, and the
        ConfigMap's copy can reach it a minute late. Returns the pods it ran in (one where it fails is
        named with ``missed``; ``pods``: those, when already listed).
        """
        done = []
        for pod in self.pods(running=True) if pods is None else pods:
            try:
                self.exec(pod.name, "python", "-c", script, path, text)
                done.append(pod.name)
            except DeployError as exc:
                say(f">> {pod.name}: {missed} ({exc})")
        return done

    def audit(self, event: dict) -> list[str]:
        """Append ``event`` (a canary's abort) to each running default pod's audit log; the pods written."""
        return self.in_each_pod(
            APPEND_SCRIPT, str(POD_RUN.audit_log), event_line(event), "the event is not in its audit log"
        )

    def publish(self, text: str, manifest: Path) -> list[str]:
        """Write the routes ``text`` into the ConfigMap and into each running default pod's routes file.

        ``manifest`` is where the ConfigMap's manifest is written and applied from. Returns the pods
        written, once each ready one's agent said it read them. A pod that cannot be written now takes
        the ConfigMap's copy when it starts, or within a minute.
        """
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(json.dumps(configmap(self.namespace, text), indent=2) + "\n")
        self.kubectl("apply", "-f", str(manifest))
        since = datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
        pods = self.pods(running=True)
        written = self.in_each_pod(
            WRITE_SCRIPT, str(POD_RUN.live_routes), text, "routes not written now; the ConfigMap brings them", pods
        )
        ready = {p.name for p in pods if p.ready}
        for pod in written:
            if pod in ready:
                self.await_read(pod, since)
        return written

    def await_read(self, pod: str, since: str, timeout: float = AGENT_READ_S) -> bool:
        """Wait until the agent in ``pod`` logs that it read its routes file after ``since``.

        Its ``[rtserve-agent] live routes:`` line, so that when :meth:`publish` returns every written pod
        routes by the new routes. Says so and returns False when the line has not come within ``timeout`` s.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                log = self.kubectl(
                    "-n",
                    self.namespace,
                    "logs",
                    pod,
                    "-c",
                    "rtserve",
                    f"--since-time={since}",
                    capture=True,
                    quiet=True,
                    errors=False,
                )
            except DeployError:
                log = ""
            if AGENT_READ_LINE in log:
                return True
            if time.monotonic() > deadline:
                say(
                    f">> {pod}: routes written, but its agent did not say it read them within "
                    f"{timeout:g} s (it reads them within a second as a rule)"
                )
                return False
            time.sleep(0.25)
