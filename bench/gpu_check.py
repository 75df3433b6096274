"""make gpu-check: the GPU tests, and each example's forward pass on the GPU against the CPU.

Runs with only torch, numpy and this checkout (``scripts/gpu-check`` on a machine without the
project's virtualenv); pytest, TorchServe (``ts``) and captum are needed for the handler's GPU tests
alone, scikit-learn for ``--export`` alone. In order:

1. A CUDA GPU: without one, it says so and exits 2, having checked nothing.
2. The GPU tests (:data:`GPU_TESTS`, under pytest): they must pass, and no test may be skipped
   for want of CUDA. Where their imports are missing it says which and fails (``--no-tests``
   skips them).
3. Each example of :data:`bench.example_models.EXAMPLES` (artifacts built beforehand, ``make
   examples``, or here with ``--export``): its program loaded as the handler loads it
   (``handler.model.load_program(path, device="cuda", direct=True)``), its outputs on the golden
   rows against the CPU's within :data:`ATOL` + :data:`RTOL` x |CPU|, then the forward latency at
   batch 1 and 64, on the GPU as a worker calls it (CPU rows in, copied there and back) and on the
   CPU with one torch thread (a worker's setting): p50 and p99 of ``--calls`` calls.

Exit status: 0 all passed, 1 a check failed or could not run, 2 no CUDA GPU.

    scripts/gpu-check                      # what make gpu-check runs (with --build)
    scripts/gpu-check --no-tests --calls 500 --out "$OUT/gpu_check.json"
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from bench.example_models import REPO, VERSION, Example, build, present

#: The test files with tests that run only where CUDA is available.
GPU_TESTS = ("tests/unit/test_device.py",)
#: Modules the GPU tests import beyond torch and numpy, and the distribution that has each.
TEST_NEEDS = {"pytest": "pytest", "yaml": "pyyaml", "ts": "torchserve", "captum": "captum"}
#: GPU against CPU outputs: ``|gpu - cpu| <= ATOL + RTOL * |cpu|``: float32 on both (the handler
#: turns TF32 off on CUDA: handler.device.on_device), whose kernels sum in other orders.
ATOL, RTOL = 1e-4, 1e-4
BATCHES = (1, 64)
NO_GPU, FAILED = 2, 1


def gpu_line() -> str | None:
    """The GPU torch reaches (name, torch, CUDA), or None when it reaches none."""
    import torch

    if not torch.cuda.is_available():
        return None
    return f"{torch.cuda.get_device_name(0)} (torch {torch.__version__}, CUDA {torch.version.cuda})"


def importable(module: str) -> bool:
    """Whether a top-level module can be found (without importing it)."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def run_gpu_tests(python: str) -> tuple[bool, list[str]]:
    """:data:`GPU_TESTS` under pytest in a child process: (passed, lines to print).

    Passed means pytest passed and no test was skipped for want of CUDA (the tests would then
    have proven nothing about the GPU).
    """
    missing = [f"{module} ({dist})" for module, dist in TEST_NEEDS.items() if not importable(module)]
    if missing:
        return False, [
            f"GPU tests not run: {python} lacks {', '.join(missing)} (carry their wheels: docs/performance.md)"
        ]
    with tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "junit.xml"
        done = subprocess.run(
            [
                python,
                "-m",
                "pytest",
                "-o",
                "addopts=",
                "-q",
                "-rs",
                "-p",
                "no:cacheprovider",
                f"--junitxml={junit}",
                *GPU_TESTS,
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
        )
        outcomes = junit_outcomes(junit.read_text()) if junit.is_file() else {}
    cuda_skips = [name for name, (outcome, why) in outcomes.items() if outcome == "skipped" and "CUDA" in why]
    lines = [line for line in done.stdout.splitlines() if line.strip()][-15:]
    passed = done.returncode == 0 and bool(outcomes) and not cuda_skips
    if cuda_skips:
        lines.append(f"skipped for want of CUDA, although torch reaches a GPU here: {', '.join(cuda_skips)}")
    ran = sorted(name for name, (outcome, _) in outcomes.items() if outcome == "passed")
    lines.append(f"GPU tests {'passed' if passed else 'FAILED'}: {len(ran)} passed of {len(outcomes)}")
    return passed, lines


def junit_outcomes(xml: str) -> dict[str, tuple[str, str]]:
    """Each test case of a JUnit XML report: ``{name: (passed|failed|skipped, message)}``."""
    out = {}
    for case in ElementTree.fromstring(xml).iter("testcase"):
        outcome, why = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = "skipped" if child.tag == "skipped" else "failed"
                why = child.get("message", "")
        out[case.get("name", "")] = (outcome, why)
    return out


def export_here(examples: list[Example], root: Path, python: str) -> None:
    """Train and export each example into ``root/<name>/<version>`` with this torch (its own
    script's ``--out``).

    Raises:
        subprocess.CalledProcessError: an example failed to train or export.
    """
    for example in examples:
        out = example.artifacts(root)
        subprocess.run([python, str(example.module), "--out", str(out), "--version", VERSION], cwd=REPO, check=True)


def latencies(forward, x, calls: int) -> tuple[float, float]:  # noqa: ANN001 - a forward function, a tensor
    """p50 and p99 in microseconds of ``calls`` calls of ``forward(x)`` after a tenth as many
    (at least 10) unmeasured; each call ends with its result on the CPU, so the clock covers it."""
    import torch

    with torch.inference_mode():
        for _ in range(max(10, calls // 10)):
            forward(x)
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            forward(x)
            times.append(time.perf_counter() - start)
    times.sort()
    return round(statistics.median(times) * 1e6, 1), round(times[min(len(times) - 1, int(0.99 * len(times)))] * 1e6, 1)


def check_example(example: Example, model_dir: Path, calls: int, device: str = "cuda:0") -> dict:
    """One example on ``device`` against the CPU: the outputs' agreement and the latencies per batch."""
    import torch

    from handler.device import on_device
    from handler.model import ModelMetadata, load_program

    meta = ModelMetadata.load(model_dir / "meta.json")
    path = model_dir / "model.pt2"
    cuda = torch.device(device)
    cpu_forward = load_program(path, "cpu", direct=True)
    gpu_forward = on_device(load_program(path, cuda, direct=True), cuda)
    rows = torch.tensor(meta.golden["features"], dtype=torch.float32)
    with torch.inference_mode():
        want, got = cpu_forward(rows), gpu_forward(rows)
    excess = float(((got - want).abs() - (ATOL + RTOL * want.abs())).max())
    result = {
        "name": example.name,
        "forward_path": getattr(cpu_forward, "forward_path", ""),
        "golden_rows": len(rows),
        "max_abs_diff": float((got - want).abs().max()),
        "agrees": excess <= 0,
        "batches": {},
    }
    for batch in BATCHES:
        x = rows[torch.arange(batch) % len(rows)]
        cpu50, cpu99 = latencies(cpu_forward, x, calls)
        gpu50, gpu99 = latencies(gpu_forward, x, calls)
        result["batches"][batch] = {"cpu_p50_us": cpu50, "cpu_p99_us": cpu99, "gpu_p50_us": gpu50, "gpu_p99_us": gpu99}
    return result


def table(results: list[dict]) -> str:
    """The per-example figures: latencies per batch, the GPU over the CPU, the outputs' agreement."""
    lines = [
        f"{'example':<12} {'batch':>5} {'CPU p50 us':>10} {'CPU p99 us':>10} {'GPU p50 us':>10} {'GPU p99 us':>10} "
        f"{'GPU/CPU p50':>11}  outputs vs CPU"
    ]
    for r in results:
        for batch, b in r["batches"].items():
            lines.append(
                f"{r['name']:<12} {batch:>5} {b['cpu_p50_us']:>10.1f} {b['cpu_p99_us']:>10.1f} "
                f"{b['gpu_p50_us']:>10.1f} {b['gpu_p99_us']:>10.1f} {b['gpu_p50_us'] / b['cpu_p50_us']:>11.2f}  "
                f"max diff {r['max_abs_diff']:.2g} ({'agrees' if r['agrees'] else 'DIFFERS'})"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Check the GPU; print the figures; the exit status says what passed (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, default=REPO / "artifacts", help="make's DEMO_ARTIFACTS")
    parser.add_argument("--kinds", help="comma-separated example names (default: every one present)")
    parser.add_argument("--calls", type=int, default=300, help="timed calls per device and batch")
    parser.add_argument("--no-tests", action="store_true", help="skip the GPU tests (the forward checks only)")
    parser.add_argument("--build", action="store_true", help="make example for each first (make gpu-check)")
    parser.add_argument("--model-store", type=Path, default=REPO / "model_store", help="for --build")
    parser.add_argument(
        "--export", action="store_true", help="train and export each example here with this torch (needs scikit-learn)"
    )
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "gpu_check.json")
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError as exc:
        print(f"no GPU check: torch cannot be imported by {sys.executable}: {exc}")
        return FAILED
    gpu = gpu_line()
    if gpu is None:
        print(
            f"no CUDA GPU found: torch {torch.__version__} (CUDA build {torch.version.cuda or 'none'}) reaches "
            f"none (torch.cuda.is_available() is False, CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')!r}); "
            "nothing was checked"
        )
        return NO_GPU
    try:
        examples, absent = present(args.kinds.split(",") if args.kinds else None)
    except ValueError as exc:
        print(exc)
        return FAILED
    print(f"GPU: {gpu}; CPU: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, 1 torch thread")
    ok = True
    tests: list[str] = []
    if not args.no_tests:
        passed, tests = run_gpu_tests(sys.executable)
        print("\n".join(tests))
        ok &= passed
    with tempfile.TemporaryDirectory() as tmp:
        root = args.artifacts.resolve()
        if args.export:
            root = Path(tmp)
            export_here(examples, root, sys.executable)
        elif args.build:
            build(examples, root, args.model_store.resolve())
        torch.set_num_threads(1)
        results, problems = [], []
        for example in examples:
            model_dir = example.artifacts(root)
            if not (model_dir / "model.pt2").is_file():
                problems.append(f"{example.name}: {model_dir}/model.pt2 is missing: make examples here, or --export")
                continue
            try:
                results.append(check_example(example, model_dir, args.calls))
            except Exception as exc:  # a program this torch cannot load, a CUDA error: reported, not a crash
                problems.append(f"{example.name}: {type(exc).__name__}: {exc}")
    print(table(results))
    problems += [
        f"{r['name']}: GPU outputs differ from the CPU's by {r['max_abs_diff']:.3g}" for r in results if not r["agrees"]
    ]
    for example in absent:
        print(f"(skipped {example.name}: {example.module.relative_to(REPO)} is not in this checkout)")
    for problem in problems:
        print(f"FAILED {problem}")
    ok &= not problems and bool(results)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "gpu": gpu,
                "calls": args.calls,
                "tolerance": {"atol": ATOL, "rtol": RTOL},
                "tests": tests,
                "examples": results,
                "problems": problems,
                "ok": ok,
            },
            indent=2,
        )
        + "\n"
    )
    print(f"gpu-check {'passed' if ok else 'FAILED'} ({args.out})")
    return 0 if ok else FAILED


if __name__ == "__main__":
    sys.exit(main())
