"""Running a documentation page's code blocks as a reader would, in two terminals.

A page marks each shell or Python block it means to be run with an HTML
comment on the line before it (invisible on the rendered page):

- ``<!-- quickstart: background until="TEXT" -->`` — the first terminal: started
  in the background, as its own process group (Ctrl+C reaches all of it), and
  waited for until its output shows TEXT;
- ``<!-- quickstart: file=NAME -->`` — a file the reader saves as NAME, in the
  second terminal's current folder;
- ``<!-- quickstart: run [expect="TEXT"] [until="TEXT"] [stderr="TEXT"] -->`` — a
  command of the second terminal; it must exit 0 and print TEXT (``until``: run
  again, as the page asks, until it does; ``stderr``: TEXT on stderr);
- ``<!-- quickstart: skip (why) -->`` and ``<!-- quickstart: shown (why) -->`` —
  not run: setup the test does its own way, or a file shown from the repository.

Second-terminal commands share one shell's variables and folder, as in a
terminal: each runs in ``bash`` with the variables the ones before it set, in
the folder the last one left it in (a ``cd`` carries over). The two terminals
may have different environments: the first one's, where ``keel up`` runs, may
set what the second was never told (its ports, say).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

MARKER = re.compile(r"^<!--\s*quickstart:\s*(?P<spec>.*?)\s*-->\s*$")
FENCE = re.compile(r"^(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)")
OPTION = re.compile(r"""(\w+)=("[^"]*"|'[^']*'|\S+)""")
RUNNABLE = {"sh", "bash", "shell", "console", "python", "py"}
ACTIONS = {"background", "file", "run", "skip", "shown"}


@dataclass
class Block:
    """A fenced code block of the page and what its marker asks."""

    line: int
    lang: str
    text: str
    action: str | None = None
    options: dict[str, str] = field(default_factory=dict)


def _marker(line: str) -> tuple[str, dict[str, str]] | None:
    found = MARKER.match(line.strip())
    if found is None:
        return None
    spec = found["spec"]
    action = re.split(r"[\s=]", spec, maxsplit=1)[0]
    options = {key: _unquoted(value) for key, value in OPTION.findall(spec)}
    return action, options


def _unquoted(value: str) -> str:
    if len(value) >= 2 and value[0] in "\"'" and value[-1] == value[0]:
        return value[1:-1]
    return value


def blocks(markdown: str) -> list[Block]:
    """Every fenced block at the start of a line, with the marker on the line before it."""
    lines = markdown.splitlines()
    found = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not lines[end].startswith(opening["fence"]):
            end += 1
        block = Block(index + 1, opening["lang"], "\n".join(lines[index + 1 : end]) + "\n")
        marked = _marker(lines[index - 1]) if index else None
        if marked is not None:
            block.action, block.options = marked
        found.append(block)
        index = end + 1
    return found


def runnable(markdown: str) -> list[Block]:
    """The shell and Python blocks; each must say whether and how it is run."""
    chosen = [b for b in blocks(markdown) if b.lang in RUNNABLE]
    unmarked = [b.line for b in chosen if b.action not in ACTIONS]
    assert not unmarked, f"code blocks without a quickstart marker, at lines {unmarked}"
    return chosen


@dataclass
class Terminals:
    """The reader's two terminals, both opened in ``folder``: the second with ``env``, the
    first with ``first_env`` (default: the same)."""

    folder: Path
    env: dict[str, str]
    state: Path
    logs: Path
    first_env: dict[str, str] | None = None
    first: subprocess.Popen | None = None
    cwd: Path | None = None  # the second terminal's folder now; None: ``folder``
    transcript: list[str] = field(default_factory=list)

    def background(self, block: Block, timeout: float = 240) -> None:
        assert self.first is None, "one command in the first terminal"
        log = self.logs / "first-terminal.log"
        with log.open("wb") as out:
            self.first = subprocess.Popen(
                ["bash", "-c", block.text],
                cwd=self.folder,
                env=self.first_env if self.first_env is not None else self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        wanted = block.options["until"]
        deadline = time.monotonic() + timeout
        while wanted not in log.read_text(errors="replace"):
            assert self.first.poll() is None, f"line {block.line} ended:\n{self.first_log()}"
            assert time.monotonic() < deadline, f"no {wanted!r} in {timeout} s:\n{self.first_log()}"
            time.sleep(0.5)

    def first_log(self, chars: int = 6000) -> str:
        log = self.logs / "first-terminal.log"
        return log.read_text(errors="replace")[-chars:] if log.exists() else ""

    @property
    def here(self) -> Path:
        """The second terminal's current folder."""
        return self.cwd if self.cwd is not None else self.folder

    def save(self, block: Block) -> None:
        (self.here / block.options["file"]).write_text(block.text)

    def run(self, block: Block, timeout: float = 120) -> str:
        """Run a second-terminal command; with ``until``, again until it prints that."""
        wanted = block.options.get("until")
        deadline = time.monotonic() + 60
        while True:
            done = self._once(block, timeout)
            output = done.stdout
            if wanted is None or wanted in output:
                break
            assert time.monotonic() < deadline, f"line {block.line} never printed {wanted!r}"
            time.sleep(1)
        expected = block.options.get("expect")
        assert expected is None or expected in output, (
            f"line {block.line} printed no {expected!r}:\n{output}"
        )
        on_stderr = block.options.get("stderr")
        assert on_stderr is None or on_stderr in done.stderr, (
            f"line {block.line} printed no {on_stderr!r} on stderr:\n{done.stderr}"
        )
        return output

    def _once(self, block: Block, timeout: float) -> subprocess.CompletedProcess[str]:
        folder = self.state.with_name(self.state.name + ".pwd")
        script = (
            f'set -e -o pipefail -a\n. "{self.state}"\n{block.text}'
            f'export -p > "{self.state}"\npwd > "{folder}"\n'
        )
        done = subprocess.run(
            ["bash", "-c", script],
            cwd=self.here,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        self.transcript.append(f"$ {block.text}{done.stdout}{done.stderr}")
        assert done.returncode == 0, (
            f"line {block.line} exited {done.returncode}:\n{done.stdout}{done.stderr}"
        )
        self.cwd = Path(folder.read_text().strip())
        return done

    def interrupt_first(self, timeout: float = 120) -> int:
        """Ctrl+C in the first terminal: SIGINT to its process group; its exit code."""
        assert self.first is not None
        os.killpg(self.first.pid, signal.SIGINT)
        return self.first.wait(timeout=timeout)

    def close(self) -> None:
        """Whatever is left of the first terminal's processes is killed (a failed test)."""
        if self.first is not None and self.first.poll() is None:
            os.killpg(self.first.pid, signal.SIGKILL)
            self.first.wait(timeout=30)


def walk(markdown: str, terminals: Terminals) -> None:
    """Do what the page says, block by block."""
    terminals.state.touch()
    for block in runnable(markdown):
        if block.action == "background":
            terminals.background(block)
        elif block.action == "file":
            terminals.save(block)
        elif block.action == "run":
            terminals.run(block)
