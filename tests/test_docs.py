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
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]  # their snippets too
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
    """The CPU-torch line reaches PyTorch's own index; docs/index.md (linked from the README) says
    what works where only the package index is mirrored, and the two commands reach nothing else."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "docs/index.md#installing-torch" in text
    flat = " ".join((ROOT / "docs" / "index.md").read_text(encoding="utf-8").split())
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


# --- A first read: the README's shape, install lines that work, no work history, versions CI tests.

README_MOST_LINES = 120
#: README lines that CI does not run, and why (each sits in a block marked ``no-run``).
README_NOT_RUN = {
    "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu":
        "reaches PyTorch's own index, which CI does not; CI installs the same CPU build from a local wheel",
}


def test_readme_is_short_and_repeats_no_line():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MOST_LINES, f"README.md has {len(lines)} lines, at most {README_MOST_LINES}"
    seen: dict[str, int] = {}
    repeated = []
    for number, line in enumerate(lines, 1):
        key = line.strip()
        if not key or key.startswith("```") or re.fullmatch(r"\|[-| ]*\|", key):
            continue
        if key in seen:
            repeated.append(f"README.md:{number} repeats line {seen[key]}: {key}")
        seen.setdefault(key, number)
    assert not repeated, repeated


def _ci_lines() -> list[str]:
    """.ci/run's commands: continuation lines joined, comments dropped."""
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8").replace("\\\n", " ")
    return [line.split(" #")[0].strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def test_every_readme_block_is_run_or_marked_and_explained():
    """Python blocks run here (test_snippets_run, never ``no-run``); every shell line of the README
    is a ``seqbal`` command run here, or a command .ci/run runs exactly as written, or stands in a
    ``no-run`` block with its reason in ``README_NOT_RUN``."""
    ci = set(_ci_lines())
    problems = []
    for info, code, line in blocks(ROOT / "README.md"):
        words = info.split()
        if words[:1] == ["python"]:
            if "no-run" in words:
                problems.append(f"README.md:{line}: a python block that does not run")
            continue
        for command in code.splitlines():
            command = command.split(" #")[0].strip()
            if not command or command.startswith("seqbal "):
                continue
            if "no-run" in words:
                if command not in README_NOT_RUN:
                    problems.append(f"README.md:{line}: `{command}` is marked no-run without a reason")
            elif command not in ci and f"{command} || exit 1" not in ci:
                problems.append(f"README.md:{line}: `{command}` is not what .ci/run runs")
    assert not problems, problems


def _extras() -> dict[str, list[str]]:
    import configparser

    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return {name: [r.strip() for r in value.splitlines() if r.strip()]
            for name, value in config["options.extras_require"].items()}


def _ci_versions(homes: bool = False) -> dict[str, set[str]]:
    """Every version .ci/run installs, by package (lower case): make_venv's torch and tensordict,
    ``name==version`` pins, and what the extras it installs resolve to (their ``==`` pin, else the
    top of their range, unless the same line pins that package itself). tensordict's "newest"
    stands for an environment whose make_venv names none. With ``homes``, only the pins of
    ``--no-deps`` lines (the homes themselves; the other pins are their dependencies, such as
    axolotl's own TRL) besides torch, tensordict and the extras."""
    extras = _extras()
    found: dict[str, set[str]] = {}

    def add(name: str, version: str) -> None:
        found.setdefault(name.lower().replace("_", "-"), set()).add(version)

    for line in _ci_lines():
        venv = re.match(r"make_venv\s+\S+\s+([\d.]+)(?:\s+([\d.]+))?$", line)
        if venv:
            add("torch", venv.group(1))
            add("tensordict", venv.group(2) or "newest")
            continue
        pinned = {}
        for name, version in re.findall(r"""(?<![\w.-])["']?([A-Za-z][\w.-]*)==([\w.]+)""", line):
            pinned[name.lower().replace("_", "-")] = version
            if not homes or "--no-deps" in line.split() or name in ("torch", "tensordict"):
                add(name, version)
        for chosen in re.findall(r"""-e\s+["']?\.\[([\w,-]+)\]""", line):
            for extra in chosen.split(","):
                for requirement in extras.get(extra, []):
                    name, spec = re.match(r"([A-Za-z][\w.-]*)(.*)", requirement).groups()
                    version = re.search(r"(?:==|<=)([\w.]+)", spec)
                    if version and name.lower().replace("_", "-") not in pinned:
                        add(name, version.group(1))
    return found


#: A home's name in the README's table and its package's name.
HOMES = {"verl": "verl", "OpenRLHF": "openrlhf", "AReaL": "areal", "torchtitan": "torchtitan", "TRL": "trl",
         "LLaMA-Factory": "llamafactory", "axolotl": "axolotl", "TransferQueue": "transferqueue"}
VERSION = r"(?:\d+\.\d+(?:\.\d+)?|newest)"


def _readme_versions() -> dict[str, set[str]]:
    """(name -> versions) of the README's table of homes, from its "tested with" column."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    table = text[text.index("## Homes"):]
    table = table[:table.index("\n## ")]
    found: dict[str, set[str]] = {}
    for row in re.findall(r"^\|(.*)\|$", table, re.M):
        cells = [c.strip() for c in row.split("|")]
        if len(cells) < 2 or cells[0] in ("trainer", "") or set(cells[0]) <= set("-"):
            continue
        for name, versions in re.findall(rf"([A-Za-z][\w-]*) ({VERSION}(?:, {VERSION})*)", cells[1]):
            found.setdefault(name, set()).update(v.strip() for v in versions.split(","))
    return found


def test_the_table_of_homes_gives_the_versions_ci_installs():
    """Every home, torch, tensordict and Python in the README's table, with exactly the versions
    .ci/run installs (a change of pins there changes the table)."""
    import sys

    table, ci = _readme_versions(), _ci_versions(homes=True)
    assert {"Python", "torch", "tensordict"} <= set(table) and set(HOMES) <= set(table), sorted(table)
    wrong = []
    for name in ("torch", "tensordict"):
        if table[name] != ci[name]:
            wrong.append(f"{name}: the table says {sorted(table[name])}, .ci/run installs {sorted(ci[name])}")
    for home, package in HOMES.items():
        if table[home] != ci.get(package, set()):
            wrong.append(f"{home}: the table says {sorted(table[home])}, .ci/run installs {sorted(ci.get(package, set()))}")
    # TRL's row names the transformers versions its environments install.
    if table.get("transformers") != _trl_transformers():
        wrong.append(f"transformers: the table says {sorted(table.get('transformers', ()))}, "
                     f"the TRL environments install {sorted(_trl_transformers())}")
    # Python: the interpreter every `python3 -m venv` environment has, and any named one.
    script = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    pythons = set(re.findall(r"\bpython ?(3\.\d+)\b", "\n".join(_ci_lines())))
    if re.search(r"python3 -m venv", script):
        pythons.add(f"{sys.version_info.major}.{sys.version_info.minor}")
    if table["Python"] != pythons:
        wrong.append(f"Python: the table says {sorted(table['Python'])}, .ci/run uses {sorted(pythons)}")
    assert not wrong, wrong


def _trl_transformers() -> set[str]:
    """The transformers versions of .ci/run's environments that install the ``trl`` extra."""
    versions = set()
    for line in _ci_lines():
        if re.search(r"""-e\s+["']?\.\[[\w,-]*\btrl\b""", line):
            pin = re.search(r"transformers==([\w.]+)", line)
            top = [re.search(r"<=([\w.]+)", r).group(1) for r in _extras()["trl"] if r.startswith("transformers")]
            versions.add(pin.group(1) if pin else top[0])
    return versions


def _install_commands(text: str) -> list[str]:
    """Every ``pip install ...`` of a page: the lines of its code blocks, and its inline code spans
    (which may wrap); cut at a comment, ``&&`` or ``;``."""
    spans = []
    for block in FENCE.finditer(text):
        spans += block.group(2).splitlines()
    prose = FENCE.sub("", text)
    spans += [" ".join(span.split()) for span in re.findall(r"`([^`]*)`", prose)]
    found = []
    for span in spans:
        if "pip install" in span:
            command = span[span.index("pip install"):]
            found.append(re.split(r"\s+#|\s*&&|\s*;", command)[0].strip())
    return found


PYTORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
INSTALL_PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]


def _install_problems(command: str, extras: dict[str, list[str]], ci: dict[str, set[str]]) -> list[str]:
    """What makes one ``pip install`` line fail from a checkout: seqbal named from the index (it is
    not there yet), an extra setup.cfg does not define, a local path that is not a project, a
    pinned version .ci/run never installs, an index other than PyTorch's CPU one."""
    import shlex

    try:
        words = shlex.split(command)[2:]
    except ValueError:
        return [f"`{command}`: unbalanced quotes"]
    problems = []
    no_index = "--no-index" in words
    skip = False
    for i, word in enumerate(words):
        if skip:
            skip = False
            continue
        if word in ("--index-url", "-i", "--extra-index-url"):
            url = words[i + 1] if i + 1 < len(words) else ""
            if url != PYTORCH_CPU_INDEX:
                problems.append(f"`{command}`: an index other than PyTorch's CPU wheels ({url})")
            skip = True
        elif word in ("--find-links", "-f"):
            if not no_index:
                problems.append(f"`{command}`: --find-links without --no-index")
            skip = True
        elif word.startswith("-"):
            continue
        elif word.startswith(".") or word.startswith("/"):
            path, _, chosen = word.partition("[")
            if not (ROOT / path / "setup.cfg").exists():
                problems.append(f"`{command}`: {path} is not a checkout of seqbal")
            for extra in filter(None, chosen.rstrip("]").split(",")):
                if extra not in extras:
                    problems.append(f"`{command}`: setup.cfg defines no extra {extra!r} ({sorted(extras)})")
        else:
            name = re.match(r"[A-Za-z0-9][\w.-]*", word)
            if name is None:
                continue
            package = name.group(0).lower().replace("_", "-")
            if package == "seqbal":
                problems.append(f"`{command}`: seqbal is not on the package index; install from the checkout")
            pin = re.search(r"==([\w.+]+)$", word)
            if pin and pin.group(1) not in ci.get(package, set()):
                problems.append(f"`{command}`: {package}=={pin.group(1)} is not a version .ci/run installs "
                                f"({sorted(ci.get(package, set()))})")
    return problems


def test_every_install_line_works_from_a_checkout():
    """Every ``pip install`` a page shows names an extra setup.cfg defines, a route that exists
    (the checkout, PyTorch's CPU index, a local wheel directory) and versions CI installs; none
    names seqbal from the package index, where it is not yet. The messages of the package, the
    examples and the benchmarks say no ``pip install seqbal...`` either."""
    extras, ci = _extras(), _ci_versions()
    problems, checked = [], 0
    for page in INSTALL_PAGES:
        for command in _install_commands(page.read_text(encoding="utf-8")):
            problems += [f"{page.name}: {p}" for p in _install_problems(command, extras, ci)]
            checked += 1
    from_index = re.compile(r"""pip install\s+(?:-\S+\s+)*["']?seqbal\b""")
    for path in sorted(p for folder in ("seqbal", "examples", "benchmarks") for p in (ROOT / folder).rglob("*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if from_index.search(line):
                problems.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert checked >= 10
    assert not problems, problems
    # The rule itself: these fail, these pass.
    assert _install_problems("pip install 'seqbal[plot]'", extras, ci)
    assert _install_problems('pip install -e ".[nosuchextra]"', extras, ci)
    assert _install_problems("pip install torch==0.0.1", extras, ci)
    assert not _install_problems('pip install -e ".[plot]"', extras, ci)


#: Work history, which product docs do not tell: what a session, an issue or "our test" found,
#: and a limit told as a story ("has not yet run on a GPU" is "not yet measured on a GPU").
HISTORY = [
    r"\bnot yet run\b",
    r"\bearlier release",
    r"(?<!Python )(?<!test )\bsessions?\b",
    r"(?<!'s )(?<!its )\bissues?\b",
    r"\bfound on the way\b",
    r"\bour (?:own )?(?:tests?|data|runs?|machine|benchmarks?)\b",
    r"\bwe\b",
    r"\bends blocked\b",
    r"\bstop \d+",
    r"\bprevious release",
    r"\bthis round\b",
    r"(?<!no )\b(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|\d+(?:st|nd|rd|th)) rounds?\b",
]
HISTORY_PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md", ROOT / "CONTRIBUTING.md"]


@pytest.mark.parametrize("page", HISTORY_PAGES, ids=[p.name for p in HISTORY_PAGES])
def test_no_work_history_in_the_docs(page):
    """The docs speak of the product and its measured behaviour; what is not yet verified is a
    limit, never the story of how the work went."""
    text = page.read_text(encoding="utf-8")
    found = [f"{page.name}:{text.count(chr(10), 0, m.start()) + 1}: {m.group(0)!r}"
             for pattern in HISTORY for m in re.finditer(pattern, text, re.I)]
    assert not found, found
    assert re.search(HISTORY[0], "has not yet run on a GPU") and not re.search(HISTORY[0], "not yet measured on a GPU")
    assert re.search(HISTORY[3], "so the issue ends blocked") and not re.search(HISTORY[3], "prime-rl's issue #2562")
    assert re.search(HISTORY[-1], "A fourth round measured") and re.search(HISTORY[-1], "the 3rd round")
    assert not re.search(HISTORY[-1], "the worst round") and not re.search(HISTORY[-1], "so no second round is needed")


def _needs(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


@pytest.mark.skipif(not _needs("transfer_queue"), reason="TransferQueue is not installed (.ci/run's TransferQueue environment has it)")
def test_transfer_queue_page_runs_as_written():
    """docs/transfer_queue.md's start-up block (``needs-transfer-queue``; test_snippets_run only
    compiles it), as written, in a fresh interpreter: it starts Ray and TransferQueue on this
    one CPU machine, reads a batch on 2 ranks, and shows a group over the cap raising."""
    import os
    import sys

    from .deadline import run_with_deadline

    found = [(code, line) for info, code, line in blocks(ROOT / "docs" / "transfer_queue.md")
             if "needs-transfer-queue" in info.split()]
    assert len(found) == 1
    code, line = found[0]
    done = run_with_deadline([sys.executable, "-c", code], deadline_s=300, cwd=str(ROOT),
                             env=dict(os.environ, PYTHONPATH=str(ROOT)),
                             what=f"docs/transfer_queue.md:{line}")
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "batch 0:" in done.stdout and "batch 1: group exceeds max_token_len" in done.stdout, done.stdout


def _ci_section(number: int) -> str:
    """The text of .ci/run's section ``number`` (from ``# N.`` to the next section)."""
    text = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    start = re.search(rf"^# {number}\. ", text, re.M).start()
    end = re.search(rf"^# {number + 1}\. ", text, re.M)
    return text[start:end.start() if end else len(text)]


@pytest.mark.parametrize("page, marker, section", [("transfer_queue.md", "--no-deps TransferQueue==", 6),
                                                   ("llamafactory.md", "--no-deps llamafactory==", 8)])
def test_a_homes_page_installs_what_its_ci_environment_installs(page, marker, section):
    """The page's install lines are its .ci/run environment's pins, no more, no fewer."""
    recipe = [code for info, code, _ in blocks(ROOT / "docs" / page) if info.split()[:1] == ["bash"] and marker in code]
    assert len(recipe) == 1, page
    text = _ci_section(section).replace("\\\n", " ")
    ci = _pins(line.replace('"', "") for line in text.splitlines() if not line.lstrip().startswith("#"))
    assert marker.split()[-1] in " ".join(ci)
    assert _pins(recipe[0].splitlines()) == ci, (_pins(recipe[0].splitlines()), ci)


def test_ci_turns_axolotls_telemetry_off_as_the_page_says():
    """docs/axolotl.md's ``export AXOLOTL_DO_NOT_TRACK=1`` is a line of .ci/run's axolotl section,
    before its tests run."""
    page = [line.split(" #")[0].strip() for info, code, _ in blocks(ROOT / "docs" / "axolotl.md")
            if info.split()[:1] == ["bash"] for line in code.splitlines()]
    assert "export AXOLOTL_DO_NOT_TRACK=1" in page
    section = _ci_section(7)
    assert section.index("\nexport AXOLOTL_DO_NOT_TRACK=1\n") < section.index("tests/test_axolotl.py")
