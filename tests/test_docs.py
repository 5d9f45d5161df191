"""Every code snippet in docs/*.md and README.md runs, so the docs cannot drift from the code.

- Every ```` ```python ```` block runs on its own, in a fresh namespace, so a reader can copy
  any one block and run it (a block that needed an earlier one would fail here). A block whose
  info string contains ``no-run`` (```` ```python no-run ````) is only compiled, for fragments
  such as import swaps that need a package we do not install (verl) or a multi-process launch.
  A block marked ``needs-verl`` runs where verl's engine utilities import (CI installs
  verl 0.9.1) and is only compiled elsewhere.
- ```` ```bash ```` blocks: every line that starts with ``seqbal `` runs through the CLI's
  ``main()`` in-process and must exit 0 (input files named in it are created from the shipped
  sample first, see ``_fixture_files``). A ```` ```text ```` block right after a bash block
  with one ``seqbal`` command is that command's output, and must match it exactly, except for
  planning times (``12 ms``), which vary from run to run. Other shell lines (``pip``,
  ``torchrun``) are not run here; the examples they launch are run by ``tests/test_examples.py``.

New pages are picked up automatically: the test is parametrised over the files present.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
from importlib.resources import files
from pathlib import Path

import numpy as np

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]  # the README snippets too
FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```\s*$", re.S | re.M)
DURATION = re.compile(r"\b\d+(\.\d+)? (ms|s)\b")


def _without_times(text: str) -> str:
    """Command output with planning times replaced, the one part that differs between runs."""
    return DURATION.sub("<time>", text.rstrip("\n"))


def blocks(path: Path) -> list[tuple[str, str, int]]:
    """(info string, code, line number) of every fenced block of a Markdown file."""
    text = path.read_text(encoding="utf-8")
    return [(m.group(1).strip(), m.group(2), text.count("\n", 0, m.start()) + 1) for m in FENCE.finditer(text)]


def _fixture_files(directory: Path) -> None:
    """Files the docs' shell examples name, built from the shipped sample."""
    lengths = np.loadtxt(str(files("seqbal") / "data" / "qwen25math_cot_rollouts.txt"), dtype=np.int64)
    np.savetxt(directory / "lengths.txt", lengths, fmt="%d")
    np.save(directory / "lengths.npy", lengths)
    with (directory / "rollouts.jsonl").open("w") as handle:
        for length in lengths.tolist():  # prompt + response = the sequence length
            prompt = length // 5
            handle.write(json.dumps({"prompt_length": prompt, "response_length": length - prompt, "uid": 0}) + "\n")


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
    ran = 0
    failures: list[str] = []
    last_output = None  # stdout of the previous block, if it was a single seqbal command
    for info, code, line in blocks(page):
        words = info.split()
        language = words[0] if words else ""
        where = f"{page.name}:{line}"
        previous_output, last_output = last_output, None
        if language == "text" and previous_output is not None:
            assert _without_times(code) == _without_times(previous_output), f"{where}: output differs from the command's"
        elif language == "python":
            compiled = compile(code, where, "exec")
            if "no-run" not in words and ("needs-verl" not in words or _verl_importable()):
                try:
                    exec(compiled, {"__name__": f"docs_{page.stem}"})  # noqa: S102 - a fresh namespace per block
                except Exception as error:  # noqa: BLE001 - report every failing block of the page at once
                    failures.append(f"{where}: {type(error).__name__}: {error}")
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
    assert not failures, "blocks that do not run on their own:\n" + "\n".join(failures)
    if page.name in {"index.md", "guide.md", "algorithm.md", "api.md"}:
        assert ran, f"{page.name} has no runnable snippet"


def test_readme_install_is_honest():
    """Python >= 3.10 (torch 2.13), the CPU build named as such, and no torch reinstall on the
    main-job line (it would replace a trainer's own torch)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "Python >= 3.10" in text and "3.9" not in text
    cpu_lines = [line for line in text.splitlines() if line.startswith("pip install torch==")]  # the CPU index line
    assert cpu_lines and all("--index-url https://download.pytorch.org/whl/cpu" in line for line in cpu_lines)
    main_job = [line for line in text.splitlines() if "torchrun" in line and line.startswith("pip ")]
    assert main_job and not any("torch==" in line for line in main_job)
    assert "not on the package index" in text


#: Internal references a reader cannot look up: our own issue, stop and session numbers
#: ("issue 29", "Stop 34"). Another project's issue, named as such ("prime-rl's issue #2562"),
#: is a public reference and allowed.
INTERNAL_NUMBER = re.compile(r"(?<!'s )(?<!its )\b(?:issues?|stops?|sessions?)\s+#?\d+", re.I)
USER_FACING = DOCS + [ROOT / "CHANGELOG.md"]


@pytest.mark.parametrize("page", USER_FACING, ids=[p.name for p in USER_FACING])
def test_no_internal_issue_numbers(page):
    """Docs speak of what a number stood for (the 12-pass target, a later round), never of
    issue or stop numbers that only our tracker knows."""
    text = page.read_text(encoding="utf-8")
    found = [f"{page.name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)}" for m in INTERNAL_NUMBER.finditer(text)]
    assert not found, found
    assert INTERNAL_NUMBER.search("as issue 29 measured") and INTERNAL_NUMBER.search("Stop 34 cut")
    assert not INTERNAL_NUMBER.search("prime-rl's issue #2562")


def test_package_docstrings_cite_no_internal_issue_numbers():
    """help() on seqbal's modules, and the examples' and benchmarks' --help, are documentation too."""
    found = []
    for path in sorted(p for folder in ("seqbal", "examples", "benchmarks") for p in (ROOT / folder).rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        found += [f"{path.relative_to(ROOT)}: {m.group(0)}" for m in INTERNAL_NUMBER.finditer(text)]
    assert not found, found


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_links_to_headings_resolve():
    """Every ``[text](page.md#anchor)`` (or ``(#anchor)``) names a heading of that page."""
    headings = {}
    for page in DOCS:
        text = FENCE.sub("", page.read_text(encoding="utf-8"))
        headings[page.name] = {_anchor(m.group(1)) for m in re.finditer(r"^#+ (.*)$", text, re.M)}
    broken = []
    for page in DOCS:
        for target, anchor in re.findall(r"\]\(([\w./-]*\.md|)#([^)\s]+)\)", page.read_text(encoding="utf-8")):
            name = Path(target).name if target else page.name
            if name in headings and anchor not in headings[name]:
                broken.append(f"{page.name} -> {name}#{anchor}")
    assert not broken, broken


def test_readme_setup_where_only_the_package_index_is_reachable():
    """The CPU-torch line reaches PyTorch's own index; the README says what works where only the
    package index is mirrored, and the two commands reach nothing else."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    flat = " ".join(text.split())
    assert "Where only the package index is reachable" in flat
    assert "pip install torch==2.13.0 --no-index --find-links DIR" in flat
    commands = [line for line in text.splitlines() if line.startswith("pip install -e ")]
    assert len(commands) == 2, commands
    for line in commands:  # self-contained: no other index, no torch pin of their own
        assert not re.search(r"--(extra-)?index-url|--find-links|download\.pytorch\.org|torch==", line), line


def _pins(lines) -> set[str]:
    return {word for line in lines for word in line.split() if re.fullmatch(r"[\w.-]+==[\w.]+", word)}


def test_verl_page_installs_what_ci_installs():
    """docs/verl.md's --no-deps recipe is .ci/run's install_verl: the same pins, the same import
    check, and pip's expected warning about verl's tensordict pin said."""
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    body = ci[ci.index("install_verl() {"):]
    body = body[:body.index("\n}\n")]
    page = (ROOT / "docs" / "verl.md").read_text(encoding="utf-8")
    recipe = [code for info, code, _ in blocks(ROOT / "docs" / "verl.md") if info == "bash" and "--no-deps verl==" in code]
    assert len(recipe) == 1
    assert _pins(recipe[0].splitlines()) == _pins(body.replace("\\\n", " ").splitlines())
    checked = set(re.findall(r"import ([\w., ]+?);", body)[0].replace(" ", "").split(","))
    documented = set(re.search(r'python -c "import ([\w., ]+)"', recipe[0]).group(1).replace(" ", "").split(","))
    assert checked <= documented and "verl.utils.seqlen_balancing" in documented
    flat = " ".join(page.split())
    assert "verl 0.9.1 requires tensordict!=0.9.0,<=0.10.0,>=0.8.0, but you have tensordict" in flat and "expected" in flat


def test_declared_versions_are_setup_cfgs():
    """A page that says what setup.cfg declares quotes setup.cfg."""
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    declared = {line.strip() for line in config["options"]["install_requires"].splitlines() if line.strip()}
    claims = []
    for page in DOCS:
        flat = " ".join(page.read_text(encoding="utf-8").split())
        for sentence in re.findall(r"setup\.cfg declares.*?(?:\.\s|$)", flat):
            claims += [(page.name, spec) for spec in
                       re.findall(r"`((?:torch|tensordict|numpy)>=[\d.]+(?:,<=?[\d.]+)?)`", sentence)]
    assert claims, "no page quotes setup.cfg's requirements"
    wrong = [(name, spec) for name, spec in claims if spec not in declared]
    assert not wrong, (wrong, declared)


def test_docs_state_verls_sync_condition_as_its_code_has_it():
    """verl 0.8.0 and 0.9.1 sync the count only when ``dp_group is not None`` (0.7.0 and older
    synced over the default group with ``dp_group=None``): no page says otherwise, and where
    verl is installed its code still reads so."""
    for page in DOCS:
        flat = " ".join(page.read_text(encoding="utf-8").split())
        assert "syncs when `dp_group=None`" not in flat, page.name
    for name in ("distributed.md", "guide.md"):
        flat = " ".join((ROOT / "docs" / name).read_text(encoding="utf-8").split())
        assert "0.8.0 and 0.9.1" in flat and "dp_group is not None" in flat, name
    try:
        import verl.utils.seqlen_balancing as balancing
    except Exception:  # noqa: BLE001 - no usable verl here: the docs check above still ran
        return
    import inspect

    source = inspect.getsource(balancing.rearrange_micro_batches)
    assert re.search(r"dist\.is_initialized\(\) and same_micro_num_in_dp and dp_group is not None", source)
