"""Hostile checkpoints through the real CLI: no code runs, nothing outside the folder is read, nothing is lost.

Each refusal case copies a finished 4-step run (checkpoints at steps 2 and 4),
damages or crafts its checkpoint folder, runs ``titan-train`` (in this process:
the same ``main`` a shell runs) and asserts the exit code, the message, no
traceback, one error line, and that every file that existed before is
byte-identical afterwards (path, size, mtime, SHA-1). The crafted pickles are
real gadgets: each is first shown to run code under plain ``pickle.loads``.
``pytest -s`` prints the table of (case, exit code, message).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hostile_harness import (
    LAST,
    assert_one_clean_error,
    assert_unchanged,
    error_lines,
    small,
    snapshot,
    table_printer,
)

from titan_core.checkpoint.integrity import file_digest

from conftest import CliResult, run_cli, run_main

SMALL = small()
MARK = "PWNED"  # a gadget that runs creates this file in the run folder
TABLE: list[tuple[str, int, str]] = []


# ---- crafted pickles: each runs `touch <mark>` when unpickled by plain pickle ----------------


def gadgets(mark: Path) -> dict[str, bytes]:
    touch = f"touch {mark}"

    class Reduce:
        def __reduce__(self) -> tuple[object, tuple[str]]:
            return (os.system, (touch,))

    code = f"open({str(mark)!r}, 'w').write('x')"
    return {
        "__reduce__ os.system": pickle.dumps(Reduce()),
        # getitem(torch.distributed.checkpoint.metadata.__builtins__, "exec")(code)
        "__builtins__ exec": (b"c_operator\ngetitem\n(ctorch.distributed.checkpoint.metadata\n__builtins__\nVexec\ntR(V"
                              + code.encode() + b"\ntR."),
        # getattr(importlib.import_module("os"), "system")(touch)
        "getattr chain": (b"cbuiltins\ngetattr\n(cimportlib\nimport_module\n(Vos\ntRVsystem\ntR(V" + touch.encode()
                          + b"\ntR."),
        "eval": b"cbuiltins\neval\n(V__import__('os').system(" + repr(touch).encode() + b")\ntR.",
        # getattr(getitem(getattr(torch.serialization._get_layout, "__globals__"), "os"), "system")(touch)
        "_get_layout __globals__": (b"cbuiltins\ngetattr\n(c_operator\ngetitem\n(cbuiltins\ngetattr\n"
                                    b"(ctorch.serialization\n_get_layout\nV__globals__\ntRVos\ntRVsystem\ntR(V"
                                    + touch.encode() + b"\ntR."),
        # a DCP Metadata whose state holds a nested GLOBAL posix.system call
        "nested GLOBAL in Metadata": (b"ctorch.distributed.checkpoint.metadata\nMetadata\n)\x81}(Vstate_dict_metadata\n"
                                      b"cposix\nsystem\n(V" + touch.encode() + b"\ntRub."),
    }


def test_every_gadget_really_runs_code_under_plain_pickle(tmp_path: Path) -> None:
    for name, payload in gadgets(tmp_path / "ran").items():
        (tmp_path / "ran").unlink(missing_ok=True)
        try:
            pickle.loads(payload)
        except Exception:
            pass  # the nested-GLOBAL one fails after its call ran
        assert (tmp_path / "ran").exists(), f"gadget {name!r} is not live"


# ---- damage helpers --------------------------------------------------------------------------


def redigest(folder: Path, *, files: dict[str, tuple[int, int]] | None = None) -> None:
    """Rewrite the manifest as an attacker with write access would: matching sizes and CRCs."""
    record_path = folder / "titan_checkpoint.json"
    record = json.loads(record_path.read_text())
    if files is None:
        files = {p.name: file_digest(p) for p in sorted(folder.iterdir())
                 if p.name != "titan_checkpoint.json" and p.is_file() and not p.is_symlink()}
    record["files"] = {name: {"size": s, "crc32": c} for name, (s, c) in files.items()}
    record_path.write_text(json.dumps(record))


def edit_index(folder: Path, edit: Callable[[dict], None]) -> None:
    path = folder / "tensor_index.json"
    index = json.loads(path.read_text())
    edit(index)
    path.write_text(json.dumps(index))
    redigest(folder)


def legacy(payload: bytes) -> Callable[[Path], None]:
    """The newest checkpoint turned into the old format: DCP's pickled .metadata, no JSON index."""
    def damage(run: Path) -> None:
        folder = run / LAST
        (folder / "tensor_index.json").unlink()
        (folder / ".metadata").write_bytes(payload)
        record = json.loads((folder / "titan_checkpoint.json").read_text())
        record["format"] = 1
        (folder / "titan_checkpoint.json").write_text(json.dumps(record))
    return damage


def extra_pickle(payload: bytes) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        (run / LAST / ".metadata").write_bytes(payload)
    return damage


def index_replaced_by(payload: bytes) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        (run / LAST / "tensor_index.json").write_bytes(payload)
        redigest(run / LAST)
    return damage


def manifest_names(name: str) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        folder = run / LAST
        files = {n: (v["size"], v["crc32"]) for n, v in json.loads((folder / "titan_checkpoint.json").read_text())["files"].items()}
        files[name] = files.pop("__0_0.distcp")
        redigest(folder, files=files)
    return damage


def chunk_file(name: str) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        edit_index(run / LAST, lambda ix: ix["tensors"]["model.norm.weight"]["chunks"][0].update(file=name))
    return damage


def symlink_out(victim: str) -> Callable[[Path], None]:
    def damage(run: Path) -> None:
        folder = run / LAST
        outside = run / f"outside-{victim}"
        (folder / victim).rename(outside)
        (folder / victim).symlink_to(outside)
    return damage


def unlisted_file(run: Path) -> None:
    (run / LAST / "notes.txt").write_text("not part of the checkpoint\n")


def unlisted_folder(run: Path) -> None:
    (run / LAST / "extra").mkdir()


def retyped(run: Path) -> None:
    def edit(ix: dict) -> None:  # bfloat16 with a consistent byte length: only the dtype check can catch it
        entry = ix["tensors"]["model.tok_embeddings.weight"]
        entry["dtype"] = "bfloat16"
        entry["chunks"][0]["length"] //= 2
    edit_index(run / LAST, edit)


def reshaped(run: Path) -> None:
    def edit(ix: dict) -> None:  # [256] -> [128], consistent chunk and length; the identity record still says [256]
        entry = ix["tensors"]["model.norm.weight"]
        entry["size"], entry["chunks"][0]["sizes"] = [128], [128]
        entry["chunks"][0]["length"] //= 2
    edit_index(run / LAST, edit)


def oversized(run: Path) -> None:
    def edit(ix: dict) -> None:  # a 4 TB tensor: refused from the numbers, nothing allocated
        entry = ix["tensors"]["rng.rank0.torch_cpu"]
        entry["size"], entry["chunks"][0]["sizes"] = [4 << 40], [4 << 40]
        entry["chunks"][0]["length"] = 4 << 40
    edit_index(run / LAST, edit)


def past_the_end(run: Path) -> None:
    edit_index(run / LAST, lambda ix: ix["tensors"]["model.norm.weight"]["chunks"][0].update(offset=1 << 30))


def short_chunks(run: Path) -> None:
    edit_index(run / LAST, lambda ix: ix["tensors"]["model.norm.weight"]["chunks"][0].update(sizes=[128], length=512))


def manifest_size_lies(run: Path) -> None:
    folder = run / LAST
    files = {n: (v["size"], v["crc32"]) for n, v in json.loads((folder / "titan_checkpoint.json").read_text())["files"].items()}
    size, crc = files["__0_0.distcp"]
    files["__0_0.distcp"] = (size * 1000, crc)
    redigest(folder, files=files)


def forged_value(run: Path) -> None:
    edit_index(run / LAST, lambda ix: ix["values"].update({"lr_scheduler.last_epoch": {"py/reduce": "os.system"}}))


def object_dtype(run: Path) -> None:
    edit_index(run / LAST, lambda ix: ix["tensors"]["model.norm.weight"].update(dtype="object"))


def nan_in_index(run: Path) -> None:
    path = run / LAST / "tensor_index.json"
    path.write_text(path.read_text().replace('"format":1', '"format":NaN', 1))
    redigest(run / LAST)


def negative_manifest_size(run: Path) -> None:
    folder = run / LAST
    files = {n: (v["size"], v["crc32"]) for n, v in json.loads((folder / "titan_checkpoint.json").read_text())["files"].items()}
    files["__0_0.distcp"] = (-1, files["__0_0.distcp"][1])
    redigest(folder, files=files)


def renamed(run: Path) -> None:
    (run / LAST).rename(run / "checkpoints" / "step-000009")


def copied(run: Path) -> None:
    shutil.copytree(run / "checkpoints" / "step-000002", run / "checkpoints" / "step-000008")


def symlinked_step(run: Path) -> None:
    (run / "checkpoints" / "step-000010").symlink_to(run / LAST)


# ---- the cases --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    fragment: str
    damage: Callable[[Path], None]
    args: tuple[str, ...] = ()  # "{run}" is filled in
    code: int = 2


_G = gadgets(Path("/nonexistent/placeholder"))  # ids only; each case crafts its payload for its own folder
CASES = [
    *[Case(f"legacy .metadata: {name}", "its tensor index is DCP's pickled .metadata", damage=lambda run, n=name: legacy(
        gadgets(run / MARK)[n])(run)) for name in _G],
    *[Case(f"extra .metadata: {name}", "holds '.metadata', which its manifest does not list",
           damage=lambda run, n=name: extra_pickle(gadgets(run / MARK)[n])(run)) for name in list(_G)[:2]],
    Case("pickle as tensor_index.json", "tensor index", damage=lambda run: index_replaced_by(
        gadgets(run / MARK)["__reduce__ os.system"])(run)),
    Case("manifest names ../", "is not a plain file name", damage=manifest_names("../__0_0.distcp")),
    Case("manifest names an absolute path", "is not a plain file name", damage=manifest_names("/etc/passwd")),
    Case("index names ../ file", "is not a plain file name inside the checkpoint folder", damage=chunk_file("../x.distcp")),
    Case("index names an unlisted file", "is not listed in the checkpoint's manifest", damage=chunk_file("other.distcp")),
    Case("shard is a symlink out", "'__0_0.distcp' is a symbolic link", damage=symlink_out("__0_0.distcp")),
    Case("index is a symlink out", "'tensor_index.json' is a symbolic link", damage=symlink_out("tensor_index.json")),
    Case("identity file is a symlink out", "titan_checkpoint.json is unreadable or corrupt",
         damage=symlink_out("titan_checkpoint.json")),
    Case("unlisted file", "holds 'notes.txt', which its manifest does not list", damage=unlisted_file),
    Case("unlisted folder", "holds 'extra', which its manifest does not list", damage=unlisted_folder),
    Case("dtype changed", "tensor 'model.tok_embeddings.weight' has dtype bfloat16[2048, 256] in the checkpoint but "
         "float32[2048, 256]", damage=retyped),
    Case("shape changed", "tensor 'model.norm.weight' has shape float32[128] in the checkpoint but float32[256]",
         damage=reshaped),
    Case("4 TB tensor declared", "lie beyond the end of __0_0.distcp", damage=oversized),
    Case("chunk past the end of its file", "lie beyond the end of __0_0.distcp", damage=past_the_end),
    Case("chunks smaller than the tensor", "its chunks hold 128 elements but its size [256] has 256", damage=short_chunks),
    Case("manifest size larger than the file", "bytes but was written with", damage=manifest_size_lies),
    Case("forged value tag in the index", "value of 'lr_scheduler.last_epoch' is not in titan-core's value encoding",
         damage=forged_value),
    Case("object dtype in the index", "dtype 'object' is not one of float64", damage=object_dtype),
    Case("NaN constant in the index", "NaN is not valid JSON", damage=nan_in_index),
    Case("negative size in the manifest", "-1 is not a non-negative integer", damage=negative_manifest_size),
    Case("renamed step folder", "is named for step 9 but its identity file records step 4", damage=renamed,
         args=("--checkpoint.resume=step-000009",)),
    Case("copied step folder", "is named for step 8 but its identity file records step 2", damage=copied,
         args=("--checkpoint.resume=step-000008",)),
    Case("symlinked step folder", "is a symbolic link; titan-core resumes only from a real folder",
         damage=symlinked_step, args=("--checkpoint.resume=step-000010",)),
]


# ---- fixtures ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def good_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 4-step run with checkpoints at steps 2 and 4."""
    run = tmp_path_factory.mktemp("good") / "run"
    result = run_cli(*SMALL, "--training.steps=4", f"--job.run_dir={run}")
    assert result.code == 0, result.text
    assert sorted(p.name for p in (run / LAST).iterdir()) == ["__0_0.distcp", "tensor_index.json", "titan_checkpoint.json"]
    return run


table = table_printer(TABLE, "checkpoint")


def train(capsys: pytest.CaptureFixture[str], run: Path, *args: str) -> CliResult:
    result = run_main(capsys, *SMALL, f"--job.run_dir={run}", *args)
    lines = error_lines(result)
    TABLE.append((str(run.name), result.code, lines[0] if lines else ""))
    return result


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_checkpoint_is_refused_and_changes_nothing(case: Case, good_run: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / case.id.replace(" ", "_").replace("/", "_")
    shutil.copytree(good_run, run, symlinks=True)
    case.damage(run)
    before = snapshot(run)
    result = train(capsys, run, "--training.steps=6", *(a.format(run=run) for a in case.args))
    assert_one_clean_error(result, case.fragment, case.code)
    assert_unchanged(before, run)
    assert not (run / MARK).exists(), "a crafted pickle ran code"


# ---- cases that run (something is ignored, or nothing dangerous is read) -----------------------


def test_a_listed_pickle_is_never_read(good_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An attacker who also rewrites the manifest can add a listed pickle: titan-core never opens it.

    (A listed ``.metadata`` is refused outright: manifest names are plain, non-hidden file names.)
    """
    run = tmp_path / "run"
    shutil.copytree(good_run, run)
    (run / LAST / "metadata.pkl").write_bytes(gadgets(run / MARK)["__reduce__ os.system"])
    redigest(run / LAST)
    result = train(capsys, run, "--training.steps=6")
    assert result.code == 0, result.text
    assert f"resuming from {run / LAST} at step 4" in result.text
    assert not (run / MARK).exists()


def test_a_pickle_in_place_of_a_shard_loads_as_numbers_never_as_code(
        good_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    shutil.copytree(good_run, run)
    shard = run / LAST / "__0_0.distcp"
    payload = gadgets(run / MARK)["__reduce__ os.system"]
    shard.write_bytes(payload + bytes(shard.stat().st_size - len(payload)))  # same size, re-digested
    redigest(run / LAST)
    result = train(capsys, run, "--training.steps=6")
    assert not (run / MARK).exists()
    # the forged bytes pass every check but are nonsense: refused cleanly when applied, never run
    assert_one_clean_error(result, "holds a state this run cannot apply (RuntimeError: Invalid mt19937 state)")


def test_loading_a_checkpoint_unpickles_nothing(good_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    shutil.copytree(good_run, run)

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("a checkpoint load unpickled something")

    for target, name in ((pickle, "load"), (pickle, "loads"), (pickle, "Unpickler"), (torch, "load")):
        monkeypatch.setattr(target, name, forbidden)
    result = train(capsys, run, "--training.steps=5")
    assert result.code == 0, result.text
    assert f"resuming from {run / LAST} at step 4" in result.text


@pytest.mark.parametrize("damage", [copied, symlinked_step], ids=["copied", "symlinked"])
def test_auto_resume_ignores_misnamed_and_linked_folders(damage: Callable[[Path], None], good_run: Path,
                                                         tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    shutil.copytree(good_run, run)
    damage(run)
    bogus = sorted((run / "checkpoints").iterdir())[-1]
    before = snapshot(run / "checkpoints")
    result = train(capsys, run, "--training.steps=6", "--checkpoint.keep_latest_k=1")
    assert result.code == 0, result.text
    assert f"ignoring {bogus}" in result.text
    assert f"resuming from {run / LAST} at step 4" in result.text
    # retention (keep 1) deleted steps 2 and 4 but never the link, its target's files, or the copy
    assert bogus.exists() or bogus.is_symlink()
    after = snapshot(run / "checkpoints")
    assert {k: v for k, v in before.items() if k.startswith(bogus.name)} == \
        {k: v for k, v in after.items() if k.startswith(bogus.name)}
    assert not (run / LAST).exists() and (run / "checkpoints" / "step-000006").is_dir()


def test_retention_never_deletes_a_checkpoint_newer_than_the_resumed_one(
        good_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    shutil.copytree(good_run, run)
    newer = snapshot(run / LAST)
    result = train(capsys, run, "--training.steps=3", "--checkpoint.resume=step-000002", "--checkpoint.keep_latest_k=1")
    assert result.code == 0, result.text
    assert "deleted" in result.text and "step-000002 (keep_latest_k=1)" in result.text
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000003", "step-000004"]
    assert snapshot(run / LAST) == newer


def test_legacy_checkpoint_in_auto_mode_is_refused_with_how_to_proceed(
        good_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    shutil.copytree(good_run, run)
    legacy(gadgets(run / MARK)["__reduce__ os.system"])(run)
    before = snapshot(run)
    result = train(capsys, run, "--training.steps=6")
    assert_one_clean_error(result, "convert it once: python -m titan_core.checkpoint.legacy --i-trust-this-checkpoint")
    assert "--checkpoint.resume=never" in result.text
    assert_unchanged(before, run)
    assert not (run / MARK).exists()


# ---- config, run folder and non-finite state --------------------------------------------------


def test_empty_run_dir_is_an_error_and_creates_nothing(tmp_path: Path) -> None:
    result = run_cli(*SMALL, "--training.steps=1", "--job.run_dir=", cwd=tmp_path)
    assert_one_clean_error(result, "job.run_dir: empty; give the folder for this run's files")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("args", "fragment"), [
    (("--optimizer.lr=inf",), "optimizer.lr = inf: config values must be finite numbers"),
    (("--training.max_norm=nan",), "training.max_norm = nan: config values must be finite numbers"),
    (("--config", "{toml}"), "optimizer.weight_decay = nan: config values must be finite"),
])
def test_non_finite_config_values_are_config_errors(args: tuple[str, ...], fragment: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text("[optimizer]\nweight_decay = nan\n")
    result = train(capsys, tmp_path / "run", *(a.format(toml=toml) for a in args))
    assert_one_clean_error(result, fragment)
    assert not (tmp_path / "run").exists()


def test_a_non_finite_state_is_never_saved(good_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Step 1's loss and gradients are finite but its update leaves an inf weight: step 1 is not saved."""
    from titan_core.train.trainer import Trainer

    original = Trainer.train_step

    def overflowing_step(self: Trainer, batches: object) -> object:
        result = original(self, batches)
        with torch.no_grad():
            self.model_parts[0].norm.weight[3] = float("inf")  # what an overflowing update leaves behind
        return result

    monkeypatch.setattr(Trainer, "train_step", overflowing_step)
    run = tmp_path / "run"
    shutil.copytree(good_run, run)
    before = snapshot(run / "checkpoints")
    result = train(capsys, run, "--training.steps=2", "--checkpoint.interval=1", "--checkpoint.resume=never")
    assert_one_clean_error(result, "step 1: parameter 'norm.weight' holds non-finite values (NaN or inf), so the "
                           "checkpoint of step 1 was not saved", code=3)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000002", "step-000004"]
    assert_unchanged(before, run / "checkpoints")


def test_metrics_hold_one_record_per_step_after_a_resume(good_run: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    shutil.copytree(good_run, run)
    shutil.rmtree(run / LAST)  # as if the run had crashed after logging steps 3 and 4 but before saving 4
    old = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    result = train(capsys, run, "--training.steps=4")
    assert result.code == 0, result.text
    assert "moved 2 records of steps after 2 from metrics.jsonl to metrics.superseded.jsonl" in result.text
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 4]
    moved = [json.loads(line) for line in (run / "metrics.superseded.jsonl").read_text().splitlines()]
    assert [r["step"] for r in moved] == [3, 4] and all(r["superseded_by_run_from_step"] == 2 for r in moved)
    assert [r["loss"] for r in moved] == [r["loss"] for r in old[2:4]]
    assert not list(run.glob(".*.tmp"))  # config.toml and metrics.jsonl were replaced atomically


# ---- the value encoding: round trip, and nothing but plain data ---------------------------------


def test_values_round_trip_through_json_and_anything_else_is_refused() -> None:
    from titan_core.checkpoint.tensor_index import decode_value, encode_value
    from titan_core.errors import CheckpointError

    value = {"betas": (0.9, 0.95), 3: [None, True, -2, float("inf")], "name": "x", "nested": {"t": (1, (2,))}}
    decoded = decode_value(json.loads(json.dumps(encode_value(value, key="k"))), key="k")
    assert decoded == value and isinstance(decoded["betas"], tuple) and isinstance(decoded["nested"]["t"][1], tuple)
    with pytest.raises(CheckpointError, match=r"cannot save the state entry 'opt.dtype': a dtype is neither"):
        encode_value(torch.float32, key="opt.dtype")
    for forged in ({"py/object": "os.system"}, {"tuple": "abc"}, {"float": "1e999"}, {"dict": [[True, 1]]}):
        with pytest.raises(ValueError, match="not in titan-core's value encoding"):
            decode_value(forged, key="k")


def test_two_ranks_refuse_a_forged_checkpoint_together_without_hanging(tmp_path: Path) -> None:
    """FSDP2 on 2 processes: the dtype check fails inside DCP's planning on both ranks; both exit 2."""
    run = tmp_path / "run"
    fsdp = ("--nproc-per-node", "2", "--parallelism.dp_shard=2")
    first = run_cli(*SMALL, *fsdp, "--training.steps=2", f"--job.run_dir={run}", timeout=300)
    assert first.code == 0, first.text
    edit_index(run / "checkpoints" / "step-000002",
               lambda ix: ix["tensors"]["model.norm.weight"].update(dtype="float16") or
               [c.update(length=c["length"] // 2) for c in ix["tensors"]["model.norm.weight"]["chunks"]])
    before = snapshot(run)
    result = run_cli(*SMALL, *fsdp, "--training.steps=4", f"--job.run_dir={run}", timeout=300)
    assert result.code == 2, result.text
    assert "tensor 'model.norm.weight' has dtype float16[256] in the checkpoint but float32[256]" in result.text
    assert "Traceback" not in result.text, result.text
    # Both ranks refuse with the same message; the launcher prints it once (worker_errors.py).
    errors = error_lines(result)
    assert len(errors) == 1 and errors[0].startswith("titan-train: error: tensor 'model.norm.weight'"), result.err
    assert_unchanged(before, run)


def test_a_save_replaces_a_symlink_in_its_way_without_following_it(good_run: Path, tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    run, outside = tmp_path / "run", tmp_path / "outside"
    shutil.copytree(good_run, run)
    shutil.copytree(good_run / "checkpoints" / "step-000002", outside)
    link = run / "checkpoints" / "step-000006"
    link.symlink_to(outside)
    before = snapshot(outside)
    result = train(capsys, run, "--training.steps=6")
    assert result.code == 0, result.text
    assert f"ignoring {link}: a symbolic link is never resumed from" in result.text
    assert f"resuming from {run / LAST} at step 4" in result.text
    assert link.is_dir() and not link.is_symlink()  # the new save of step 6
    assert snapshot(outside) == before
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000002", "step-000004", "step-000006"]
