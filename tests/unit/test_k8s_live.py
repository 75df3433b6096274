"""Shadow and canary in a cluster, the parts that need none: the default pods' copy of the routes
ConfigMap (rtserve.promotion.live.routes.RoutesSync, run by rtserve.container), and the kubectl
side's scripts and log copies (rtserve.promotion.live.kubectl) with ``kubectl exec`` replaced by running the same
command here, on files standing in for the pods' (the cluster tier runs them in real pods:
tests/cluster/test_live_traffic.py)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from handler.audit import event_line
from rtserve import container
from rtserve.errors import DeployError
from rtserve.k8s.pod import PodState
from rtserve.promotion.history import History
from rtserve.promotion.live.kubectl import (
    AGENT_READ_LINE,
    POD_RUN,
    READ_SCRIPT,
    ROUTES_CONFIGMAP,
    ROUTES_KEY,
    WRITE_SCRIPT,
    Cluster,
    LogCopy,
    configmap,
    parse_read,
)
from rtserve.promotion.live.routes import Route, Routes, RoutesSync, read_routes, set_route
from rtserve.promotion.live.watcher import Watch, watch
from rtserve.server.disk import BUDGET_KEY, audit_cap
from rtserve.server.properties import write_properties
from rtserve.settings import Settings
from tests.unit.test_live import CANARY, canary_lines

pytestmark = pytest.mark.unit

ROUTES = Routes(
    "m",
    "/home/model-server/run/live-log.jsonl",
    shadow=Route("2.0", 100.0, "http://rtserve-candidate.ns.svc:8080/predictions/m/2.0"),
    token_file=None,
)


def text(routes: Routes) -> str:
    return json.dumps(routes.json())


# -- the default pods' copy of the ConfigMap --------------------------------------------------------
def test_routes_sync_copies_only_a_changed_configmap(tmp_path):
    source, target = tmp_path / "etc" / "routes.json", tmp_path / "run" / "live-routes.json"
    said: list[str] = []
    sync = RoutesSync(source, target, said.append)
    assert sync.sync() is False and not target.exists()  # no ConfigMap yet: no routes
    source.parent.mkdir()
    source.write_text(text(ROUTES))
    assert sync.sync() is True and read_routes(target) == ROUTES
    # an abort writes the pod's file straight away; the unchanged ConfigMap does not flip it back
    aborted = Routes("m", ROUTES.log, canary=Route("2.0", 0.0, "http://c/predictions/m/2.0", "x-rtserve-key"))
    target.write_text(text(aborted))
    assert sync.sync() is False and read_routes(target) == aborted
    # the ConfigMap's update (the same routes, later) is copied again
    source.write_text(text(aborted) + "\n")
    assert sync.sync() is True and read_routes(target) == aborted
    # routes the kubelet brings late (a lower revision than the pod's) never replace newer ones
    newer = Routes("m", ROUTES.log, revision=20)
    target.write_text(text(newer))
    source.write_text(text(Routes("m", ROUTES.log, shadow=ROUTES.shadow, revision=10)))
    assert sync.sync() is False and read_routes(target) == newer
    assert said[-1] == f"live routes: {source} not copied: revision 10 is older than {target}'s 20"
    latest = Routes("m", ROUTES.log, revision=30)
    source.write_text(text(latest))
    assert sync.sync() is True and read_routes(target) == latest
    source.write_text("{not json")
    assert sync.sync() is False and read_routes(target) == latest  # the agent keeps what it has
    assert said[-1].startswith(f"live routes: {source} not copied: ")
    source.unlink()
    assert sync.sync() is True and not target.exists()
    assert said[-1] == f"live routes: {source} is gone: {target} removed (no routes)"


def test_the_pod_syncs_the_routes_it_mounts(tmp_path):
    settings = Settings.from_env(
        {"RTSERVE_RUN_DIR": str(tmp_path / "run"), "RTSERVE_LIVE_ROUTES": str(tmp_path / "routes.json")}
    )
    (tmp_path / "routes.json").write_text(text(ROUTES))
    (hook,) = container.syncs(settings)  # no gateway here: the routes' sync only
    container.each([hook])()
    assert read_routes(settings.run.live_routes) == ROUTES
    assert container.syncs(Settings.from_env({"RTSERVE_RUN_DIR": str(tmp_path)})) == []
    assert container.each([]) is None


def test_one_failing_sync_does_not_stop_the_others(caplog):
    ran = []

    def broken():
        raise OSError("boom")

    container.each([broken, lambda: ran.append(1)])()
    assert ran == [1] and "broken failed" in caplog.text


# -- the scripts run in the pods, and the copies of their logs ---------------------------------------
@dataclass
class Pod:
    name: str
    uid: str
    ready: bool = True
    running: bool = True


class HereCluster(Cluster):
    """:class:`rtserve.promotion.live.kubectl.Cluster` with its ``pods`` and ``exec`` here, each pod's run
    directory a directory here: the command runs as kubectl exec would run it, with the pod's
    paths mapped."""

    def __init__(self, root: Path) -> None:  # no kubectl
        self.root, self.listed = root, [Pod("rtserve-a", "uid-a"), Pod("rtserve-b", "uid-b")]

    def run_dir(self, pod: str) -> Path:
        return self.root / pod

    def pods(self, running: bool = False):
        return [p for p in self.listed if p.ready or (running and p.running)]

    def exec(self, pod: str, *cmd: str) -> str:
        mapped = [
            str(self.run_dir(pod)) + c[len(str(POD_RUN.path)) :] if c.startswith(str(POD_RUN.path)) else c for c in cmd
        ]  # the pod's paths; not the routes' text
        done = subprocess.run(
            [sys.executable if mapped[0] == "python" else mapped[0], *mapped[1:]], capture_output=True, text=True
        )
        if done.returncode:
            raise DeployError(done.stderr)
        return done.stdout


def append(path: Path, *lines: str, torn: str = "") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write("".join(line + "\n" for line in lines) + torn)


def test_log_copy_appends_only_what_each_pod_gained(tmp_path):
    cluster = HereCluster(tmp_path / "pods")
    live = lambda pod: cluster.run_dir(pod) / "live-log.jsonl"  # noqa: E731
    segment = lambda pod, n: cluster.run_dir(pod) / "records" / f"{n:020d}-1.jsonl"  # noqa: E731
    append(live("rtserve-a"), '{"n": "a1"}', torn='{"n": "a2 torn')
    append(
        segment("rtserve-a", 1),
        '{"request_id":"r1","label":"low","answer":{"prediction":0},"inputs":[1]}',
        torn='{"request_id":"r2"',
    )
    copy = LogCopy(tmp_path / "here" / "live-log.jsonl", tmp_path / "here" / "records.jsonl")
    assert copy.pull(cluster) == 2  # pod b has no logs yet
    assert copy.live_log.read_text() == '{"n": "a1"}\n'  # the torn line waits
    # records come cut before their answer (the report reads the keys before it)
    assert copy.records.read_text() == '{"request_id":"r1","label":"low"}\n'
    append(segment("rtserve-a", 1), ',"label":"high","answer":{}}')
    append(segment("rtserve-a", 2), '{"request_id":"r3"}')
    assert copy.pull(cluster) == 2 and copy.records.read_text().splitlines()[1:] == [
        '{"request_id":"r2","label":"high"}',
        '{"request_id":"r3"}',
    ]
    append(live("rtserve-a"), '"}', '{"n": "a3"}')
    append(live("rtserve-b"), '{"n": "b1"}')
    assert copy.pull(cluster) == 3
    assert copy.live_log.read_text().splitlines() == ['{"n": "a1"}', '{"n": "a2 torn"}', '{"n": "a3"}', '{"n": "b1"}']
    assert copy.pull(cluster) == 0
    # a new pod (a replica added, or one replaced): read from its start
    cluster.listed = [Pod("rtserve-a", "uid-a"), Pod("rtserve-c", "uid-c")]
    append(live("rtserve-c"), '{"n": "new"}')
    assert copy.pull(cluster) == 1 and copy.live_log.read_text().splitlines()[-1] == '{"n": "new"}'
    # the watcher's copy starts at the end each pod's logs have when it first sees it
    watcher = LogCopy(tmp_path / "w" / "live-log.jsonl", tmp_path / "w" / "records.jsonl", from_end=True)
    assert watcher.pull(cluster) == 0
    append(live("rtserve-c"), '{"n": "after"}')
    append(segment("rtserve-a", 2), '{"request_id":"r4"}')
    append(segment("rtserve-a", 3), '{"request_id":"r5"}')  # a new segment: read from its start
    assert watcher.pull(cluster) == 3 and watcher.live_log.read_text() == '{"n": "after"}\n'
    assert watcher.records.read_text() == '{"request_id":"r4"}\n{"request_id":"r5"}\n'
    assert copy.fresh().live_log.read_text() == "" and copy.offsets == {}


def test_log_copy_keeps_every_line_once_across_a_pods_log_rotations(tmp_path):
    """The pods' live logs rotate to one backup (their disk budget): what a pull had
    not read of the rotated file comes from the backup, then the new file's lines."""
    cluster = HereCluster(tmp_path / "pods")
    cluster.listed = [Pod("rtserve-a", "uid-a")]
    live = cluster.run_dir("rtserve-a") / "live-log.jsonl"
    append(live, '{"n": 1}')
    copy = LogCopy(tmp_path / "here" / "live-log.jsonl", tmp_path / "here" / "records.jsonl")
    assert copy.pull(cluster) == 1
    append(live, '{"n": 2}', torn='{"n": 3')
    assert copy.pull(cluster) == 1
    append(live, "}")
    live.rename(live.with_name("live-log.jsonl.1"))  # rotated: the rest of it is in the backup
    append(live, '{"n": 4}')
    assert copy.pull(cluster) == 2
    append(live, '{"n": 5}')
    live.rename(live.with_name("live-log.jsonl.1"))
    assert copy.pull(cluster) == 1  # in the middle of a rotation: the new file not there yet
    append(live, '{"n": 6}')
    assert copy.pull(cluster) == 1 and copy.pull(cluster) == 0
    assert [json.loads(line)["n"] for line in copy.live_log.read_text().splitlines()] == [1, 2, 3, 4, 5, 6]
    # a first read from the start takes the backup first
    fresh = LogCopy(tmp_path / "again" / "live-log.jsonl", tmp_path / "again" / "records.jsonl")
    assert fresh.pull(cluster) == 3
    assert fresh.live_log.read_text() == '{"n": 4}\n{"n": 5}\n{"n": 6}\n'


def test_a_pod_that_cannot_be_read_is_read_at_the_next_pull(tmp_path):
    cluster = HereCluster(tmp_path / "pods")
    append(cluster.run_dir("rtserve-a") / "live-log.jsonl", '{"n": 1}')
    cluster.exec = lambda pod, *cmd: (_ for _ in ()).throw(DeployError("pod is terminating"))
    copy = LogCopy(tmp_path / "live.jsonl", tmp_path / "records.jsonl")
    assert copy.pull(cluster) == 0 and copy.offsets == {}
    del cluster.exec
    assert copy.pull(cluster) == 1


def test_the_read_scripts_answer_is_checked():
    with pytest.raises(DeployError, match="not what the log reader prints"):
        parse_read("Error from server", 2)
    with pytest.raises(DeployError, match="for 1 files, not 2"):
        parse_read('[[0, 0, ""]]', 2)


def test_the_write_script_replaces_the_routes_file_at_once(tmp_path):
    cluster = HereCluster(tmp_path)
    target = cluster.run_dir("rtserve-a") / "live-routes.json"
    target.parent.mkdir()
    cluster.exec("rtserve-a", "python", "-c", WRITE_SCRIPT, str(POD_RUN.live_routes), text(ROUTES))
    assert read_routes(target) == ROUTES
    assert sorted(p.name for p in target.parent.iterdir()) == ["live-routes.json"]
    assert READ_SCRIPT.count("\n") < 30  # small enough for an argument


def test_an_abort_is_appended_to_each_pods_audit_log(tmp_path):
    here = HereCluster(tmp_path)
    audit = here.run_dir("rtserve-a") / "logs" / "audit.log"
    append(audit, '{"event":"prediction"}')
    (here.run_dir("rtserve-b") / "logs").mkdir(parents=True)
    event = {"event": "canary-abort", "action": "canary-abort", "version": "2.0"}
    assert here.audit(event) == ["rtserve-a", "rtserve-b"]
    assert audit.read_text().splitlines() == [
        '{"event":"prediction"}',
        '{"event":"canary-abort","action":"canary-abort","version":"2.0"}',
    ]
    # within the audit log's cap of the pod's budget (its effective config records it)
    write_properties(here.run_dir("rtserve-a") / "config.properties", {BUDGET_KEY: str(8 * 2**20)})
    cap = audit_cap(here.run_dir("rtserve-a"))
    append(audit, "x" * (cap // 2 - 100))
    assert here.audit(event) == ["rtserve-a", "rtserve-b"]
    assert audit.read_text() == event_line(event)
    assert audit.with_name("audit.log.1").stat().st_size <= cap // 2


def test_the_configmap_holds_the_routes_as_the_pods_mount_them():
    cm = configmap("rtserve-local", text(ROUTES))
    assert cm["metadata"]["name"] == ROUTES_CONFIGMAP and cm["metadata"]["namespace"] == "rtserve-local"
    assert json.loads(cm["data"][ROUTES_KEY]) == ROUTES.json()


# -- the watcher with the cluster's hooks --------------------------------------------------------------
def test_the_watcher_pulls_before_each_look_and_publishes_its_abort(tmp_path):
    routes = tmp_path / "live-routes.json"
    set_route(
        routes,
        "m",
        "/pod/live-log.jsonl",
        "canary",
        Route("2.0", 10.0, "http://rtserve-candidate.ns.svc:8080/predictions/m/2.0", "x-rtserve-key"),
    )
    live_log = tmp_path / "live-log.jsonl"
    published: list[Routes] = []
    pulls = []

    def pull():  # what the pods' logs gained, as LogCopy.pull appends it
        pulls.append(1)
        if len(pulls) == 3:
            now = time.time() * 1000
            append(live_log, *canary_lines(15, at=now), *canary_lines(5, failed=5, at=now, start=50))

    w = Watch(
        "m",
        "2.0",
        routes,
        live_log,
        tmp_path / "records.jsonl",
        tmp_path / "audit.log",
        History(tmp_path / "history.jsonl"),
        CANARY,
        pull=pull,
        publish=published.append,
    )
    result = {}
    thread = threading.Thread(target=lambda: result.update(event=watch(w, lambda _: None, poll_s=0.01)))
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and result["event"]["action"] == "canary-abort"
    assert len(pulls) >= 3
    (sent,) = published
    assert sent == read_routes(routes) and sent.canary.percent == 0.0 and sent.log == "/pod/live-log.jsonl"
    assert [e["action"] for e in w.history.events()] == ["canary-abort"]


# -- the commands' routes: what `make k8s-shadow` and `make k8s-canary` publish ----------------------
def test_each_change_is_published_with_the_pods_paths_the_token_and_a_newer_revision(tmp_path, monkeypatch):
    from rtserve.cli import build_parser
    from rtserve.cli.k8s import live_options
    from rtserve.promotion.live.cluster import ClusterLive
    from rtserve.promotion.live.kubectl import POD_TOKEN_FILE
    from rtserve.promotion.live.routes import KEY_HEADER

    sent: list[tuple[str, Path]] = []
    monkeypatch.setattr(Cluster, "publish", lambda self, text, manifest: sent.append((text, manifest)) or ["pod-a"])
    args = build_parser().parse_args(["k8s", "live-stop", "--overlay", "local", "--state-dir", str(tmp_path)])
    live = ClusterLive(live_options(args))
    url = "http://rtserve-candidate.rtserve-local.svc:8080/predictions/realtime-classifier/2.0"
    live.set(shadow=Route("2.0", 100.0, url))
    published = live.set(canary=Route("2.0", 10.0, url, KEY_HEADER))
    first, second = (Routes.parse(json.loads(text), "sent") for text, _ in sent)
    assert first.log == str(POD_RUN.live_log) and first.token_file == POD_TOKEN_FILE
    assert first.shadow.percent == 100.0 and first.canary is None
    assert second.shadow == first.shadow and second.canary == Route("2.0", 10.0, url, KEY_HEADER)
    assert time.time() * 1000 - 60_000 < first.revision < second.revision
    assert read_routes(live.state.live_routes) == second == published  # the watcher reads this copy
    assert sent[0][1] == tmp_path / "live-routes-configmap.json"
    assert live.namespace == "rtserve-local" and live.target.verify_dir == Path("deploy/k8s/overlays/local/candidate")


def test_the_sticky_bucket_is_the_agents():
    from rtserve.promotion.live.routes import sticky_bucket

    # `java -cp build/agent/rtserve-agent.jar rtserve.agent.Routes --bucket user-1 user-2` prints
    # 77.640592 and 84.831868 (agent/src/rtserve/agent/Routes.java)
    assert [round(sticky_bucket(k), 6) for k in ("user-1", "user-2")] == [77.640592, 84.831868]


def test_publish_applies_the_configmap_and_writes_each_pods_routes_file(tmp_path):
    here = HereCluster(tmp_path / "pods")
    here.namespace, applied = "rtserve-local", []

    def kubectl(*args, **_):  # the agent's line in each pod's container log (`kubectl logs`)
        applied.append(args)
        return f"{AGENT_READ_LINE} /var/run/rtserve/live-routes.json: shadow 2.0 at 100%\n" if "logs" in args else ""

    here.kubectl = kubectl
    for pod in ("rtserve-a", "rtserve-b"):
        here.run_dir(pod).mkdir(parents=True)
    manifest = tmp_path / "live" / "live-routes-configmap.json"
    assert here.publish(text(ROUTES), manifest) == ["rtserve-a", "rtserve-b"]
    assert applied[0] == ("apply", "-f", str(manifest))
    # publish returns once each written pod's agent said it read the routes, since the write
    assert [a[3] for a in applied[1:]] == ["rtserve-a", "rtserve-b"]
    assert all(
        a[1:3] == ("rtserve-local", "logs") and a[-1].startswith("--since-time=") and a[-1].endswith("Z")
        for a in applied[1:]
    )
    assert json.loads(manifest.read_text()) == configmap("rtserve-local", text(ROUTES))
    assert {read_routes(here.run_dir(p) / "live-routes.json") for p in ("rtserve-a", "rtserve-b")} == {ROUTES}


def test_publish_says_so_when_a_pods_agent_does_not_read_its_routes(tmp_path, capsys):
    here = HereCluster(tmp_path / "pods")
    here.namespace = "rtserve-local"
    here.kubectl = lambda *args, **_: ""  # no line from the agent
    began = time.monotonic()
    assert here.await_read("rtserve-a", "2026-12-01T08:00:00.000000Z", timeout=0.5) is False
    assert 0.5 <= time.monotonic() - began < 5
    assert "rtserve-a: routes written, but its agent did not say it read them within 0.5 s" in capsys.readouterr().out


def test_publish_writes_a_pod_still_starting_and_waits_only_for_the_ready_ones(tmp_path):
    """A pod whose container runs but is not ready yet (TorchServe starting) gets the routes too:
    once ready it must not serve the older ones until the ConfigMap's copy arrives. Its agent is
    not up to read them yet, so only the ready pods' logs are awaited."""
    here = HereCluster(tmp_path / "pods")
    here.namespace, asked = "rtserve-local", []
    here.listed = [
        Pod("rtserve-a", "uid-a"),
        Pod("rtserve-b", "uid-b", ready=False),
        Pod("rtserve-c", "uid-c", ready=False, running=False),
    ]

    def kubectl(*args, **_):
        asked.append(args)
        return f"{AGENT_READ_LINE} x\n" if "logs" in args else ""

    here.kubectl = kubectl
    for pod in ("rtserve-a", "rtserve-b", "rtserve-c"):
        here.run_dir(pod).mkdir(parents=True)
    assert here.publish(text(ROUTES), tmp_path / "live" / "cm.json") == ["rtserve-a", "rtserve-b"]
    assert read_routes(here.run_dir("rtserve-b") / "live-routes.json") == ROUTES
    assert not (here.run_dir("rtserve-c") / "live-routes.json").exists()  # the ConfigMap brings them
    assert [a[3] for a in asked if "logs" in a] == ["rtserve-a"]


def test_a_pods_state_says_whether_its_rtserve_container_runs():
    item = {
        "metadata": {"name": "rtserve-x", "uid": "u", "creationTimestamp": "2026-12-01T10:00:00Z"},
        "spec": {"containers": [{"name": "rtserve", "image": "registry.example.com/ml/rtserve:2.0"}]},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "False"}],
            "initContainerStatuses": [{"name": "gateway", "state": {"running": {}}}],
            "containerStatuses": [{"name": "rtserve", "state": {"running": {}}, "restartCount": 0}],
        },
    }
    state = PodState.of(item)
    assert state.running and not state.ready and state.version == "2.0"
    item["status"]["containerStatuses"][0]["state"] = {"waiting": {"reason": "ContainerCreating"}}
    assert not PodState.of(item).running


# -- make k8s-deploy's live evidence (live.promote.require_shadow) ------------------------------------
def deploy_args(tmp_path: Path, monkeypatch, pairs: int = 0, disagree: int = 0, *extra: str, **live):
    """`python -m rtserve k8s deploy ... 2.0` with a gate config requiring the shadow (``live``:
    its live.shadow thresholds), the default pods' logs here holding ``pairs`` mirrored requests
    (``disagree`` of them answered with another class by 2.0)."""
    import yaml

    from rtserve.cli import build_parser
    from rtserve.promotion.live import cluster as k8s_live
    from tests.conftest import REPO
    from tests.unit.test_live import live_line, record_line

    config = yaml.safe_load((REPO / "config" / "gate.yaml").read_text())
    config["live"]["promote"]["require_shadow"] = live.pop("require", True)
    config["live"]["shadow"].update(live)
    gate = tmp_path / "gate.yaml"
    gate.parent.mkdir(parents=True, exist_ok=True)
    gate.write_text(yaml.safe_dump(config))
    here = HereCluster(tmp_path / "pods")
    pod = here.run_dir("rtserve-a")
    append(
        pod / "live-log.jsonl", *(live_line("shadow", n, label="high" if n < disagree else "low") for n in range(pairs))
    )
    append(pod / "records" / "00000000000000000001-7.jsonl", *(record_line(n, label="low") for n in range(pairs)))
    monkeypatch.setattr(k8s_live, "Cluster", lambda *a, **k: here)
    return build_parser().parse_args(
        [
            "k8s",
            "deploy",
            "--overlay",
            "local",
            "--image",
            "img",
            "--version",
            "2.0",
            "--model",
            "m",
            "--kubectl",
            "false",
            "--gate-config",
            str(gate),
            "--state-dir",
            str(tmp_path / "live"),
            "--model-store",
            str(tmp_path / "store"),
            *extra,
        ]
    )


def live_evidence(args):
    """``make k8s-deploy``'s live evidence as its command asks for it (the flags mapped by the CLI)."""
    from rtserve.cli.k8s import live_options
    from rtserve.cli.live import show_report
    from rtserve.promotion.live.cluster import deploy_evidence

    return deploy_evidence(
        live_options(args),
        args.version,
        args.force,
        args.reason,
        lambda found, saved_to: show_report(found, saved_to, False),
    )


def history_of(tmp_path: Path) -> list[dict]:
    return History(tmp_path / "live" / "rollout-history.jsonl").events()


def test_deploy_asks_no_live_evidence_unless_the_gate_requires_it(tmp_path, monkeypatch):
    assert live_evidence(deploy_args(tmp_path, monkeypatch, require=False)) is None
    assert not (tmp_path / "live").exists()


def test_deploy_is_refused_on_too_few_mirrored_requests_or_poor_agreement_and_records_it(tmp_path, monkeypatch):
    few = deploy_args(tmp_path / "few", monkeypatch, 30, 0, min_requests=500)
    with pytest.raises(
        DeployError,
        match=r"live requests: the shadow report has 30 mirrored requests .*"
        r"at least 500 required.*nothing applied",
    ):
        live_evidence(few)
    (event,) = history_of(tmp_path / "few")
    assert event["outcome"] == "refused" and event["live"]["requests"] == 30 and event["version"] == "2.0"

    poor = deploy_args(tmp_path / "poor", monkeypatch, 40, 10, min_requests=20, min_agreement=0.9)
    with pytest.raises(
        DeployError,
        match=r"live agreement: the candidate gave the default's class on "
        r"0\.7500 of 40 mirrored requests \(at least 0\.9 required\)",
    ):
        live_evidence(poor)
    assert json.loads((tmp_path / "poor" / "live" / "shadow-report.json").read_text())["agreement"] == 0.75


def test_deploy_goes_on_with_good_evidence_or_forced_with_a_reason(tmp_path, monkeypatch):
    live, event = live_evidence(deploy_args(tmp_path / "good", monkeypatch, 40, 1, min_requests=20))
    assert event["failures"] == [] and event["live"]["agreement"] == 0.975
    assert history_of(tmp_path / "good") == []  # recorded once the deploy is done (cmd_deploy)

    with pytest.raises(DeployError, match="a forced deploy needs a reason"):
        live_evidence(deploy_args(tmp_path / "bare", monkeypatch, 40, 0, "--force", min_requests=500))
    forced = deploy_args(tmp_path / "forced", monkeypatch, 40, 0, "--force", "--reason", "hotfix", min_requests=500)
    _, event = live_evidence(forced)
    (recorded,) = history_of(tmp_path / "forced")
    assert recorded["outcome"] == "forced" and recorded["reason"] == "hotfix" and recorded["forced_by"]
