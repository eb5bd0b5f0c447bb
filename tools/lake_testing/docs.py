"""Run a Markdown page's code blocks as a reader would: shell lines and Python, in order.

Python blocks run in one namespace per pass (a tutorial builds on its earlier
steps). Shell blocks are split into commands (``\\`` continuations joined):

- ``lake meta`` and ``lake query`` start servers (a trailing ``&`` is the
  reader's way to background them), on free ports instead of the defaults
  50052/50051, which the harness rewrites everywhere in the page so parallel
  tests never collide; they run until ``kill %1 %2`` or the end of the pass;
- any other ``lake ...`` command runs to completion and must exit 0;
- ``hatch run ...`` lines are the repository's own (demo test, the suite);
- ``pip install ...`` lines are proved elsewhere (tests/packaging installs
  the SDK in a clean venv); the harness checks each local path exists;
- anything else is an error, so a new kind of snippet cannot go unrun.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tools.lake_testing.servers import LakeProcess, free_port, wait_healthy

__all__ = ["Block", "DocRun", "blocks"]

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
LAKE = [sys.executable, "-c", "from lake_core.cli import main; main()"]
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Block:
    lang: str
    code: str


def blocks(path: Path) -> list[Block]:
    return [Block(lang, code) for lang, code in FENCE.findall(path.read_text())]


def commands(code: str) -> list[str]:
    """A shell block's commands: continuations joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", code)
    found = []
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            found.append(line)
    return found


@dataclass
class DocRun:
    """One page, run pass after pass against the servers it starts itself."""

    page: Path
    workdir: Path
    meta_port: int = field(default_factory=free_port)
    query_port: int = field(default_factory=free_port)
    servers: list[LakeProcess] = field(default_factory=list)
    #: Commands run so far (for assertions and failure messages).
    ran: list[str] = field(default_factory=list)

    def text(self, code: str) -> str:
        return code.replace("50052", str(self.meta_port)).replace("50051", str(self.query_port))

    def run_pass(
        self, *, failing: dict[int, type[BaseException]] | None = None
    ) -> dict[str, object]:
        """Every block of the page in order; returns the Python namespace.

        ``failing`` maps a Python block's index to the error it must raise
        (a step whose feature lives on a branch not merged yet). The caller
        chdirs into ``workdir`` first (the page's relative paths).
        """
        namespace: dict[str, object] = {"__name__": "__main__"}
        python_index = 0
        try:
            for block in blocks(self.page):
                code = self.text(block.code)
                if block.lang == "python":
                    where = f"{self.page.name} (python block {python_index})"
                    expected = (failing or {}).get(python_index)
                    if expected is None:
                        exec(compile(code, where, "exec"), namespace)
                    else:
                        try:
                            exec(compile(code, where, "exec"), namespace)
                        except expected:
                            pass
                        else:
                            raise AssertionError(f"{where} ran: drop it from `failing`")
                    python_index += 1
                elif block.lang in ("bash", "sh", "console", "shell", ""):
                    for command in commands(code):
                        self.shell(command)
                # Other languages (yaml, text, json) are data, not steps.
        finally:
            self.stop()
        return namespace

    def shell(self, command: str) -> None:
        self.ran.append(command)
        words = shlex.split(command.removesuffix("&").strip())
        if words[:2] == ["pip", "install"]:
            for word in words[2:]:
                if word.startswith("./"):
                    local = ROOT / word.split("[", 1)[0]
                    assert local.exists(), f"{self.page.name}: {word} does not exist"
            return
        if "hatch" in words:
            # The repository's own commands: `hatch run demo` is run by
            # tests/docs/test_examples.py, `hatch run test` is the suite itself.
            return
        if words[:2] == ["kill", "%1"]:
            self.stop()
            return
        assert words[0] == "lake", f"{self.page.name}: unrun snippet {command!r}"
        if words[1] in ("meta", "query"):
            self.start(words[1:])
        else:
            self.lake(words[1:])

    def start(self, args: list[str]) -> None:
        server = args[0]
        port = self.meta_port if server == "meta" else self.query_port
        if "--addr" not in args:
            args = [*args, "--addr", f"127.0.0.1:{port}"]
        if server == "query" and "--metadata-addr" not in args:
            args = [*args, "--metadata-addr", f"http://127.0.0.1:{self.meta_port}"]
        name = f"doc-{server}-{port}"
        process = LakeProcess(
            name, [*LAKE[1:], *args], f"127.0.0.1:{port}", self.workdir / f"{name}.log"
        )
        self.servers.append(process)
        process.start()
        wait_healthy(process, 60)

    def lake(self, args: list[str]) -> str:
        if args[0] in ("client", "sql") and "--addr" not in args:
            port = self.meta_port if args[0] == "client" else self.query_port
            args = [args[0], "--addr", f"127.0.0.1:{port}", *args[1:]]
        done = subprocess.run([*LAKE, *args], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"lake {shlex.join(args)}:\n{done.stderr}{done.stdout}"
        return done.stdout

    def stop(self) -> None:
        while self.servers:
            self.servers.pop().stop()
