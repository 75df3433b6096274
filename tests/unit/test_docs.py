"""The README and docs/ stay true to the repository: links resolve, make targets exist, and the
``python -m rtserve ...`` commands they show parse.

Only what the pages present as code is checked for commands (fenced blocks and inline code
spans), so prose such as "make it" is not read as a target. Links are read from the prose.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import shlex
import subprocess
from functools import cache
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

FENCE = re.compile(r"^ *(```|~~~)")
INLINE_CODE = re.compile(r"`([^`]+)`")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
MAKE = re.compile(r"(?<![\w./-])make((?:[ \t]+[^\s`|;&()]+)+)")
RTSERVE = re.compile(r"(?<![\w.])python -m (rtserve(?:\.\w+)*)\b(.*)")


def _rel(page: Path) -> str:
    return str(page.relative_to(REPO))


@cache
def split(page: Path) -> tuple[str, list[str]]:
    """The page's prose (fenced blocks removed) and its fenced blocks' lines, with shell line
    continuations (a trailing backslash) joined."""
    prose: list[str] = []
    code: list[str] = []
    fenced = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if fenced:
            if code and code[-1].endswith("\\"):
                code[-1] = code[-1][:-1] + " " + line.strip()
            else:
                code.append(line)
        else:
            prose.append(line)
    return "\n".join(prose), code


def code_snippets(page: Path) -> list[str]:
    """Every fenced line and every inline code span (newlines inside a span become spaces)."""
    prose, code = split(page)
    return code + [" ".join(span.split()) for span in INLINE_CODE.findall(prose)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation removed except
    hyphens and underscores, spaces to hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = text.replace("`", "").replace("*", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    """The anchors GitHub gives the page's headings (repeated headings get -1, -2, ...)."""
    prose, _ = split(page)
    seen: dict[str, int] = {}
    result = set()
    for line in prose.splitlines():
        match = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        result.add(base if count == 0 else f"{base}-{count}")
    return frozenset(result)


def links(page: Path) -> list[str]:
    """Relative link targets in the page's prose (inline code spans blanked first)."""
    prose, _ = split(page)
    prose = INLINE_CODE.sub("code", prose)
    return [t for t in LINK.findall(prose) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


def test_pages_exist():
    """The front door and at least the topic pages the README links to."""
    assert (REPO / "README.md").is_file()
    assert len(PAGES) > 5, [_rel(p) for p in PAGES]
    assert len((REPO / "README.md").read_text(encoding="utf-8").splitlines()) <= 250


def test_relative_links_resolve():
    """Every relative link points at an existing file, and every #anchor at a heading of it."""
    broken = []
    for page in PAGES:
        for target in links(page):
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{_rel(page)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{_rel(page)}: {target} (no heading with that anchor in {dest.name})")
    assert not broken, "\n".join(broken)


@cache
def make_targets() -> frozenset[str]:
    """Every target the Makefile defines, from make's own database (one run, nothing built)."""
    out = subprocess.run(
        ["make", "-pRrq", "--no-print-directory", "-f", "Makefile"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    targets = set()
    previous = ""
    for line in out.splitlines():
        match = re.match(r"^([A-Za-z0-9_./%+-][^:\s=]*):(?![:=])", line)
        if match and previous != "# Not a target:":
            targets.add(match.group(1))
        previous = line
    assert "help" in targets, out[:2000]
    return frozenset(targets)


def mentioned_targets() -> dict[str, list[str]]:
    """make targets shown in code, each with the pages showing it (variables and options skipped)."""
    found: dict[str, list[str]] = {}
    for page in PAGES:
        for snippet in code_snippets(page):
            for match in MAKE.finditer(snippet):
                words = [w for w in match.group(1).split() if "=" not in w and not w.startswith("-")]
                if words and re.fullmatch(r"[a-z][a-z0-9-]*", words[0]):
                    found.setdefault(words[0], [])
                    if _rel(page) not in found[words[0]]:
                        found[words[0]].append(_rel(page))
    return found


def test_make_targets_exist():
    """Every `make <target>` the pages show is a target of the Makefile."""
    mentioned = mentioned_targets()
    assert "serve" in mentioned and "test" in mentioned, sorted(mentioned)
    missing = {t: pages for t, pages in mentioned.items() if t not in make_targets()}
    assert not missing, "no such make target:\n" + "\n".join(
        f"  make {t}  (in {', '.join(pages)})" for t, pages in sorted(missing.items())
    )


class _Parsed(Exception):
    """Raised instead of running a command once its arguments parsed."""


def commands() -> list[tuple[str, str, list[str]]]:
    """(page, module, argv) of every ``python -m rtserve[.module] ...`` shown in code."""
    found = []
    for page in PAGES:
        for snippet in code_snippets(page):
            for match in RTSERVE.finditer(snippet):
                lexer = shlex.shlex(match.group(2), posix=True, punctuation_chars=True)
                lexer.whitespace_split = True
                argv = []
                try:
                    for token in lexer:
                        if token and set(token) <= set("();<>|&"):
                            break  # the end of the command: a pipe, `)`, `&&`, ...
                        argv.append(token)
                except ValueError:  # an unbalanced quote in a shortened example
                    argv = shlex.split(match.group(2).split('"')[0])
                if argv:  # a bare `python -m rtserve` is a name, not a command
                    found.append((_rel(page), match.group(1), argv))
    return found


def parse(module: str, argv: list[str], monkeypatch: pytest.MonkeyPatch) -> str | None:
    """Parse argv with the module's own parser, in-process; None if it parses, else the error."""
    entry = importlib.import_module("rtserve.cli" if module == "rtserve" else module)
    original = argparse.ArgumentParser.parse_args

    def parse_only(self, args=None, namespace=None):
        original(self, args, namespace)
        raise _Parsed

    err = io.StringIO()
    with monkeypatch.context() as mp:
        mp.setattr(argparse.ArgumentParser, "parse_args", parse_only)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                entry.main(argv)
        except _Parsed:
            return None
        except SystemExit as exc:  # --help exits 0; a parse error exits 2
            return None if exc.code == 0 else err.getvalue().strip().splitlines()[-1]
    return "the command ran past argument parsing without calling parse_args"


def test_rtserve_commands_parse(monkeypatch):
    """Every `python -m rtserve ...` shown parses with that module's own argument parser."""
    shown = commands()
    assert any(module == "rtserve" for _, module, _ in shown), shown
    failures = []
    for page, module, argv in shown:
        error = parse(module, argv, monkeypatch)
        if error:
            failures.append(f"{page}: python -m {module} {shlex.join(argv)}\n    {error}")
    assert not failures, "\n".join(failures)
