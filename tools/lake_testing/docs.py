"""Run a Markdown page's code blocks as a reader would: shell lines and Python, in order.

Python blocks run in one namespace per pass (a tutorial builds on its earlier
steps). Shell blocks are split into commands (``\\`` continuations joined):

- ``lake meta`` and ``lake query`` start servers (a trailing ``&`` is the
  reader's way to background them), on free ports instead of the defaults
  50052/50051, which the harness rewrites everywhere in the page so parallel
  tests never collide; they run until ``kill %1 %2`` or the end of the pass.
  Each is waited for (SERVING) before the next command, unless the run is
  ``pasted_whole``: then a backgrounded server is launched as a shell would,
  and the commands after it (the other server, ``lake client``, ``lake sql``)
  run at once, as when a reader pastes the block whole; a Python block (a
  later step) runs once every server started so far reports SERVING;
- any other ``lake ...`` command runs to completion and must exit 0;
- ``hatch run ...`` lines are the repository's own (demo test, the suite);
- ``pip install ...`` lines are proved elsewhere (tests/packaging installs
  the SDK in a clean venv); the harness checks each local path exists;
- ``export NAME=value ...`` sets variables for the rest of the pass, and
  ``NAME=value`` words before a command set them for that command; ``$NAME``
  expands from the pass's environment (what the page says the reader sets);
- a program the test's fixtures already run (``weed mini``: ``given``) is
  checked by the fixture's own function instead of being started twice;
- anything else is an error, so a new kind of snippet cannot go unrun.

Ports the page names (``ports``, plus 50052/50051) are rewritten to free
ones; nothing else in a command changes. A data block whose fence names a
file (```` ```yaml file=registrar.yaml ````) is saved there, as a reader
saves it before the command that reads it.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tools.lake_testing.servers import LakeProcess, free_port, wait_healthy

__all__ = ["Block", "DocRun", "blocks", "shell_blocks"]

FENCE = re.compile(r"^```(\w*)([^\n]*)\n(.*?)^```", re.S | re.M)
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)\}")
SHELL = ("bash", "sh", "console", "shell", "")
LAKE = [sys.executable, "-c", "from lake_core.cli import main; main()"]
ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    #: The file a reader saves this block to (``file=NAME`` in the fence), if any.
    file: str | None = None


def blocks(path: Path) -> list[Block]:
    found = []
    for lang, info, code in FENCE.findall(path.read_text()):
        named = re.search(r"\bfile=(\S+)", info)
        found.append(Block(lang, code, named.group(1) if named else None))
    return found


def shell_blocks(path: Path) -> list[Block]:
    """The blocks :class:`DocRun` runs as shell (an unlabelled block is shell)."""
    return [b for b in blocks(path) if b.lang in SHELL]


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
    #: Variables the page tells the reader to have set (``$CATALOG_URL``); also
    #: given to its Python blocks as names. The process environment is the base.
    env: dict[str, str] = field(default_factory=dict)
    #: Further ports the page names -> the ports the test's servers use.
    ports: dict[int, int] = field(default_factory=dict)
    #: Programs the fixtures run already -> a check of the page's command line.
    given: dict[str, Callable[[list[str]], None]] = field(default_factory=dict)
    servers: list[LakeProcess] = field(default_factory=list)
    #: Run server lines ending in ``&`` without waiting for them (see the module docstring).
    pasted_whole: bool = False
    #: Run each Python block as its own script (a fresh namespace: its imports and
    #: setup must be its own), as a reader may run any one of them; its names are
    #: then added to what :meth:`run_pass` returns. False: one namespace down the page.
    alone: bool = True
    #: Commands run so far (for assertions and failure messages).
    ran: list[str] = field(default_factory=list)
    #: Standard output of every ``lake`` command run to completion, in order.
    printed: list[str] = field(default_factory=list)
    #: This pass's environment (``export`` adds to it).
    _shell_env: dict[str, str] = field(default_factory=dict)

    def text(self, code: str) -> str:
        mapping = {50052: self.meta_port, 50051: self.query_port, **self.ports}
        return re.sub(
            r"(?<!\d)(\d{4,5})(?!\d)",
            lambda m: str(mapping.get(int(m.group(1)), m.group(1))),
            code,
        )

    def run_pass(
        self, *, failing: dict[int, type[BaseException]] | None = None
    ) -> dict[str, object]:
        """Every block of the page in order; returns the Python namespace.

        ``failing`` maps a Python block's index to the error it must raise
        (a step whose feature lives on a branch not merged yet). The caller
        chdirs into ``workdir`` first (the page's relative paths).
        """
        namespace: dict[str, object] = {"__name__": "__main__", **self.env}
        self._shell_env = dict(self.env)
        python_index = 0
        try:
            for block in blocks(self.page):
                code = self.text(block.code)
                if block.file is not None:
                    (self.workdir / block.file).write_text(code)
                elif block.lang == "python":
                    for server in self.servers:
                        wait_healthy(server, 60)
                    where = f"{self.page.name} (python block {python_index})"
                    expected = (failing or {}).get(python_index)
                    scope = {"__name__": "__main__"} if self.alone else namespace
                    if expected is None:
                        self._exec(code, where, scope)
                    else:
                        try:
                            self._exec(code, where, scope)
                        except expected:
                            pass
                        else:
                            raise AssertionError(f"{where} ran: drop it from `failing`")
                    if scope is not namespace:
                        namespace.update(scope)
                    python_index += 1
                elif block.lang in SHELL:
                    for command in commands(code):
                        self.shell(command)
                # Other languages (yaml, text, json) are data, not steps.
        finally:
            self.stop()
        return namespace

    def _exec(self, code: str, where: str, scope: dict[str, object]) -> None:
        """One Python block, with the page's variables in its environment (``os.environ``)."""
        saved = {key: os.environ.get(key) for key in self.env}
        os.environ.update(self.env)
        try:
            exec(compile(code, where, "exec"), scope)
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def shell(self, command: str) -> None:
        self.ran.append(command)
        words = [self.expand(w) for w in shlex.split(command.removesuffix("&").strip())]
        if words[0] == "export":
            for word in words[1:]:
                name, _, value = word.partition("=")
                self._shell_env[name] = value
            return
        scoped: dict[str, str] = {}
        while words and ASSIGNMENT.match(words[0]):
            name, value = words.pop(0).split("=", 1)
            scoped[name] = value
        env = {**self._shell_env, **scoped}
        if words[0] in self.given:
            self.given[words[0]](words)
            return
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
            background = self.pasted_whole and command.rstrip().endswith("&")
            self.start(words[1:], env, background=background)
        else:
            self.printed.append(self.lake(words[1:], env))

    def expand(self, word: str) -> str:
        """``$NAME`` from the pass's environment; an unset name fails the page."""

        def value(match: re.Match[str]) -> str:
            name = match.group(1) or match.group(2)
            found = self._shell_env.get(name, os.environ.get(name))
            assert found is not None, f"{self.page.name}: ${name} is not set"
            return found

        return VARIABLE.sub(value, word)

    def start(
        self, args: list[str], env: dict[str, str] | None = None, *, background: bool = False
    ) -> None:
        server = args[0]
        port = self.meta_port if server == "meta" else self.query_port
        if "--addr" not in args:
            args = [*args, "--addr", f"127.0.0.1:{port}"]
        if server == "query" and "--metadata-addr" not in args:
            args = [*args, "--metadata-addr", f"http://127.0.0.1:{self.meta_port}"]
        addr = args[args.index("--addr") + 1]
        name = f"doc-{server}-{addr.rsplit(':', 1)[1]}"
        process = LakeProcess(
            name, [*LAKE[1:], *args], addr, self.workdir / f"{name}.log", dict(env or {})
        )
        self.servers.append(process)
        process.launch()
        if not background:
            wait_healthy(process, 60)

    def lake(self, args: list[str], env: dict[str, str] | None = None) -> str:
        if args[0] in ("client", "sql") and "--addr" not in args:
            port = self.meta_port if args[0] == "client" else self.query_port
            args = [args[0], "--addr", f"127.0.0.1:{port}", *args[1:]]
        done = subprocess.run(
            [*LAKE, *args],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=self.workdir,
            env={**os.environ, **(env or {})},
        )
        assert done.returncode == 0, f"lake {shlex.join(args)}:\n{done.stderr}{done.stdout}"
        return done.stdout

    def stop(self) -> None:
        while self.servers:
            self.servers.pop().stop()
