"""What the local cluster's node changes on this machine, and how it is put back.

:func:`prepare` makes the bridge and records the kernel settings; :func:`clean` removes the mounts, network
namespaces, bridge, ``KUBE-*`` iptables chains, the network policy controller's ipsets and ``kubepods`` cgroups
idempotently, so ``make cluster-stop``
works after a crash too. One node per machine: :func:`owner` says which run directory holds it.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

from rtserve.cluster import netpol, node
from rtserve.errors import ClusterError

#: Which run directory's node holds this machine's bridge (one node per machine).
OWNER = Path("/run/rtserve-cluster/owner")
SYSCTL_RECORD = "sysctls.json"
NETNS_DIR = Path("/var/run/netns")
CGROUP_ROOT = Path("/sys/fs/cgroup")
FAMILIES = ("iptables", "ip6tables")


def _run(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if check and done.returncode:
        raise ClusterError(f"{shlex.join(argv)} exited {done.returncode}: {done.stderr.strip()}")
    return done


def owner() -> Path | None:
    """The run directory whose node holds this machine's bridge, or None."""
    try:
        return Path(OWNER.read_text().strip())
    except FileNotFoundError:
        return None


def bridge_exists() -> bool:
    return Path(f"/sys/class/net/{node.BRIDGE}").exists()


def prepare(run_dir: Path) -> None:
    """Claim the machine for ``run_dir``'s node and make its bridge.

    Records the kernel settings a node may change; the bridge holds the pods' gateway and the node's address.

    Raises:
        ClusterError: another run directory's node holds the machine, or the bridge exists.
    """
    held = owner()
    if held is not None and held != run_dir:
        raise ClusterError(
            f"this machine's node belongs to the cluster of {held} (one node per machine): "
            f"stop it first (make cluster-stop CLUSTER_RUN_DIR={held})"
        )
    if bridge_exists():
        raise ClusterError(
            f"the bridge {node.BRIDGE} exists: a node ran here and was not cleaned up "
            f"(make cluster-stop CLUSTER_RUN_DIR={held or run_dir})"
        )
    OWNER.parent.mkdir(parents=True, exist_ok=True)
    OWNER.write_text(f"{run_dir}\n")
    share_netns_dir()
    record = run_dir / SYSCTL_RECORD
    if not record.exists():
        record.write_text(json.dumps({k: _sysctl(k) for k in node.SYSCTLS}, indent=2) + "\n")
    _run("ip", "link", "add", node.BRIDGE, "type", "bridge")
    _run("ip", "addr", "add", f"{node.POD_GATEWAY}/{node.POD_CIDR.split('/')[1]}", "dev", node.BRIDGE)
    _run("ip", "addr", "add", f"{node.NODE_IP}/32", "dev", node.BRIDGE)
    _run("ip", "link", "set", node.BRIDGE, "up")


def share_netns_dir(directory: Path = NETNS_DIR) -> None:
    """Make the network namespaces' directory a shared mount point of its own before the node's first pod.

    As ``ip netns`` and podman do when it is not one: otherwise a later podman binds the directory onto
    itself and covers every pod's namespace mount, so the kubelet cannot tear the pods down. Left in place
    after the stop, as those tools leave it.
    """
    path = directory.resolve()  # (/var/run is /run)
    path.mkdir(parents=True, exist_ok=True)
    if str(path) not in mounts_under(path):
        _run("mount", "--bind", str(path), str(path))
    _run("mount", "--make-shared", str(path))


def _sysctl(key: str) -> str | None:
    try:
        return Path("/proc/sys", *key.split(".")).read_text().strip()
    except OSError:
        return None


def mounts_under(root: Path) -> list[str]:
    """The mount points under ``root`` (itself included), deepest first."""
    found = []
    prefix = str(root).rstrip("/")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return sorted(set(found), key=lambda p: (-p.count("/"), p))


def kube_rules(save: str) -> tuple[list[tuple[str, list[str]]], list[tuple[str, str]]]:
    """Parse ``iptables-save`` output ``save`` for what the node added.

    Returns:
        The built-in chains' rules that jump to a ``KUBE-*`` chain (table, rule arguments after
        ``-A``) and the ``KUBE-*`` chains (table, name).
    """
    rules, chains, table = [], [], ""
    for line in save.splitlines():
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith(":KUBE-"):
            chains.append((table, line[1:].split()[0]))
        elif line.startswith("-A ") and not line.startswith("-A KUBE-"):
            args = shlex.split(line)[1:]
            if any(a.startswith("KUBE-") for a in args[1:]):
                rules.append((table, args))
    return rules, chains


def remove_iptables() -> list[str]:
    """Delete every ``KUBE-*`` chain and every jump to one, in both address families.

    Returns:
        What was removed (``iptables -t nat -X KUBE-SERVICES`` and so on).
    """
    removed = []
    for family in FAMILIES:
        save = _run(f"{family}-save", check=False)
        if save.returncode:
            continue
        rules, chains = kube_rules(save.stdout)
        for table, args in rules:
            _run(family, "-w", "-t", table, "-D", *args, check=False)
            removed.append(f"{family} -t {table} -D {shlex.join(args)}")
        for op in ("-F", "-X"):
            for table, chain in chains:
                _run(family, "-w", "-t", table, op, chain, check=False)
        removed += [f"{family} -t {t} -X {c}" for t, c in chains]
    return removed


def left_iptables() -> list[str]:
    """The ``KUBE-*`` chains still in either family (empty after :func:`remove_iptables`)."""
    left = []
    for family in FAMILIES:
        save = _run(f"{family}-save", check=False)
        if not save.returncode:
            left += [f"{family} {t} {c}" for t, c in kube_rules(save.stdout)[1]]
    return left


def _ipsets() -> list[str]:
    """The network policy controller's ipsets on this machine (none when ipset is not installed)."""
    try:
        listed = _run("ipset", "list", "-n", check=False)
    except FileNotFoundError:
        return []
    return netpol.own_ipsets(listed.stdout.split()) if not listed.returncode else []


def remove_ipsets() -> list[str]:
    """Destroy the network policy controller's ipsets (after its chains, which refer to them).

    Returns:
        What was removed (``ipset destroy KUBE-SRC-...``).
    """
    removed = []
    for name in _ipsets():
        if not _run("ipset", "destroy", name, check=False).returncode:
            removed.append(f"ipset destroy {name}")
    return removed


def left_ipsets() -> list[str]:
    """The network policy controller's ipsets still here (empty after :func:`remove_ipsets`)."""
    return [f"ipset {name}" for name in _ipsets()]


def remove_cgroups() -> None:
    """Remove the (empty) ``kubepods`` control groups the kubelet made, deepest first."""
    for top in CGROUP_ROOT.glob("*/kubepods"):
        for dirpath, _dirs, _files in sorted(os.walk(top), key=lambda w: -w[0].count("/")):
            try:
                os.rmdir(dirpath)
            except OSError:
                pass


def _remove_netns(paths: list[str], report: list[str]) -> list[str]:
    """Unmount and delete the network namespace files ``paths``; returns those that stay, named.

    A busy file that is not mounted where we look is covered by its directory bound onto itself after
    the namespace was mounted: that bind is undone and the file tried again.
    """

    def removed(path: str) -> OSError | None:
        if _run("umount", path, check=False).returncode:  # busy: a process still in it
            _run("umount", "-l", path, check=False)
        try:
            Path(path).unlink(missing_ok=True)
        except OSError as exc:
            return exc
        report.append(f"removed network namespace {path}")
        return None

    busy = [p for p in paths if removed(p)]
    for parent in sorted({str(Path(p).resolve().parent) for p in busy}):  # (/var/run: /run)
        if parent in mounts_under(Path(parent)):
            _run("umount", "-l", parent, check=False)
            report.append(f"unmounted {parent} (bound onto itself, covering namespaces)")
    # the rest is still cleaned; these are named in the error
    return [f"network namespace {p} ({exc.strerror})" for p in busy if (exc := removed(p))]


def clean(run_dir: Path, netns: list[str]) -> list[str]:
    """Undo what the node changed on the host (its processes already stopped).

    Removes the mounts under ``run_dir``, the pods' network namespaces ``netns``, the bridge, the ``KUBE-*``
    iptables chains, the network policy controller's ipsets, the ``kubepods`` control groups, and restores the
    kernel settings.

    Returns:
        What was left behind before (one line each), for the stop's report.

    Raises:
        ClusterError: a mount, the bridge or a chain could not be removed.
    """
    report = []
    for point in mounts_under(run_dir):
        if _run("umount", point, check=False).returncode:
            _run("umount", "-l", point)
        report.append(f"unmounted {point}")
    kept = _remove_netns([p for p in netns if Path(p).exists()], report)
    if bridge_exists():
        _run("ip", "link", "del", node.BRIDGE)
        report.append(f"removed bridge {node.BRIDGE}")
    removed = remove_iptables()
    if removed:
        report.append(f"removed {len(removed)} iptables rules and chains")
    sets = remove_ipsets()
    if sets:
        report.append(f"removed {len(sets)} ipsets")
    remove_cgroups()
    record = run_dir / SYSCTL_RECORD
    if record.exists():
        for key, value in json.loads(record.read_text()).items():
            if value is not None and _sysctl(key) != value:
                Path("/proc/sys", *key.split(".")).write_text(value)
                report.append(f"restored {key} = {value}")
        record.unlink()
    left = mounts_under(run_dir) + left_iptables() + left_ipsets() + ([node.BRIDGE] if bridge_exists() else []) + kept
    if left:
        raise ClusterError(f"the node left behind: {', '.join(left)}")
    if owner() == run_dir:
        OWNER.unlink(missing_ok=True)
    return report
