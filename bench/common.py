"""What the bench scripts share: their common options, a TorchServe for a run, and the results.

Each script under ``bench/`` keeps only its own measurement (a ``run()`` on a ready server, or a
harness of its own) and how it renders it; this module gives it the rest:

- :func:`parser`: ``--model``, the version options, ``--model-store``, ``--attach RUN_DIR`` and
  ``--out`` (default ``bench/results/<script>.json``);
- :func:`serving`: a TorchServe on free loopback ports for the run, ready, stopped afterwards
  (:func:`rtserve.testing.server.serving`, what the tests' server fixture uses too); with
  ``--attach``, the one already running from RUN_DIR
  instead, left running (how the test suite runs each script's ``main()`` against one server);
- :func:`steady_load`: :class:`bench.loadgen.SteadyLoad` on a server's prediction route;
- :func:`phase_lines` and :func:`finish`: the per-phase table, then the summary printed, the
  report written as JSON, and the exit status.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.loadgen import SteadyLoad
from rtserve.errors import ServerError
from rtserve.server.properties import read_properties
from rtserve.server.readiness import sample_payload
from rtserve.server.torchserve import TorchServe
from rtserve.testing import server as local

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench" / "results"
MODEL = "realtime-classifier"


def parser(
    doc: str,
    out: str,
    versions: dict[str, str] | None = None,
    attach: bool = True,
    model_store: bool = True,
    run_root: bool = True,
    model: bool = True,
) -> argparse.ArgumentParser:
    """The options every server-driving script has; the script adds its own.

    Args:
        doc: the script's docstring (its ``--help``).
        out: the report's file name under ``bench/results``.
        versions: option name -> default (``{"version": "1.0"}`` unless given).
        attach: offer ``--attach RUN_DIR`` (not for scripts that stop or replace the server).
        model_store: offer ``--model-store`` (not for pods: their images hold the archives).
        run_root: offer ``--run-root`` (for :func:`serving`; scripts with replicas of their own
            have a ``--work-dir``).
        model: offer ``--model`` (not for scripts that measure only the demo model).
    """
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    if model:
        p.add_argument("--model", default=MODEL)
    for name, default in (versions or {"version": "1.0"}).items():
        p.add_argument(f"--{name}", default=default)
    if model_store:
        p.add_argument("--model-store", type=Path, default=REPO / "model_store")
    if run_root:
        p.add_argument(
            "--run-root",
            type=Path,
            default=REPO / "build",
            help="where a server started for the run keeps its run directory",
        )
    if attach:
        p.add_argument(
            "--attach",
            type=Path,
            metavar="RUN_DIR",
            help="use the TorchServe already running from RUN_DIR (left running) instead of starting one",
        )
    p.add_argument("--out", type=Path, default=RESULTS / out)
    return p


def log_to_stdout() -> None:
    """Progress lines (``logging`` INFO) on stdout, message only."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)


def attached(run_dir: Path) -> TorchServe:
    """The TorchServe running from ``run_dir``, reached through the effective config it was
    started with (as ``python -m rtserve server status --run-dir`` does).

    Raises:
        ServerError: nothing runs from ``run_dir``.
    """
    config = Path(run_dir) / "config.properties"
    if not config.is_file():
        raise ServerError(f"no TorchServe was started from {run_dir}")
    server = TorchServe(run_dir, Path(read_properties(config)["model_store"]), config=config)
    if server.pid() is None:
        raise ServerError(f"no TorchServe running from {run_dir}")
    return server


@contextmanager
def serving(
    args: argparse.Namespace, run_name: str, archives: list[str] | None = None, overrides: dict[str, str] | None = None
) -> Iterator[TorchServe]:
    """A ready TorchServe serving ``archives`` (default ``<model>_<version>.mar``) from
    ``args.model_store`` as ``args.model``, in ``<args.run_root>/<run_name>``, on free loopback
    ports, stopped afterwards; or, with ``args.attach``, the server running from there, left
    running.

    Raises:
        ServerError: it did not start, or ``--attach`` names no running server, or both
            ``--attach`` and ``overrides`` were given (an attached server keeps its config).
    """
    if getattr(args, "attach", None) is not None:
        if overrides:
            raise ServerError(f"--attach uses the server as it runs: cannot apply {overrides}")
        yield attached(args.attach)
        return
    archives = archives or [f"{args.model}_{args.version}.mar"]
    with local.serving(
        args.run_root / run_name,
        args.model_store,
        [f"{args.model}={mar}" for mar in archives],
        overrides,
        ready=[args.model],
    ) as server:
        yield server


def predictions_url(server: TorchServe, model: str, route: str = "predictions") -> str:
    """The server's ``/<route>/<model>`` URL."""
    return f"{server.props['inference_address']}/{route}/{model}"


def steady_load(
    server: TorchServe, model: str, rate: float, concurrency: int, max_seconds: float, timeout: float = 10.0, **kwargs
) -> SteadyLoad:
    """Steady predictions on ``server``'s route for ``model`` with its current inference key
    (not started); ``kwargs`` go to :class:`SteadyLoad`."""
    client = server.client(timeout=timeout)
    return SteadyLoad(
        predictions_url(server, model),
        sample_payload(),
        lambda: client.keys.get("inference"),
        rate=rate,
        concurrency=concurrency,
        max_seconds=max_seconds,
        timeout=timeout,
        **kwargs,
    )


def phase_lines(phases: list[dict], width: int, versions: bool = True, title: str = "phase") -> list[str]:
    """A per-phase table (``bench.loadgen.PhaseReport`` as dicts): sent, failed on the first
    try, resent, failed after resending, p50, p99, the versions seen, and each phase's first-try
    failures by status and its errors below it."""
    lines = [
        f"{title:{width}} {'sent':>6} {'failed':>7} {'resent':>6} {'failed':>6} {'p50 ms':>7} "
        f"{'p99 ms':>7}" + ("  versions seen" if versions else ""),
        f"{'':{width}} {'':>6} {'1st try':>7} {'':>6} {'at end':>6}",
    ]
    for p in phases:
        seen = ", ".join(f"{v}: {n}" for v, n in sorted(p["versions"].items()))
        lines.append(
            f"{p['phase']:{width}} {p['sent']:>6} {p['failed_first']:>7} {p['resent']:>6} "
            f"{p['failed_after_resend']:>6} {p['p50_ms']:>7} {p['p99_ms']:>7}" + (f"  {seen}" if versions else "")
        )
        if p["failed_first"]:
            lines.append(
                "    failed on the first try: "
                + ", ".join(f"{status}: {n}" for status, n in p["failed_first_by_status"].items())
            )
        lines += [f"    error: {' '.join(e.split())}" for e in p["errors"]]
    return lines


def write_json(report: object, out: Path) -> None:
    """Write ``report`` as indented JSON to ``out`` (its folder created)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


def finish(report: object, out: Path, text: str, ok: bool) -> int:
    """Print ``text``, write ``report`` to ``out``; the exit status: 0 when ``ok``."""
    sys.stdout.write(text + "\n")
    write_json(report, out)
    return 0 if ok else 1
