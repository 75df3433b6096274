"""The route table (rtserve/server/routes.py) matches the code that serves the routes and the page
that shows it: a route added in the gateway, the agent, the OIP sidecar or the exporter without
its row fails here."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from rtserve.gateway import nginx
from rtserve.observability import request_latency
from rtserve.server import oip, routes
from rtserve.server.routes import (
    AGENT,
    GATEWAY,
    GATEWAY_HEALTH,
    INFERENCE,
    METRICS,
    OIP,
    PREDICTION_PATH,
    ROUTES,
    TORCHSERVE_METRICS,
    WORKER,
    Route,
)
from tests.conftest import REPO

pytestmark = pytest.mark.unit

AGENT_SOURCES = sorted((REPO / "agent/src/rtserve/agent").glob("*.java"))
#: A path literal in code: "/predictions/", "/metrics".
PATH_LITERAL = re.compile(r'"(/[A-Za-z][\w/.-]*)"')
#: A route named in a string: "GET /v2/models/{name}[/versions/{version}][/ready]".
METHOD_PATH = re.compile(r"\b(GET|POST|PUT|DELETE) (/[^\s\"`]*)")
#: The agent's test of a path's segments: "v2".equals(segments[1]).
SEGMENT = re.compile(r'"(\w+)"\.equals\(segments\[(\d+)\]\)')


def sample(path: str) -> str:
    """A concrete path for a template: each ``{name}`` becomes ``m``."""
    return re.sub(r"\{[^}]*\}", "m", path)


def table(api) -> list[Route]:
    return [r for r in ROUTES if r.api is api]


def java_code(path: Path) -> str:
    """The source without its comment lines (javadoc and ``//`` lines)."""
    return "\n".join(line for line in path.read_text().splitlines() if not line.strip().startswith(("*", "/*", "//")))


def test_every_file_the_table_names_exists():
    named = {f for r in ROUTES for f in r.files} | {s.file for s in PREDICTION_PATH if s.file}
    assert named
    missing = sorted(f for f in named if not (REPO / f).is_file())
    assert not missing, missing


def test_each_step_of_the_prediction_path_names_a_function_of_its_file():
    for step in PREDICTION_PATH:
        if step.file is None:
            continue
        name = step.function.rsplit(".", 1)[-1]
        text = (REPO / step.file).read_text()
        if step.file.endswith(".py"):
            defined = {n.name for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            assert name in defined, f"{step.file} defines no {name}"
        else:
            assert re.search(rf"\b{re.escape(name)}\(", java_code(REPO / step.file)), (
                f"{step.file} has no method {name}"
            )


def test_variants_and_locations():
    route = Route("GET", "/v2/models/{name}[/versions/{version}][/ready]", INFERENCE, "", ())
    assert route.variants() == (
        "/v2/models/{name}",
        "/v2/models/{name}/ready",
        "/v2/models/{name}/versions/{version}",
        "/v2/models/{name}/versions/{version}/ready",
    )
    assert Route("any", "/v2/*", GATEWAY, "", ()).location == "/v2/"
    assert Route("any", "/v2", GATEWAY, "", ()).location == "= /v2"


def nginx_servers() -> list[str]:
    """The gateway's nginx config, one text per ``server`` block, in order."""
    return re.split(r"^\s*server\s*\{", nginx.render_nginx_conf(nginx.POD), flags=re.MULTILINE)[1:]


def nginx_locations(server: str) -> dict[str, str]:
    """location -> its text (up to the next location), the internal ones left out."""
    found = {}
    for chunk in re.split(r"^\s*location\s+", server, flags=re.MULTILINE)[1:]:
        head = chunk.split("{", 1)[0].strip()
        name = head.split()[-1]
        if not name.startswith(("@", "/@")):
            found[" ".join(head.split())] = chunk
    return found


def test_the_gateway_serves_exactly_the_table_s_routes():
    public, health = nginx_servers()
    assert set(nginx_locations(public)) == {r.location for r in table(GATEWAY)}
    assert set(nginx_locations(health)) == {r.location for r in table(GATEWAY_HEALTH)}
    passed = [loc for loc, text in nginx_locations(public).items() if "proxy_pass http://torchserve" in text]
    assert tuple(passed) == routes.gateway_locations() == nginx.ROUTES
    proxied = {loc for loc, text in nginx_locations(health).items() if "proxy_pass" in text}
    assert proxied == {r.location for r in table(GATEWAY_HEALTH) if r.forwards_to is INFERENCE}


def passed_by_gateway(path: str) -> bool:
    """Whether the pod's gateway passes a request for ``path`` on (nginx's location rules)."""
    for location in routes.gateway_locations():
        if location.startswith("= ") and path == location[2:] or path.startswith(location):
            return True
    return False


def test_the_table_says_which_inference_routes_the_gateway_refuses():
    for route in table(INFERENCE):
        says_not = "not passed by the gateway" in route.answered_by
        assert says_not != all(passed_by_gateway(sample(v)) for v in route.variants()), route


def test_every_path_the_agent_serves_is_in_the_table():
    served = {v for r in table(INFERENCE) if AGENT in r.processes for v in r.variants()}
    agent_routes = [r for r in table(INFERENCE) if AGENT in r.processes]
    found = []
    for source in AGENT_SOURCES:
        code = java_code(source)
        for method, path in METHOD_PATH.findall(code):
            assert any(r.method == method and r.path == path for r in agent_routes), (
                f"{source.name}: {method} {path} is not a route of the agent in ROUTES"
            )
            found.append(path)
        prefixes = PATH_LITERAL.findall(code)
        segments = {int(i): s for s, i in SEGMENT.findall(code)}
        if segments:
            prefixes.append("".join(f"/{segments[i]}" for i in sorted(segments)) + "/")
        for prefix in prefixes:
            assert any(v.startswith(prefix) for v in served), (
                f"{source.name}: {prefix} is not the start of a route of the agent in ROUTES"
            )
            found.append(prefix)
    # and the other way: each of the agent's routes is one the sources name
    for route in agent_routes:
        assert any(route.path == p or route.path.startswith(p) for p in found), route
        assert any(f.startswith("agent/") for f in route.files), route


def test_every_path_the_oip_sidecar_serves_is_in_the_table():
    rows = table(OIP)
    documented = {(m, p) for m, p in METHOD_PATH.findall(Path(oip.__file__).read_text())}
    assert documented == {(r.method, r.path) for r in rows}
    handlers = re.findall(r"def do_(\w+)\(", Path(oip.__file__).read_text())
    assert handlers == ["GET"] and {r.method for r in rows} == {"GET"}
    variants = {sample(v) for r in rows for v in r.variants()}
    assert all(oip.ROUTE.match(v) for v in variants), variants
    forms = {f"/v2/models/m{version}{ready}" for version in ("", "/versions/m") for ready in ("", "/ready")}
    assert {f for f in forms if oip.ROUTE.match(f)} == variants
    # the agent passes on exactly what the sidecar answers
    (passed,) = [r for r in table(INFERENCE) if r.forwards_to is OIP]
    assert {sample(v) for v in passed.variants()} == variants


def test_every_path_the_exporter_serves_is_in_the_table():
    from rtserve.observability import exporter

    code = Path(exporter.__file__).read_text()
    literals = set(PATH_LITERAL.findall(code))
    assert literals == {r.path for r in table(METRICS)} == {"/metrics"}
    assert "{upstream}/metrics" in code
    assert [r.path for r in table(TORCHSERVE_METRICS)] == ["/metrics"]
    assert [r.forwards_to for r in table(METRICS)] == [TORCHSERVE_METRICS]


def test_the_latency_histogram_counts_every_route_the_gateway_passes_to_the_handler():
    for route in table(INFERENCE):
        if WORKER in route.processes and route.method == "POST":
            for variant in route.variants():
                if passed_by_gateway(sample(variant)):
                    assert request_latency._route(sample(variant)) is not None, route


def test_the_page_shows_the_table():
    page = (REPO / "docs/routes.md").read_text()
    assert routes.markdown() in page, (
        "docs/routes.md is out of date: paste the output of python -m rtserve.server.routes"
    )
    assert page.endswith(routes.markdown())
