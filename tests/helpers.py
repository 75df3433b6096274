"""Shared test helpers: a faithful TorchServe context, payloads, and the reference model."""

from __future__ import annotations

import contextlib
import functools
import json
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import torch
import yaml

from handler.model import ModelMetadata
from rtserve.model.archive import read_archive
from rtserve.runtime.process import terminate
from rtserve.testing.worker import METRICS_YAML, make_context, start_batch  # noqa: F401 - shared

REPO = Path(__file__).resolve().parent.parent
#: The shipped model config (model/model-config.yaml), as the archive carries it.
MODEL_YAML = yaml.safe_load((REPO / "model" / "model-config.yaml").read_text())


def make(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """``make ARGS`` in the repository with its virtualenv; output (both streams) in ``stdout``."""
    return subprocess.run(
        ["make", "--no-print-directory", *args, f"VENV={REPO / '.venv'}"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
    )


def assembled_libs(target: str, banner: str, timeout: float) -> Path:
    """``make TARGET`` (a ``*-deps`` target that assembles jars from Maven Central); the
    directory its last line names (``>> <banner>: N jars in DIR``)."""
    start = time.monotonic()
    done = make(target, timeout=timeout)
    assert done.returncode == 0, f"make {target} failed:\n{done.stdout[-4000:]}"
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith(f">> {banner}") and " jars in " in line, done.stdout
    print(f"make {target}: {time.monotonic() - start:.0f} s")
    return Path(line.rsplit(" jars in ", 1)[1])


@contextlib.contextmanager
def made_server(
    start: str, stop: str, where: list[str], processes: Callable[[], list[int]], stop_recorded: Callable[[], object]
) -> Iterator[str]:
    """``make START WHERE...`` (a local server from recorded state); yields its output, then
    ``make STOP WHERE...`` however the block ends, which must leave none of ``processes()``
    (then ``stop_recorded()`` and SIGTERM end what is left, so nothing outlives the session)."""
    try:
        done = make(start, *where)
        assert done.returncode == 0, f"make {start} failed:\n{done.stdout[-6000:]}"
        yield done.stdout
    finally:
        stopped = make(stop, *where)
        left = processes()
        stop_recorded()
        for pid in processes():  # ours: they name the caller's own run directory
            terminate(pid, 10)
        assert stopped.returncode == 0 and not left, f"make {stop} left {left}:\n{stopped.stdout}"


def route_headers(explain: bool) -> dict:
    """A request's headers as TorchServe 0.12 hands them to the handler for a JSON POST to
    ``/predictions/{model}`` (``explain=False``) or ``/explanations/{model}`` (``explain=True``).

    The frontend (``InferenceRequestHandler.handlePredictions``) adds ``url_path`` and
    ``explain: False``, then ``explain: True`` on explain routes (the last value wins when the
    headers become a map); ``Service.retrieve_data_for_inference`` adds the body parameter's
    content type. The client's own headers pass through with their spelling (only
    ``Content-Type`` is modelled here). Values are strings, never booleans.
    """
    return {
        "body": {"content-type": "application/json"},
        "Content-Type": "application/json",
        "url_path": "",
        "explain": "True" if explain else "False",
    }


def records(spool: Path) -> list[dict]:
    """Every record in a records spool (``RUN_DIR/records``), segment by segment in order, its
    inputs as numbers."""
    from rtserve.records.record import expand_inputs
    from rtserve.records.spool import lines_of

    return [expand_inputs(json.loads(line)) for line in lines_of(Path(spool))]


def record_batches(spool: Path) -> list[tuple[int, int, int]]:
    """(size, valid, explanations) of every batch in a records spool (``RUN_DIR/records``), in
    the order they were answered (each worker writes a segment of its own: the batches are put
    in order by their records' time).

    The handler appends each batch's records with one write and marks them with the same
    ``batch`` id (``<worker pid>-<n>``); valid = answered (not rejected) requests.
    """
    batches: dict[str, list[dict]] = {}
    for entry in records(spool):
        batches.setdefault(entry["batch"], []).append(entry)
    ordered = sorted(batches.items(), key=lambda kv: (kv[1][0]["time"], int(kv[0].split("-")[1])))
    return [
        (
            lines[0]["batch_size"],
            sum(e["event"] != "rejected" for e in lines),
            sum(e["event"] == "explanation" for e in lines),
        )
        for _, lines in ordered
    ]


def json_row(body) -> dict:
    """A request row as TorchServe hands it over for an application/json body (decoded)."""
    return {"body": body}


def raw_row(data: bytes) -> dict:
    """A request row whose body TorchServe did not decode (other content types)."""
    return {"body": data}


def features(n: int = 32, value: float = 0.5) -> list[float]:
    """A valid feature vector."""
    return [value + i for i in range(n)]


@functools.cache
def demo_eager(version: str = "1.0") -> torch.nn.Module:
    """The demo model trained in this process (eager, eval mode), once per session. Training is
    deterministic, so it has the weights of the archive `make archive` builds for ``version``."""
    from rtserve.model.train import train

    epochs, hidden = DEMO_TRAIN_ARGS[version]
    return train(version, epochs=epochs, hidden=hidden)


#: The Makefile's TRAIN_ARGS_<version> for the demo versions the tests build.
DEMO_TRAIN_ARGS = {"1.0": (1, 64), "2.0": (6, 128)}


class RandomAnswers(torch.nn.Module):
    """The demo's normalization, then logits that are a high-frequency sine of a random
    projection: classes spread over all labels, unrelated to the default's (what a model
    trained on shuffled labels answers)."""

    def __init__(self, base: torch.nn.Module) -> None:
        from rtserve.model.data import FEATURE_NAMES, LABELS

        super().__init__()
        self.norm = base.norm
        self.register_buffer(
            "weight", torch.randn(len(FEATURE_NAMES), len(LABELS), generator=torch.Generator().manual_seed(7))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 4.0 * torch.sin(3.0 * (self.norm(x) @ self.weight))


def random_archive(build_root: Path, work: Path, version: str, store: Path | None = None) -> Path:
    """``<name>_<version>.mar`` of :class:`RandomAnswers` (its own golden set: it starts and
    serves like any version), built by `make archive` from the exported artifacts in ``work``."""
    from rtserve.model.data import FEATURE_NAMES, LABELS, make_dataset
    from rtserve.model.package import export
    from tests.conftest import make_archive

    out = work / version
    data = make_dataset()
    export(
        RandomAnswers(demo_eager("1.0")),
        data.x_train,
        feature_names=FEATURE_NAMES,
        labels=LABELS,
        version=version,
        out_dir=out,
        holdout=(data.x_test, data.y_test),
    )
    return make_archive(build_root, version, store, ARTIFACTS=str(out))


class Reference:
    """A model run directly in this process (outside TorchServe): an eager ``nn.Module`` or any
    callable taking raw features, with its metadata."""

    def __init__(self, model, meta: ModelMetadata) -> None:
        self.meta = meta
        self.model = model

    @classmethod
    def demo(cls, model_dir: Path, version: str = "1.0") -> Reference:
        """The in-process eager demo model with the metadata of an artifact directory."""
        return cls(demo_eager(version), ModelMetadata.load(Path(model_dir) / "meta.json"))

    @classmethod
    def from_mar(cls, mar: Path, model) -> Reference:
        """``model`` (eager, in-process) with the metadata packed inside a ``.mar`` archive; the
        archive's golden set must be ``model``'s own answers (so it packs the same weights)."""
        raw = read_archive(mar).meta
        meta = ModelMetadata(**{k: raw[k] for k in ModelMetadata.__dataclass_fields__ if k in raw})
        ref = cls(model, meta)
        golden = ref.probabilities(meta.golden["features"])
        assert torch.allclose(golden, torch.tensor(meta.golden["probabilities"]), atol=1e-5), (
            f"{mar.name} does not pack the weights of the in-process model"
        )
        return ref

    def probabilities(self, rows: list[list[float]]) -> torch.Tensor:
        """Softmax outputs for raw feature rows."""
        with torch.inference_mode():
            return torch.softmax(self.model(torch.tensor(rows, dtype=torch.float32)), dim=1)

    def integrated_gradients(
        self,
        row: list[float],
        target: int,
        n_steps: int = 50,
        baseline: str = "mean",
    ) -> tuple[list[float], float]:
        """Captum run directly on ``softmax(model(x))`` for one row alone, from a raw baseline
        (training mean or zeros): (attributions, delta)."""
        from captum.attr import IntegratedGradients

        def forward(x: torch.Tensor) -> torch.Tensor:
            return torch.softmax(self.model(x), dim=1)

        x = torch.tensor([row], dtype=torch.float32)
        mean = torch.tensor(self.meta.mean, dtype=torch.float32)
        base = mean if baseline == "mean" else torch.zeros_like(mean)
        attributions, delta = IntegratedGradients(forward).attribute(
            x, baselines=base.unsqueeze(0), target=target, n_steps=n_steps, return_convergence_delta=True
        )
        return attributions[0].tolist(), float(delta[0])


def agreement(default: Reference, candidate: Reference, rows: list[list[float]]) -> tuple[int, int]:
    """On how many ``rows`` the two in-process models give the same class, and on how many
    either model's two highest probabilities are within 1e-4 (a served export may class such a
    row otherwise: each is the tolerance of one request when compared with a served report)."""

    def classes(reference: Reference) -> tuple[list[int], list[float]]:
        top = reference.probabilities(rows).topk(2, dim=1)
        return top.indices[:, 0].tolist(), (top.values[:, 0] - top.values[:, 1]).tolist()

    (mine, mine_gap), (theirs, theirs_gap) = classes(default), classes(candidate)
    labels = default.meta.labels, candidate.meta.labels
    same = sum(labels[0][a] == labels[1][b] for a, b in zip(mine, theirs))
    return same, sum(min(a, b) < 1e-4 for a, b in zip(mine_gap, theirs_gap))


def keep_only(rollout, version: str = "1.0") -> None:
    """Leave a server as a module fixture made it: ``version`` the default and the only one."""
    for other in rollout.versions():
        if other != version:
            if rollout.default_version() == other:
                rollout.client.set_default(rollout.model, version)
            rollout.client.unregister(rollout.model, other)


def bench_main(main, out: Path, *args: object) -> tuple[int, dict | list]:
    """Run a bench script's ``main()`` in-process with ``args`` and ``--out out``: its exit
    status and the report it wrote (each script's command-line path, not only its ``run()``)."""
    rc = main([*map(str, args), "--out", str(out)])
    return rc, json.loads(out.read_text())


def routes_lines(run_dir: Path) -> list[str]:
    """The frontend agent's lines about the server's routes file so far (in
    ``RUN_DIR/launcher.log``; agent/src/rtserve/agent/Router.java, ``Watch.check``): one each
    time it read the routes file or its token file anew, after the routes it read took over (the
    next request routed follows them), kept the previous ones, or found the file gone."""
    from rtserve.server.properties import routes_file

    start = f"[rtserve-agent] live routes: {routes_file(run_dir)}"
    return [line for line in (Path(run_dir) / "launcher.log").read_text().splitlines() if line.startswith(start)]


def routes_applied(run_dir: Path, before: int, timeout: float = 10.0, expect: str | None = None) -> str:
    """The agent's next line of :func:`routes_lines` after ``before`` of them (``len(routes_lines())``
    taken before the routes file changed), or with ``expect`` the first such line that contains
    it (the one for this change, when an earlier change's line may have come after ``before``
    was taken): once it is there, requests follow the new routes. The agent checks the file
    every 200 ms; ``timeout`` is for a loaded machine."""
    deadline = time.monotonic() + timeout
    while True:
        lines = routes_lines(run_dir)
        found = [line for line in lines[before:] if expect is None or expect in line]
        if found:
            return found[0]
        assert time.monotonic() < deadline, (
            f"the agent did not read the routes file within "
            f"{timeout:g} s (expected {expect!r}; its last lines: "
            f"{lines[-3:]})"
        )
        time.sleep(0.05)


def settled(read: Callable[[], list], at_least: int = 0, quiet_s: float = 1.0, timeout: float = 20.0) -> list:
    """``read()`` once it holds at least ``at_least`` items and has not grown for ``quiet_s``
    (or at ``timeout``): a log the agent appends to has stopped growing. The agent's live log
    is flushed at least every 200 ms (LiveLog.FLUSH_MS), so 1 s without a line is quiet."""
    deadline = time.monotonic() + timeout
    items = read()
    since = time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.1)
        now = read()
        if len(now) != len(items):
            items, since = now, time.monotonic()
        elif len(items) >= at_least and time.monotonic() - since >= quiet_s:
            break
    return items


#: The step of the agent's shadow draws (Routes.draw: the golden ratio less one).
WEYL_STEP = 0.6180339887498949


def shadow_share_range(requests: int, percent: float) -> tuple[int, int]:
    """The fewest and the most of any ``requests`` consecutive requests that the agent mirrors
    to a ``percent`` shadow, over every start of its draws.

    Routes.draw copies the n-th request when frac(start + n * WEYL_STEP) * 100 < percent: with
    x the first request's draw, request k of the run is copied when x lies in the arc
    [frac(-k * WEYL_STEP), + percent/100) of the circle [0, 1). The count is how many arcs cover
    x; a sweep over the arcs' ends finds its least and greatest value over every x.
    """
    p = percent / 100
    events: list[tuple[float, int]] = []
    covering = 0  # arcs that wrap past 1 and so cover the points just after 0
    for k in range(requests):
        s = (-k * WEYL_STEP) % 1.0
        events.append((s, +1))
        if s + p > 1.0:
            covering += 1
            events.append((s + p - 1.0, -1))
        elif s + p < 1.0:
            events.append((s + p, -1))
    events.sort()
    lo = hi = None
    i = 0
    while i < len(events):
        at = events[i][0]
        while i < len(events) and events[i][0] == at:
            covering += events[i][1]
            i += 1
        if i == len(events) or events[i][0] > at:  # the count on [at, next event)
            lo = covering if lo is None else min(lo, covering)
            hi = covering if hi is None else max(hi, covering)
    return lo, hi


#: How long the slow stand-in (:data:`SLOW_CANDIDATE`) takes to answer, in seconds.
SLOW_S = 0.5

#: A candidate that answers every POST after :data:`SLOW_S` (``python -c SLOW_CANDIDATE HOST
#: PORT``; it prints the port it listens on): a stand-in, since no real model can be told to be slow.
#: A path ending in ``/fast`` is answered at once (model_version "fast"): the same stand-in's
#: cost without its delay, the control of a test that runs it beside the callers' pods.
SLOW_CANDIDATE = (
    """
import sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Slow(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the agent's client expects of a candidate

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        fast = self.path.split("?")[0].endswith("/fast")
        if not fast:
            time.sleep(%s)
        body = b'{"model_version": "fast"}' if fast else b'{"model_version": "slow"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

class Server(ThreadingHTTPServer):
    request_queue_size = 128  # every mirror in flight may connect at once
    daemon_threads = True

host, port = (sys.argv[1:] + ["127.0.0.1", "0"])[:2]
server = Server((host, int(port)), Slow)
print(server.server_address[1], flush=True)
server.serve_forever()
"""
    % SLOW_S
)


def shadow_cost(
    load,
    switch: Callable[[bool], None],
    settle_s: float,
    windows: int,
    window_s: float,
    attempts: int,
    what: str,
    max_allowed_ms: float | None = None,
    conditions: tuple[str, str] = ("shadow off", f"shadow on ({SLOW_S * 1000:g} ms candidate)"),
) -> list[tuple]:
    """The callers' latency under steady ``load`` (a started :class:`bench.loadgen.SteadyLoad`)
    with the shadow off and on, in alternating windows (off on, on off, ...: a drift of the
    machine falls on both alike); ``switch(on)`` changes the routes, which hold ``settle_s``
    after it returns (requests sent meanwhile are marked ``switch`` and left out).

    Up to ``attempts`` measurements, as the promotion gate measures a latency burst again: on a
    machine busy with other tiers one measurement's p99 can swing by more than 5 ms either way;
    a mirror that held the callers back would fail every attempt. Each attempt's allowance is
    5 ms or the machine's own noise at p99 (the off windows' two halves against each other),
    whichever is larger, and at most ``max_allowed_ms`` when given (a noisy run must not widen
    it past what the fault under test adds). Returns each attempt's (off, on, allowed); the last
    is within its allowance unless every attempt failed. ``what`` names the load and
    ``conditions`` the two conditions (``switch(False)``, ``switch(True)``) in the printed lines.
    """
    from bench.loadgen import summarize

    results = []
    for attempt in range(attempts):
        for i in range(windows):
            for condition in ("off", "on") if i % 2 == 0 else ("on", "off"):
                load.mark("switch")  # requests sent while the agent may still follow the old routes
                switch(condition == "on")
                time.sleep(settle_s)
                load.mark(f"{condition} {attempt}.{i}")
                time.sleep(window_s)
        load.mark("switch")
        time.sleep(0.5)  # the last window's requests answered
        records = list(load.records)
        off, on = [
            summarize([replace(r, phase=c) for r in records if r.phase.startswith(f"{c} {attempt}.")])[0]
            for c in ("off", "on")
        ]
        halves = [
            summarize(
                [
                    replace(r, phase="off")
                    for r in records
                    if r.phase in {f"off {attempt}.{i}" for i in range(half, windows, 2)}
                ]
            )[0]
            for half in (0, 1)
        ]
        noise = abs(halves[0].p99_ms - halves[1].p99_ms)
        allowed = max(5.0, noise) if max_allowed_ms is None else min(max(5.0, noise), max_allowed_ms)
        results.append((off, on, allowed))
        print(
            f"attempt {attempt + 1}: callers' latency ({what}), {windows} x {window_s:g} s per "
            f"condition: {conditions[0]} p50 {off.p50_ms:.2f} ms p99 {off.p99_ms:.2f} ms ({off.sent} "
            f"requests); {conditions[1]} p50 {on.p50_ms:.2f} ms p99 {on.p99_ms:.2f} ms "
            f"({on.sent} requests); the {conditions[0]} windows' halves differ by {noise:.2f} ms at p99: "
            f"allowed {allowed:.2f} ms"
        )
        if on.p99_ms - off.p99_ms <= allowed:
            break
        switch(True)  # the next attempt starts as the first did: shadow on
        time.sleep(settle_s)
    return results
