"""Every command the docs/ pages show works as written, counted (issue 31 point 3).

Each command of each page (``tests/doc_commands.documented_commands``) is accounted for in one of four ways,
and the count is printed (pytest -s shows it) and checked, so a command added to a page is a command run:

- **run by its guide's test**: pages a test runs block by block for real (PAGE_TESTS), and single commands a
  named test runs on fixtures of its own (ELSEWHERE); the named test file must exist and run that command;
- **run here**, for real: in the page's order, in one folder per page, with the shell variables the page set
  above it and none of the test suite's own settings (no default spec). A bash block runs whole, as one
  ``set -e`` script, with its shell glue (a run started with ``&``, the loop that waits for it, the ``kill``);
  a transcript's ``$`` lines run one by one. ``titan-train`` is a fresh fork of the suite's warm interpreter
  (tests/warm_start.py: the imports are paid once); ``torchrun`` and the other tools are this environment's.
  A /tmp path a page chose lands in the page's folder. Each must exit as the page shows: 0, or the code of
  its ``# exits N`` mark, or 2 under an ``error:`` line; and print what the page copies under it (the ``error:``
  lines of a transcript, and every line under a command it shows failing; the lines without a number of the
  ``text`` block after a bash block, and, to the digit, those whose numbers are the same on every run
  (``SAME_ON_EVERY_RUN``: step names, a refusal's values); "..." standing for a part left out);
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
import time
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
    # one node's line: alone it waits for the other node; the test starts both agents on this machine
    ("distributed.md", "--rdzv-endpoint $HEAD_NODE:29500", "tests/test_multinode.py", '"--rdzv-backend", "c10d"'),
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
#: Copied lines whose numbers are the same on every run (a checkpoint's step, the step a resume starts from, a
#: refusal's values), checked to the digit; other lines with a number (a loss, a save's random suffix) are not.
SAME_ON_EVERY_RUN = re.compile(r"^\[checkpoint\] (saved|deleted|exported) |^\[titan\] (resuming|moved) |"
                               r"^[\w-]+: error: ")
#: What the test suite sets for itself that a reader's shell does not have.
SUITE_ONLY_ENV = ("TITAN_DEFAULT_SPEC", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT",
                  "PYTHONPATH")


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


def moved_tmp(text: str, folder: Path) -> str:
    """A /tmp path a page chose lands in the page's folder instead (runs of the suite never share one)."""
    return re.sub(r"(?<![\w.])/tmp/", f"{folder}/tmp/", text)


def shell_script(command: DocCommand, folder: Path) -> str:
    """The page's variables, then the command's whole bash block (its shell glue too), or the transcript's one
    command; ``set -e``, so that a failing line stops the script with its own exit code."""
    lines = ["set -e"]
    for assignment in command.context:
        name, _, value = assignment.partition("=")
        if value.startswith("/tmp/"):
            value = moved_tmp(value, folder)
            lines.append(f"mkdir -p {shlex.quote(value)}")
        lines.append(f"{name}={value}")
    lines.append(command.script or command.text)
    return "\n".join(lines)


def shown(line: str, output: str) -> bool:
    """A line the page shows is printed; "..." (or "…") stands for a part the page left out."""
    return all(piece.strip() in output for piece in re.split(r"\.\.\.|…", line) if piece.strip())


def block_problems(block: list[DocCommand]) -> list[str]:
    """What keeps a bash block from running as one script with one expected exit code."""
    failing = [c for c in block if c.exit_code != 0]
    if failing and failing[-1] is not block[-1] or len(failing) > 1:
        return ["only the last command of a block may fail as the page shows (set -e stops at the first failure): "
                "put a failing command in a block of its own"]
    return []


def test_every_command_of_every_docs_page_is_run_or_accounted_for(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    commands = [command for page in PAGES for command in documented_commands(page)]
    env = {k: v for k, v in os.environ.items() if k not in SUITE_ONLY_ENV}
    # titan-train is the suite's warm client (tests/warm_start.py): a fork of an interpreter that has imported
    # torch, and a real run; torchrun and the other tools are this environment's own.
    env.update(OMP_NUM_THREADS="1",
               PATH=os.pathsep.join([str(shell_titan_train().parent), str(BIN), os.environ["PATH"]]))
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    folders: dict[str, Path] = {}
    counts = {"run": 0, "guide": 0, "checked": 0, "not here": 0}
    scripts = 0
    took: list[tuple[float, str]] = []
    failed: list[str] = []
    ran_blocks: set[tuple[str, int]] = set()
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
        block: list[DocCommand] = [command]
        if command.script:  # a bash block runs once, whole, when its first command comes up
            if (command.page, command.block) in ran_blocks:
                continue
            ran_blocks.add((command.page, command.block))
            block = [c for c in commands if c.page == command.page and c.block == command.block]
            others = {accounted(c)[0] for c in block} - {"run"}
            if others:
                failed.append(f"{where}\n  its block also holds commands {others} that are not run here: "
                              f"put them in a block of their own")
                continue
            if problems := block_problems(block):
                failed.append(f"{where}\n  {problems[0]}")
                continue
        if command.page == "evaluation.md" and command.page not in folders:  # it reads the quickstart's run
            folders[command.page] = page_folder(tmp_path, command.page)
            made = subprocess.run([str(BIN / "titan-train"), "--spec", "llama3", "--llama3.n_layers=1",
                                   "--training.steps=2", "--training.seq_len=32", "--checkpoint.enable=true",
                                   "--metrics.report=false", "--job.run_dir=runs/quickstart"],
                                  cwd=folders[command.page], env=env, capture_output=True, text=True, timeout=300)
            assert made.returncode == 0, made.stderr[-2000:]
        folder = folders.get(command.page) or folders.setdefault(command.page, page_folder(tmp_path, command.page))
        scripts += 1
        started = time.monotonic()
        proc = subprocess.run(["bash", "-c", shell_script(command, folder)], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=600)
        took.append((time.monotonic() - started, where))
        output = proc.stdout + proc.stderr
        expected = block[-1].exit_code
        shows = [line for c in block for line in c.printed if "error:" in line or c.exit_code != 0]
        shows += [moved_tmp(line, folder) for line in command.copied
                  if line.strip() and (not re.search(r"\d", line) or SAME_ON_EVERY_RUN.search(line))]
        missing = [line for line in shows if not shown(line, output)]
        if proc.returncode != expected:
            failed.append(f"{where}\n  exit {proc.returncode}, the page shows {expected}:\n  {output[-1500:]}")
        elif "Traceback (most recent call last)" in output:
            failed.append(f"{where}\n  printed a traceback:\n  {output[-1500:]}")
        elif missing:
            failed.append(f"{where}\n  does not print what the page shows: {missing}\n  it printed: {output[-1500:]}")

    with capsys.disabled():
        print(f"\ndocs commands: {len(commands)} in {len(PAGES)} pages: {counts['run']} run here for real "
              f"(in {scripts} scripts: a bash block runs whole), "
              f"{counts['guide']} run by their guide's test, {counts['checked']} pip line checked against "
              f"pyproject.toml, {counts['not here']} not runnable here (GPU, cluster, server); "
              f"{len(failed)} failed; slowest scripts:")
        for seconds, slow in sorted(took, reverse=True)[:6]:
            print(f"  {seconds:6.1f} s  {slow[:150]}")
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


@pytest.mark.fast
def test_a_bash_block_runs_whole_with_its_glue_and_its_marked_exit_code() -> None:
    """The crash demo's block keeps the lines between its commands (the background run, the wait, the kill),
    its copied output comes along, and "# exits 3" sets the code; a block may fail only at its end."""
    commands = documented_commands("checkpointing.md")
    crash = next(c for c in commands if "checkpoint_pause" in c.text)
    rerun = next(c for c in commands if c.block == crash.block and c is not crash)
    assert "kill -9 $pid" in crash.script and crash.script == rerun.script
    assert any("removed the interrupted save" in line for line in crash.copied)
    nonfinite = next(c for c in commands if "fault_nonfinite" in c.text)
    assert nonfinite.exit_code == 3 and "# exits 3" in nonfinite.script
    ok = DocCommand("p.md", 1, "titan-train --x", (), 0, (), block=4, script="titan-train --x")
    refused = DocCommand("p.md", 2, "titan-train --y", (), 2, (), block=4, script="titan-train --x")
    assert block_problems([ok, refused]) == []
    assert "block of its own" in block_problems([refused, ok])[0]
    assert shown("[titan] done: 15 steps this run, final loss … (mean", "[titan] done: 15 steps this run, "
                 "final loss 6.1 (mean of the last 10 steps)")
    assert not shown("titan-train: error: spec qwen3 has no experts", "titan-train: error: spec qwen3, flavor x "
                     "has no experts")
