"""The one command runner: the command and its output travel in its error."""

from __future__ import annotations

import subprocess
from pathlib import Path

from rtserve.cluster.errors import CommandError


def run(argv: list[str], cwd: Path | None = None, env: dict[str, str] | None = None,
        timeout: float = 1800, stdin: str | None = None) -> str:
    """Run ``argv`` and return its standard output.

    Raises:
        CommandError: it exits non-zero (with its standard output and error).
    """
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, input=stdin, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=timeout)
    if done.returncode:
        raise CommandError([str(a) for a in argv], done.returncode, done.stdout + done.stderr)
    return done.stdout
