"""Hardening, second pass (issue 23): every case runs the real command in its own process, feeds the
hostile input and checks the exit code, the one message and that no file already there changed.

1. the lock covers every folder a run writes: a second run whose checkpoint folder (or run folder)
   lies inside a live run's, contains it, or is the same folder after the live run's ``.lock`` was
   deleted, is refused; a checkpoint or Hugging Face folder as the run folder is refused;
2. a resumed run's HF export keeps files a user put in ``export/hf``; ``titan-convert`` killed just
   before it publishes OUT leaves no OUT, and the same command run again finishes;
3. deadlines: an ``hf:`` source behind a server that accepts and never answers, a ``convert()`` that
   never returns (titan-train and titan-plugin check); a folder of 2,000 small ``.jsonl`` files is read
   quickly, with progress lines;
4. plugin names that are core section names are refused when they load, and by ``titan-plugin new``;
5. ``titan-convert`` flags and ``--config`` checked; invalid UTF-8 in a JSON line names file and line;
   a tokenizer whose ids exceed its vocabulary is blamed; an error of the core's own code inside a plugin
   call is not called a plugin bug; ``WORLD_SIZE`` without ``RANK`` and ``--nproc-per-node`` under a
   launcher's environment are refused at once;
6. a ``config.json`` whose ``rope_parameters`` and legacy ``rope_scaling`` disagree is refused; agreeing
   ones load.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from one_process import run_in_one_process

from conftest import REPO, stop_process

TINY = ("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1", "--training.seq_len=32",
        "--training.local_batch_size=2", "--metrics.log_freq=1", "--lr_scheduler.warmup_steps=1")
PLUGINS = ("--import", "_hardening_plugins")


def env(**extra: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "MASTER_PORT")}
    return {**base, "OMP_NUM_THREADS": "1", "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'tests'}", **extra}


def run(*args: str, timeout: float = 180, module: str = "titan_core",
        extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", module, *args], cwd=REPO, env=env(**(extra_env or {})),
                          capture_output=True, text=True, timeout=timeout)


def train(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return run(*TINY, *args, **kw)  # type: ignore[arg-type]


def convert(*args: str, **kw: object) -> subprocess.CompletedProcess[str]:
    return run(*args, module="titan_core.commands.convert", **kw)  # type: ignore[arg-type]


def run_all(commands: list[tuple[str, ...]], *, module: str = "titan_core",
            timeout: float = 300) -> list[subprocess.CompletedProcess[str]]:
    """Several independent commands at once (each a real process); their results in order."""
    procs = [subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO, env=env(), text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for args in commands]
    out = []
    for args, proc in zip(commands, procs):
        stdout, stderr = proc.communicate(timeout=timeout)
        out.append(subprocess.CompletedProcess(list(args), proc.returncode, stdout, stderr))
    return out


def one_process(commands: list[tuple[str, ...]], *, module: str) -> list[subprocess.CompletedProcess[str]]:
    return run_in_one_process(commands, module=module, env=env(), cwd=REPO)


def snapshot(*folders: Path) -> dict[str, str]:
    return {str(p): hashlib.sha1(p.read_bytes()).hexdigest()
            for folder in folders if folder.exists() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(proc: subprocess.CompletedProcess[str], *fragments: str, code: int = 2) -> str:
    text = proc.stdout + proc.stderr
    assert proc.returncode == code, text
    assert "Traceback" not in text, text
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in:\n{text}"
    errors = [line for line in text.splitlines() if ": error: " in line]
    assert len(errors) == 1, text  # one message
    return text


# ---- a finished run (checkpoints + HF export) to convert and to point runs at ----------------------

@pytest.fixture(scope="module")
def done(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("done") / "run"
    proc = train(f"--job.run_dir={run_dir}", "--training.steps=2", "--checkpoint.enable=true",
                 "--checkpoint.interval=2", "--checkpoint.export_at_end=true", "--checkpoint.export_format=hf")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (run_dir / "export/hf/config.json").is_file() and (run_dir / "checkpoints/step-000002").is_dir()
    return run_dir


# ---- 1. the lock covers every folder a run writes ------------------------------------------------

@pytest.fixture
def live_run(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """A run held alive (SIGSTOP) after it saved checkpoints; killed at the end."""
    run_dir, log = tmp_path / "live", tmp_path / "live.log"
    proc = subprocess.Popen([sys.executable, "-m", "titan_core", *TINY, f"--job.run_dir={run_dir}",
                             "--training.steps=100000", "--checkpoint.enable=true", "--checkpoint.interval=2",
                             "--checkpoint.keep_latest_k=0"],
                            cwd=REPO, env=env(), stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(list((run_dir / "checkpoints").glob("step-*"))) < 2:
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        stop_process(proc.pid)  # alive, holding its locks, and its files stay still
        time.sleep(0.3)  # a save in flight when it stopped stays in flight: the snapshot is of that
        yield proc, run_dir
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_a_second_run_touching_a_live_runs_folders_is_refused(live_run: tuple[subprocess.Popen[bytes], Path],
                                                               tmp_path: Path) -> None:
    proc, live = live_run
    holder = f"pid {proc.pid} on host {socket.gethostname()}"
    (tmp_path / "link").symlink_to(live)
    cases = [
        # its --checkpoint.folder is the live run's checkpoint folder (the first report of the issue)
        ((f"--job.run_dir={tmp_path / 'b'}", "--checkpoint.enable=true", f"--checkpoint.folder={live / 'checkpoints'}"),
         f"the checkpoint folder (checkpoint.folder) {live / 'checkpoints'} lies inside {live}, which another run is "
         f"writing: {holder}"),
        # a checkpoint folder inside the live one, reached under --nproc-per-node (the launcher holds the locks)
        (("--nproc-per-node", "2", "--parallelism.dp_shard=2", f"--job.run_dir={tmp_path / 'c'}",
          "--checkpoint.enable=true", f"--checkpoint.folder={live / 'checkpoints' / 'mine'}"),
         f"lies inside {live}, which another run is writing: {holder}"),
        # a run folder that contains the live run's
        ((f"--job.run_dir={live.parent}",), f"the run folder {live.parent} contains a folder that another run is writing"),
        # the same folder through a symbolic link, its .lock deleted (below): the folder itself is locked
        ((f"--job.run_dir={tmp_path / 'link'}",), f"the run folder {live} is in use by another run: {holder}"),
    ]
    (live / ".lock").unlink()
    before = snapshot(live)
    results = run_all([(*TINY, *args, "--training.steps=2") for args, _ in cases])
    for (_, fragment), proc in zip(cases, results):
        refused(proc, fragment)
    assert snapshot(live) == before
    assert not (tmp_path / "b").exists() and not (tmp_path / "c").exists()  # a refused run creates nothing


def test_a_checkpoint_or_hf_folder_as_the_run_folder_is_refused(done: Path) -> None:
    before = snapshot(done)
    step = done / "checkpoints/step-000002"
    first, second, third = one_process([(*TINY, f"--job.run_dir={folder}", "--training.steps=2") for folder in
                                               (step, done / "checkpoints", done / "export/hf/sub")],
                                              module="titan_core.commands.titan_train")
    refused(first, f"the run folder {step} is a titan checkpoint", f"--checkpoint.initial_load={step}")
    refused(second, f"the run folder {done / 'checkpoints'} is a folder of titan checkpoints")
    refused(third, f"lies inside {done / 'export/hf'}, which is a Hugging Face model folder")
    assert snapshot(done) == before


# ---- 2. exports and titan-convert write only their own files, and publish whole ------------------

def test_a_resumed_runs_hf_export_keeps_the_users_files(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    flags = (f"--job.run_dir={run_dir}", "--checkpoint.enable=true", "--checkpoint.interval=2",
             "--checkpoint.export_at_end=true", "--checkpoint.export_format=hf")
    assert train(*flags, "--training.steps=2").returncode == 0
    hf = run_dir / "export/hf"
    (hf / "eval_results.json").write_text('{"mmlu": 0.25}\n')
    (hf / "notes").mkdir()
    (hf / "notes" / "readme.txt").write_text("mine\n")
    weights = hashlib.sha1((hf / "model.safetensors").read_bytes()).hexdigest()
    proc = train(*flags, "--training.steps=4")
    assert proc.returncode == 0 and "resuming from" in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert (hf / "eval_results.json").read_text() == '{"mmlu": 0.25}\n'
    assert (hf / "notes" / "readme.txt").read_text() == "mine\n"
    assert hashlib.sha1((hf / "model.safetensors").read_bytes()).hexdigest() != weights  # a new export
    assert sorted(p.name for p in hf.parent.iterdir()) == ["hf"]  # no partial or previous copy left beside it


def _paused(args: list[str], pause: Path) -> subprocess.Popen[str]:
    code = "import tests.faults.convert_pause, sys; from titan_core.commands.convert import main; sys.exit(main())"
    return subprocess.Popen([sys.executable, "-c", code, *args], cwd=REPO, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env(TEST_CONVERT_PAUSE_FILE=str(pause)))


@pytest.mark.parametrize("direction", ["to-hf", "from-hf"])
def test_titan_convert_killed_before_it_publishes_leaves_no_out_and_a_rerun_finishes(
        direction: str, done: Path, tmp_path: Path) -> None:
    source = done / ("checkpoints/step-000002" if direction == "to-hf" else "export/hf")
    out = tmp_path / "out"
    before = snapshot(source)
    pause = tmp_path / "paused"
    proc = _paused([direction, str(source), str(out)], pause)
    try:
        deadline = time.monotonic() + 120
        while not pause.exists():
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline
            time.sleep(0.1)
        os.kill(proc.pid, signal.SIGKILL)  # every file written, nothing published
    finally:
        proc.kill()
        proc.wait()
    assert not out.exists()  # nothing that looks complete
    assert (tmp_path / ".out.partial").is_dir()
    again = convert(direction, str(source), str(out))
    assert again.returncode == 0, again.stdout + again.stderr
    assert not (tmp_path / ".out.partial").exists()
    if direction == "to-hf":
        assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    else:
        assert (out / "step-000000" / "titan_checkpoint.json").is_file()
    assert snapshot(source) == before


# ---- 3. deadlines and many small files --------------------------------------------------------------

@pytest.fixture
def silent_server() -> Iterator[int]:
    """A TCP server on 127.0.0.1 that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()


def test_an_hf_source_behind_a_server_that_never_answers_stops_at_its_deadline(silent_server: int,
                                                                              tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{silent_server}"
    t0 = time.monotonic()
    proc = train(f"--job.run_dir={tmp_path / 'run'}", "--training.steps=2", "--data.source=hf:someone/corpus",
                 "--data.allow_download=true", "--data.hf_timeout_s=3",
                 extra_env={"HF_ENDPOINT": url, "HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": "0",
                            "HF_HOME": str(tmp_path / "hf-home")}, timeout=120)
    seconds = time.monotonic() - t0
    refused(proc, 'data.source "hf:someone/corpus": no data for 3 s (data.hf_timeout_s)', url)
    assert seconds < 60, seconds


def test_a_convert_that_never_returns_stops_at_its_deadline_in_titan_train(tmp_path: Path) -> None:
    t0 = time.monotonic()
    proc = train(*PLUGINS, "--converters", "hang_convert", "--model.plugin_timeout_s=2",
                 f"--job.run_dir={tmp_path / 'run'}", "--training.steps=2", timeout=120)
    refused(proc, 'converter "hang_convert"', "did not return from convert() within 2 s (model.plugin_timeout_s)")
    assert time.monotonic() - t0 < 60


def test_a_convert_that_never_returns_fails_its_check_in_titan_plugin_check() -> None:
    proc = run("check", "hang_convert", "--fast", "--call-timeout", "2", *PLUGINS, module="titan_core.commands.titan_plugin",
               timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1, text
    assert "select/convert on meta" in text and "did not return from convert() within 2 s" in text, text
    assert "not run: a call into the plugin did not return" in text, text
    assert "Traceback" not in text, text


def test_a_folder_of_thousands_of_small_jsonl_files_is_read_directly_with_progress(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for i in range(2000):
        shard = data / f"part{i // 500}"
        shard.mkdir(parents=True, exist_ok=True)
        (shard / f"{i:05d}.jsonl").write_text(json.dumps({"text": f"document {i}: " + "lorem ipsum " * 20}) + "\n")
    proc = train(f"--job.run_dir={tmp_path / 'run'}", "--training.steps=1", f"--data.source={data}")
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text
    assert f"reading data.source {data}: 2,000 files" in text, text
    line = next(line for line in text.splitlines() if f"read data.source {data}: 2,000 files, 2,000 documents" in line)
    assert float(line.rsplit(" in ", 1)[1].split()[0]) < 20, line  # one datasets load per file took minutes


# ---- 4. plugin names cannot shadow core sections ------------------------------------------------------

def test_plugins_named_like_core_sections_are_refused(tmp_path: Path) -> None:
    refused(train(*PLUGINS, "--converters", "optimizer", f"--job.run_dir={tmp_path / 'a'}", "--dry-run"),
            'converter "optimizer" of <registered in _hardening_plugins>', "core config section ([optimizer])")
    refused(run(*PLUGINS, "--spec", "training", f"--job.run_dir={tmp_path / 'b'}", "--dry-run"),
            'spec "training" of <registered in ', "core config section ([training])")
    refused(run("new", "converter", "lr_scheduler", "--dir", str(tmp_path / "pkg"), module="titan_core.commands.titan_plugin"),
            'is named "lr_scheduler", which is also the name of a core config section')
    assert not (tmp_path / "pkg").exists() and not (tmp_path / "a").exists()


# ---- 5. titan-convert flags, data, tokenizer, blame, launcher environment ------------------------------

def test_titan_convert_flags_and_config_are_checked(done: Path, tmp_path: Path) -> None:
    step = done / "checkpoints/step-000002"
    before = snapshot(done)
    huge = tmp_path / "huge.toml"
    with huge.open("wb") as fh:
        fh.truncate(17 * 2**20)  # sparse: 17 MiB of nothing
    nonfinite = tmp_path / "nan.toml"
    nonfinite.write_text("[llama3]\nrope_theta = nan\n")
    out = str(tmp_path / "out")
    values = ("nan", "inf", "-1", "0", "1e400")
    cases = [(("to-hf", str(step), out, "--shard-gb", v), f"--shard-gb {float(v)!r}: give the largest safetensors "
              f"file in GB") for v in values] + [
        (("to-hf", str(step), out, "--config", str(huge)), "more than a config file can be (at most 16 MiB)"),
        (("to-hf", str(step), out, "--config", "/dev/zero"), "not a regular file"),
        (("to-hf", str(step), out, "--config", str(nonfinite)), "llama3.rope_theta = nan: config values must be finite"),
    ]
    results = one_process([args for args, _ in cases], module="titan_core.commands.convert")
    for (_, fragment), proc in zip(cases, results, strict=True):
        refused(proc, fragment)
    assert not (tmp_path / "out").exists() and snapshot(done) == before


def test_invalid_utf8_inside_a_json_line_names_the_file_and_line(tmp_path: Path) -> None:
    data = tmp_path / "in" / "bad.jsonl"
    data.parent.mkdir()
    data.write_bytes(b'{"text": "fine"}\n{"text": "also fine"}\n{"text": "caf\xe9"}\n')
    before = snapshot(tmp_path / "in")
    refused(train(f"--job.run_dir={tmp_path / 'run'}", "--training.steps=1", f"--data.source={data}"),
            f"data file {data} line 3: invalid UTF-8 (undecodable byte 0xe9")
    assert snapshot(tmp_path / "in") == before


def test_a_tokenizer_whose_ids_exceed_its_vocabulary_is_blamed(tmp_path: Path) -> None:
    folder = tmp_path / "in" / "tok"
    folder.mkdir(parents=True)
    vocab = {"[UNK]": 0, "<|begin_of_text|>": 1, "<|end_of_text|>": 2, "hello": 5000}
    (folder / "tokenizer.json").write_text(json.dumps({
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": [], "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}}))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<|begin_of_text|>",
                                                              "eos_token": "<|end_of_text|>"}))
    data = tmp_path / "in" / "d.jsonl"
    data.write_text("".join(json.dumps({"text": "hello hello hello " * 20}) + "\n" for _ in range(40)))
    before = snapshot(tmp_path / "in")
    text = refused(train(f"--job.run_dir={tmp_path / 'run'}", "--training.steps=1", f"--data.source={data}",
                         f"--data.tokenizer={folder}"),
                   "the tokenizer", "produced token id 5000, outside its own vocabulary of 4 ids")
    assert "failed in the model's forward" not in text
    assert snapshot(tmp_path / "in") == before


def test_an_error_of_the_cores_own_code_inside_a_plugin_call_is_not_called_a_plugin_bug() -> None:
    from titan_core.errors import CoreErrorInPluginCall
    from titan_core.models.model_parts import output_head
    from titan_core.plugin.guard import plugin_call

    def plugins_forward() -> None:  # the plugin's code hands the core's helper something it cannot use
        output_head(None, False)  # type: ignore[arg-type]

    with pytest.raises(CoreErrorInPluginCall) as caught, plugin_call("titan.train_specs", "x", "the model's forward"):
        plugins_forward()
    assert "titan-core's output_head (models/model_parts.py:" in str(caught.value)
    assert "comes from titan-core's own code, not from the plugin's" in str(caught.value)


def test_a_spec_whose_blocks_the_default_parallelize_fn_cannot_find_is_told_where_to_say(tmp_path: Path) -> None:
    """Was the example of the test above (the core's lookup of model.layers raised inside the plugin call); the
    lookup now names the spec, the attribute that holds the blocks and blocks_attr=."""
    text = refused(run(*PLUGINS, "--spec", "no_layers", "--no_layers.n_layers=1", "--training.seq_len=32",
                       "--training.local_batch_size=2", f"--job.run_dir={tmp_path / 'run'}", "--training.steps=1"),
                   "looks for the model's blocks in model.layers", "_NoLayers has int there (it has model.blocks)")
    assert "titan-core's own code" not in text


def test_world_size_without_rank_and_nproc_under_a_launcher_environment_are_refused_at_once(tmp_path: Path) -> None:
    t0 = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-m", "titan_core", *TINY, *args], cwd=REPO, env=env(**extra),
                              text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
             for args, extra in [((f"--job.run_dir={tmp_path / 'a'}",), {"WORLD_SIZE": "2"}),
                                 (("--nproc-per-node", "2", f"--job.run_dir={tmp_path / 'b'}"),
                                  {"WORLD_SIZE": "2", "RANK": "0"}),
                                 (("--nproc-per-node", "2", f"--job.run_dir={tmp_path / 'c'}"), {"WORLD_SIZE": "4"})]]
    results = [subprocess.CompletedProcess(p.args, p.wait(timeout=120), p.communicate()[0], "") for p in procs]
    refused(results[0], "environment variable WORLD_SIZE=2 is set but RANK is not")
    refused(results[1], "--nproc-per-node 2 starts its own 2 worker(s)", "WORLD_SIZE=2 and RANK=0")
    refused(results[2], "this process already has WORLD_SIZE=4 in its environment")
    assert time.monotonic() - t0 < 60  # no rendezvous wait
    assert not any((tmp_path / n).exists() for n in "abc")


# ---- 6. rope_parameters and a legacy rope_scaling --------------------------------------------------

def test_rope_parameters_and_a_disagreeing_rope_scaling_are_refused(done: Path, tmp_path: Path) -> None:
    import shutil

    config = json.loads((done / "export/hf/config.json").read_text())
    assert config["rope_parameters"]["rope_theta"] == config["rope_theta"]  # titan writes both spellings, equal
    scaled = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 1024}
    # Four copies of the export, each with its own config.json, converted one after the other in one process.
    variants = {
        "disagree_factor": dict(rope_parameters={**scaled, "rope_theta": 500000.0}, rope_scaling={**scaled, "factor": 32.0}),
        # equal scaling, but another base frequency
        "disagree_theta": dict(rope_parameters={**scaled, "rope_theta": 500000.0}, rope_scaling=scaled, rope_theta=10000.0),
        "legacy_theta": dict(rope_parameters={**scaled, "rope_theta": 500000.0}, rope_scaling=None, rope_theta=10000.0),
        # now they agree: read as every transformers version reads it
        "agree": dict(rope_parameters={**scaled, "rope_theta": 500000.0}, rope_scaling=scaled, rope_theta=500000.0),
    }
    before = {}
    for name, change in variants.items():
        hf = tmp_path / name
        shutil.copytree(done / "export/hf", hf)
        (hf / "config.json").write_text(json.dumps({**config, **change}))
        before[name] = snapshot(hf)
    factor, theta, legacy, ok = one_process(
        [("from-hf", str(tmp_path / name), str(tmp_path / f"out-{name}")) for name in variants],
        module="titan_core.commands.convert")
    refused(factor, "sets both rope_parameters and the legacy rope_scaling, and they disagree on factor")
    refused(theta, "they disagree on rope_theta")
    refused(legacy, "sets rope_theta=10000.0 but rope_parameters.rope_theta=500000.0")
    assert not any((tmp_path / f"out-{name}").exists() for name in ("disagree_factor", "disagree_theta", "legacy_theta"))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    shape = json.loads((tmp_path / "out-agree/step-000000/hf_config.json").read_text())
    assert shape["rope_parameters"]["factor"] == 8.0
    for name in variants:  # every input left as it was
        assert snapshot(tmp_path / name) == before[name], name
