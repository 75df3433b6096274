"""What one exec probe costs the pod (``make bench-probe``): wall and CPU time of
``python -m rtserve probe ready`` and ``live`` against a warmed TorchServe, and their imports.

The kubelet starts each probe as a new process (readiness and startup every 5 s, liveness every
10 s), so its whole cost is a Python start-up, the imports of the probe's command and one or two
loopback calls: this runs each command ``--runs`` times (each must pass) and reports the median
and largest wall time and the CPU time (user + system, from the kernel's accounting of the
finished child), next to ``python -c pass`` (the interpreter's own start-up, the floor), and
one run under ``-X importtime``: the sum of the imports' own times and the modules imported.
rtserve's and the handler's bytecode is compiled first, as the image does (its ``compileall``):
with ``PYTHONDONTWRITEBYTECODE`` set, every run would compile them again.

    .venv/bin/python -m bench.probe_cost [--runs 10] [--attach RUN_DIR]

Prints a table and writes ``bench/results/probe_cost.json``.
"""

from __future__ import annotations

import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench import common
from bench.common import REPO

#: ``-X importtime``'s lines: ``import time: <self us> | <cumulative us> | <indent><module>``.
IMPORT_LINE = re.compile(r"^import time:\s+(\d+) \|\s+\d+ \|( *)(\S+)$", re.M)


def probe_command(check: str, run_dir: Path, model: str) -> list[str]:
    """The probe as the pod runs it, pointed at ``run_dir`` and ``model``."""
    return [sys.executable, "-m", "rtserve", "probe", check, "--run-dir", str(run_dir), "--model", model]


def precompile() -> None:
    """Compile rtserve's and the handler's bytecode, as the image does."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "handler", "rtserve"],
        cwd=REPO,
        check=True,
        stdout=subprocess.DEVNULL,
        timeout=300,
    )


def cost(cmd: list[str], runs: int, env: dict[str, str] | None = None) -> dict:
    """Run ``cmd`` ``runs`` times (each must exit 0; ``env``: its environment, default this
    one's): median and largest wall and CPU ms, and the last run's output."""
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
        walls.append(time.perf_counter() - started)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(cmd[1:])} failed ({done.returncode}): {done.stdout}{done.stderr}")
    return {
        "runs": runs,
        "wall_ms": ms(statistics.median(walls)),
        "wall_max_ms": ms(max(walls)),
        "cpu_ms": ms(statistics.median(cpus)),
        "cpu_max_ms": ms(max(cpus)),
        "output": done.stdout.strip(),
    }


def imports(cmd: list[str]) -> dict:
    """One run of ``cmd`` under ``-X importtime``: the imports' own ms summed, the modules
    imported, and whether ``requests`` is one of them."""
    done = subprocess.run([cmd[0], "-X", "importtime", *cmd[1:]], cwd=REPO, capture_output=True, text=True, timeout=60)
    found = IMPORT_LINE.findall(done.stderr)
    names = {name for _, _, name in found}
    return {
        "import_ms": ms(sum(int(own) for own, _, _ in found) / 1e6),
        "modules": len(names),
        "requests": "requests" in names,
    }


def ms(seconds: float) -> float:
    return round(seconds * 1000, 1)


def main(argv: list[str] | None = None) -> int:
    p = common.parser(__doc__, "probe_cost.json")
    p.add_argument("--runs", type=int, default=10, help="timed runs of each command")
    args = p.parse_args(argv)
    common.log_to_stdout()
    report: dict = {"runs": args.runs, "commands": {}}
    precompile()
    with common.serving(args, "bench-probe-cost") as server:
        commands = {"python -c pass": [sys.executable, "-c", "pass"]}
        for check in ("ready", "live"):
            commands[f"probe {check}"] = probe_command(check, server.run_dir, args.model)
        for name, cmd in commands.items():
            report["commands"][name] = {**cost(cmd, args.runs), **imports(cmd)}
    lines = [
        f"{'command':16} {'wall ms':>8} {'max':>6} {'CPU ms':>7} {'max':>6} {'imports ms':>10} "
        f"{'modules':>7}  requests",
        *(
            f"{name:16} {r['wall_ms']:>8} {r['wall_max_ms']:>6} {r['cpu_ms']:>7} {r['cpu_max_ms']:>6} "
            f"{r['import_ms']:>10} {r['modules']:>7}  {'yes' if r['requests'] else 'no'}"
            for name, r in report["commands"].items()
        ),
        f"(median of {args.runs} runs; CPU is user + system of each finished process)",
    ]
    return common.finish(report, args.out, "\n".join(lines), ok=True)


if __name__ == "__main__":
    raise SystemExit(main())
