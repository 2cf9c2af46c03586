"""Malformed inputs through the real CLI: each is one clear message, a documented exit code, no damage.

Every case runs the CLI against its own copy of a run folder that already holds a good
run (config, metrics, two checkpoints): three (a configuration error, a flag argparse
refuses, a damaged checkpoint) as ``python -m titan_core`` in a fresh process, the others
through the CLI's ``main`` in this process (the same code after start-up; a process start
costs 10-30 times a case). Each asserts: the exit code, a message fragment naming the culprit, no Python
traceback, and that no file that existed in the run folder changed (path, size,
mtime and SHA-1). ``pytest -s`` prints the table of (case, exit code, message).

The second survey (``IN_PROCESS``) covers run-time classes: settings torch or the machine
would reject later, launcher environment variables, config functions and plugins that
exit, raise or return the wrong shape, the run folder and its files (in use, full disk,
folders where files belong), and data entries that cannot be read. It calls the CLI's
``main`` in this process (same code path, no interpreter start-up per case), with the same
assertions. Signals, dead and frozen ranks and a racing second run need real processes:
tests/test_signals_and_hangs.py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from hostile_harness import (
    LAST,
    HostileCase,
    assert_one_clean_error,
    assert_unchanged,
    damaged_copy,
    first_error_line,
    isolate,
    run_in_process,
    small,
    snapshot,
    table_printer,
)

from conftest import REPO, run_cli

SMALL = small()
TABLE: list[tuple[str, int, str]] = []


@dataclass(frozen=True)
class Case:
    id: str
    args: tuple[str, ...]  # "{run}" and "{inputs}" are filled in
    fragment: str  # must appear in the message
    code: int = 2
    damage: Callable[[Path], None] | None = None  # applied to the run folder copy before the snapshot
    small: bool = True  # prepend the SMALL flags (spec, flavor, shapes, checkpoint settings)
    process: bool = False  # run `python -m titan_core` in a fresh process (else the CLI's main in this one)


def truncate_shard(run: Path) -> None:
    shard = run / LAST / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])


def corrupt_identity(run: Path) -> None:
    (run / LAST / "titan_checkpoint.json").write_text('{"format": 1, "step": ', encoding="utf-8")


def garbage_index(run: Path) -> None:
    (run / LAST / "tensor_index.json").write_bytes(b"\x80\x04garbage, not JSON" * 8)


def drop_index(run: Path) -> None:
    (run / LAST / "tensor_index.json").unlink()


def flip_shard_byte(run: Path) -> None:
    shard = run / LAST / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF
    shard.write_bytes(bytes(data))


def add_blocker(run: Path) -> None:
    (run / "blocker").write_text("a regular file, not a folder\n", encoding="utf-8")


CASES = [
    # ---- configuration ------------------------------------------------------------------------
    Case("unknown section", ("--trainng.steps=5",), 'unknown section "trainng". Did you mean "training"?', process=True),
    Case("unknown key", ("--training.stepz=5",), 'unknown key "training.stepz". Did you mean "steps"?'),
    Case("wrong type", ("--training.steps=many",), "training.steps: Input should be a valid integer"),
    Case("negative steps", ("--training.steps=-3",), "training.steps: Input should be greater than 0 (got -3)"),
    Case("literal out of choices", ("--training.dtype=float16",), "training.dtype: Input should be 'auto', 'float32' or 'bfloat16'"),
    Case("TOML syntax error", ("--config", "{inputs}/syntax.toml"), "TOML syntax error"),
    Case("binary file as --config", ("--config", "{inputs}/binary.toml"), "not a text file"),
    Case("unknown key in TOML", ("--config", "{inputs}/unknown_key.toml"), 'unknown key "training.stepz"'),
    Case("missing --config file", ("--config", "{inputs}/missing.toml"), "no such file"),
    Case("config function returns int", ("--config", "hostile_config:number"), "returned int"),
    Case("config function raises", ("--config", "hostile_config:broken"), "the config function raised RuntimeError"),
    Case("config module missing", ("--config", "no_such_module_xyz:fn"), "module 'no_such_module_xyz' could not be imported"),
    # ---- flags --------------------------------------------------------------------------------
    Case("flag value missing", ("--training.steps",), "--training.steps needs a value"),
    Case("stray argument", ("stray",), "unrecognised argument 'stray'"),
    Case("non-integer --nproc-per-node", ("--nproc-per-node", "two"), "--nproc-per-node: invalid int value",
         process=True),  # argparse exits the process itself
    # ---- plugins and layouts ------------------------------------------------------------------
    Case("unknown spec", ("--spec", "nosuchspec"), 'unknown spec "nosuchspec". Installed specs: deepseek_v3, llama3', small=False),
    Case("unknown flavor", ("--flavor", "huge"), 'spec "llama3" has no flavor "huge"'),
    Case("unknown converter", ("--converters", "nosuchconv"), 'unknown converter "nosuchconv"'),
    Case("duplicate converters", ("--converters", "float8,float8"), 'converter "float8" is listed twice'),
    Case("world size does not fit", ("--nproc-per-node", "2", "--parallelism.tp=4"), "tp=4 x pp=1 = 4 does not divide world size 2"),
    # ---- data and tokenizer paths -------------------------------------------------------------
    Case("nonexistent data source", ("--data.source={inputs}/nope.txt",), 'nope.txt" does not exist'),
    Case("empty data file", ("--data.source={inputs}/empty.txt",), "contains no documents"),
    Case("binary data file", ("--data.source={inputs}/binary.txt",), "binary.txt is not UTF-8 text"),
    Case(".csv data file", ("--data.source={inputs}/table.csv",), 'unsupported extension ".csv"'),
    Case("jsonl without the text field", ("--data.source={inputs}/other_field.jsonl",),
         'other_field.jsonl line 1: row 0 has no field "text" (its fields: body)'),
    Case("tokenizer in the wrong format", ("--data.tokenizer={inputs}/words.model",), "words.model: line 1 is not '<base64 token> <rank>'"),
    Case("nonexistent tokenizer", ("--data.tokenizer={inputs}/nope.model",), "nope.model does not exist"),
    # ---- checkpoints (a run starts; the resume is refused) -----------------------------------
    Case("resume path missing tensor_index.json", ("--training.steps=6", "--checkpoint.resume=step-000004"),
         "is not a complete checkpoint: missing tensor_index.json", damage=drop_index),
    Case("resume path that does not exist", ("--training.steps=6", "--checkpoint.resume={run}/checkpoints/step-000099"),
         "is not a complete checkpoint: missing the folder"),
    Case("truncated shard", ("--training.steps=6",), "(truncated or overwritten)", damage=truncate_shard),
    Case("flipped byte in a shard", ("--training.steps=6",), "does not match its recorded CRC-32", damage=flip_shard_byte, process=True),
    Case("corrupt titan_checkpoint.json", ("--training.steps=6",), "titan_checkpoint.json is unreadable or corrupt",
         damage=corrupt_identity),
    Case("garbage tensor_index.json", ("--training.steps=6",), "tensor_index.json is 152 bytes but was written with",
         damage=garbage_index),
    Case("checkpoint of another model", ("--training.steps=6", "--llama3.n_layers=3"),
         "does not fit this model: parameter 'layers.2.attention.wk.weight' (shape [256, 256]) exists in this model"),
    Case("unwritable checkpoint folder", ("--training.steps=6", "--checkpoint.folder=blocker/ckpt"),
         "cannot create the checkpoint folder", damage=add_blocker),
]


# ---- fixtures -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 4-step run with checkpoints at steps 2 and 4."""
    run = tmp_path_factory.mktemp("good") / "run"
    result = run_cli(*SMALL, "--training.steps=4", f"--job.run_dir={run}")
    assert result.code == 0, result.text
    assert (run / LAST / "tensor_index.json").is_file() and (run / "checkpoints" / "step-000002").is_dir()
    return run


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("inputs")
    (folder / "syntax.toml").write_text("[training\nsteps = 3\n", encoding="utf-8")
    (folder / "binary.toml").write_bytes(bytes(range(256)) * 4)
    (folder / "unknown_key.toml").write_text("[training]\nstepz = 3\n", encoding="utf-8")
    (folder / "hostile_config.py").write_text(
        "def number():\n    return 42\n\n\ndef broken():\n    raise RuntimeError('boom')\n", encoding="utf-8")
    (folder / "empty.txt").write_bytes(b"")
    (folder / "binary.txt").write_bytes(bytes(range(256)) * 64)
    (folder / "table.csv").write_text("id,text\n1,hello world\n2,more text\n", encoding="utf-8")
    (folder / "other_field.jsonl").write_text('{"body": "hello"}\n{"body": "world"}\n', encoding="utf-8")
    (folder / "words.model").write_text("hello world\nthis is not a tiktoken ranks file\n", encoding="utf-8")
    return folder


table = table_printer(TABLE, "input")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_is_one_clear_error_and_changes_nothing(
        case: Case, good_run: Path, inputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    run = damaged_copy(good_run, tmp_path, case.damage)
    before = snapshot(run)
    args = [*(SMALL if case.small else ()), f"--job.run_dir={run}", *(a.format(run=run, inputs=inputs) for a in case.args)]
    if case.process:
        result = run_cli(*args, env={"PYTHONPATH": os.pathsep.join([str(REPO), str(inputs)])}, timeout=300)
    else:
        isolate(monkeypatch)
        monkeypatch.syspath_prepend(str(inputs))  # the config-function module of the cases
        result = run_in_process(capsys, *args)
    TABLE.append((case.id, result.code, first_error_line(result)))
    assert_one_clean_error(result, case.fragment, case.code)
    assert_unchanged(before, run)


# ---- the second survey: run-time classes, in this process where no real process is needed ------------
# (signals, dead and frozen ranks and the racing second run are real processes: test_signals_and_hangs.py)

PLUGINS = ("--import", "_hostile_plugins")
FRESH = "--job.run_dir={fresh}"
TINY_SPEC = ("--training.seq_len=32", "--training.local_batch_size=2", "--training.steps=2", FRESH)


@dataclass(frozen=True)
class InProcess(HostileCase):
    """The survey's case (hostile_harness.HostileCase) with a set-up step and a run allowed to have begun."""

    prepare: Callable[[pytest.MonkeyPatch, Path], None] | None = None  # (monkeypatch, run folder)
    # The run was accepted and began (it resumed and wrote its own config.toml) before the failure.
    started: bool = False


def hide_wandb(mp: pytest.MonkeyPatch, run: Path) -> None:
    import sys

    mp.setitem(sys.modules, "wandb", None)  # importlib.util.find_spec("wandb") is then None


def metrics_to_dev_full(run: Path) -> None:
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").symlink_to("/dev/full")


def metrics_is_a_folder(run: Path) -> None:
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").mkdir()


def config_toml_is_a_folder(run: Path) -> None:
    (run / "config.toml").unlink()
    (run / "config.toml").mkdir()


def lock_is_a_symlink(run: Path) -> None:
    (run / ".lock").unlink(missing_ok=True)
    (run / ".lock").symlink_to(run / "config.toml")


def export_is_a_file(run: Path) -> None:
    (run / "export").write_text("not a folder\n")


def hold_lock(mp: pytest.MonkeyPatch, run: Path) -> None:
    """A live holder in this very process (flock locks are per open file, so a second open conflicts)."""
    import fcntl

    fd = os.open(run / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    HELD.append(fd)


HELD: list[int] = []


def data_folder_with(kind: str) -> Callable[[pytest.MonkeyPatch, Path], None]:
    def prepare(mp: pytest.MonkeyPatch, run: Path) -> None:
        folder = run.parent / "data"
        folder.mkdir()
        (folder / "a.txt").write_text("hello world\n" * 50)
        odd = folder / "b.txt"
        if kind == "dangling":
            odd.symlink_to(folder / "missing.txt")
        elif kind == "fifo":
            os.mkfifo(odd)
        elif kind == "loop":
            (folder / "sub").mkdir()
            (folder / "sub" / "back").symlink_to(folder, target_is_directory=True)
        elif kind == "socket":
            import socket

            s = socket.socket(socket.AF_UNIX)
            s.bind(str(odd))
            s.close()
    return prepare


def data_source_fifo(mp: pytest.MonkeyPatch, run: Path) -> None:
    os.mkfifo(run.parent / "data.txt")


def plugin_module(name: str, body: str) -> Callable[[pytest.MonkeyPatch, Path], None]:
    def prepare(mp: pytest.MonkeyPatch, run: Path) -> None:
        (run.parent / f"{name}.py").write_text(body)
        mp.syspath_prepend(str(run.parent))
        import sys

        mp.delitem(sys.modules, name, raising=False)
    return prepare


def hostile_spec(name: str) -> tuple[str, ...]:
    return (*PLUGINS, "--spec", name, f"--{name}.n_layers=1", *TINY_SPEC)


IN_PROCESS = [
    # ---- optimizer and numeric settings torch would reject later ---------------------------------
    InProcess("beta1 equal to 1", ("--optimizer.betas=1.0,0.95",), "optimizer.betas.0: Input should be less than 1"),
    InProcess("beta2 above 1", ("--optimizer.betas=0.9,1.5",), "optimizer.betas.1: Input should be less than 1 (got 1.5)"),
    InProcess("negative beta", ("--optimizer.betas=-0.1,0.95",), "optimizer.betas.0: Input should be greater than or equal to 0"),
    InProcess("one beta only", ("--optimizer.betas=0.9",), "optimizer.betas"),
    InProcess("negative eps", ("--optimizer.eps=-1e-8",), "optimizer.eps: Input should be greater than 0"),
    InProcess("zero eps", ("--optimizer.eps=0",), "optimizer.eps: Input should be greater than 0"),
    InProcess("negative weight decay", ("--optimizer.weight_decay=-0.1",), "optimizer.weight_decay"),
    InProcess("negative lr", ("--optimizer.lr=-1e-3",), "optimizer.lr: Input should be greater than or equal to 0"),
    InProcess("unknown optimizer", ("--optimizer.name=Adagrad",), "optimizer.name"),
    InProcess("validation with a V-shaped pipeline schedule",
              ("--parallelism.pp=2", "--parallelism.pp_schedule=ZBVZeroBubble", "--validation.enable=true"),
              "V-shaped pipeline schedules have no forward-only pass"),
    InProcess("negative warmup", ("--lr_scheduler.warmup_steps=-1",), "lr_scheduler.warmup_steps"),
    InProcess("zero decay ratio", ("--lr_scheduler.decay_ratio=0",), "lr_scheduler.decay_ratio"),
    InProcess("val_fraction of 1", ("--data.val_fraction=1",), "data.val_fraction"),
    InProcess("negative max_norm", ("--training.max_norm=-1",), "training.max_norm"),
    InProcess("zero local batch", ("--training.local_batch_size=0",), "training.local_batch_size"),
    InProcess("seed not a number", ("--training.seed=abc",), "training.seed"),
    InProcess("zero log_freq", ("--metrics.log_freq=0",), "metrics.log_freq"),
    InProcess("zero validation freq", ("--validation.freq=0",), "validation.freq"),
    InProcess("negative keep_latest_k", ("--checkpoint.keep_latest_k=-1",), "checkpoint.keep_latest_k"),
    InProcess("zero checkpoint interval", ("--checkpoint.interval=0",), "checkpoint.interval"),
    InProcess("zero pipeline degree", ("--parallelism.pp=0",), "parallelism.pp"),
    InProcess("unknown activation checkpointing", ("--activation_checkpoint.mode=most",), "activation_checkpoint.mode"),
    InProcess("compile flag not a bool", ("--compile.enable=maybe",), "compile.enable"),
    InProcess("save_on_sigterm not a bool", ("--checkpoint.save_on_sigterm=perhaps",), "checkpoint.save_on_sigterm"),
    InProcess("zero init timeout", ("--parallelism.init_timeout_s=0",), "parallelism.init_timeout_s: Input should be greater than 0"),
    InProcess("negative collective timeout", ("--parallelism.collective_timeout_s=-5",), "parallelism.collective_timeout_s"),
    InProcess("NaN collective timeout", ("--parallelism.collective_timeout_s=nan",), "parallelism.collective_timeout_s"),
    InProcess("year-long collective timeout", ("--parallelism.collective_timeout_s=31536000",), "less than or equal to 86400"),
    InProcess("unknown key in a plugin section", ("--llama3.n_layerz=2",), 'unknown key "llama3.n_layerz"'),
    InProcess("plugin value of the wrong type", ("--llama3.n_layers=two",), "llama3.n_layers"),
    # ---- the model and the machine ----------------------------------------------------------------
    InProcess("seq_len beyond max_seq_len", ("--training.seq_len=4096",),
              "training.seq_len=4096 is longer than the model's max_seq_len=2048"),
    InProcess("seq_len beyond max_seq_len, dry run", ("--training.seq_len=64", "--llama3.max_seq_len=32", "--dry-run"),
              "training.seq_len=64 is longer than the model's max_seq_len=32"),
    InProcess("vocab smaller than the tokenizer", ("--llama3.vocab_size=256", FRESH),
              "the tokenizer gives 2048 token ids but the model's vocab_size is 256 (spec llama3)"),
    InProcess("vocab smaller than the tokenizer, dry run", ("--llama3.vocab_size=1000", "--dry-run", FRESH),
              "raise the model's vocab_size to 2048 or more (e.g. --llama3.vocab_size=2048"),
    InProcess("wandb without wandb installed", ("--metrics.wandb=true",), "metrics.wandb=true but the wandb package is not installed",
              prepare=hide_wandb),
    InProcess("device cuda without CUDA", ("--training.device=cuda",), "training.device=cuda but this machine has no usable CUDA device"),
    InProcess("nccl without CUDA", ("--parallelism.backend=nccl",), "parallelism.backend=nccl but this machine has no usable CUDA device"),
    InProcess("model that cannot fit", ("--llama3.vocab_size=400000000", FRESH),
              "the model cannot fit: 204,801,705,216 parameters need at least 3,051.8 GiB per rank"),
    # ---- launcher environment ----------------------------------------------------------------------
    InProcess("--nproc-per-node 0", ("--nproc-per-node", "0"), "--nproc-per-node 0: give the number of processes"),
    InProcess("--nproc-per-node negative", ("--nproc-per-node", "-2"), "--nproc-per-node -2"),
    InProcess("WORLD_SIZE garbage", (), "environment variable WORLD_SIZE='abc' is not an integer >= 1", env=(("WORLD_SIZE", "abc"),)),
    InProcess("WORLD_SIZE zero", (), "WORLD_SIZE='0' is not an integer >= 1", env=(("WORLD_SIZE", "0"),)),
    InProcess("WORLD_SIZE negative", (), "WORLD_SIZE='-4'", env=(("WORLD_SIZE", "-4"),)),
    InProcess("WORLD_SIZE float", (), "WORLD_SIZE='2.0'", env=(("WORLD_SIZE", "2.0"),)),
    InProcess("RANK garbage", ("--parallelism.dp_shard=2", FRESH), "environment variable RANK='zero'",
              env=(("WORLD_SIZE", "2"), ("RANK", "zero"))),
    InProcess("RANK beyond WORLD_SIZE", ("--parallelism.dp_shard=2", FRESH), "RANK=5 must be below WORLD_SIZE=2",
              env=(("WORLD_SIZE", "2"), ("RANK", "5"))),
    InProcess("LOCAL_RANK negative", ("--parallelism.dp_shard=2", FRESH), "environment variable LOCAL_RANK='-1'",
              env=(("WORLD_SIZE", "2"), ("RANK", "0"), ("LOCAL_RANK", "-1"))),
    InProcess("MASTER_PORT garbage", ("--parallelism.dp_shard=2", FRESH), "environment variable MASTER_PORT='http'",
              env=(("WORLD_SIZE", "2"), ("RANK", "1"), ("LOCAL_RANK", "1"), ("MASTER_PORT", "http"))),
    # ---- config functions and plugins that exit or interrupt -----------------------------------------
    InProcess("config function calls sys.exit(0)", ("--config", "exits_cfg:fn"), "the config function raised SystemExit",
              prepare=plugin_module("exits_cfg", "import sys\ndef fn():\n    sys.exit(0)\n")),
    InProcess("config function raises KeyboardInterrupt", ("--config", "interrupts_cfg:fn"),
              "the config function raised KeyboardInterrupt",
              prepare=plugin_module("interrupts_cfg", "def fn():\n    raise KeyboardInterrupt\n")),
    InProcess("config module exits at import", ("--config", "exits_mod:fn"), "module 'exits_mod' could not be imported (SystemExit",
              prepare=plugin_module("exits_mod", "import sys\nsys.exit(3)\ndef fn():\n    return {}\n")),
    InProcess("--import module exits", ("--import", "exits_imp"), "--import exits_imp: the module could not be imported (SystemExit",
              prepare=plugin_module("exits_imp", "raise SystemExit(0)\n")),
    InProcess("--import module interrupts", ("--import", "interrupts_imp"), "(KeyboardInterrupt",
              prepare=plugin_module("interrupts_imp", "raise KeyboardInterrupt\n")),
    InProcess("converter defaults fail validation", (*PLUGINS, "--converters", "hostile_defaults", "--dry-run"),
              "the defaults of plugin section [hostile_defaults]"),
    InProcess("converter convert() raises", (*PLUGINS, "--converters", "hostile_convert", "--dry-run"),
              'converter "hostile_convert" (<registered in _hostile_plugins>) failed in convert(): RuntimeError'),
    InProcess("converter select() raises", (*PLUGINS, "--converters", "hostile_select", "--dry-run"),
              'converter "hostile_select" (<registered in _hostile_plugins>) failed in select(): KeyError'),
    InProcess("converter __init__ raises", (*PLUGINS, "--converters", "hostile_conv_init", *TINY_SPEC),
              'converter "hostile_conv_init" (<registered in _hostile_plugins>) failed in __init__: ZeroDivisionError'),
    InProcess("spec parallelize_fn raises", hostile_spec("hostile_parallelize"),
              "failed in parallelize_fn: RuntimeError: plugin bug on purpose", small=False),
    InProcess("model init_parameter raises", hostile_spec("hostile_init"),
              "failed in the model's init_parameter/init_buffers: ValueError: cannot initialise", small=False),
    InProcess("model forward raises", hostile_spec("hostile_forward"),
              "failed in the model's forward: IndexError: forward bug on purpose", small=False),
    InProcess("model output of the wrong shape", hostile_spec("hostile_short_output"),
              "failed in the model's forward: it returned shape [2, 31, ", small=False),
    # ---- every other call through the plugin facade (plugin_boundary.py): guarded, its result checked ----
    InProcess("model constructor raises", (*hostile_spec("hostile_model_cls"), "--dry-run"),
              "failed in model_cls(model_args): AttributeError: model constructor bug on purpose", small=False),
    InProcess("spec build_tokenizer_fn raises", (*hostile_spec("hostile_tokenizer"), "--dry-run"),
              "failed in build_tokenizer_fn: RuntimeError: plugin bug on purpose", small=False),
    InProcess("spec validate_fn crashes", (*hostile_spec("hostile_validate"), "--dry-run"),
              "failed in validate_fn: AssertionError: validate bug on purpose", small=False),
    InProcess("spec flops_per_token_fn raises", hostile_spec("hostile_flops"),
              "failed in flops_per_token_fn: RuntimeError: plugin bug on purpose", small=False),
    InProcess("spec build_loss_fn returns None", hostile_spec("hostile_loss"),
              "failed in build_loss_fn: TypeError: it returned NoneType, not a loss function", small=False),
    InProcess("spec build_optimizers_fn returns None", hostile_spec("hostile_optimizers"),
              "failed in build_optimizers_fn: TypeError: it returned NoneType, not a torch.optim.Optimizer",
              small=False),
    InProcess("converter post_optimizer_hook raises", (*PLUGINS, "--converters", "hostile_hook", *TINY_SPEC),
              'converter "hostile_hook" (<registered in _hostile_plugins>) failed in post_optimizer_hook: OSError: '
              "hook bug on purpose"),
    # ---- the run folder and its files --------------------------------------------------------------
    InProcess("run folder is a file", ("--job.run_dir={inputs}/syntax.toml",), "syntax.toml: it already exists and is not a folder"),
    InProcess("run folder below a file", ("--job.run_dir={inputs}/syntax.toml/run",), "a path component is a file, not a folder"),
    InProcess("run folder below /dev/null", ("--job.run_dir=/dev/null/run",), "cannot use /dev/null/run"),
    InProcess("run folder in use by a live run", ("--training.steps=6",),
              "is in use by another run: pid {pid} on host {host}, started 20", prepare=hold_lock),
    InProcess(".lock is a symbolic link", ("--training.steps=6",), "it is a symbolic link, which the run refuses to follow",
              damage=lock_is_a_symlink),
    InProcess("metrics.jsonl on a full disk", ("--training.steps=6",), "disk full while writing", damage=metrics_to_dev_full,
              started=True),
    InProcess("metrics.jsonl is a folder", ("--training.steps=6",), "metrics.jsonl: it is a folder, where a file was expected",
              damage=metrics_is_a_folder, started=True),
    InProcess("config.toml is a folder", ("--training.steps=6",), "config.toml: it is a folder, where a file was expected",
              damage=config_toml_is_a_folder),
    InProcess("export path is a file", ("--training.steps=6", "--checkpoint.export_at_end=true"),
              "/export: a path component is a file, not a folder", damage=export_is_a_file),
    # ---- data entries that cannot be read ------------------------------------------------------------
    InProcess("dangling symlink in the data folder", ("--data.source={run}/../data", FRESH),
              "b.txt (a dangling symbolic link)", prepare=data_folder_with("dangling")),
    InProcess("FIFO in the data folder", ("--data.source={run}/../data", FRESH), "b.txt (a named pipe (FIFO))",
              prepare=data_folder_with("fifo")),
    InProcess("link loop in the data folder", ("--data.source={run}/../data", FRESH),
              "sub/back links back to a folder that contains it (a loop)", prepare=data_folder_with("loop")),
    InProcess("socket in the data folder", ("--data.source={run}/../data", FRESH), "b.txt (a socket)",
              prepare=data_folder_with("socket")),
    InProcess("data.source is a FIFO", ("--data.source={run}/../data.txt", FRESH), "is a named pipe (FIFO), not a regular file",
              prepare=data_source_fifo),
    InProcess("data.source is a device", ("--data.source=/dev/zero", FRESH), "is a device, not a regular file"),
    InProcess("--config is a FIFO", ("--config", "{run}/../cfg.toml"), "cfg.toml is a named pipe (FIFO), not a regular file",
              prepare=lambda mp, run: os.mkfifo(run.parent / "cfg.toml")),
    InProcess("--config is /dev/zero", ("--config", "/dev/zero"), "--config /dev/zero is a device, not a regular file"),
    InProcess("--config is a folder", ("--config", "{run}/.."), "is a folder, not a regular file"),
]


@pytest.mark.parametrize("case", IN_PROCESS, ids=[c.id for c in IN_PROCESS])
def test_run_time_hostile_input_is_one_clear_error_and_changes_nothing(
        case: InProcess, good_run: Path, inputs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    import socket

    run = damaged_copy(good_run, tmp_path, case.damage)
    isolate(monkeypatch, case.env)
    if case.prepare is not None:
        case.prepare(monkeypatch, run)
    before = snapshot(run)
    args = [a.format(run=run, inputs=inputs, fresh=tmp_path / "fresh") for a in case.args]
    try:
        result = run_in_process(capsys, *(SMALL if case.small else ()), f"--job.run_dir={run}", *args)
    finally:
        while HELD:
            os.close(HELD.pop())
    TABLE.append((case.id, result.code, first_error_line(result)))
    assert_one_clean_error(result, case.fragment.format(pid=os.getpid(), host=socket.gethostname()), case.code)
    assert_unchanged(before, run, allowed=("config.toml",) if case.started else ())
