"""Every command the docs/ pages show works as written, counted (issue 31 point 3).

Each command of each page (``tests/doc_commands.documented_commands``) is accounted for in one of four ways,
and the count is printed (pytest -s shows it) and checked, so a command added to a page is a command run:

- **run by its guide's test**: pages a test runs block by block for real (PAGE_TESTS), and single commands a
  named test runs on fixtures of its own (ELSEWHERE); the named test file must exist and run that command;
- **run here**: in the page's order, in one folder per page, with the shell variables the page set above it
  and none of the test suite's own settings (no default spec). ``titan-train`` runs with ``--dry-run`` added
  (the config and every plugin section validate, the layout is checked, the model builds on meta and the
  converters convert; a memory plan is printed); ``torchrun ... -m titan_core`` runs as the worker torchrun
  starts for rank 0, also with ``--dry-run``; the other tools run for real. Both go to the suite's warm
  interpreter (tests/warm_start.py), which forks a fresh process per command: the imports, most of a dry run's time, are
  paid once. A command the page shows failing
  (an ``error:`` line under it, or ``# exits 2``) must exit 2 and print that line;
- **checked**: ``pip install 'titan-core[EXTRA]'`` names an extra that pyproject.toml declares;
- **not runnable here**, each with its reason (NOT_HERE): a GPU, a Slurm cluster, a server that runs until
  stopped.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from conftest import REPO, shell_titan_train
from doc_commands import DocCommand, documented_commands

BIN = Path(sys.executable).parent
PAGES = sorted(p.name for p in (REPO / "docs").glob("*.md"))

#: Pages whose every block a test runs for real, in order.
PAGE_TESTS = {
    "custom-trainer.md": "tests/test_custom_trainer.py",
    "data.md": "tests/test_data_guide.py",
    "huggingface.md": "tests/hf/test_huggingface_doc.py",
    "seeing-a-run.md": "tests/test_seeing_a_run_doc.py",
    "writing-a-converter.md": "tests/test_wheels.py",
    "writing-a-train-spec.md": "tests/test_wheels.py",
}
#: (page, a piece of the command, the test that runs it for real, a piece of that test's text that shows it).
ELSEWHERE = [
    ("fault-tolerance.md", "--fault_tolerance.local_replicas=", "tests/test_fault_tolerance_guide.py",
     "run_blocks(pairs[:2]"),
    ("distributed.md", "--target-device H100", "tests/test_memory_plan.py", '"--target-device" in command'),
    ("distributed.md", "--rehearse-rank 127", "tests/test_rehearsal.py", '"--rehearse-rank"'),
    ("evaluation.md", "bash scripts/quickstart.sh", "tests/test_readme.py", '"bash", "scripts/quickstart.sh"'),
    ("evaluation.md", "titan-lm-eval --model titan", "tests/test_lm_eval_adapter.py", '"--include_path"'),
    ("evaluation.md", "lm_eval --model titan", "tests/test_lm_eval_adapter.py", 'parent / "lm_eval"'),
    ("checkpointing.md", "titan_core.checkpoint.legacy", "tests/test_checkpoint.py", "legacy.TRUST_FLAG"),
    ("benchmarks.md", "scripts/gpu/fetch_wheels.sh", "tests/test_gpu_checks_script.py", '"fetch_wheels.sh"'),
]
#: (page, a piece of the command, why it cannot run on this machine).
NOT_HERE = [
    ("benchmarks.md", "scripts/gpu/checks.sh", "needs the GPU machine (tests/test_gpu_checks_script.py checks "
                                               "what it runs and its time budget)"),
    ("distributed.md", "srun torchrun", "a Slurm batch script for a GPU cluster"),
    ("fault-tolerance.md", "srun --nodes", "a Slurm job per replica group on a GPU cluster"),
    ("fault-tolerance.md", "torchft_lighthouse", "the cluster recipe's lighthouse, a server that runs until stopped"),
    ("distributed.md", "--flavor 70B --nnodes 8 --nproc-per-node 8 --parallelism.tp=8 --rehearse-rank 0",
     "three real steps of one 70B rank (1.1 B parameters at seq 8192): the GPU machine's job; the same path "
     "runs in tests/test_rehearsal.py on a 128-rank debugmodel layout"),
    ("observing.md", "tensorboard --logdir", "starts TensorBoard's web server, which runs until stopped"),
]
#: What the test suite sets for itself that a reader's shell does not have.
SUITE_ONLY_ENV = ("TITAN_DEFAULT_SPEC", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT",
                  "PYTHONPATH")

# titan-train as the reader's, with --dry-run added unless the command already stops before training.
TITAN_TRAIN_SHIM = """#!/bin/bash
for word in "$@"; do
  case "$word" in --dry-run|--print-config|--schema|--list|--help|-h) exec "{real}" "$@";; esac
done
exec "{real}" "$@" --dry-run
"""
# torchrun as the worker it would start for rank 0 of its world, with --dry-run.
TORCHRUN_SHIM = """import os, sys
TITAN_TRAIN = {titan_train!r}
args = sys.argv[1:]
module = args.index("-m")
options, rest = args[:module], args[module + 2:]
def option(name, default):
    return int(options[options.index(name) + 1]) if name in options else default
nproc = option("--nproc-per-node", 1)
os.environ.update(WORLD_SIZE=str(nproc * option("--nnodes", 1)), RANK="0", LOCAL_RANK="0",
                  LOCAL_WORLD_SIZE=str(nproc))
if args[module + 1] == "titan_core":  # python -m titan_core is titan-train
    os.execv(TITAN_TRAIN, [TITAN_TRAIN, *rest, "--dry-run"])
os.execv(sys.executable, [sys.executable, "-m", args[module + 1], *rest, "--dry-run"])
"""


def accounted(command: DocCommand) -> tuple[str, str]:
    """("guide", test) / ("not here", reason) / ("checked", what) / ("run", "")."""
    if command.page in PAGE_TESTS:
        return "guide", PAGE_TESTS[command.page]
    for page, piece, test, _ in ELSEWHERE:
        if page == command.page and piece in command.text:
            return "guide", test
    for page, piece, reason in NOT_HERE:
        if page == command.page and piece in command.text:
            return "not here", reason
    if command.program == "pip":
        return "checked", "extra"
    return "run", ""


def page_folder(root: Path, page: str) -> Path:
    folder = root / Path(page).stem
    folder.mkdir()
    for name in ("README.md", "tests", "examples"):  # pages run from a clone name its files and examples
        (folder / name).symlink_to(REPO / name)
    return folder


def shell_line(command: DocCommand, folder: Path) -> str:
    """The page's variables, then the command; a /tmp path a page chose lands in this folder instead."""
    lines = []
    for assignment in command.context:
        name, _, value = assignment.partition("=")
        if value.startswith("/tmp/"):
            value = str(folder / "tmp" / value.removeprefix("/tmp/"))
            lines.append(f"mkdir -p {shlex.quote(value)}")
        lines.append(f"{name}={value}")
    # A command the page starts in the background runs in the foreground here, so that its exit is seen.
    lines.append(re.sub(r"\s*&$", "", command.text))
    return "\n".join(lines)


def shown(line: str, output: str) -> bool:
    """A line the page shows is printed; "..." stands for the part the page left out."""
    return all(piece.strip() in output for piece in line.split("...") if piece.strip())


def test_every_command_of_every_docs_page_is_run_or_accounted_for(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    commands = [command for page in PAGES for command in documented_commands(page)]
    shims = tmp_path / "shims"
    shims.mkdir()
    real = shell_titan_train()
    (shims / "titan-train").write_text(TITAN_TRAIN_SHIM.format(real=real))
    # a bash launcher: a long interpreter path breaks a #! line
    (shims / "torchrun.py").write_text(TORCHRUN_SHIM.format(titan_train=str(real)))
    (shims / "torchrun").write_text(f'#!/bin/bash\nexec "{sys.executable}" "{shims / "torchrun.py"}" "$@"\n')
    for shim in shims.iterdir():
        shim.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in SUITE_ONLY_ENV}
    env.update(OMP_NUM_THREADS="1", PATH=os.pathsep.join([str(shims), str(BIN), os.environ["PATH"]]))
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    folders: dict[str, Path] = {}
    counts = {"run": 0, "guide": 0, "checked": 0, "not here": 0}
    failed: list[str] = []
    for command in commands:
        how, detail = accounted(command)
        counts[how] += 1
        where = f"docs/{command.page}:{command.line}: {command.text}"
        if how == "checked":
            named = re.findall(r"titan-core\[([\w,-]+)\]", command.text)
            if not named or not all(extra in extras for extra in named[0].split(",")):
                failed.append(f"{where}\n  names no extra of pyproject.toml ({', '.join(extras)})")
            continue
        if how != "run":
            continue
        if command.page == "evaluation.md" and command.page not in folders:  # it reads the quickstart's run
            folders[command.page] = page_folder(tmp_path, command.page)
            made = subprocess.run([str(BIN / "titan-train"), "--spec", "llama3", "--llama3.n_layers=1",
                                   "--training.steps=2", "--training.seq_len=32", "--checkpoint.enable=true",
                                   "--metrics.report=false", "--job.run_dir=runs/quickstart"],
                                  cwd=folders[command.page], env=env, capture_output=True, text=True, timeout=300)
            assert made.returncode == 0, made.stderr[-2000:]
        folder = folders.get(command.page) or folders.setdefault(command.page, page_folder(tmp_path, command.page))
        proc = subprocess.run(["bash", "-c", shell_line(command, folder)], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=600)
        output = proc.stdout + proc.stderr
        errors = [line for line in command.printed if "error:" in line]
        if proc.returncode != command.exit_code:
            failed.append(f"{where}\n  exit {proc.returncode}, the page shows {command.exit_code}:\n"
                          f"  {output[-800:]}")
        elif "Traceback (most recent call last)" in output:
            failed.append(f"{where}\n  printed a traceback:\n  {output[-800:]}")
        elif not all(shown(line, output) for line in errors):
            failed.append(f"{where}\n  does not print what the page shows: {errors}\n  it printed: {output[-800:]}")

    with capsys.disabled():
        print(f"\ndocs commands: {len(commands)} in {len(PAGES)} pages: {counts['run']} run here, "
              f"{counts['guide']} run by their guide's test, {counts['checked']} pip line checked against "
              f"pyproject.toml, {counts['not here']} not runnable here (GPU, cluster, server); "
              f"{len(failed)} failed")
    assert not failed, "\n\n".join(failed)
    assert counts["run"] >= 30 and counts["not here"] == len(NOT_HERE), counts


def test_every_command_run_elsewhere_is_run_by_the_test_named() -> None:
    """The guide tests named above exist, read their page, and run the command this test leaves to them."""
    for page, test in PAGE_TESTS.items():
        text = (REPO / test).read_text()
        assert page in text or page.removesuffix(".md") in text, (page, test)
    commands = [command for page in PAGES for command in documented_commands(page)]
    for page, piece, test, evidence in ELSEWHERE:
        assert any(c.page == page and piece in c.text for c in commands), f"docs/{page} no longer shows {piece!r}"
        assert evidence in (REPO / test).read_text(), (test, evidence)
    for page, piece, _ in NOT_HERE:
        assert any(c.page == page and piece in c.text for c in commands), f"docs/{page} no longer shows {piece!r}"


@pytest.mark.fast
def test_every_extra_the_docs_and_the_readme_name_is_declared() -> None:
    """``pip install 'titan-core[EXTRA]'`` anywhere in the README or docs/, prose included, names an extra of
    pyproject.toml (an undeclared one installs nothing and pip only warns)."""
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    named = {(path.name, extra) for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
             for group in re.findall(r"titan-core\[([\w,-]+)\]", path.read_text()) for extra in group.split(",")}
    assert len(named) >= 6, named
    assert {(page, extra) for page, extra in named if extra not in extras} == set(), sorted(extras)


@pytest.mark.fast
def test_commands_are_read_from_every_kind_of_block() -> None:
    """Bash lines with continuations and page variables, console prompts, and plain-block transcripts."""
    checkpointing = documented_commands("checkpointing.md")
    assert checkpointing[0].text == "titan-train $F --job.run_dir=$RUN/demo"
    assert checkpointing[0].context[0] == "RUN=/tmp/titan-ckpt-doc" and checkpointing[0].exit_code == 0
    refusals = [c for c in documented_commands("distributed.md") if c.exit_code == 2 and c.printed]
    assert len(refusals) >= 8 and all(c.printed[0].startswith("titan-train: error:") for c in refusals)
    assert any(c.text.endswith("--dry-run --target-device H100") and c.exit_code == 2
               for c in documented_commands("distributed.md"))  # "# exits 2"
    evaluation = [c.text for c in documented_commands("evaluation.md")]
    assert "titan-eval runs/quickstart --tasks builtin --output eval.json" in evaluation
