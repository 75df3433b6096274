"""The rollout history file (rtserve.promotion.history.History): JSON lines, appended, never rewritten."""

from __future__ import annotations

import json
import multiprocessing

import pytest

from rtserve.promotion.history import History
from rtserve.promotion.rollout import RolloutError

pytestmark = pytest.mark.unit


def test_each_append_adds_one_json_line_and_keeps_the_earlier_bytes(tmp_path):
    history = History(tmp_path / "run" / "rollout-history.jsonl")
    assert history.events() == [] and history.previous_default("m") is None
    history.append({"action": "promote", "model": "m", "from": "1.0", "to": "2.0"})
    first = history.path.read_bytes()
    history.append(
        {
            "action": "gate",
            "model": "m",
            "default": "2.0",
            "candidate": "3.0",
            "outcome": "refused",
            "at": "2026-01-01T00:00:00+00:00",
        }
    )
    history.append({"action": "promote", "model": "other", "from": "a", "to": "b"})
    raw = history.path.read_bytes()
    assert raw.startswith(first)  # appended, not rewritten
    lines = raw.decode().splitlines()
    assert len(lines) == 3 and raw.endswith(b"\n")
    parsed = [json.loads(line) for line in lines]
    assert [e["action"] for e in parsed] == ["promote", "gate", "promote"]
    assert parsed[1]["at"] == "2026-01-01T00:00:00+00:00"  # an event's own time is kept
    assert parsed[0]["at"] and parsed[2]["at"]
    assert history.events("m") == parsed[:2]
    assert history.previous_default("m") == "1.0" and history.previous_default("other") == "a"


def _append_many(path: str, writer: int, n: int) -> None:
    history = History(path)
    for i in range(n):
        history.append(
            {"action": "gate", "model": "m", "writer": writer, "i": i, "pad": "x" * 3000}
        )  # about as long as a gate decision's line


def test_concurrent_writers_never_interleave(tmp_path):
    """Four processes append 50 lines each at once: every line parses, none is lost."""
    path = tmp_path / "rollout-history.jsonl"
    procs = [
        multiprocessing.get_context("fork").Process(target=_append_many, args=(str(path), w, 50)) for w in range(4)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0] * 4
    events = History(path).events()
    assert sorted((e["writer"], e["i"]) for e in events) == [(w, i) for w in range(4) for i in range(50)]
    for writer in range(4):  # each writer's lines in its own order
        assert [e["i"] for e in events if e["writer"] == writer] == list(range(50))


def test_a_damaged_line_is_a_clear_error(tmp_path):
    path = tmp_path / "rollout-history.jsonl"
    History(path).append({"action": "promote", "model": "m", "from": "1.0", "to": "2.0"})
    with open(path, "a") as out:
        out.write('{"action": "promote", "mod\n')
    with pytest.raises(RolloutError, match=r"rollout-history.jsonl:2: not a JSON line"):
        History(path).previous_default("m")
