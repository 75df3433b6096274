"""rtserve's import graph: no circle, and every import points down the layers of
docs/development.md ("Where things are"). Every import counts, those inside functions too (a
lazy import circle is still a circle)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.unit

PACKAGE = REPO / "rtserve"
#: Bottom to top: a module may import its own package's modules and anything in a lower layer.
LAYERS = (
    ("rtserve", "rtserve.errors"),
    ("rtserve.settings",),
    ("rtserve.runtime",),
    ("rtserve.client", "rtserve.model"),
    ("rtserve.server",),
    ("rtserve.observability", "rtserve.gateway", "rtserve.k8s", "rtserve.cluster", "rtserve.stream", "rtserve.records"),
    # above rtserve.k8s: its live traffic (rtserve.promotion.live) deploys a candidate with kubectl
    ("rtserve.promotion",),
    ("rtserve.container", "rtserve.testing"),
    ("rtserve.cli",),
    ("rtserve.__main__",),
)


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def resolve(name: str) -> str:
    """The rtserve module ``name`` stands for (a name inside a module: that module)."""
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def imports(module: str) -> set[str]:
    """The rtserve modules ``module`` imports, anywhere in its source."""
    path = MODULES[module]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {resolve(a.name) for a in node.names if a.name.split(".")[0] == "rtserve"}
        elif (
            isinstance(node, ast.ImportFrom)
            and node.level == 0
            and node.module
            and node.module.split(".")[0] == "rtserve"
        ):
            # `from rtserve.server import probe` imports the module rtserve.server.probe
            found |= {resolve(f"{node.module}.{a.name}") for a in node.names}
    return found - {module}


GRAPH = {module: imports(module) for module in MODULES}


def package(module: str) -> str:
    """A module's package: ``rtserve.<package>`` (a top-level module is its own)."""
    return ".".join(module.split(".")[:2])


def layer(module: str) -> int:
    (found,) = [i for i, names in enumerate(LAYERS) if package(module) in names]
    return found


def test_every_package_has_a_layer_and_a_purpose():
    for module in MODULES:
        assert any(package(module) in names for names in LAYERS), (
            f"{module}: add its package to LAYERS (and to docs/development.md)"
        )
    for init in PACKAGE.glob("*/__init__.py"):
        lines = (ast.get_docstring(ast.parse(init.read_text())) or "").splitlines()
        assert lines and lines[0].endswith(".") and lines[1:2] in ([], [""]), (
            f"{init}: a one-line purpose first in its docstring"
        )


def test_no_import_circle():
    """Depth-first search for a cycle; the message names it."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(GRAPH[module]):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(GRAPH):
        if module not in state:
            cycle = visit(module)
            assert cycle is None, "import circle: " + " -> ".join(cycle)


def test_imports_only_point_down():
    upward = sorted(
        f"{a} imports {b}"
        for a, targets in GRAPH.items()
        for b in targets
        if package(a) != package(b) and layer(b) >= layer(a)
    )
    assert not upward, "imports that point up or sideways:\n" + "\n".join(upward)


def test_the_server_never_imports_the_gateway_nor_the_version_policy():
    """What the pod's entry point composes (rtserve.container) stays above both."""
    server = [m for m in MODULES if package(m) == "rtserve.server"]
    assert server
    for module in server:
        assert not {package(t) for t in GRAPH[module]} & {"rtserve.gateway", "rtserve.promotion"}


def test_the_walk_sees_function_level_imports():
    """The graph holds an import made inside a function (the command groups import lazily)."""
    assert "rtserve.server.probe" in GRAPH["rtserve.cli.probe"]
    assert "rtserve.container" in GRAPH["rtserve.cli.server"]


#: The modules that may read the process environment, and why. Everything else is handed a
#: :class:`rtserve.settings.Settings` (or the values it needs) by its caller; a copy of the
#: environment built for a child process (``dict(os.environ)``, ``{**os.environ, ...}``) is
#: not a read.
ENVIRONMENT_READERS = {
    "rtserve.settings": "Settings.from_env: every RTSERVE_* variable is read there",
    "rtserve.cli": "the command line: each command builds its Settings once (from_env) and hands "
    "it down (the pod's entry point, rtserve.container, is handed one too)",
    "rtserve.cluster.images": "TMPDIR, the temporary directory every Unix tool honours, not an rtserve setting",
    "rtserve.stream.service": "PYTHONPATH, extended for the child it starts",
    "rtserve.promotion.rollout": "USER, who made a change, as getpass reads it",
}


def environment_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, what)`` for each read of the environment in ``tree``: ``Settings.from_env``
    named (called or passed), a ``from_env`` defined, ``os.environ`` read (a copy of it for a
    child is not a read), ``os.getenv``, ``from os import environ/getenv``."""
    copies = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
            copies |= {id(a) for a in node.args}
        elif isinstance(node, ast.Dict):
            copies |= {id(v) for k, v in zip(node.keys, node.values) if k is None}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "from_env":
            found.append((node.lineno, "from_env"))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == "from_env":
            found.append((node.lineno, "def from_env"))
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
            and node.attr in ("environ", "environb", "getenv", "getenvb")
        ):
            if id(node) not in copies:
                found.append((node.lineno, f"os.{node.attr}"))
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            found += [
                (node.lineno, f"from os import {a.name}")
                for a in node.names
                if a.name in ("environ", "environb", "getenv", "getenvb")
            ]
    return found


def reads_environment(module: str) -> bool:
    """Whether ``module`` is one of :data:`ENVIRONMENT_READERS` (or in a package that is)."""
    return any(module == m or module.startswith(m + ".") for m in ENVIRONMENT_READERS)


def test_the_environment_is_read_at_the_edges_only():
    """Library code takes its settings as a parameter: ``from_env`` and ``os.environ`` only in
    :data:`ENVIRONMENT_READERS` (docs/configuration.md lists every setting and who reads it)."""
    found = [
        f"{MODULES[m].relative_to(REPO)}:{line}: {what}"
        for m in sorted(MODULES)
        if not reads_environment(m)
        for line, what in environment_reads(ast.parse(MODULES[m].read_text()))
    ]
    assert not found, (
        "the environment read outside the edges (take a Settings as a parameter, "
        "or add the module to ENVIRONMENT_READERS with why):\n" + "\n".join(found)
    )
    assert all(
        any(reads_environment(m) for m in MODULES if m == r or m.startswith(r + ".")) for r in ENVIRONMENT_READERS
    ), "ENVIRONMENT_READERS names a module that is gone"


def test_the_environment_walk_sees_reads_and_leaves_copies():
    source = """
import os
from os import getenv
def f(settings=Settings.from_env):
    a = os.environ.get("A")
    b = os.environ["B"]
    child = dict(os.environ, C="1")
    other = {**os.environ, "D": "2"}
    return os.getenv("E"), Settings.from_env()
"""
    assert [what for _, what in sorted(environment_reads(ast.parse(source)))] == [
        "from os import getenv",
        "from_env",
        "os.environ",
        "os.environ",
        "from_env",
        "os.getenv",
    ]
