"""Shared test helpers: run the real CLI in a subprocess or in-process."""

from __future__ import annotations

import atexit
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import warm_start
from warm_start import WarmStart

REPO = Path(__file__).resolve().parents[1]
# This checkout installs two specs (llama3, qwen3); commands that name none mean llama3, in this
# process and in every titan process the tests start (they inherit the environment).
os.environ.setdefault("TITAN_DEFAULT_SPEC", "llama3")
# Before anything loads torch (its OpenMP runtime reads this once, when loaded): the suite runs two test
# files at a time on two cores and most tests start more processes, so the machine is oversubscribed.
# OpenMP's default lets a waiting thread spin, which then only burns the core another process needs;
# passive threads sleep. Numbers are unchanged: the same threads do the same work.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


@dataclass(frozen=True)
class CliResult:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + self.err


_WARM: WarmStart | None = None


def titan_command(*args: str) -> list[str]:
    """What to start for ``python -m titan_core ARGS``: a client of this test process's warm interpreter
    (tests/warm_start.py: the command runs in a fresh fork of an interpreter that has imported torch and the
    core already), or, with TITAN_TEST_WARM=0, the cold command itself."""
    warm = _warm()
    return warm.command(list(args)) if warm else [sys.executable, "-m", "titan_core", *args]


def warm_path() -> list[str]:
    """Folders to put first on PATH so that a shell's ``titan-train`` starts warm (none with TITAN_TEST_WARM=0)."""
    warm = _warm()
    return [str(warm.bin)] if warm else []


def shell_titan_train() -> Path:
    """The ``titan-train`` a test's shell should run: the warm client, or this interpreter's console script."""
    return Path((warm_path() or [str(Path(sys.executable).parent)])[0]) / "titan-train"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for a store, a rendezvous or torchrun's master)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _warm() -> WarmStart | None:
    """This test process's warm interpreter, started on first use."""
    global _WARM
    if not warm_start.enabled():
        return None
    if _WARM is None:
        _WARM = WarmStart(Path(tempfile.mkdtemp(prefix="titan-warm-"))).start()
        atexit.register(_WARM.stop)
    return _WARM


@pytest.fixture(scope="session", autouse=True)
def warm_kit_runs() -> Iterator[None]:
    """The conformance kit's training runs, when a test runs the kit in its own process, start warm too, workers
    included (tests/warm_start.py). Their output, exit code and timeout behave as the cold processes'."""
    warm = _warm()
    undo = warm_start.route_kit_runs(warm.command) if warm is not None else None
    yield
    if undo is not None:
        undo()


def run_cli(*args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 600) -> CliResult:
    """``python -m titan_core ARGS`` in a process of its own (what a user's shell runs)."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), **(env or {})}
    proc = subprocess.Popen(titan_command(*args), cwd=cwd or REPO, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:  # timed out or interrupted: leave no process behind
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    return CliResult(proc.returncode, out, err)


@dataclass(frozen=True)
class Run(CliResult):
    """A finished run of the CLI (possibly several processes) and the folder it wrote."""

    run_dir: Path

    def records(self) -> list[dict[str, float]]:
        """The training-step records of ``metrics.jsonl`` (validation records left out)."""
        return [r for r in self.all_records() if "loss" in r]

    def all_records(self) -> list[dict[str, float]]:
        lines = (self.run_dir / "metrics.jsonl").read_text().splitlines()
        return [json.loads(line) for line in lines]

    def step_records(self, name: str, steps: int) -> list[dict[str, float]]:
        """``records()`` of a run that must have succeeded (no traceback) and logged steps 1..``steps``."""
        assert self.code == 0, f"{name} failed:\n{self.text}"
        assert "Traceback" not in self.text, self.text
        records = self.records()
        assert [int(r["step"]) for r in records] == list(range(1, steps + 1)), name
        return records


def write_uneven_corpus(path: Path, *, seed: int, documents: int, longest: int) -> Path:
    """A JSONL corpus of short documents of very uneven length (1-4 words, or ``longest``): windows hold
    from none to many document ends (document masking, ignored labels)."""
    rng = random.Random(seed)
    words = ["alpha", "beta", "gamma", "delta", "pi", "x", "loop", "cache", "token", "mask"]
    lengths = [rng.choice([1, 2, 3, 4, longest]) for _ in range(documents)]
    path.write_text("".join(json.dumps({"text": " ".join(rng.choices(words, k=n))}) + "\n" for n in lengths))
    return path


def run_command(cmd: list[str], *, run_dir: Path, timeout: float = 300) -> Run:
    """Run ``cmd`` in its own process group, killing the whole group (workers too) on timeout. Started warm,
    its launcher's workers start warm too (tests/warm_start.py; they are then not its children)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO),
           warm_start.WORKERS_ENV: os.environ.get(warm_start.WORKERS_ENV, "1")}  # "0": cold workers
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"timed out after {timeout}s: {' '.join(cmd)}\n{out}\n{err}") from None
    finally:
        if proc.poll() is None:  # the test was interrupted: leave no worker behind
            os.killpg(proc.pid, signal.SIGKILL)
    return Run(proc.returncode, out, err, run_dir)


def titan(run_dir: Path, *args: str, nproc: int | None = None, timeout: float = 300) -> Run:
    """``python -m titan_core [--nproc-per-node N] --job.run_dir=RUN_DIR ARGS``."""
    launch = ["--nproc-per-node", str(nproc)] if nproc else []
    return run_command(titan_command(*launch, f"--job.run_dir={run_dir}", *args), run_dir=run_dir, timeout=timeout)


def torchrun(run_dir: Path, *args: str, nproc: int = 2, timeout: float = 300) -> Run:
    """``python -m torch.distributed.run --standalone --nproc-per-node N -m titan_core ARGS``."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
           "-m", "titan_core", f"--job.run_dir={run_dir}", *args]
    return run_command(cmd, run_dir=run_dir, timeout=timeout)


def run_ok(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess[str]:
    """``subprocess.run`` that captures text and fails the test (showing the output) on a non-zero exit."""
    proc = subprocess.run(cmd, capture_output=True, text=True, **kw)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
    return proc


class Wheels:
    """Wheels built from source folders, each built (and installed to a folder) once per test session."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._wheels: dict[Path, Path] = {}
        self._sites: dict[Path, Path] = {}

    def wheel(self, source: Path) -> Path:
        source = source.resolve()
        if source not in self._wheels:
            out = self.root / f"dist{len(self._wheels)}"
            run_ok([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(out),
                    str(source)])
            (self._wheels[source],) = out.glob("*.whl")
        return self._wheels[source]

    def site(self, source: Path) -> Path:
        """A folder holding only ``source``'s installed wheel (put it on PYTHONPATH to use it)."""
        source = source.resolve()
        if source not in self._sites:
            target = self.root / f"site{len(self._sites)}"
            run_ok([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target),
                    str(self.wheel(source))])
            self._sites[source] = target
        return self._sites[source]


@pytest.fixture(scope="session")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Wheels:
    return Wheels(tmp_path_factory.mktemp("wheels"))


def run_main(capsys: pytest.CaptureFixture[str], *args: str) -> CliResult:
    """The CLI's ``main`` in this process (fast; same code path after process start)."""
    from titan_core.commands.titan_train import main

    code = main(list(args))
    captured = capsys.readouterr()
    return CliResult(code, captured.out, captured.err)


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]):
    return lambda *args: run_main(capsys, *args)


def assert_user_error(result: CliResult, *fragments: str, code: int = 2) -> None:
    """Exit code, every fragment in the message, and no Python traceback."""
    assert result.code == code, result.text
    for fragment in fragments:
        assert fragment in result.text, f"{fragment!r} not in:\n{result.text}"
    assert "Traceback (most recent call last)" not in result.text, result.text


# The multi-process parity tests' model and batch: the llama3 debug model shrunk to 2 layers, on 32-token
# windows, a global batch of 4 sequences; every layout must match one process within PARITY_TOLERANCE.
PARITY_TOLERANCE = 1e-5
PARITY_GLOBAL_BATCH = 4
PARITY_SEQ_LEN = 32
DEBUG_LLAMA_2_LAYERS = ("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=2",
                        f"--training.seq_len={PARITY_SEQ_LEN}")

SMALL_RUN = ["model.spec=llama3", "training.seq_len=64", "training.local_batch_size=4", "metrics.log_freq=1", "lr_scheduler.warmup_steps=2"]


def trained(run_dir: Path, *pairs: str) -> tuple[Any, list[float]]:
    """(Trainer, losses) of a small in-process run; ``pairs`` are ``section.key=value`` overrides."""
    from titan_core import Trainer
    from titan_core.plan.resolve import resolve_config

    overrides = [tuple(p.split("=", 1)) for p in (*SMALL_RUN, f"job.run_dir={run_dir}", *pairs)]
    trainer = Trainer(resolve_config(config_source=None, override_pairs=overrides))  # type: ignore[arg-type]
    trainer.setup()
    return trainer, trainer.train()


# ---- no test writes into the checkout ----------------------------------------------------------
# Untracked or ignored paths that may appear while tests run: interpreter and pytest caches.
_ALLOWED_NEW = ("__pycache__", ".pytest_cache")
_checkout_before: set[str] | None = None


def _checkout_paths() -> set[str] | None:
    """``git status`` lines of the checkout (untracked and ignored folders collapsed), None outside git."""
    try:
        proc = subprocess.run(["git", "status", "--porcelain", "--ignored"], cwd=REPO, capture_output=True,
                              text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return None
    return {line for line in proc.stdout.splitlines() if not any(cache in line for cache in _ALLOWED_NEW)}


@pytest.fixture(autouse=True)
def _forget_plugins_registered_by_the_test() -> Iterator[None]:
    """Specs and converters a test registers in this process (``--import`` of a test plugin run through the
    CLI's main, ``register_train_spec``) end with the test, and a module imported by the test that
    registered them is imported afresh next time (registering again). Without this, they leak into
    whichever tests share the process: two specs then claim one Hugging Face folder, and a test's outcome
    depends on the order files run in (pytest-xdist changes it)."""
    from titan_core.plugin import discovery

    before = {group: set(entries) for group, entries in discovery._registered.items()}
    modules_before = set(sys.modules)
    yield
    forgot = False
    for group, entries in discovery._registered.items():
        for name in [n for n in entries if n not in before.get(group, set())]:
            del entries[name]
            forgot = True
    if forgot:  # the test plugin modules this test imported (tests/*.py) register again when next imported
        tests = str(Path(__file__).parent) + os.sep
        for module in set(sys.modules) - modules_before:
            if (getattr(sys.modules[module], "__file__", None) or "").startswith(tests):
                del sys.modules[module]


def _is_xdist_worker(session: pytest.Session) -> bool:
    return hasattr(session.config, "workerinput")


def pytest_sessionstart(session: pytest.Session) -> None:
    # Under pytest-xdist the controller checks the checkout around the whole run; a worker's own check
    # would race the other workers' tests.
    global _checkout_before
    if not _is_xdist_worker(session):
        _checkout_before = _checkout_paths()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _is_xdist_worker(session) or _checkout_before is None:
        return
    after = _checkout_paths()
    if after is None:
        return
    new = sorted(after - _checkout_before)
    if new:
        print(f"\nthe tests wrote into the checkout {REPO} (write under tmp_path instead):\n  " + "\n  ".join(new),
              file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """With TITAN_TEST_TIMES=FILE, each phase's duration is appended to FILE as it ends (a tab-separated
    line: seconds, phase, test), so the slowest tests of a run still going, or killed, can be read."""
    path = os.environ.get("TITAN_TEST_TIMES")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{report.duration:.2f}\t{report.when}\t{report.nodeid}\n")


# The frozen API-1.0 plugins carry their own tests/test_conformance.py: they run as those plugins' tests, not ours.
collect_ignore_glob = ["compat/third_party/*"]


# ---- the fast tier (bash scripts/test.sh --fast, i.e. pytest -m fast) ------------------------------
# The edit-test loop: unit-level modules, one short end-to-end run (the golden single-process
# curve) and one 2-process run (the golden FSDP2 curve); at most 5 minutes on 2 cores. CI runs all.
FAST_MODULES = {
    "test_plugin_api_contract.py", "test_config.py", "test_discovery.py", "test_optim.py", "test_tokenizer.py", "test_llama_model.py",
    "test_data.py", "test_mx_converter.py", "test_converters_pipeline.py", "test_docs.py",
    "test_float8_converter.py", "test_precision_and_mfu.py", "test_readme.py", "test_checkpoint.py",
    "test_moved_modules.py", "test_architecture_doc.py", "test_torch_compat.py", "test_ema_units.py", "test_muon.py",
    "test_eval_tasks.py",
    "test_stability_units.py", "test_wave8_settings_garbage.py", "test_ft_report_units.py", "test_prepare_provenance.py",
}
FAST_TESTS = {
    "test_golden_curves.py::test_every_case_has_a_golden_file_with_its_current_arguments",
    "test_golden_curves.py::test_loss_curve_matches_golden[single]",
    "test_golden_curves.py::test_loss_curve_matches_golden[fsdp2]",
    "test_data_shards.py::test_prepare_runs_without_torch_and_one_or_two_workers_write_the_same_bytes",
    "test_deepseek_tp.py::test_tp_must_divide_the_heads",
    "test_qk_clip.py::test_the_factors_cut_each_head_to_tau_with_grouped_keys",
    "test_qk_clip.py::test_qk_clip_with_pp_or_fault_tolerance_is_refused_naming_the_keys",
    "test_layer_stats.py::test_the_report_draws_a_heatmap_per_figure_and_marks_each_spike_on_the_loss_curve",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        module = item.path.name
        if item.get_closest_marker("slow") is None and (
            module in FAST_MODULES or f"{module}::{item.name}" in FAST_TESTS
        ):
            item.add_marker(pytest.mark.fast)


def _children_by_parent() -> dict[int, list[int]]:
    """Every process by its parent's pid (from /proc's parent links)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    return children


def child_pids(pid: int) -> list[int]:
    """The processes ``pid`` started itself, sorted."""
    return sorted(_children_by_parent().get(pid, []))


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``."""
    children = _children_by_parent()
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def stop_process(pid: int, timeout: float = 10.0) -> None:
    """SIGSTOP ``pid`` and wait until the kernel shows it stopped: the signal is asynchronous, and a
    process still finishing a write would change its files after a snapshot taken at once."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return  # gone: nothing left to write either
        if state in ("T", "t"):
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not stop within {timeout} s of SIGSTOP")
