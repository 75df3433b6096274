"""The cluster package's errors (one root, caught once by the command line)."""

from __future__ import annotations


class ClusterError(RuntimeError):
    """The local cluster cannot be built, configured, started or stopped."""


class CommandError(ClusterError):
    """A command failed; it keeps the command, its exit status and its output."""

    def __init__(self, argv: list[str], returncode: int, output: str) -> None:
        self.argv, self.returncode, self.output = argv, returncode, output
        tail = output[-4000:]
        super().__init__(f"{' '.join(argv)} exited with {returncode}:\n{tail}")
