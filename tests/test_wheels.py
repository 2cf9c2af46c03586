"""The four distributions as real wheels in a fresh venv, plus on-the-fly plugin packages.

This catches what editable installs hide: entry points and package data that only
work from a source checkout.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import warm_start
from one_process import run_in_one_process
from packaging.requirements import Requirement
from warm_start import WarmStart

from conftest import REPO, Wheels, run_ok

DISTS = [REPO, REPO / "plugins/titan-llama", REPO / "plugins/titan-qwen3", REPO / "plugins/titan-deepseek",
         REPO / "plugins/titan-float8", REPO / "plugins/titan-mx-prototype"]


def _package(root: Path, dist: str, module: str, entry: str, body: str) -> Path:
    """Write a tiny plugin distribution with one titan.model_converters entry point."""
    pkg = root / dist
    (pkg / "src" / module).mkdir(parents=True)
    (pkg / "src" / module / "__init__.py").write_text(textwrap.dedent(body))
    (pkg / "pyproject.toml").write_text(textwrap.dedent(f"""
        [build-system]
        requires = ["hatchling"]
        build-backend = "hatchling.build"
        [project]
        name = "{dist}"
        version = "0.0.1"
        dependencies = ["titan-core"]
        [project.entry-points."titan.model_converters"]
        {entry}
        [tool.hatch.build.targets.wheel]
        packages = ["src/{module}"]
    """))
    return pkg


GOOD_BODY = """
    from titan_core import ModelConverter
    class Renamer(ModelConverter):
        plugin_api_version = "1.0"
        def select(self, model):
            return ["output"]
        def convert(self, model, fqns):
            return None
"""


# Two installed converters that each supply tensor-parallel styles (for attention and feed-forward linears).
STYLED_BODY = """
    from titan_core import ModelConverter, TensorParallelStyles
    class StyledA(ModelConverter):
        plugin_api_version = "1.0"
        part = ".attention."
        def tensor_parallel_styles(self):
            return TensorParallelStyles.default()
        def select(self, model):
            return [n for n, _ in model.named_modules() if self.part in n and n.endswith(("wq", "w1"))]
        def convert(self, model, fqns):
            for fqn in fqns:
                model.get_submodule(fqn).register_forward_pre_hook(lambda module, args: None)
    class StyledB(StyledA):
        part = ".feed_forward."
"""


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory, wheels: Wheels) -> Path:
    root = tmp_path_factory.mktemp("wheels")
    dist = root / "dist"
    extra = [
        _package(root, "titan-newconv", "titan_newconv", 'newconv = "titan_newconv:Renamer"', GOOD_BODY),
        _package(root, "titan-brokenconv", "titan_brokenconv", 'broken = "titan_brokenconv:Conv"',
                 "raise ImportError('simulated: this plugin needs libfoo')\n"),
        _package(root, "titan-clash-a", "titan_clash_a", 'twin = "titan_clash_a:Renamer"', GOOD_BODY),
        _package(root, "titan-clash-b", "titan_clash_b", 'twin = "titan_clash_b:Renamer"', GOOD_BODY),
        _package(root, "titan-styled", "titan_styled", 'styled_a = "titan_styled:StyledA"\n        styled_b = "titan_styled:StyledB"',
                 STYLED_BODY),
    ]
    dist.mkdir()
    for src in DISTS + extra:  # the session's wheels: each source is built once per test run
        shutil.copy(wheels.wheel(src), dist)
    venv = root / "venv"
    run_ok([sys.executable, "-m", "venv", str(venv)])
    # torch comes first, as the README says, and it is this interpreter's own, already byte-compiled: a folder of
    # links to torch and the distributions it needs, on the venv's path through a .pth file. pip sees torch
    # installed and installs everything else the wheels declare, as on a user's machine. (Installing torch here
    # took about a minute of CI; without its byte-compiling, every command in the venv compiled it again.)
    _link_torch(venv, root / "torch-only")
    pip = [str(venv / "bin/python"), "-m", "pip", "install", "-q"]
    run_ok(pip + sorted(str(w) for w in dist.glob("*.whl")), timeout=900)
    return venv


def _requirement_closure(name: str) -> list[importlib.metadata.Distribution]:
    """``name``'s distribution and every one its requirements (with markers true here) need, installed here."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = [name]
    while todo:
        requirement = Requirement(todo.pop())
        key = requirement.name.lower().replace("_", "-")
        if key in found or (requirement.marker is not None and not requirement.marker.evaluate({"extra": ""})):
            continue
        found[key] = importlib.metadata.distribution(requirement.name)
        todo.extend(found[key].requires or [])
    return list(found.values())


def _link_torch(venv: Path, folder: Path) -> None:
    folder.mkdir()
    for dist in _requirement_closure("torch"):
        tops = {Path(str(file)).parts[0] for file in dist.files or [] if not str(file).startswith("..")}
        for top in tops:
            source = Path(str(dist.locate_file(top)))
            if source.exists() and not (folder / top).exists():
                (folder / top).symlink_to(source)
    [site] = (venv / "lib").glob("python*/site-packages")
    (site / "torch-from-parent.pth").write_text(f"{folder}\n")


def _titan(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(venv / "bin/titan-train"), *args], capture_output=True, text=True, env=env,
                          cwd=venv.parent, timeout=600)


@pytest.mark.slow
def test_list_from_installed_wheels(fresh_venv: Path) -> None:
    result = _titan(fresh_venv, "--list")
    assert result.returncode == 0, result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.startswith("  ")}
    assert "titan-llama 0.1.0" in lines["llama3"] and "plugin API 1.1" in lines["llama3"]
    assert "titan-qwen3 0.1.0" in lines["qwen3"] and "plugin API 1.3" in lines["qwen3"]
    assert "titan-deepseek 0.1.0" in lines["deepseek_v3"] and "plugin API 1.2" in lines["deepseek_v3"]
    assert "titan-float8 0.1.0" in lines["float8"] and "[prototype]" not in lines["float8"]
    assert "titan-mx-prototype 0.1.0" in lines["mx"] and lines["mx"].rstrip().endswith("[prototype]")
    assert "titan-newconv 0.0.1" in lines["newconv"]
    assert "BROKEN" in lines["broken"] and "simulated: this plugin needs libfoo" in lines["broken"]
    assert "CLASH" in lines["twin"] and "titan-clash-a" in lines["twin"] and "titan-clash-b" in lines["twin"]
    # the wheels really were used: titan_core comes from the venv, not this checkout
    where = subprocess.run([str(fresh_venv / "bin/python"), "-c", "import titan_core; print(titan_core.__file__)"],
                           capture_output=True, text=True, cwd=fresh_venv.parent)
    assert str(fresh_venv) in where.stdout


@pytest.mark.slow
def test_requested_plugins_from_wheels(fresh_venv: Path) -> None:
    # titan-train's main (the console script's target; test_list_from_installed_wheels runs the script itself)
    # for each case in turn in one process of the venv's python: one start-up, not five.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    fine, ok, broken, clash, both = run_in_one_process([
        # a broken plugin that is not requested never stops a run (first: nothing was loaded before it)
        ("--print-config", "--converters", "newconv"),
        ("--dry-run", "--converters", "float8,mx"),
        ("--print-config", "--converters", "broken"),
        ("--print-config", "--converters", "twin"),
        # Two installed converters supplying TP styles: refused by the launcher, before any worker starts.
        ("--converters", "styled_a,styled_b", "--nproc-per-node", "2", "--parallelism.tp=2", "--training.steps=1",
         "--job.run_dir=styled-run"),
    ], module="titan_core.commands.titan_train", env=env, cwd=fresh_venv.parent, timeout=600,
        python=str(fresh_venv / "bin/python"))
    assert fine.returncode == 0, fine.stderr
    assert ok.returncode == 0, ok.stderr
    assert "float8" in ok.stdout and "mx" in ok.stdout
    assert broken.returncode == 2
    assert "titan-brokenconv 0.0.1" in broken.stderr and "simulated: this plugin needs libfoo" in broken.stderr
    assert "Traceback" not in broken.stderr
    assert clash.returncode == 2 and "titan-clash-a" in clash.stderr and "titan-clash-b" in clash.stderr
    assert both.returncode == 2 and "Traceback" not in both.stderr and "[rank" not in both.stderr, both.stderr
    assert "converters styled_a, styled_b each supply their own tensor-parallel styles" in both.stderr
    assert not (fresh_venv.parent / "styled-run").exists()


@pytest.mark.slow
def test_builtin_tokenizer_and_corpus_ship_in_the_wheel(fresh_venv: Path) -> None:
    code = ("from titan_core.plan.tokenizer import build_tokenizer; print(build_tokenizer('builtin').vocab_size); "
            "from titan_core.data.corpus import builtin_documents, SNAPSHOT_PATH; "
            "print(len(builtin_documents()), SNAPSHOT_PATH)")
    out = subprocess.run([str(fresh_venv / "bin/python"), "-c", code], capture_output=True, text=True, cwd=fresh_venv.parent)
    assert out.returncode == 0, out.stderr
    vocab, corpus = out.stdout.split("\n")[:2]
    assert vocab == "2048"
    # the corpus snapshot is package data of the installed wheel, not read from this checkout
    n_docs, path = corpus.split(" ", 1)
    assert n_docs == "218" and path.startswith(str(fresh_venv)), out.stdout


# ---- the plugin guides, command by command, in the fresh venv ----------------------------------------
GUIDES = [REPO / "docs/writing-a-converter.md", REPO / "docs/writing-a-train-spec.md"]
#: Guide commands that show an error: the exit code and a piece of the message they print.
EXPECTED_ERRORS = {
    "PYTHONPATH=tmp/site titan-train --spec llama3 --converters int8fake --int8fake.bitz=4 --dry-run": 'Did you mean "bits"',
    "PYTHONPATH=tmp/site titan-train --spec llama3 --converters int8fake,float8 --dry-run": 'converter "int8fake" was requested but has no module left',
    "titan-train --spec tinygpt --nproc-per-node 3 --parallelism.tp=3": "parallelism.tp=3 does not divide tinygpt n_heads=4",
}

#: Guide commands whose whole transcript is the same on every run (the plugins listed with their versions and
#: plugin APIs, a refusal that counts the modules it selected): every line shown under them is printed, digits
#: included.
EXACT_TRANSCRIPTS = (
    "PYTHONPATH=tmp/site titan-train --list",
    "PYTHONPATH=tmp/site titan-train --spec llama3 --converters int8fake,float8 --dry-run",
)


def transcript(guide: Path, command: str) -> list[str]:
    """The lines a console block of the guide shows under ``$ command``."""
    for body in re.findall(r"```console\n(.*?)```", guide.read_text(), flags=re.S):
        parts = re.split(r"^\$ (.*)\n", body, flags=re.M)  # ["", command, its lines, command, its lines, ...]
        for shown, lines in zip(parts[1::2], parts[2::2], strict=True):
            if shown.strip() == command:
                return [line for line in lines.splitlines() if line.strip()]
    raise AssertionError(f"{guide.name} shows no transcript of {command}")


#: Commands the guides' prose names inline (in backticks); each is run after the guide's code blocks.
INLINE_RUN = {
    "titan-train --help",
    "PYTHONPATH=tmp/site titan-train --spec llama3 --converters int8fake --schema",
    "titan-train --spec tinygpt --schema",
    "python -m pip install -e examples/titan-tinygpt",
}
#: Inline patterns with a placeholder (NAME, <name>, yourmodule, ...) or a bare program name: not runnable as written.
INLINE_PATTERNS = {
    "titan-train --converters NAME", "titan-plugin new", "titan-plugin check", "titan-plugin check NAME",
    "titan-train --list", "titan-train --import yourmodule --converters name",
    "titan-train --spec <name>", "titan-train --import mypkg.mymodule",
    "titan-train --spec tinygpt", "titan-convert",
}


def inline_commands(guide: Path) -> set[str]:
    """Backticked commands in a guide's prose (outside code blocks)."""
    prose = re.sub(r"```.*?```", "", guide.read_text(), flags=re.S)
    return set(re.findall(r"`((?:PYTHONPATH=\S+ )?(?:titan-(?:train|plugin|convert)|pip|python -m)\b[^`]*)`", prose))


def guide_commands(guide: Path) -> list[str]:
    """Every command of a guide: the lines of its bash blocks, and the "$ " lines of its console blocks."""
    commands = []
    for lang, body in re.findall(r"```(bash|console)\n(.*?)```", guide.read_text(), flags=re.S):
        for line in body.splitlines():
            if lang == "bash" and line.strip() and not line.startswith("#"):
                commands.append(line.strip())
            elif lang == "console" and line.startswith("$ "):
                commands.append(line[2:].strip())
    return commands


def _in_venv(venv: Path, cwd: Path, command: str, warm: WarmStart | None = None) -> subprocess.CompletedProcess[str]:
    """``command`` in a shell of the venv; with ``warm``, its ``titan-train`` is a fork of that warm interpreter."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    path = os.pathsep.join([*([str(warm.bin)] if warm else []), str(venv / "bin"), env["PATH"]])
    env.update(PATH=path, VIRTUAL_ENV=str(venv), OMP_NUM_THREADS="1")
    if warm:  # a guide's `titan-train --nproc-per-node 2`: its workers start warm too
        env[warm_start.WORKERS_ENV] = "1"
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, cwd=cwd, timeout=900)


@pytest.mark.slow
def test_every_command_of_the_plugin_guides_runs_in_a_fresh_venv(fresh_venv: Path, tmp_path: Path) -> None:
    """Includes `titan-plugin new` + `pip install` + `titan-plugin check --fast` for both kinds."""
    (tmp_path / "examples").symlink_to(REPO / "examples")
    assert _in_venv(fresh_venv, tmp_path, "python -m pip install -q pytest hatchling").returncode == 0
    # The converter guide's unit-test file, which its pytest command runs.
    body = re.search(r'```python\n("""The converter\'s selection and numbers.*?)```',
                     GUIDES[0].read_text(), flags=re.S)
    assert body is not None
    (tmp_path / "tmp/mytests").mkdir(parents=True)
    (tmp_path / "tmp/mytests/test_my_converter.py").write_text(body.group(1))
    # The guides use their example from section 5 on and install it in section 8: install both first.
    for setup in ("pip install -q examples/titan-tinygpt",
                  "python -m pip wheel -q --no-deps --no-build-isolation -w tmp examples/titan-int8-fake",
                  "python -m pip install -q --no-deps --target tmp/site tmp/titan_int8_fake-0.1.0-py3-none-any.whl"):
        done = _in_venv(fresh_venv, tmp_path, setup)
        assert done.returncode == 0, done.stderr
    ran = []
    # The guides' titan-train commands (about thirty, most of each one's time importing torch and the core)
    # run in fresh forks of one warm interpreter of the venv; every other command is a process of its own.
    with contextlib.ExitStack() as stack:
        warm = stack.enter_context(WarmStart(tmp_path / "warm", python=str(fresh_venv / "bin/python"))) \
            if warm_start.enabled() else None
        for guide in GUIDES:
            for command in guide_commands(guide):
                proc = _in_venv(fresh_venv, tmp_path, command, warm)
                expected = EXPECTED_ERRORS.get(command)
                if expected is None:
                    assert proc.returncode == 0, f"{guide.name}: {command}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
                else:
                    assert proc.returncode == 2 and expected in proc.stderr, f"{command}\n{proc.stderr[-2000:]}"
                if command in EXACT_TRANSCRIPTS:
                    missing = [line for line in transcript(guide, command) if line not in proc.stdout + proc.stderr]
                    assert not missing, f"{guide.name}: {command} does not print {missing}:\n{proc.stdout}{proc.stderr}"
                ran.append(command)
        assert "titan-plugin check myconv --fast" in ran and "titan-plugin check mymodel --fast" in ran
        assert set(EXPECTED_ERRORS) <= set(ran) and set(EXACT_TRANSCRIPTS) <= set(ran)
        # Every command named in the prose is run here, or is a pattern with a placeholder (or run above).
        inline = set().union(*(inline_commands(g) for g in GUIDES))
        assert inline - set(ran) - INLINE_PATTERNS == INLINE_RUN and INLINE_PATTERNS <= inline, inline - set(ran)
        for command in sorted(INLINE_RUN):
            proc = _in_venv(fresh_venv, tmp_path, command, warm)
            assert proc.returncode == 0 and "Traceback" not in proc.stderr, \
                f"{command}\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"

    # The three plugins of this repository through the quick checks (the examples had theirs: tinygpt by the
    # spec guide's command above, int8fake by its own pytest class in test_conformance_kit.py), and every
    # check on the scaffolded spec.
    three = _in_venv(fresh_venv, tmp_path, "titan-plugin check llama3 float8 mx --fast")
    assert three.returncode == 0, three.stdout + three.stderr[-3000:]
    assert three.stdout.count("\ncheck ") == 3 and "FAIL" not in three.stdout, three.stdout
    full = _in_venv(fresh_venv, tmp_path, "titan-plugin check mymodel")
    assert full.returncode == 0, full.stdout + full.stderr[-3000:]
    for check in ("FSDP2 x2 = 1 process", "TP 2 = 1 process", "CP 2 = 1 process", "resume bit-exact",
                  "init identical across layouts"):
        assert re.search(rf"^{re.escape(check)}\s+pass\s", full.stdout, flags=re.M), full.stdout
