"""Where a machine's CPU goes while something runs (e.g. `make test`): CPU-seconds per kind of process.

Samples ``/proc`` every ``--interval`` seconds until ``--pid`` exits (or ``--seconds`` pass), adds
each process's CPU time since the last sample to its kind (:func:`kind`, from its command line), and
prints the kinds, largest first, with the machine's own busy, I/O-wait and idle seconds
(``/proc/stat``). A process that starts and ends between two samples is missed (only its parent's
count of reaped children holds it, which no kind adds): the ``unseen`` line is the busy time no kind took.

    python -m bench.cpu_split --pid $(cat build/ci.pid) --out build/cpu-split.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")

#: (kind, pattern over the command line), first match wins.
KINDS: list[tuple[str, str]] = [
    ("torchserve worker", r"model_service_worker\.py"),
    ("torchserve frontend (JVM)", r"java .*(org\.pytorch\.serve|model_server_home)"),
    ("kafka (JVM)", r"java .*kafka"),
    ("cassandra (JVM)", r"java .*cassandra"),
    ("other JVM (maven, javac)", r"^\S*(java|javac|mvn)\b"),
    ("kube-apiserver", r"kube-apiserver"),
    ("etcd", r"\betcd\b"),
    ("kube-controller-manager", r"kube-controller-manager"),
    ("kubelet", r"\bkubelet\b"),
    ("kube-scheduler, kube-proxy, kube-router", r"kube-scheduler|kube-proxy|kube-router"),
    ("containerd, runc, shims", r"containerd|runc|\bshim\b"),
    ("prometheus, adapter, metrics-server, coredns", r"prometheus|metrics-server|coredns"),
    ("kubectl", r"\bkubectl\b"),
    ("podman, buildah, skopeo", r"\b(podman|buildah|skopeo|conmon)\b"),
    ("nginx", r"\bnginx\b"),
    ("pytest: cluster tier", r"pytest tests/cluster"),
    ("pytest: stream and records tiers", r"pytest tests/stream"),
    ("pytest: main tier", r"-m pytest"),
    ("rtserve in pods and servers (python -m rtserve)", r"-m rtserve"),
    ("load generators and benches (python -m bench)", r"-m bench|wrk"),
    ("other python", r"python"),
    ("kernel threads (kdamond, kswapd, ...)", r"^\["),
    ("make, sh, git, tar, cp", r"\b(make|bash|sh|git|tar|cp|find|sha256sum|gzip)\b"),
]


def kind(cmdline: str) -> str:
    """The kind of the process whose command line (NUL bytes as spaces) is ``cmdline``."""
    for name, pattern in KINDS:
        if re.search(pattern, cmdline):
            return name
    return "other"


def processes() -> dict[int, tuple[str, int, int]]:
    """pid -> (command line, CPU ticks the process itself used so far, its start time)."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            cmd = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        out[int(entry.name)] = (
            cmd or "[" + stat.split("(", 1)[1].rsplit(")", 1)[0] + "]",
            int(fields[11]) + int(fields[12]),
            int(fields[19]),
        )
    return out


def machine() -> dict[str, float]:
    """The machine's busy, iowait and idle seconds so far, all CPUs (``/proc/stat``)."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = values[:8]
    return {
        "busy": (user + nice + system + irq + softirq) / TICK,
        "iowait": iowait / TICK,
        "idle": idle / TICK,
        "steal": steal / TICK,
    }


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def sample(pid: int | None, seconds: float, interval: float) -> dict:
    start, before, seen = time.monotonic(), machine(), processes()
    totals: dict[str, float] = {}
    while time.monotonic() - start < seconds and (pid is None or alive(pid)):
        time.sleep(interval)
        now = processes()
        for p, (cmd, ticks, started) in now.items():
            old = seen.get(p)
            used = ticks - old[1] if old and old[2] == started else ticks
            if used > 0:
                totals[kind(cmd)] = totals.get(kind(cmd), 0.0) + used / TICK
        seen = now
    after = machine()
    split = {k: round(v, 1) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])}
    used = {k: round(after[k] - before[k], 1) for k in after}
    used["unseen"] = round(used["busy"] - sum(split.values()), 1)
    return {"seconds": round(time.monotonic() - start, 1), "machine": used, "kinds": split}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pid", type=int, help="sample until this process exits")
    parser.add_argument("--seconds", type=float, default=6 * 3600.0)
    parser.add_argument("--interval", type=float, default=5.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    report = sample(args.pid, args.seconds, args.interval)
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    m = report["machine"]
    print(f">> {report['seconds']:.0f} s: busy {m['busy']:.0f} CPU-s, iowait {m['iowait']:.0f}, idle {m['idle']:.0f}")
    for name, cpu in report["kinds"].items():
        print(f"  {cpu:9.1f}  {name}")
    print(f"  {m['unseen']:9.1f}  unseen (processes between two samples, the kernel)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
