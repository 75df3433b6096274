"""The agent (agent/, `make agent`) without a server: each patch of TorchServe 0.12.0's frontend
classes applies to the pinned class and leaves another one stock, saying so; the live routes'
file check and sticky hash (agent/src/rtserve/agent/Routes.java).

A JVM loads (and links, which verifies the patched bytecode) the frontend's own classes from
TorchServe's model-server.jar with the agent, as the frontend would; nothing else runs.
"""

from __future__ import annotations

import json
import os
import subprocess
from hashlib import sha256
from pathlib import Path

import pytest
import ts

from rtserve.promotion.live.routes import sticky_bucket
from rtserve.settings import Settings

pytestmark = pytest.mark.unit

FRONTEND_JAR = Path(ts.__file__).parent / "frontend" / "model-server.jar"
#: Every patched class, with the start of the line the agent writes when it patches it.
PATCHED = {
    "org.pytorch.serve.wlm.Model": "greedy batching",
    "org.pytorch.serve.http.api.rest.InferenceRequestHandler": "OIP model routes",
    "org.pytorch.serve.util.ApiUtils": "live routes",
}
LOAD = """
public class Load {
    public static void main(String[] names) throws Exception {
        for (String name : names) {
            Class.forName(name, true, Load.class.getClassLoader());
        }
    }
}
"""


def agent_jar() -> Path:
    jar = Settings.from_env().agent_jar
    assert jar.is_file(), f"{jar} is missing: `make agent` builds it (`make test` does first)"
    return jar


def load_with_agent(tmp_path, options: str) -> list[str]:
    """Load and link every patched class with the agent; its stderr lines."""
    source = tmp_path / "Load.java"
    source.write_text(LOAD)
    done = subprocess.run(
        ["java", f"-javaagent:{agent_jar()}={options}", "-cp", str(FRONTEND_JAR), str(source), *PATCHED],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return [line for line in done.stderr.splitlines() if line.startswith("[rtserve-agent]")]


def test_every_patch_applies_to_the_pinned_frontend_and_the_classes_link(tmp_path):
    lines = load_with_agent(tmp_path, f"oip=http://127.0.0.1:1,routes={tmp_path / 'live-routes.json'}")
    assert sorted(line.split(" (")[0] for line in lines) == [
        "[rtserve-agent] OIP model routes ON: patched "
        "org/pytorch/serve/http/api/rest/InferenceRequestHandler.handleRequest",
        "[rtserve-agent] greedy batching ON: patched org/pytorch/serve/wlm/Model.pollBatch",
        "[rtserve-agent] live routes ON: patched org/pytorch/serve/util/ApiUtils.addRESTInferenceJob",
    ]


def test_a_wrong_checksum_leaves_each_class_stock_and_says_so(tmp_path):
    wrong = "0" * 64
    pins = ",".join(f"sha256.{name.rsplit('.', 1)[1]}={wrong}" for name in PATCHED)
    lines = load_with_agent(tmp_path, f"oip=http://127.0.0.1:1,routes={tmp_path / 'r.json'},{pins}")
    assert len(lines) == len(PATCHED), lines
    for name, feature in PATCHED.items():
        path = name.replace(".", "/")
        actual = sha256(
            subprocess.run(["unzip", "-p", str(FRONTEND_JAR), f"{path}.class"], capture_output=True, check=True).stdout
        ).hexdigest()
        [line] = [line for line in lines if line.startswith(f"[rtserve-agent] {feature} OFF: ")]
        assert f"{path}.class has SHA-256 {actual}, not the pinned {wrong}" in line
    assert [line.rsplit("; ", 1)[1] for line in sorted(lines)] == [
        "those routes answer TorchServe's 404",
        "TorchServe runs stock",
        "every prediction is queued as usual (no shadow or canary)",
    ]


def test_routes_off_and_a_relative_routes_path_leave_apiutils_stock(tmp_path):
    assert [line for line in load_with_agent(tmp_path, "routes=off") if "live routes" in line] == []
    [line] = [line for line in load_with_agent(tmp_path, "routes=live-routes.json") if "live routes" in line]
    assert line == (
        "[rtserve-agent] live routes OFF: routes=live-routes.json is not a file's path "
        "(not an absolute path: live-routes.json)"
    )


def check(*paths: Path) -> tuple[int, list[str]]:
    """`Routes FILE...`: its exit status and a line per file."""
    done = subprocess.run(
        ["java", "-cp", str(agent_jar()), "rtserve.agent.Routes", *map(str, paths)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stdout.splitlines()


GOOD = {
    "model": "m",
    "log": "/tmp/live-log.jsonl",
    "token_file": None,
    "shadow": {"version": "2.0", "percent": 100.0, "url": "http://127.0.0.1:8080/predictions/m/2.0"},
    "canary": {
        "version": "2.0",
        "percent": 10,
        "url": "http://127.0.0.1:8080/predictions/m/2.0",
        "key_header": "x-rtserve-key",
    },
}


def test_a_routes_file_as_the_python_side_writes_it_is_read(tmp_path):
    good, other = tmp_path / "good.json", tmp_path / "other.json"
    good.write_text(json.dumps(GOOD))
    other.write_text(json.dumps({"model": "m", "log": "/tmp/l", "shadow": None, "extra": [1, {"a": "\u00e9"}]}))
    assert check(good, other) == (
        0,
        [
            f"{good}: model m, shadow 2.0 at 100.0% to http://127.0.0.1:8080/predictions/m/2.0, canary 2.0 "
            "at 10.0% to http://127.0.0.1:8080/predictions/m/2.0 (key: x-rtserve-key or the client's "
            "address), log /tmp/live-log.jsonl",
            f"{other}: model m, shadow none, canary none, log /tmp/l",
        ],
    )


#: Routes files the agent refuses (keeping the routes it had), with the problem it names.
INVALID = [
    (json.dumps({**GOOD, "model": ""}), '"model" must be a non-empty string'),
    (json.dumps({**GOOD, "log": "live-log.jsonl"}), '"log" must be an absolute path, not "live-log.jsonl"'),
    (
        json.dumps({**GOOD, "shadow": {**GOOD["shadow"], "percent": "10"}}),
        '"shadow.percent" must be a number from 0 to 100',
    ),
    (
        json.dumps({**GOOD, "shadow": {**GOOD["shadow"], "percent": -1}}),
        '"shadow.percent" must be from 0 to 100, not -1.0',
    ),
    (
        json.dumps({**GOOD, "canary": {**GOOD["canary"], "url": "ftp://h/p"}}),
        '"canary.url" must be http(s)://HOST[:PORT]/..., not "ftp://h/p"',
    ),
    (
        json.dumps({**GOOD, "canary": {"percent": 5, "url": "http://h/p"}}),
        '"canary.version" must be a non-empty string (missing)',
    ),
    (json.dumps({**GOOD, "canary": [1]}), '"canary" must be an object or null'),
    (
        json.dumps({**GOOD, "token_file": "/nonexistent/token"}),
        '"token_file" /nonexistent/token cannot be read (java.nio.file.NoSuchFileException: /nonexistent/token)',
    ),
    ("", "invalid JSON at character 0: unexpected end"),
    ('{"model": "m",}', "invalid JSON at character 14: expected a quoted key"),
    ('{"model": "m", "model": "n"}', 'invalid JSON at character 24: duplicate key "model"'),
    ("[]", "the file is not a JSON object"),
    ('{"model": "m"} x', "invalid JSON at character 15: unexpected text after the value"),
    ('{"model": "m\\q"}', "invalid JSON at character 12: bad escape '\\q'"),
]


def test_an_invalid_routes_file_is_refused_naming_the_problem(tmp_path):
    paths = []
    for i, (text, _) in enumerate(INVALID):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(text)
    rc, lines = check(*paths)
    assert rc == 1
    assert lines == [f"{path}: invalid: {problem}" for path, (_, problem) in zip(paths, INVALID)]


def test_the_sticky_bucket_is_the_documented_hash_and_nested_in_the_percent():
    keys = [f"user-{i}" for i in range(50)] + ["127.0.0.1", "::1"]
    out = subprocess.run(
        ["java", "-cp", str(agent_jar()), "rtserve.agent.Routes", "--bucket", *keys],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split()
    expected = [sticky_bucket(k) for k in keys]  # Python's one definition: the documented formula
    assert [float(b) for b in out] == pytest.approx(expected, abs=1e-6)
    assert all(0 <= b < 100 for b in expected)


#: Appends argv[2] lines of about 170 bytes to the live log argv[0], capped at argv[1] bytes, from
#: four threads (a test driver in the agent's package: LiveLog is package-private).
LIVE_LOG_DRIVER = """
package rtserve.agent;

import java.nio.file.Paths;

public class LiveLogDriver {
    public static void main(String[] args) throws Exception {
        LiveLog.cap(Long.parseLong(args[1]));
        int n = Integer.parseInt(args[2]);
        Thread[] threads = new Thread[4];
        for (int t = 0; t < threads.length; t++) {
            int first = t;
            threads[t] = new Thread(() -> {
                for (int i = first; i < n; i += threads.length) {
                    LiveLog.append(Paths.get(args[0]), "shadow", "req-" + i, "cand-" + i, "2.0", 200,
                            1.5, i, "{\\"label\\": \\"low\\"}", null);
                }
            });
            threads[t].start();
        }
        for (Thread thread : threads) {
            thread.join();
        }
        Thread.sleep(1000);  // the writer thread drains the queue (it flushes every 200 ms)
    }
}
"""


def test_the_live_log_rotates_to_one_backup_at_its_cap(tmp_path):
    source = tmp_path / "src" / "rtserve" / "agent" / "LiveLogDriver.java"
    source.parent.mkdir(parents=True)
    source.write_text(LIVE_LOG_DRIVER)
    classes = tmp_path / "classes"
    subprocess.run(["javac", "-cp", str(agent_jar()), "-d", str(classes), str(source)], check=True, timeout=120)
    log, cap, n = tmp_path / "live-log.jsonl", 40_000, 2_000
    subprocess.run(
        ["java", "-cp", f"{classes}:{agent_jar()}", "rtserve.agent.LiveLogDriver", str(log), str(cap), str(n)],
        check=True,
        timeout=120,
    )
    backup = log.with_name(log.name + ".1")
    assert log.stat().st_size <= cap // 2 and backup.stat().st_size <= cap // 2
    lines = [json.loads(line) for line in (backup.read_text() + log.read_text()).splitlines()]
    assert len(lines) >= cap // 2 // 200  # a full backup and the current file's lines
    kept = [int(line["of"].split("-")[1]) for line in lines]
    assert len(set(kept)) == len(kept)  # each line once, whole
    for thread in range(4):  # each thread's newest lines, in its order: older files were dropped
        mine = [i for i in kept if i % 4 == thread]
        assert mine == list(range(n - 4 + thread - 4 * (len(mine) - 1), n, 4)), mine
    without = tmp_path / "uncapped.jsonl"
    subprocess.run(
        ["java", "-cp", f"{classes}:{agent_jar()}", "rtserve.agent.LiveLogDriver", str(without), "0", "500"],
        check=True,
        timeout=120,
    )
    assert len(without.read_text().splitlines()) == 500 and not without.with_name(without.name + ".1").exists()


#: Appends one answer per length in argv[4:] (a JSON body of about that many characters, one of
#: them non-ASCII) to the live log argv[0], with the cap argv[1] and the longest body kept whole
#: argv[2] (0: the agent's defaults), then prints "appended" and lets the writer run argv[3] ms.
LIVE_LOG_BODIES = """
package rtserve.agent;

import java.nio.file.Paths;

public class LiveLogBodies {
    public static void main(String[] args) throws Exception {
        LiveLog.cap(Long.parseLong(args[1]));
        if (Integer.parseInt(args[2]) > 0) {
            LiveLog.maxBody(Integer.parseInt(args[2]));
        }
        for (int i = 4; i < args.length; i++) {
            int n = Integer.parseInt(args[i]);
            String body = "{\\"label\\": \\"low\\", \\"pad\\": \\"\\u00e9" + "a".repeat(n - 28) + "\\"}";
            LiveLog.append(Paths.get(args[0]), "shadow", "req-" + i, "cand-" + i, "2.0", 200, 1.5, i,
                    body, null);
        }
        System.out.println("appended");
        System.out.flush();
        Thread.sleep(Long.parseLong(args[3]));
    }
}
"""


def body_of(n: int) -> str:
    """The body LiveLogBodies sends for length ``n``."""
    return '{"label": "low", "pad": "\u00e9' + "a" * (n - 28) + '"}'


@pytest.fixture(scope="module")
def bodies_driver(tmp_path_factory) -> list[str]:
    """The command that runs LiveLogBodies (compiled against the built agent)."""
    tmp = tmp_path_factory.mktemp("bodies")
    source = tmp / "src" / "rtserve" / "agent" / "LiveLogBodies.java"
    source.parent.mkdir(parents=True)
    source.write_text(LIVE_LOG_BODIES)
    classes = tmp / "classes"
    subprocess.run(["javac", "-cp", str(agent_jar()), "-d", str(classes), str(source)], check=True, timeout=120)
    return ["java", "-cp", f"{classes}:{agent_jar()}", "rtserve.agent.LiveLogBodies"]


def test_an_answer_is_logged_whole_or_marked_truncated_never_cut(tmp_path, bodies_driver):
    """A body within the limit (the frontend's max_response_size; 10,000 characters here) is
    written whole, 4,096 characters and more included; a longer one is marked truncated with its
    status, id and time kept; with a cap, so is a line that half the cap could not hold."""
    log = tmp_path / "live-log.jsonl"
    lengths = [100, 4097, 10_000, 10_001, 200_000]
    subprocess.run(
        [*bodies_driver, str(log), "0", "10000", "1000", *map(str, lengths)],
        check=True,
        timeout=120,
        capture_output=True,
    )
    lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert [line["of"] for line in lines] == [f"req-{i}" for i in range(4, 4 + len(lengths))]
    for line, n in zip(lines, lengths):
        assert (line["status"], line["id"], line["ms"]) == (200, line["of"].replace("req", "cand"), 1.5)
        if n <= 10_000:
            assert line["body"] == body_of(n) and "truncated" not in line
            assert json.loads(line["body"])["label"] == "low"
        else:
            assert line["body"] == "" and line["truncated"] is True
    capped = tmp_path / "capped.jsonl"  # half the cap: 20,000 bytes per file
    subprocess.run(
        [*bodies_driver, str(capped), "40000", "0", "1000", "15000", "25000"],
        check=True,
        timeout=120,
        capture_output=True,
    )
    lines = [json.loads(line) for line in capped.read_text(encoding="utf-8").splitlines()]
    assert [(line["body"] == body_of(15_000), line.get("truncated")) for line in lines] == [(True, None), (False, True)]
    assert capped.stat().st_size <= 20_000 and not capped.with_name(capped.name + ".1").exists()


def test_the_queue_is_bounded_in_bytes_and_drops_with_a_status_minus_1_line(tmp_path, bodies_driver):
    """With the writer held (its file a FIFO nobody reads yet), answers of 6 MB each fill the
    queue's 32 MiB after five: the sixth and seventh become status -1 lines naming the bound."""
    fifo = tmp_path / "live-log.fifo"
    os.mkfifo(fifo)
    n = 6_000_000
    driver = subprocess.Popen(
        [*bodies_driver, str(fifo), "0", "0", "3000", *[str(n)] * 7],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout.readline() == "appended\n"  # all seven queued while the writer waits
        with open(fifo, "rb") as reader:
            data = reader.read()
        assert driver.wait(timeout=60) == 0, driver.stderr.read()
    finally:
        driver.kill()
        driver.wait()
    lines = [json.loads(line) for line in data.decode().splitlines()]
    whole = [line for line in lines if line["status"] == 200]
    dropped = [line for line in lines if line["status"] == -1]
    assert len(lines) == 7 and len(whole) == 5 and all(line["body"] == body_of(n) for line in whole)
    assert [(line["body"], line["error"]) for line in dropped] == [
        ("", "dropped: more than 33554432 bytes of the live log waiting")
    ] * 2
