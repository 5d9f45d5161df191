"""Every code snippet in docs/*.md and README.md runs, so the docs cannot drift from the code.

- ```` ```python ```` blocks of one page run in order in one namespace (a page is a story:
  later blocks use what earlier ones defined). A block whose info string contains ``no-run``
  (```` ```python no-run ````) is only compiled, for fragments such as import swaps that need
  a package we do not install (verl) or a multi-process launch. A block marked ``needs-verl``
  runs where verl's engine utilities import (CI installs verl 0.9.1) and is only compiled elsewhere.
- ```` ```bash ```` blocks: every line that starts with ``seqbal `` runs through the CLI's
  ``main()`` in-process and must exit 0 (input files named in it are created from the shipped
  sample first, see ``_fixture_files``). A ```` ```text ```` block right after a bash block
  with one ``seqbal`` command is that command's output, and must match it exactly. Other shell lines (``pip``, ``torchrun``) are not run
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
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]  # the README snippets too
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


def _verl_importable() -> bool:
    try:
        import verl.workers.engine.utils  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "no usable verl here"
        return False
    return True


def test_docs_exist():
    names = {p.name for p in DOCS}
    assert {"index.md", "guide.md", "algorithm.md", "api.md"} <= names


def test_every_public_name_is_documented():
    """Every name of ``seqbal.__all__`` appears in backticks on some docs page (api.md for the
    core; pages owned by other features, e.g. schedule.md, may document their own)."""
    import seqbal

    text = "\n".join(p.read_text(encoding="utf-8") for p in DOCS)
    missing = [name for name in seqbal.__all__ if f"`{name}" not in text]
    assert not missing, f"public names without documentation: {missing}"


def test_documented_signatures_match_the_code():
    """The ``def name(...)`` stubs of api.md have the real parameter names, kinds and defaults."""
    import ast
    import inspect

    import seqbal

    checked = 0
    for info, code, line in blocks(ROOT / "docs" / "api.md"):
        if not info.startswith("python"):
            continue
        for node in ast.parse(code).body:
            if not isinstance(node, ast.FunctionDef) or node.name not in seqbal.__all__:
                continue
            real = inspect.signature(getattr(seqbal, node.name)).parameters
            args = node.args
            documented = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
            assert documented == list(real), f"api.md:{line} {node.name}: {documented} != {list(real)}"
            positional = args.posonlyargs + args.args
            defaults = dict(zip([a.arg for a in positional[len(positional) - len(args.defaults):]], args.defaults))
            defaults.update({a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None})
            for name, parameter in real.items():
                if parameter.default is inspect.Parameter.empty:
                    assert name not in defaults, f"api.md:{line} {node.name}: {name} has no default in the code"
                else:
                    assert ast.literal_eval(defaults[name]) == parameter.default, f"api.md:{line} {node.name}.{name}"
            checked += 1
    assert checked >= 7


@pytest.mark.parametrize("page", DOCS, ids=[p.name for p in DOCS])
def test_snippets_run(page, tmp_path, monkeypatch):
    from seqbal.cli import main

    monkeypatch.chdir(tmp_path)
    _fixture_files(tmp_path)
    namespace: dict = {"__name__": f"docs_{page.stem}"}
    ran = 0
    last_output = None  # stdout of the previous block, if it was a single seqbal command
    for info, code, line in blocks(page):
        words = info.split()
        language = words[0] if words else ""
        where = f"{page.name}:{line}"
        previous_output, last_output = last_output, None
        if language == "text" and previous_output is not None:
            assert code.rstrip("\n") == previous_output.rstrip("\n"), f"{where}: output differs from the command's"
        elif language == "python":
            compiled = compile(code, where, "exec")
            if "no-run" not in words and ("needs-verl" not in words or _verl_importable()):
                exec(compiled, namespace)  # noqa: S102 - the point of the test
                ran += 1
        elif language in ("bash", "sh", "console") and "no-run" not in words:
            outputs = []
            for command in code.splitlines():
                command = command.split(" #")[0].strip()
                if not command.startswith("seqbal "):
                    continue
                argv = shlex.split(command)[1:]
                out, err = io.StringIO(), io.StringIO()
                with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                    code_ = main(argv)
                assert code_ == 0, f"{where}: `{command}` exited {code_}: {err.getvalue()}"
                outputs.append(out.getvalue())
                ran += 1
            if len(outputs) == 1:
                last_output = outputs[0]
    if page.name in {"index.md", "guide.md", "algorithm.md", "api.md"}:
        assert ran, f"{page.name} has no runnable snippet"
