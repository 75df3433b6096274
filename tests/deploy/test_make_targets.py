"""The Makefile's targets that need no cluster, some through recording stand-ins.

``make k8s-deploy``, ``k8s-verify``, ``k8s-rollback``, ``k8s-status`` and ``k8s-history`` run
against a real API server and node in the cluster tier (tests/cluster/test_deploy.py). Here,
``KUBECTL`` and ``DOCKER`` are stand-in scripts that record their arguments, for what no local
cluster answers (a registry push) and to prove that a refused deploy applies nothing (the
stand-in kubectl runs the real ``kubectl kustomize``). ``make help`` groups every public target
under one naming rule, and the names before it fail and name their successors.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rtserve.cli import build_parser
from rtserve.cli import cassandra as cassandra_cli
from rtserve.cli import kafka as kafka_cli
from tests.conftest import MODEL_NAME, REPO
from tests.deploy.conftest import K8S_DIR, load, makefile_text, pinned_tag, render

pytestmark = pytest.mark.deploy

IMG = "registry.example.com/ml/rtserve"

STAND_IN = f"""#!{sys.executable}
# Stand-in for {{tool}}: records its arguments (no API server / engine exists here).
import json, os, shutil, sys
args = sys.argv[1:]
log = os.environ["STAND_IN_LOG"]
with open(log, "a") as out:
    out.write(json.dumps(args) + "\\n")
if args[:1] == ["kustomize"]:
    os.execvp("kubectl", ["kubectl", *args])
if args[:2] == ["apply", "-f"]:
    shutil.copy(args[2], log + (".verify.yaml" if "-verify" in args[2] else ".applied.yaml"))
if "rollout" in args and "status" in args and os.environ.get("FAIL_ROLLOUT"):
    sys.stderr.write('error: deployment "rtserve" exceeded its progress deadline\\n')
    sys.exit(1)
if "get" in args and "job/rtserve-verify" in args:  # the Job's true conditions
    sys.stdout.write("Failed" if os.environ.get("FAIL_VERIFY") else "Complete")
if "logs" in args:
    sys.stdout.write("error: realtime-classifier 2.0 answers 3 of 256 golden rows differently\\n"
                     if os.environ.get("FAIL_VERIFY") else "verified {{}}\\n")
# Images the engine holds, with their IDs and rtserve.inputs labels (any other name: no output).
images = json.loads(os.environ.get("STAND_IN_IMAGES", "{{}}"))
if args[:3] == ["image", "inspect", "--format"] and args[4] in images:
    fields = dict(inputs="rtserve.inputs", Id=".Id")  # the --format asks for one of them
    sys.stdout.write("".join(value for field, value in images[args[4]].items() if fields[field] in args[3]))
"""


class Make:
    """``make`` with stand-in tools; ``calls`` are the recorded argument lists, in order."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.log = tmp_path / "calls.jsonl"
        for tool in ("kubectl", "docker"):
            script = tmp_path / tool
            script.write_text(STAND_IN.replace("{tool}", tool))
            script.chmod(0o755)

    def __call__(self, *args: str, fail_rollout: bool = False, fail_verify: bool = False,
                 images: dict[str, dict[str, str]] | None = None) -> subprocess.CompletedProcess:
        """``images``: what the stand-in engine holds, name -> {"Id": ..., "inputs": ...}."""
        self.log.unlink(missing_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
        env["STAND_IN_LOG"] = str(self.log)  # and no variables inherited from an outer make
        env["STAND_IN_IMAGES"] = json.dumps(images or {})
        if fail_rollout:
            env["FAIL_ROLLOUT"] = "1"
        if fail_verify:
            env["FAIL_VERIFY"] = "1"
        return subprocess.run(
            ["make", "--no-print-directory", *args, f"KUBECTL={self.tmp / 'kubectl'}",
             f"DOCKER={self.tmp / 'docker'}", f"K8S_BUILD={self.tmp / 'k8s-build'}"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)

    @property
    def calls(self) -> list[list[str]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    @property
    def applied(self) -> list[dict]:
        return load(Path(str(self.log) + ".applied.yaml").read_text())

    @property
    def verify_applied(self) -> list[dict]:
        return load(Path(str(self.log) + ".verify.yaml").read_text())


@pytest.fixture
def make(tmp_path) -> Make:
    return Make(tmp_path)


def tracked_changes() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                          capture_output=True, text=True, check=True).stdout


def deployment(objects: list[dict]) -> dict:
    (dep,) = [o for o in objects if o["kind"] == "Deployment"]
    return dep


def other_version(overlay: str) -> str:
    """A model version the overlay does not pin."""
    return "1.0" if pinned_tag(overlay) == "2.0" else "2.0"


def test_k8s_deploy_without_a_version_rolls_out_the_overlays_pin(make):
    plan = make("-n", "k8s-deploy", "OVERLAY=staging")
    assert plan.returncode == 0, plan.stderr
    assert f'--version "{pinned_tag("staging")}" --namespace rtserve-staging' in plan.stdout, plan.stdout


def test_k8s_deploy_refuses_an_image_the_overlay_does_not_use(make):
    result = make("k8s-deploy", "OVERLAY=staging", "IMG=other.example.com/rtserve")
    assert result.returncode != 0
    assert "image is not other.example.com/rtserve" in result.stderr  # the CLI's error: line
    assert [c[0] for c in make.calls] == ["kustomize"], "nothing may be applied"


def test_k8s_deploy_refuses_an_unknown_overlay(make):
    result = make("k8s-deploy", "OVERLAY=nowhere")
    assert result.returncode != 0 and "no overlay" in result.stderr
    assert make.calls == []


@pytest.mark.parametrize("target, args, usage", [
    ("k8s-shadow", [], "usage: make k8s-shadow OVERLAY=staging MODEL_VERSION=2.0 [PERCENT=100]"),
    ("k8s-canary", [], "usage: make k8s-canary OVERLAY=staging MODEL_VERSION=2.0 PERCENT=10"),
    ("k8s-canary", ["MODEL_VERSION=2.0"], "usage: make k8s-canary OVERLAY=staging MODEL_VERSION=2.0 PERCENT=10"),
])
def test_k8s_shadow_and_canary_want_a_version_and_a_share(make, target, args, usage):
    result = make(target, "OVERLAY=staging", *args)
    assert result.returncode == 2 and usage in result.stdout, result.stdout + result.stderr
    assert make.calls == []


def test_k8s_live_targets_pass_the_overlays_places(make):
    plan = make("-n", "k8s-canary", "OVERLAY=staging", "MODEL_VERSION=2.0", "PERCENT=10")
    assert plan.returncode == 0, plan.stderr
    assert ("-m rtserve k8s canary 2.0 --percent 10 --overlay staging --image registry.example.com/ml/rtserve "
            "--namespace rtserve-staging") in plan.stdout, plan.stdout
    assert "--state-dir " in plan.stdout and "-live --kubectl" in plan.stdout


#: The names before one naming rule, and what each is called now (`history` is not here: it now
#: names the local server's history, the cluster's is k8s-history).
RENAMED = {"deploy": "k8s-deploy", "rollout-status": "k8s-status", "history-versions": "history",
           "podman": "pod-deps", "checkov-venv": "k8s-deps", "nginx": "nginx-deps",
           "rehearsal": "bench-rehearsal"}

#: `make help`'s groups, in order, and the rule every target in each follows. Cluster operations
#: are k8s-*, the local cluster cluster*, Kafka and the stream consumer kafka*/stream*, pod and
#: image targets image*/pod*, the records' node cassandra*, tool installs <group>-deps; nothing else may
#: take those prefixes.
GROUPS = {
    "General": lambda t: t == "help",
    "Build": lambda t: not prefixed(t),
    "Run": lambda t: not prefixed(t),
    "Versions (local server)": lambda t: not prefixed(t),
    "Live traffic (shadow, canary)": lambda t: t.startswith(("shadow", "canary")),
    "Monitoring": lambda t: t.startswith("monitor"),
    "Image and pod": lambda t: t.startswith(("image", "pod")),
    "Kubernetes (cluster)": lambda t: t.startswith("k8s-"),
    "Local cluster": lambda t: t.startswith("cluster"),
    "Streaming (Kafka)": lambda t: t.startswith(("kafka", "stream")),
    "Records (Cassandra)": lambda t: t.startswith("cassandra"),
    "Test": lambda t: t.startswith("test"),
    "Benchmarks": lambda t: t.startswith("bench"),
    "Reliability": lambda t: t.startswith("bench-") or t in ("soak", "nginx-deps"),
}


def prefixed(target: str) -> bool:
    return target.startswith(("k8s-", "cluster", "image", "pod", "bench", "monitor", "test", "kafka", "stream",
                              "shadow", "canary", "cassandra")) \
        or target.endswith("-deps")


def help_groups() -> dict[str, list[str]]:
    """`make help` as group header -> the targets listed under it, in order."""
    out = subprocess.run(["make", "--no-print-directory", "help"], cwd=REPO, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    groups: dict[str, list[str]] = {}
    current = None
    for line in re.sub(r"\x1b\[[0-9;]*m", "", out).splitlines():
        if line and not line.startswith((" ", "Usage:", "Variables:")):
            current = groups.setdefault(line, [])
        elif line.startswith("  "):
            assert current is not None, f"{line.split()[0]} is listed before any group header"
            current.append(line.split()[0])
    return groups


def test_make_help_lists_every_public_target_once_under_the_naming_rule():
    makefile = makefile_text()
    documented = re.findall(r"(?m)^([A-Za-z0-9_.-]+):[^=\n]*?##", makefile)
    database = subprocess.run(["make", "--no-print-directory", "-pq", "help"], cwd=REPO,
                              capture_output=True, text=True, timeout=60).stdout
    (phony,) = re.findall(r"(?m)^\.PHONY: (.*)$", database)
    # Every phony target but FORCE and the old names has a ## description.
    assert set(phony.split()) - {"FORCE", *RENAMED} == set(documented)
    groups = help_groups()
    assert list(groups) == list(GROUPS)
    listed = [t for targets in groups.values() for t in targets]
    assert sorted(listed) == sorted(documented), "a target listed twice, or one missing"
    for group, targets in groups.items():
        assert targets, f"{group} is empty"
        breaking = [t for t in targets if not GROUPS[group](t)]
        assert not breaking, f"{group}: {breaking} break the naming rule"
    assert "image-push" in groups["Image and pod"]
    assert {"k8s-deploy", "k8s-status", "k8s-history", "k8s-rollback", "k8s-deps"} \
        <= set(groups["Kubernetes (cluster)"])
    assert {"register", "promote", "rollback", "history"} <= set(groups["Versions (local server)"])
    assert {"shadow", "shadow-report", "shadow-stop", "canary", "canary-stop"} \
        == set(groups["Live traffic (shadow, canary)"])
    assert not set(RENAMED) & set(listed)


@pytest.mark.parametrize("old", sorted(RENAMED))
def test_an_old_name_fails_and_names_its_successor(make, old):
    result = make(old, "OVERLAY=staging")
    assert result.returncode == 2
    assert f"make {old} was renamed: use make {RENAMED[old]}\n" in result.stderr
    assert make.calls == [], "an old name ran something"
    assert subprocess.run(["make", "-n", RENAMED[old]], cwd=REPO, capture_output=True,
                          timeout=60).returncode == 0


def test_history_is_the_local_servers_and_k8s_history_the_clusters(make):
    local = make("-n", "history", "RUN_DIR=/nowhere/run")
    assert local.returncode == 0, local.stderr
    assert re.search(rf"-m rtserve .*--run-dir /nowhere/run .* history {MODEL_NAME}$",
                     local.stdout, re.M), local.stdout
    assert "kubectl" not in local.stdout
    cluster = make("-n", "k8s-history", "OVERLAY=production")
    assert f"{make.tmp / 'kubectl'} -n rtserve-production rollout history deployment/rtserve" \
        in cluster.stdout


def test_k8s_pin_records_the_version_in_the_overlay(make, tmp_path):
    copy = tmp_path / "k8s"
    shutil.copytree(K8S_DIR, copy)
    before = tracked_changes()
    version = other_version("production")
    result = make("k8s-pin", "OVERLAY=production", f"MODEL_VERSION={version}", f"K8S_DIR={copy}")
    assert result.returncode == 0, result.stderr
    image = deployment(load(render(copy / "overlays" / "production")))["spec"]["template"]["spec"][
        "containers"][0]["image"]
    assert image == f"{IMG}:{version}"
    assert tracked_changes() == before, "the repository's overlay was modified"


def dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with line continuations joined and comments dropped."""
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [(m.group(1).upper(), m.group(2).strip())
            for m in re.finditer(r"^\s*([A-Za-z]+)\s+(.*)$", joined, re.M)]


#: The base `make image` builds on when the engine has it (the stand-in has every image).
OFFICIAL_BASE = "docker.io/library/python:3.11-slim-bookworm"
DEPS_DOCKERFILE = "deploy/podman/deps.Dockerfile"


def image_builds(calls: list[list[str]]) -> list[list[str]]:
    """The engine's `build` calls, in order."""
    return [call for call in calls if call[:1] == ["build"]]


def option_values(build: list[str], option: str) -> dict[str, str]:
    """A build's ``--build-arg`` (or ``--label``) values, by name."""
    return dict(build[i + 1].split("=", 1) for i, a in enumerate(build) if a == option)


def image_variables(context: Path, mar: Path, build_root: Path) -> list[str]:
    return ["MODEL_VERSION=1.0", f"IMG={IMG}", f"IMAGE_CONTEXT={context}", f"MODEL_STORE={mar.parent}",
            f"DEMO_ARTIFACTS={build_root / 'artifacts'}", f"VENV={REPO / '.venv'}"]


def test_make_image_stages_every_file_the_dockerfile_copies(make, mar_v1, build_root, tmp_path):
    """Two images, two contexts: the dependencies image (deploy/podman/deps.Dockerfile: Java, the
    virtualenv from the wheelhouse) and the version's on it (the Dockerfile: rtserve's files, the
    agent built from source, the archive); every file either copies is in its staged context."""
    context = tmp_path / "context"
    result = make("image", *image_variables(context, mar_v1, build_root))
    assert result.returncode == 0, result.stdout + result.stderr
    deps_build, build = image_builds(make.calls)
    # The dependencies image first, tagged with the hash of its inputs (its label), from a context
    # beside the version's: none of the wheelhouse goes into the version's.
    deps_context, deps = Path(deps_build[-1]), deps_build[-2]
    assert deps_context == tmp_path / "context-deps"
    assert re.fullmatch(r"localhost/rtserve-deps:[0-9a-f]{16}", deps)
    assert option_values(deps_build, "--label") == {"rtserve.inputs": deps.rpartition(":")[2]}
    assert deps_build[deps_build.index("-f") + 1] == str(deps_context / "deps.Dockerfile")
    assert option_values(deps_build, "--build-arg") == {"BASE_IMAGE": OFFICIAL_BASE}
    assert (deps_context / "deps.Dockerfile").read_text() == (REPO / DEPS_DOCKERFILE).read_text()
    # Then the version's, on it.
    assert build[-3:] == ["-t", f"{IMG}:1.0", str(context)]
    build_args = option_values(build, "--build-arg")
    assert build_args == {"BASE_IMAGE": OFFICIAL_BASE, "DEPS_IMAGE": deps, "MODEL_NAME": MODEL_NAME,
                          "MODEL_VERSION": "1.0"}

    deps_instructions = dockerfile_instructions((deps_context / "deps.Dockerfile").read_text())
    instructions = dockerfile_instructions((context / "Dockerfile").read_text())

    def froms(steps: list[tuple[str, str]]) -> list[list[str]]:
        return [args.split() for op, args in steps if op == "FROM"]

    # Every stage on the BASE_IMAGE build argument, or on a stage or image made from it: the Java
    # runtime and the virtualenv's builder, the dependencies image on the Java stage; the agent's
    # builder (a JDK) on the base, the version's image on the dependencies image.
    assert froms(deps_instructions) == [["${BASE_IMAGE}", "AS", "java"], ["${BASE_IMAGE}", "AS", "builder"],
                                        ["java", "AS", "deps"]]
    assert froms(instructions) == [["${BASE_IMAGE}", "AS", "agent"], ["${DEPS_IMAGE}", "AS", "runtime"]]
    for steps in (deps_instructions, instructions):
        args = {k: v for k, _, v in (a.partition("=") for op, a in steps if op == "ARG")}
        assert args["BASE_IMAGE"] == OFFICIAL_BASE
    assert "DEPS_IMAGE" in [a for op, a in instructions if op == "ARG"], "no default: make image names it"
    # The agent is built from source with javac and jar, as the Makefile does, never copied in.
    runs = " ".join(a for op, a in instructions if op == "RUN")
    assert "javac --release 17 -Xlint:all -Werror" in runs and "jar --create" in runs
    assert not list(context.rglob("*.jar")) and not list(deps_context.rglob("*.jar")), "a built jar in a context"
    assert (context / "agent" / "MANIFEST.MF").is_file()
    # What each copies from another stage: the virtualenv into the dependencies image, the agent's
    # jar into the version's.
    assert [a for op, a in deps_instructions if op == "COPY" and a.startswith("--from=")] == \
        ["--from=builder /opt/venv /opt/venv"]
    assert [a for op, a in instructions if op == "COPY" and a.startswith("--from=")] == \
        ["--from=agent /build/build/agent/rtserve-agent.jar ./build/agent/rtserve-agent.jar"]
    for where, steps, values in ((deps_context, deps_instructions, {}), (context, instructions, build_args)):
        args = {k: v for k, _, v in (a.partition("=") for op, a in steps if op == "ARG")} | values
        copies = [a.split() for op, a in steps if op == "COPY" and not a.startswith("--from=")]
        assert copies, f"no COPY found in {where}"
        for *sources, _dest in copies:
            for source in sources:
                path = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], source)
                assert (where / path).exists(), f"COPY source missing from {where}: {path}"
    assert (context / "model_store" / mar_v1.name).read_bytes() == mar_v1.read_bytes()
    assert sorted(p.name for p in (context / "model_store").iterdir()) == [mar_v1.name]
    # The wheelhouse, in the dependencies' context only: the pinned requirements and a wheel for
    # each of them, nothing to download.
    assert not (context / "wheelhouse").exists()
    wheelhouse = deps_context / "wheelhouse"
    wheels = sorted(p.name for p in wheelhouse.glob("*.whl"))
    assert (wheelhouse / "requirements.txt").read_text() == (REPO / "requirements.txt").read_text()
    for line in (REPO / "requirements.txt").read_text().splitlines():
        name = line.split("#")[0].strip().split("==")[0]
        if name:
            normal = re.sub(r"[-_.]+", "_", name).lower()
            assert any(w.lower().startswith(normal + "-") for w in wheels), f"no wheel for {name}"

    (user,) = [a for op, a in instructions if op == "USER"]
    uid, gid = (int(x) for x in user.split(":"))
    assert uid > 10000 and gid > 10000
    # The user the version's image runs as is the one the dependencies image made.
    (make_user,) = [a for op, a in deps_instructions if op == "RUN" and "useradd" in a]
    assert f"--uid {uid} --gid {gid}" in make_user and f"groupadd --gid {gid}" in make_user
    assert ":latest" not in (context / "Dockerfile").read_text() + (deps_context / "deps.Dockerfile").read_text()
    (cmd,) = [json.loads(a) for op, a in instructions if op == "CMD"]
    assert cmd == ["python", "-m", "rtserve", "server", "run"]
    help_text = subprocess.run([sys.executable, "-m", "rtserve", "server", "--help"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout
    assert "run" in help_text
    env = " ".join(a for op, a in instructions if op == "ENV")
    assert "RTSERVE_MODELS=${MODEL_NAME}=${MODEL_NAME}_${MODEL_VERSION}.mar" in env
    (expose,) = [a for op, a in instructions if op == "EXPOSE"]
    assert expose.split() == ["8081", "8082"]  # inference: loopback, behind the gateway sidecar
    for op in ("USER", "CMD", "ENTRYPOINT", "EXPOSE", "ENV"):
        assert op not in {o for o, _ in deps_instructions}, f"{op} belongs to the version's image"


def test_make_image_builds_no_dependencies_image_when_its_tagged_image_exists(make, mar_v1, build_root,
                                                                              tmp_path):
    """When the engine holds DEPS_IMG:<inputs> labelled with those inputs, `make image` runs no
    build of it (a build with every layer cached still re-reads the wheels and the virtualenv:
    about 90 s) and builds the version's image on it; the dependencies image's ID is one of the
    version's inputs, so a new one rebuilds the version's image; with both current, no build."""
    variables = image_variables(tmp_path / "context", mar_v1, build_root)
    first = make("image", *variables)
    assert first.returncode == 0, first.stdout + first.stderr
    deps_build, build = image_builds(make.calls)
    deps, inputs = deps_build[-2], deps_build[-2].rpartition(":")[2]

    held = {deps: {"Id": "sha256:" + "d" * 64, "inputs": inputs}}
    again = make("image", *variables, images=held)
    assert again.returncode == 0, again.stdout + again.stderr
    (rebuild,) = image_builds(make.calls)
    assert rebuild[-3:] == ["-t", f"{IMG}:1.0", str(tmp_path / "context")]
    assert option_values(rebuild, "--build-arg")["DEPS_IMAGE"] == deps
    assert f">> {deps} is up to date (inputs {inputs})\n" in again.stdout
    version_inputs = option_values(rebuild, "--label")["rtserve.inputs"]
    assert version_inputs != option_values(build, "--label")["rtserve.inputs"], \
        "the dependencies image's ID is not among the version's inputs"

    held[f"{IMG}:1.0"] = {"Id": "sha256:" + "e" * 64, "inputs": version_inputs}
    current = make("image", *variables, images=held)
    assert current.returncode == 0, current.stdout + current.stderr
    assert image_builds(make.calls) == []
    assert f">> {IMG}:1.0 is up to date (inputs {version_inputs})\n" in current.stdout


@dataclasses.dataclass(frozen=True)
class JvmImage:
    """What a JVM service's image (the records store's, the stream's broker's) stages and runs."""

    target: str
    version_var: str
    name: str
    jar: str
    wheels: tuple[str, ...]
    code: str
    cli: object
    libs: str
    expose: tuple[str, ...] | None  # None: the foreground command's --port


JVM_IMAGES = [
    JvmImage("cassandra", "CASSANDRA_VERSION", "rtserve-cassandra", "cassandra-all-{v}.jar", ("pyyaml",),
             "records/foreground.py", cassandra_cli, "/opt/cassandra/libs", ("9042", "7000")),
    JvmImage("kafka", "KAFKA_VERSION", "rtserve-kafka", "kafka_2.13-{v}.jar", ("confluent_kafka", "psutil"),
             "stream/local.py", kafka_cli, "/opt/kafka/libs", None),
]


@pytest.mark.parametrize("image", JVM_IMAGES, ids=lambda i: i.target)
def test_make_image_of_a_jvm_service_stages_every_file_its_containerfile_copies(make, tmp_path, image):
    """The records store's and the stream broker's images: the jars their `*-deps` assembled,
    rtserve's code and only the wheels they run, nothing of torch; the rtserve image's Java step
    (one layer shared); their entry command the CLI's foreground service as user 10001."""
    context = tmp_path / "context"
    var = image.version_var.split("_")[0]
    result = make(f"image-{image.target}", f"{var}_CONTEXT={context}", f"VENV={REPO / '.venv'}")
    assert result.returncode == 0, result.stdout + result.stderr
    (build,) = [call for call in make.calls if call[:1] == ["build"]]
    version = re.search(rf"^{image.version_var}\s+\?= (\S+)$", makefile_text(), re.M)[1]
    assert build[-3:] == ["-t", f"registry.example.com/ml/{image.name}:{version}", str(context)]
    assert build[build.index("-f") + 1] == str(context / "Containerfile")
    build_args = dict(build[i + 1].split("=", 1) for i, a in enumerate(build) if a == "--build-arg")
    assert build_args == {"BASE_IMAGE": "docker.io/library/python:3.11-slim-bookworm", image.version_var: version}
    instructions = dockerfile_instructions((context / "Containerfile").read_text())
    froms = [args.split() for op, args in instructions if op == "FROM"]
    assert froms == [["${BASE_IMAGE}", "AS", "builder"], ["${BASE_IMAGE}", "AS", "runtime"]]
    for *sources, _dest in (a.split() for op, a in instructions if op == "COPY" and not a.startswith("--from=")):
        for source in sources:
            assert (context / source).exists(), f"COPY source missing from the context: {source}"
    assert (context / "libs" / image.jar.format(v=version)).is_file()
    assert sorted(w.name.split("-")[0].lower() for w in (context / "wheelhouse").iterdir()) == list(image.wheels)
    assert (context / "rtserve" / image.code).is_file()
    assert not list(context.rglob("__pycache__")) and not (context / "handler").exists()

    def java(text: str) -> list[str]:
        runs = [" ".join(a.split()) for op, a in dockerfile_instructions(text) if op == "RUN"]
        return [run for run in runs if "openjdk-17-jre-headless tini" in run]

    assert java((context / "Containerfile").read_text()) == java((REPO / DEPS_DOCKERFILE).read_text())
    assert len(java((REPO / DEPS_DOCKERFILE).read_text())) == 1
    (user,) = [a for op, a in instructions if op == "USER"]
    assert user == "10001:10001"
    (cmd,) = [json.loads(a) for op, a in instructions if op == "CMD"]
    args = build_parser().parse_args(cmd[3:])
    assert cmd[:3] == ["python", "-m", "rtserve"] and args.func is image.cli.cmd_run
    assert str(args.libs) == image.libs
    (expose,) = [a for op, a in instructions if op == "EXPOSE"]
    assert expose.split() == list(image.expose or (str(args.port),))


def plan(*args: str) -> list[str]:
    """The commands `make -n` would run (lines joined), with no variables from an outer make."""
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(["make", "--no-print-directory", "-n", *args, f"VENV={REPO / '.venv'}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.replace("\\\n", " ").splitlines()


def registers(lines: list[str], name: str, version: str) -> bool:
    return any(re.search(rf"-m rtserve .* register {re.escape(name)} {re.escape(version)}\b", l)
               for l in lines)


def serves(lines: list[str], name: str, version: str) -> bool:
    return any(re.search(rf"-m rtserve server start .* --models {re.escape(name)}="
                         rf"{re.escape(name)}_{re.escape(version)}\.mar\b", l) for l in lines)


def builds(lines: list[str]) -> set[str]:
    """Which archive-building steps the plan runs: training the demo, packing an archive."""
    return {step for step, marker in (("train", "-m rtserve model train"), ("pack", "torch-model-archiver"))
            if any(marker in l for l in lines)}


@pytest.mark.parametrize("target,uses", [("register", registers), ("serve", serves)])
@pytest.mark.parametrize("name,version,demo_artifacts,expected", [
    ("churn", "1.0", False, set()),                   # your model, packed earlier: registered as is
    (MODEL_NAME, "3.1", False, set()),                # your model under the demo's name, packed earlier
    (MODEL_NAME, "1.0", True, set()),                 # the demo, archive up to date
    (MODEL_NAME, "2.0", False, {"train", "pack"}),    # the demo, nothing built yet
])
def test_make_register_and_serve_use_the_archive_make_archive_built(tmp_path, name, version,
                                                                    demo_artifacts, expected,
                                                                    target, uses):
    """`make register|serve MODEL_NAME=x MODEL_VERSION=y` use model_store/x_y.mar built earlier by
    `make archive ... ARTIFACTS=dir` without ARTIFACTS restated (before, the demo's rules would
    train the demo into it); the demo's archive is still built when missing."""
    store, artifacts = tmp_path / "store", tmp_path / "artifacts"
    store.mkdir()
    if demo_artifacts:  # what `make archive` leaves for the demo (fresh artifacts, then the archive)
        (artifacts / version).mkdir(parents=True)
        for f in ("model.pt2", "meta.json"):
            (artifacts / version / f).write_text("{}")
    if expected != {"train", "pack"}:
        (store / f"{name}_{version}.mar").write_bytes(b"PK")
        later = time.time() + 60
        os.utime(store / f"{name}_{version}.mar", (later, later))
    lines = plan(target, f"MODEL_NAME={name}", f"MODEL_VERSION={version}",
                 f"MODEL_STORE={store}", f"DEMO_ARTIFACTS={artifacts}")
    assert builds(lines) == expected, lines
    assert uses(lines, name, version), lines


def test_make_register_rebuilds_from_artifacts_when_given(tmp_path):
    """With ARTIFACTS, `make register` packs them first when they are newer than the archive."""
    store, mine = tmp_path / "store", tmp_path / "mine"
    store.mkdir(), mine.mkdir()
    (store / "churn_1.0.mar").write_bytes(b"PK")
    os.utime(store / "churn_1.0.mar", (1, 1))
    for f in ("model.pt2", "meta.json"):
        (mine / f).write_text("{}")
    lines = plan("register", "MODEL_NAME=churn", "MODEL_VERSION=1.0", f"MODEL_STORE={store}",
                 f"ARTIFACTS={mine}")
    assert builds(lines) == {"pack"} and registers(lines, "churn", "1.0"), lines
    assert any(f"rtserve model check {mine}" in l for l in lines), lines


def test_make_register_of_a_missing_archive_says_how_to_build_it(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    done = subprocess.run(["make", "--no-print-directory", "register", "MODEL_NAME=churn",
                           "MODEL_VERSION=1.0", f"MODEL_STORE={tmp_path}", f"VENV={REPO / '.venv'}",
                           f"RUN_DIR={tmp_path / 'run'}"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout.splitlines()[0] == (
        f"error: {tmp_path}/churn_1.0.mar is missing: build it with make archive MODEL_NAME=churn "
        "MODEL_VERSION=1.0 ARTIFACTS=<dir> (docs/bring-your-own-model.md)")
    assert not (tmp_path / "run").exists()  # no server was asked
