"""Rotating files with real files (rtserve.runtime.logs, handler.audit): a follower keeps every line
once across rename rotations; an output file copy-truncated; the audit log rotated by its writer."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from handler.audit import append_event
from rtserve.runtime.logs import LogFollower, backup, copy_truncate, read_rotated

pytestmark = pytest.mark.unit


def write(path, *lines: str, torn: str = "") -> None:
    with open(path, "a") as f:
        f.write("".join(f"{line}\n" for line in lines) + torn)


def rotate(path) -> None:
    """What log4j2 (and the live log's and audit log's writers) do: the file becomes its backup."""
    os.replace(path, backup(path))


def numbered(start: int, stop: int) -> list[str]:
    return [f"line {i}" for i in range(start, stop)]


def test_a_rotation_finishes_the_old_files_lines_then_reads_the_new_one(tmp_path):
    path = tmp_path / "ts_log.log"
    write(path, *numbered(0, 3))
    follower = LogFollower(path, from_end=True)
    write(path, *numbered(3, 5))
    assert follower.lines() == numbered(3, 5)
    write(path, *numbered(5, 8))  # written, not read yet ...
    rotate(path)  # ... when the file rolls
    write(path, *numbered(8, 10))
    assert follower.lines() == numbered(5, 10)
    assert follower.lines() == []
    write(path, *numbered(10, 11))
    assert follower.lines() == numbered(10, 11)


def test_two_rotations_between_reads_lose_no_line(tmp_path):
    """The followed file is gone by then (the second roll deleted the backup it had become): its
    rest comes from the open file, the file rolled in between from the backup."""
    path = tmp_path / "access_log.log"
    write(path, *numbered(0, 2))
    follower = LogFollower(path, from_end=False)
    assert follower.lines() == numbered(0, 2)
    write(path, *numbered(2, 4))
    rotate(path)
    write(path, *numbered(4, 6))
    rotate(path)  # the first file is deleted now
    write(path, *numbered(6, 7))
    assert not any(p.name.endswith(".2") for p in tmp_path.iterdir())
    assert follower.lines() == numbered(2, 7)


def test_reading_from_the_start_takes_the_backup_first(tmp_path):
    path = tmp_path / "live-log.jsonl"
    write(path, *numbered(0, 3))
    rotate(path)
    write(path, *numbered(3, 5), torn='{"half')
    follower = LogFollower(path, from_end=False)
    assert follower.lines() == numbered(0, 5)  # the torn line waits
    write(path, ' a line"}')
    assert follower.lines() == ['{"half a line"}']
    assert read_rotated(path) == "".join(f"{x}\n" for x in numbered(0, 5)) + '{"half a line"}\n'


def test_a_rotated_files_torn_last_line_ends_with_it_and_a_missing_file_is_waited_for(tmp_path):
    path = tmp_path / "model_log.log"
    follower = LogFollower(path, from_end=True)
    assert follower.lines() == []  # no file yet
    write(path, "first", torn="torn")
    assert follower.lines() == ["first"]
    rotate(path)
    assert follower.lines() == []  # renamed; the new file not created yet
    write(path, "second")
    assert follower.lines() == ["torn", "second"]


def test_a_file_truncated_in_place_is_read_from_its_start(tmp_path):
    path = tmp_path / "x.log"
    write(path, "a", "b", "c")
    follower = LogFollower(path, from_end=False)
    assert follower.lines() == ["a", "b", "c"]
    path.write_text("new\n")  # shorter than what was read
    assert follower.lines() == ["new"]


def test_a_follower_keeps_up_with_a_writer_that_rotates_while_it_reads(tmp_path):
    """A writer thread appends 20,000 numbered lines, rolling the file every 200 and then waiting
    for the follower's next read to begin (one roll between two reads at most); the follower,
    reading meanwhile, gets each line once, in order."""
    path = tmp_path / "live-log.jsonl"
    path.touch()
    follower = LogFollower(path, from_end=True)
    reads = [0]
    total = 20_000

    def writer() -> None:
        for start in range(0, total, 100):
            write(path, *numbered(start, start + 100))
            if start % 200 == 100:
                rotate(path)
                before = reads[0]
                while reads[0] < before + 2:  # a read began after the roll
                    time.sleep(0.0001)

    thread = threading.Thread(target=writer)
    thread.start()
    seen: list[str] = []
    while thread.is_alive():
        seen += follower.lines()
        reads[0] += 1
    thread.join()
    seen += follower.lines()
    assert seen == numbered(0, total)


def test_copy_truncate_keeps_an_appended_file_and_its_backup_within_the_cap(tmp_path):
    path = tmp_path / "launcher.log"
    out = open(path, "ab", buffering=0)  # a child's stdout: O_APPEND, never reopened
    try:
        out.write(b"".join(f"{i:04d} {'x' * 90}\n".encode() for i in range(30)))  # 30 x 96 bytes
        assert not copy_truncate(path, cap=8000)  # 2880 bytes: within half the cap
        out.write(b"".join(f"{i:04d} {'x' * 90}\n".encode() for i in range(30, 60)))
        assert copy_truncate(path, cap=4000)
        kept = backup(path).read_text().splitlines()
        assert kept[-1].startswith("0059") and len(kept) == 2000 // 96
        assert all(len(line) == 95 for line in kept)  # whole lines only
        assert path.stat().st_size == 0
        out.write(b"after\n")  # the writer goes on at the file's new start: no hole
        assert path.read_bytes() == b"after\n"
        assert backup(path).stat().st_size <= 2000
    finally:
        out.close()


def test_the_audit_log_rotates_to_one_backup_at_its_cap(tmp_path):
    path = tmp_path / "logs" / "audit.log"
    events = [{"event": "gate", "n": i, "pad": "x" * 40} for i in range(100)]
    for event in events:
        append_event(path, event, max_bytes=2000)
    current, old = path.read_text().splitlines(), backup(path).read_text().splitlines()
    assert path.stat().st_size <= 1000 and backup(path).stat().st_size <= 1000
    kept = [json.loads(line)["n"] for line in old + current]
    assert kept == list(range(100 - len(kept), 100)) and len(kept) >= 2 * (1000 // 80) - 2
    assert oct(path.stat().st_mode & 0o777) == "0o640"
    append_event(path, {"event": "gate", "n": 100})  # no cap: no rotation
    assert path.read_text().splitlines()[-1] == '{"event":"gate","n":100}'


def test_two_writers_rotating_the_audit_log_never_lose_the_backup_or_tear_a_line(tmp_path):
    path = tmp_path / "audit.log"

    def writer(name: str) -> None:
        for i in range(300):
            append_event(path, {"event": "canary-abort", "writer": name, "n": i}, max_bytes=6000)

    threads = [threading.Thread(target=writer, args=(w,)) for w in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    lines = (backup(path).read_text() + path.read_text()).splitlines()
    assert path.stat().st_size <= 3000 and backup(path).stat().st_size <= 3000
    parsed = [json.loads(line) for line in lines]  # every line whole
    for name in "ab":  # each writer's kept events are its last ones, in order
        mine = [e["n"] for e in parsed if e["writer"] == name]
        assert mine == list(range(300 - len(mine), 300)), mine
    assert len(parsed) > 6000 // 2 // 60  # the backup was not clobbered by a second rotation
