"""Every code snippet in docs/*.md runs, so the docs cannot drift from the code.

- ```` ```python ```` blocks of one page run in order in one namespace (a page is a story:
  later blocks use what earlier ones defined). A block whose info string contains ``no-run``
  (```` ```python no-run ````) is only compiled, for fragments such as import swaps that need
  a package we do not install (verl) or a multi-process launch.
- ```` ```bash ```` blocks: every line that starts with ``seqbal `` runs through the CLI's
  ``main()`` in-process and must exit 0 (input files named in it are created from the shipped
  sample first, see ``_fixture_files``). Other shell lines (``pip``, ``torchrun``) are not run
  here; the examples they launch are run by ``tests/test_examples.py``.

New pages are picked up automatically: the test is parametrised over the files present.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md"))
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.S | re.M)


def blocks(path: Path) -> list[tuple[str, str, int]]:
    """(info string, code, line number) of every fenced block of a Markdown file."""
    text = path.read_text(encoding="utf-8")
    return [(m.group(1).strip(), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


def _fixture_files(directory: Path) -> None:
    """Files the docs' shell examples name, built from the shipped sample."""
    lengths = np.loadtxt(ROOT / "seqbal" / "data" / "qwen25math_cot_rollouts.txt", dtype=np.int64)
    np.savetxt(directory / "lengths.txt", lengths, fmt="%d")
    np.save(directory / "lengths.npy", lengths)
    with (directory / "rollouts.jsonl").open("w") as handle:
        for length in lengths.tolist():
            handle.write(json.dumps({"response_length": length, "uid": 0}) + "\n")


def test_docs_exist():
    names = {p.name for p in DOCS}
    assert {"index.md", "guide.md", "algorithm.md", "api.md"} <= names


@pytest.mark.parametrize("page", DOCS, ids=[p.name for p in DOCS])
def test_snippets_run(page, tmp_path, monkeypatch):
    from seqbal.cli import main

    monkeypatch.chdir(tmp_path)
    _fixture_files(tmp_path)
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    ran = 0
    for info, code, line in blocks(page):
        words = info.split()
        language = words[0] if words else ""
        where = f"{page.name}:{line}"
        if language == "python":
            compiled = compile(code, where, "exec")
            if "no-run" not in words:
                exec(compiled, namespace)  # noqa: S102 - the point of the test
                ran += 1
        elif language in ("bash", "sh", "console") and "no-run" not in words:
            for command in code.splitlines():
                command = command.split(" #")[0].strip()
                if not command.startswith("seqbal "):
                    continue
                argv = shlex.split(command)[1:]
                out, err = io.StringIO(), io.StringIO()
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    code_ = main(argv)
                assert code_ == 0, f"{where}: `{command}` exited {code_}: {err.getvalue()}"
                ran += 1
    if page.name in {"index.md", "guide.md", "algorithm.md", "api.md"}:
        assert ran, f"{page.name} has no runnable snippet"
