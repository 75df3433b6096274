"""One error root: every rtserve exception is an RtserveError, keeps what it carries when
reworded, and the command line catches the root once (``error:`` on stderr, exit status 1). Only a
TorchServeError carries an HTTP status: the one of the answer it comes from. The handler's refusal
reaches a client with its reason and expected count as data, not as a sentence to parse."""

from __future__ import annotations

import argparse
import ast
import importlib
import json
import subprocess
import sys

import pytest
from requests import Response

from handler.errors import EXPECTED_HEADER, REASON_HEADER
from handler.rtserve_handler import RealTimeHandler
from rtserve import cli
from rtserve.client.rest import _error
from rtserve.errors import (
    EXIT_ERROR,
    CommandError,
    GateRefused,
    LiveError,
    PortInUseError,
    RtserveError,
    SettingsError,
    StoreSchemaError,
    TorchServeError,
)
from tests.conftest import REPO
from tests.helpers import MODEL_YAML, json_row, make_context, start_batch

pytestmark = pytest.mark.unit


def rtserve_exceptions() -> list[type]:
    """Every exception class a module of the rtserve package defines."""
    found = []
    for path in sorted((REPO / "rtserve").rglob("*.py")):
        names = [n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.ClassDef)]
        if not names:
            continue
        module = importlib.import_module(".".join(path.relative_to(REPO).with_suffix("").parts))
        found += [c for n in names if isinstance(c := getattr(module, n), type) and issubclass(c, BaseException)]
    return found


def test_every_rtserve_exception_derives_from_the_root_and_says_what_failed():
    """No HTTP answer is made from an rtserve error, so none names a status nobody reads; a
    TorchServeError holds the status of the answer it comes from (0: no answer)."""
    classes = rtserve_exceptions()
    assert len(classes) >= 15, classes
    for cls in classes:
        assert issubclass(cls, RtserveError), f"{cls.__module__}.{cls.__name__}"
        assert (cls.__doc__ or "").strip(), f"{cls.__name__}: say what failed"
        assert not hasattr(cls, "status"), f"{cls.__name__}: a status no surface reads"
    assert TorchServeError("no answer").status == 0
    assert TorchServeError("GET /models/m -> 404", 404).status == 404


def test_reworded_keeps_status_body_and_report():
    error = TorchServeError("POST /models -> 500: failed", 500, {"code": 500}, "invalid", None)
    again = error.reworded(f"{error} (the handler failed to load)")
    assert type(again) is TorchServeError and str(again).endswith("(the handler failed to load)")
    assert (again.status, again.body, again.reason) == (500, {"code": 500}, "invalid")

    class Report:
        model, candidate = "m", "2.0"

        def text(self) -> str:
            return "gate m: candidate 2.0"

    refused = GateRefused(Report())
    assert refused.reworded("refused; unregistered again").report is refused.report


@pytest.fixture
def handler(trained_dir):
    ctx = make_context(trained_dir, MODEL_YAML)
    h = RealTimeHandler()
    h.initialize(ctx)
    return h, ctx


def test_a_refused_request_carries_its_reason_and_expected_count(handler):
    """The handler's 400 for 2 features, as rtserve's client reads it (what the readiness probe
    uses to ask a model of another feature count): the count comes from a header."""
    h, ctx = handler
    start_batch(ctx, 2)
    out = h.handle([json_row({"features": [1.0, 2.0]}), json_row({"features": "x"})], ctx)
    answers = []
    for idx, body in enumerate(out):
        resp = Response()
        resp.status_code = ctx.get_response_status(idx)[0]
        resp._content = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        resp.headers.update(ctx.get_response_headers(idx))
        answers.append(_error("POST", "/predictions/realtime-classifier", resp))
    assert (answers[0].status, answers[0].reason, answers[0].expected) == (400, "wrong_length", 32)
    assert (answers[1].status, answers[1].reason, answers[1].expected) == (400, "not_a_list", None)
    assert ctx.get_response_headers(0)[EXPECTED_HEADER] == "32"
    assert ctx.get_response_headers(1)[REASON_HEADER] == "not_a_list"


def test_the_command_line_catches_the_root_once(tmp_path, capsys):
    (tmp_path / "rollout-history.jsonl").write_text("not json\n")
    status = cli.main(["versions", "--run-dir", str(tmp_path), "history", "realtime-classifier"])
    assert status == 1
    assert capsys.readouterr().err == (
        f"error: {tmp_path / 'rollout-history.jsonl'}:1: not a JSON line (Expecting value: line 1 "
        "column 1 (char 0)); move the file away to start a new history\n"
    )


#: One error of each kind that builds itself (its own ``__init__``), and plain ones.
RAISED = [
    SettingsError("RTSERVE_X is not a number"),
    LiveError("no shadow to report on"),
    CommandError(["kubectl", "apply"], 3, "refused"),
    PortInUseError("port 8080 is taken", "127.0.0.1:8080", 8080),
    StoreSchemaError("schema 9 is newer than 2", 9, 2),
    TorchServeError("GET /models/m -> 404: not found", 404),
]


@pytest.mark.parametrize("error", RAISED, ids=lambda e: type(e).__name__)
def test_any_rtserve_error_ends_a_command_with_one_line_on_stderr_and_exit_status_1(error, monkeypatch, capsys):
    def command(args: argparse.Namespace) -> int:
        print("what the command printed before it failed")
        raise error

    def build_parser(group: str | None = None) -> argparse.ArgumentParser:
        parser = argparse.ArgumentParser()
        parser.set_defaults(func=command)
        return parser

    monkeypatch.setattr(cli, "build_parser", build_parser)
    assert cli.main([]) == EXIT_ERROR == 1
    out, err = capsys.readouterr()
    assert out == "what the command printed before it failed\n"
    assert err == f"error: {error}\n"


def test_the_command_line_in_a_process_exits_1_or_2_with_its_error_on_stderr(tmp_path):
    """``python -m rtserve``: an rtserve error exits 1 with one ``error:`` line on stderr; a
    command line argparse cannot parse exits 2 with its usage on stderr; stdout holds neither."""

    def rtserve(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "rtserve", *args], cwd=REPO, text=True, capture_output=True, timeout=60
        )

    refused = rtserve("live", "--run-dir", str(tmp_path / "none"), "shadow-report", "m")
    assert refused.returncode == 1, refused
    assert refused.stderr.startswith("error: no shadow to report on") and refused.stderr.count("\n") == 1
    assert "error:" not in refused.stdout
    unparsed = rtserve("versions", "no-such-command")
    assert unparsed.returncode == 2, unparsed
    assert "invalid choice: 'no-such-command'" in unparsed.stderr and unparsed.stdout == ""
