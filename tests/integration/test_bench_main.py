"""The bench scripts' command-line paths (``main()``), run in-process with tiny, bounded settings.

Scripts whose ``main()`` another test already runs: drain, overload (own servers), worker_crash,
hostile_input, rollout_load, explain_latency, probe_cost (``--attach`` to their module's server),
the rolling rehearsal (nginx) and the pod rollout (pod tier). Here: the others. ``bench/perf.py --smoke``
starts its own server, as it measures the cold start; so does ``k8s_footprint.py``, which runs
TorchServe the way the pod does, and ``kinds.py`` (rtserve and the peer on the digits example).
"""

from __future__ import annotations

import re

import pytest

from bench import fastapi_seed, handler_micro, k8s_footprint, kinds, perf, request_histogram, tune
from tests.conftest import require
from tests.helpers import bench_main, make

pytestmark = pytest.mark.integration


def test_request_histogram_main(capsys):
    assert request_histogram.main(["--lines", "500", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    per_request = float(re.search(r"exporter CPU per request .*: ([\d.]+) us", out).group(1))
    assert per_request > 0, out


def test_handler_micro_main(trained_dir, tmp_path):
    rc, report = bench_main(handler_micro.main, tmp_path / "report.json", "--model-dir", trained_dir, "--batch", 4)
    assert rc == 0
    assert set(report["handler"]) >= {"exported", "exported_with_hook"}
    for timings in report["handler"].values():
        assert timings["batch"] == 4 and timings["handle_us_per_request"] > 0, timings
    assert all(v > 0 for v in report["forward"].values()) and report["forward"]
    assert set(report["batch_parse"]) == {
        f"{parser}_us_batch_of_{n}" for parser in ("torchserve", "lean") for n in (1, 20)
    }
    assert all(v > 0 for v in report["batch_parse"].values()), report["batch_parse"]


@pytest.mark.parametrize("servers", ["torchserve", "fastapi-1w-async-direct"])
def test_perf_main_smoke(servers, mar_v1, build_root, tmp_path, capsys):
    """One closed-loop point (c=1, 1 s) with wrk, against rtserve and bench/fastapi_seed.py
    (`make bench-deps` installs wrk and FastAPI; the test fails without them)."""
    require("wrk")
    if servers.startswith("fastapi"):
        require("fastapi")
    rc, report = bench_main(
        perf.main,
        tmp_path / "perf.json",
        "--smoke",
        "--servers",
        servers,
        "--model-store",
        mar_v1.parent,
        "--model-dir",
        build_root / "artifacts" / "1.0",
        "--plot",
        tmp_path / "perf.png",
    )
    assert rc == 0
    (server,) = report["servers"]
    assert server["name"] == servers
    (point,) = server["points"]
    assert point["concurrency"] == 1 and point["requests"] > 0 and point["errors"] == 0, point
    assert server["cold_start_s"] > 0 and server["first_request_ms"] > 0
    assert report["handler"]["handle_us_per_request"] > 0
    assert (tmp_path / "perf.png").stat().st_size > 0
    assert servers in capsys.readouterr().out


def test_kinds_main_smoke(build_root, tmp_path, capsys):
    """make bench-kinds' script on the digits example at c=1 for 1 s per body form: rtserve and the
    peer answer the check rows alike in every form (array, base64 PNG, raw PNG), every point is
    measured without errors, and the c=64 target is said not to be measured."""
    require("wrk")
    require("fastapi")
    where = [f"DEMO_ARTIFACTS={build_root / 'artifacts'}", f"MODEL_STORE={build_root / 'model_store'}"]
    done = make("example", "EXAMPLE_NAME=digits", *where, timeout=900)
    assert done.returncode == 0, f"make example failed:\n{done.stdout[-3000:]}"
    rc, report = bench_main(
        kinds.main,
        tmp_path / "kinds.json",
        *("--kinds", "digits", "--forms", "direct", "--concurrency", 1, "--duration", 1, "--warmup", 0),
        *("--server-warmup", 0, "--retry-busy", 0, "--check-rows", 2),
        *("--artifacts", build_root / "artifacts", "--model-store", build_root / "model_store"),
    )
    assert rc == 0
    (kind,) = report["kinds"]
    assert [b["name"] for b in kind["bodies"]] == ["json", "png-b64", "png"]
    assert [s["name"] for s in kind["servers"]] == ["torchserve", "fastapi-2w-async-direct"]
    assert kind["answers_check"]["fastapi-2w-async-direct"] <= kinds.ANSWER_TOLERANCE
    for server in kind["servers"]:
        assert [p["body"] for p in server["points"]] == ["json", "png-b64", "png"], server["name"]
        assert all(p["requests"] > 0 and p["errors"] == 0 for p in server["points"]), server["points"]
    for body in kind["by_body"].values():
        assert [t["met"] is None for t in body["targets"]] == [True, False], body["targets"]
    text = (tmp_path / "kinds.txt").read_text()
    assert text.startswith("== digits") and "[not measured] json: c=64 throughput" in text
    assert "torchserve / best FastAPI" in capsys.readouterr().out


def test_the_peers_forms_are_one_model(trained_dir, monkeypatch):
    """The FastAPI peer's three forms of the model answer the golden rows alike, and a form that
    answers differently stops the benchmark before it compares anything."""
    diffs = fastapi_seed.check_forms(trained_dir)
    assert set(diffs) == set(fastapi_seed.FORMS)
    assert all(d <= fastapi_seed.FORM_TOLERANCE for d in diffs.values()), diffs
    load = fastapi_seed.load_form

    def skewed(model_dir, form):
        forward = load(model_dir, form)
        return (lambda x: forward(x) + 1e-3) if form == "direct" else forward

    monkeypatch.setattr(fastapi_seed, "load_form", skewed)
    with pytest.raises(ValueError, match="direct"):
        fastapi_seed.check_forms(trained_dir)


def test_the_best_peer_is_chosen_by_what_it_served():
    """Peer names parse into (workers, async, form); ``-best`` takes the form that served the
    most requests earlier in the run, and every ratio is against the best figure of any peer."""
    assert perf.parse_peer("fastapi-2w") == (2, False, "eager")
    assert perf.parse_peer("fastapi-1w-async-best") == (1, True, "best")
    with pytest.raises(ValueError, match="forms"):
        perf.parse_peer("fastapi-2w-async-compiled")

    def result(name, form, rps, p99):
        point = perf.Point(8, 1.0, int(rps), rps, 1.0, 1.0, 1.0, p99, 1.0, 0, {}, 0.1, 0, 0, 0, 0, 0)
        return perf.ServerResult(name, "", 0, 0, 0, 0, [], 0, points=[point], settings={"forward": form})

    results = [
        result("fastapi-2w-async-eager", "eager", 3000, 9.0),
        result("fastapi-2w-async-direct", "direct", 3500, 12.0),
        result("torchserve", "", 4200, 6.0),
    ]
    assert perf.best_form(results) == "direct"
    best = perf.best_fastapi(results)[8]
    assert (best["rps"], best["rps_from"]) == (3500, "fastapi-2w-async-direct")
    assert (best["p99_ms"], best["p99_from"]) == (9.0, "fastapi-2w-async-eager")
    ratio = perf.ratios(results)[8]
    assert ratio == {"rps_ratio": 1.2, "p50_ratio": 1.0, "p99_ratio": 0.67}


def test_tune_main_lists_its_variants(capsys):
    """tune measures with perf's bench_server (run above); its command line lists the variants."""
    assert tune.main(["--list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == list(tune.VARIANTS)
    with pytest.raises(SystemExit, match="unknown variant"):
        tune.main(["no-such-variant"])


def test_k8s_footprint_main(mar_v1, capsys):
    assert k8s_footprint.main(["--model-store", str(mar_v1.parent), "--requests", "20", "--probe-runs", "1"]) == 0
    out = capsys.readouterr().out
    assert "20 predictions from 16 threads" in out
    peak = int(re.search(r"peak under load (\d+) MiB", out).group(1))
    assert peak > 0, out
    for check in ("ready", "live"):
        assert f"python -m rtserve probe {check}: median" in out
