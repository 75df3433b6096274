"""The local cluster's pure parts: the generated Go modules, the certificates, the components'
argv and the PID-file teardown (rtserve/cluster/)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rtserve.cli import main
from rtserve.cluster import components, gomod, host, node, pki, runtime
from rtserve.errors import ClusterError
from tests.conftest import REPO, go_pin

pytestmark = pytest.mark.unit

#: What ``go mod edit -json`` prints for the parts of Kubernetes' and etcd's go.mod files we read.
KUBERNETES_GOMOD = {
    "Go": "1.26.0",
    "GoDebug": [{"Key": "default", "Value": "go1.26"}],
    "Require": [
        {"Path": "k8s.io/api", "Version": "v0.0.0"},
        {"Path": "k8s.io/kubectl", "Version": "v0.0.0"},
        {"Path": "k8s.io/klog/v2", "Version": "v2.140.0"},
    ],
    "Replace": [
        {"Old": {"Path": "k8s.io/kubectl"}, "New": {"Path": "./staging/src/k8s.io/kubectl"}},
        {"Old": {"Path": "k8s.io/api"}, "New": {"Path": "./staging/src/k8s.io/api"}},
    ],
}
ETCD_GOMOD = {
    "Go": "1.26.0",
    "Require": [{"Path": "go.etcd.io/etcd/api/v3", "Version": "v3.6.16"}],
    "Replace": [
        {"Old": {"Path": "go.etcd.io/etcd/api/v3"}, "New": {"Path": "../api"}},
        {"Old": {"Path": "go.etcd.io/etcd"}, "New": {"Path": "./FORBIDDEN_DEPENDENCY"}},
        {"Old": {"Path": "example.com/x"}, "New": {"Path": "example.com/y", "Version": "v1.0.0"}},
    ],
}


def test_staging_modules_map_to_their_published_version():
    assert gomod.published_versions(KUBERNETES_GOMOD, "v1.36.3") == (
        ("k8s.io/api", "v0.36.3"),
        ("k8s.io/kubectl", "v0.36.3"),
    )


def test_etcd_modules_keep_the_version_required_and_guards_are_left_out():
    assert gomod.published_versions(ETCD_GOMOD, "v3.6.16") == (("go.etcd.io/etcd/api/v3", "v3.6.16"),)


def test_a_prerelease_maps_to_the_staging_prerelease():
    assert dict(gomod.published_versions(KUBERNETES_GOMOD, "v1.38.0-beta.0"))["k8s.io/api"] == "v0.38.0-beta.0"


def test_a_version_that_names_no_staging_release_is_refused():
    with pytest.raises(ClusterError, match="k8s.io/kubectl is required at v0.0.0 and 1.36.3 is not a v1.x.y version"):
        gomod.published_versions(KUBERNETES_GOMOD, "1.36.3")


def test_rendered_module_requires_maps_and_builds():
    text = gomod.kubernetes_module(KUBERNETES_GOMOD, "v1.36.3").render()
    assert "module rtserve/deploy/cluster\n" in text and "go 1.26.0\n" in text
    assert "godebug (\n\tdefault=go1.26\n)" in text
    assert "\tk8s.io/kubernetes v1.36.3\n" in text
    assert "\tk8s.io/kubectl => k8s.io/kubectl v0.36.3\n" in text
    for tool in gomod.KUBERNETES_TOOLS:
        assert f"\t{tool}\n" in text


@pytest.mark.parametrize("sub, module", [("", gomod.KUBERNETES), ("etcd", gomod.ETCD_SERVER)])
def test_committed_modules_pin_one_version_and_map_every_replacement(sub, module):
    """The committed go.mod files are the generator's: one pinned version, a replacement for
    each module they map, each to the same published version line (never a local path)."""
    text = (REPO / "deploy" / "cluster" / sub / "go.mod").read_text()
    assert text.startswith(gomod.HEADER)
    version = go_pin(REPO / "deploy" / "cluster" / sub / "go.mod", module)
    assert version.startswith("v1.36." if module == gomod.KUBERNETES else "v3.6.")
    replaced = [line.split() for line in text.splitlines() if "=>" in line]
    assert replaced, "no replace lines"
    for old, _, new, new_version in replaced:
        assert old == new and new_version.startswith("v"), (old, new, new_version)
    assert (REPO / "deploy" / "cluster" / sub / "go.sum").is_file()


def test_certificates_are_signed_by_the_ca_with_their_names(tmp_path):
    certs = pki.certificates(components.SERVICE_IP, node.NODE_NAME, node.NODE_IP)
    pki.make(tmp_path, certs)
    for cert in certs:
        verified = subprocess.run(
            ["openssl", "verify", "-CAfile", tmp_path / f"{cert.ca}.crt", tmp_path / f"{cert.name}.crt"],
            capture_output=True,
            text=True,
        )
        assert verified.returncode == 0, verified.stderr
    text = subprocess.run(
        ["openssl", "x509", "-in", tmp_path / "apiserver.crt", "-noout", "-text"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "IP Address:127.0.0.1" in text and "IP Address:10.0.0.1" in text
    assert "DNS:kubernetes.default.svc.cluster.local" in text
    admin = subprocess.run(
        ["openssl", "x509", "-in", tmp_path / "admin.crt", "-noout", "-subject"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert admin.strip() == "subject=CN = kubernetes-admin, O = system:masters"
    kubelet = subprocess.run(
        ["openssl", "x509", "-in", tmp_path / "node.crt", "-noout", "-subject"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert kubelet.strip() == f"subject=CN = system:node:{node.NODE_NAME}, O = system:nodes"
    serving = subprocess.run(
        ["openssl", "x509", "-in", tmp_path / "kubelet.crt", "-noout", "-ext", "subjectAltName"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert f"IP Address:{node.NODE_IP}" in serving
    wrong_ca = subprocess.run(
        ["openssl", "verify", "-CAfile", tmp_path / "ca.crt", tmp_path / "front-proxy-client.crt"],
        capture_output=True,
        text=True,
    )
    assert wrong_ca.returncode == 2, "the front proxy's client certificate is signed by its own CA only"
    assert (tmp_path / "sa.pub").read_text().startswith("-----BEGIN PUBLIC KEY-----")


def _layout(tmp_path: Path) -> components.Layout:
    ports = dict(zip(components.PORT_NAMES, range(20001, 20001 + len(components.PORT_NAMES))))
    return components.Layout(tmp_path / "run", tmp_path / "bin", tmp_path / "admin.kubeconfig", ports)


def test_api_server_runs_as_a_real_one(tmp_path):
    layout = _layout(tmp_path)
    argv = components.kube_apiserver(layout).argv
    assert argv[0] == str(tmp_path / "bin" / "kube-apiserver")
    assert "--authorization-mode=Node,RBAC" in argv and "--secure-port=20003" in argv
    assert "--etcd-servers=https://127.0.0.1:20001" in argv
    assert f"--service-account-signing-key-file={layout.pki / 'sa.key'}" in argv
    assert not any(a.startswith("--disable-admission-plugins") for a in argv)
    assert [c.name for c in components.control_plane(layout)] == list(components.CONTROL_PLANE)
    assert "--kubelet-preferred-address-types=InternalIP" in argv


def test_kubeconfig_embeds_the_certificates_or_names_them(tmp_path):
    layout = _layout(tmp_path)
    layout.pki.mkdir(parents=True)
    for name in ("ca.crt", "admin.crt", "admin.key"):
        (layout.pki / name).write_text(f"pem of {name}")
    embedded = yaml.safe_load(components.kubeconfig(layout, "admin", embed=True))
    assert embedded["clusters"][0]["cluster"]["server"] == "https://127.0.0.1:20003"
    assert embedded["users"][0]["user"]["client-key-data"] == "cGVtIG9mIGFkbWluLmtleQ=="
    named = yaml.safe_load(components.kubeconfig(layout, "admin"))
    assert named["clusters"][0]["cluster"]["certificate-authority"] == str(layout.pki / "ca.crt")


def test_stop_ends_the_recorded_process_and_spares_a_reused_pid(tmp_path):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for proc in (sleeper, other):  # until each has exec'd (a fork still shows our command line)
            deadline = time.monotonic() + 10
            while b"time.sleep" not in Path(f"/proc/{proc.pid}/cmdline").read_bytes():
                assert time.monotonic() < deadline, "the sleeper did not start"
                time.sleep(0.01)
        (tmp_path / "etcd.pid").write_text(f"{sleeper.pid}\n{sys.executable}\n")
        # A PID file whose process now runs another binary (a reused PID): left alone.
        (tmp_path / "kube-apiserver.pid").write_text(f"{other.pid}\n/nonexistent/kube-apiserver\n")
        assert runtime.status(tmp_path) == {
            "etcd": f"running (pid {sleeper.pid})",
            "kube-apiserver": f"dead (pid {other.pid})",
        }
        assert runtime.stop(tmp_path) == ["etcd"]
        assert not Path(f"/proc/{sleeper.pid}").exists()  # ended and reaped by stop
        assert other.poll() is None
        assert not list(tmp_path.glob("*.pid"))
    finally:
        for proc in (sleeper, other):
            proc.kill()
            proc.wait()


def test_a_node_whose_processes_are_all_gone_is_reclaimed_and_a_live_one_is_not(tmp_path, monkeypatch):
    """A session killed mid-run leaves the machine claimed (owner file, bridge, chains) by a node
    that no longer runs: the next start cleans it up instead of refusing. Here the owner file is
    redirected and the host's clean-up observed (the real one is run by the cluster tier)."""
    owner, dead_dir, live_dir = tmp_path / "owner", tmp_path / "dead", tmp_path / "live"
    monkeypatch.setattr(host, "OWNER", owner)
    cleaned = []

    def clean(run_dir, netns):  # what the real one does with the claim once the host is clean
        cleaned.append(run_dir)
        owner.unlink()
        return ["removed bridge rtsl0"]

    monkeypatch.setattr(host, "clean", clean)
    dead_dir.mkdir()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (dead_dir / "kubelet.pid").write_text(f"{gone.pid}\n{sys.executable}\n")
    owner.write_text(f"{dead_dir}\n")
    assert runtime.reclaim(tmp_path / "new") == ["removed bridge rtsl0"]
    assert cleaned == [dead_dir] and not list(dead_dir.glob("*.pid"))
    assert runtime.reclaim(tmp_path / "new") == []  # the claim was given up
    live_dir.mkdir()
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        deadline = time.monotonic() + 10
        while b"time.sleep" not in Path(f"/proc/{sleeper.pid}/cmdline").read_bytes():
            assert time.monotonic() < deadline, "the sleeper did not start"
            time.sleep(0.01)
        (live_dir / "kubelet.pid").write_text(f"{sleeper.pid}\n{sys.executable}\n")
        owner.write_text(f"{live_dir}\n")
        cleaned.clear()
        assert runtime.reclaim(tmp_path / "new") == [] and cleaned == [] and sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()


def test_start_names_the_missing_binaries(tmp_path, capsys):
    assert main(["cluster", "start", "--bin-dir", str(tmp_path), "--run-dir", str(tmp_path / "run")]) == 1
    err = capsys.readouterr().err
    assert f"missing: {tmp_path / 'etcd'}, {tmp_path / 'kube-apiserver'}" in err and "make cluster-deps" in err


def test_a_bad_port_is_refused(capsys):
    with pytest.raises(SystemExit):
        main(["cluster", "start", "--bin-dir", "x", "--port", "apiserver=6443"])
    assert "expected NAME=PORT with NAME one of etcd" in capsys.readouterr().err
