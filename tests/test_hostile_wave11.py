"""Hostile inputs, wave 11: a rehearsal into a real run's folder (it replaced the run's checkpoint with one rank's
shards), a resume path ignored while checkpointing is off, an optimizer parameter-group rule that takes no
parameter, command flags that each choose what titan-train does, a plugin named like the core's
[fault_tolerance] section, and dry runs that passed what the run refuses.

Each case runs ``titan-train``'s ``main`` in this process. ``pytest -s`` prints the table of (case, exit code,
message).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import hostile_harness as harness
import pytest

from titan_core import register_train_spec
from titan_core.plugin.discovery import load_train_spec

from conftest import CliResult

TABLE: list[tuple[str, int, str]] = []
table = harness.table_printer(TABLE, "input (wave 11)")
TINY = ("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=1", "--training.seq_len=32",
        "--training.local_batch_size=2", "--metrics.report=false")
DRY = (*TINY, "--dry-run")
REHEARSE_RANK_1 = ("--nproc-per-node", "2", "--parallelism.dp_shard=2", "--rehearse-rank", "1")


def titan_train(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, case: str,
                *args: str) -> CliResult:
    harness.isolate(monkeypatch)
    result = harness.run_in_process(capsys, *args)
    TABLE.append((case, result.code, harness.first_error_line(result)))
    return result


# ---- a rehearsal and a real run never share a run folder ------------------------------------------------------


def test_a_rehearsal_refuses_a_folder_holding_a_run_and_leaves_it_as_it_was(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: exit 0, the run's step-000002 replaced by rank 1's shards alone, its metrics set aside and its
    config.toml rewritten; a later rehearsal's step-N fragment then stopped the real run's resume."""
    run = tmp_path / "run"
    trained = titan_train(capsys, monkeypatch, "a real run", *TINY, "--training.steps=2", "--checkpoint.enable=true",
                          "--checkpoint.interval=2", f"--job.run_dir={run}")
    assert trained.code == 0, trained.text
    before = harness.snapshot(run)
    result = titan_train(capsys, monkeypatch, "--rehearse-rank 1 into that run's folder (exit 0, replaced it)",
                         *TINY, "--training.steps=2", "--checkpoint.enable=true", "--checkpoint.interval=2",
                         f"--job.run_dir={run}", *REHEARSE_RANK_1)
    harness.assert_one_clean_error(result, f"--rehearse-rank 1: the run folder {run} holds a training run's files "
                                           f"(config.toml, metrics.jsonl, checkpoints/)")
    assert f"--job.run_dir={run}-rehearsal" in result.text
    harness.assert_unchanged(before, run)


def test_a_rehearsal_keeps_its_own_folder_and_a_real_run_refuses_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "rehearsal"
    folder.mkdir()
    (folder / "console.txt").write_text("a script's log of the command, written first\n")  # not a run's file
    args = (*TINY, "--training.steps=2", "--checkpoint.enable=true", "--checkpoint.interval=2",
            f"--job.run_dir={folder}")
    first = titan_train(capsys, monkeypatch, "--rehearse-rank 1 into a new folder", *args, *REHEARSE_RANK_1)
    assert first.code == 0, first.text
    assert json.loads((folder / "rehearsal.json").read_text()) == {"rehearsal": {"rank": 1, "world_size": 2}}
    assert (folder / "checkpoints" / "step-000002" / "__1_0.distcp").is_file()
    again = titan_train(capsys, monkeypatch, "--rehearse-rank 1 again, same folder", *args, *REHEARSE_RANK_1)
    assert again.code == 0, again.text  # a rehearsal's own folder is reused
    before = harness.snapshot(folder)
    real = titan_train(capsys, monkeypatch, "real run in a rehearsal's folder (exit 2 on its fragment)",
                       *args[:-1], "--training.steps=4", f"--job.run_dir={folder}")
    harness.assert_one_clean_error(real, f"the run folder {folder.resolve()} holds a rehearsal")
    harness.assert_unchanged(before, folder)


def test_a_one_rank_rehearsal_says_it_is_a_plain_run(capsys: pytest.CaptureFixture[str],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: "--rehearse-rank R needs the layout's size: --nproc-per-node M", which was given."""
    result = titan_train(capsys, monkeypatch, "--rehearse-rank 0 --nproc-per-node 1", *TINY, "--nproc-per-node",
                         "1", "--rehearse-rank", "0")
    harness.assert_one_clean_error(result, "--rehearse-rank 0 rehearses one rank of a layout of several (the layout "
                                           "given has 1 rank)")
    assert "A one-rank job is a plain run: drop --rehearse-rank." in result.text


# ---- checkpoint.resume while checkpointing is off -----------------------------------------------------------------


def test_a_resume_path_without_checkpointing_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: exit 0, trained from step 1 and set the run's metrics aside; the checkpoint named was not read."""
    run = tmp_path / "run"
    saved = titan_train(capsys, monkeypatch, "a run with checkpoints", *TINY, "--training.steps=4",
                        "--checkpoint.enable=true", "--checkpoint.interval=2", f"--job.run_dir={run}")
    assert saved.code == 0, saved.text
    before = harness.snapshot(run)
    result = titan_train(capsys, monkeypatch, "--checkpoint.resume=step-000002, enable=false (ignored, exit 0)",
                         *TINY, "--training.steps=6", f"--job.run_dir={run}", "--checkpoint.resume=step-000002")
    harness.assert_one_clean_error(result, "checkpoint.resume=step-000002 names a checkpoint to resume, but "
                                           "checkpoint.enable is false")
    assert "Add --checkpoint.enable=true to resume from it" in result.text
    harness.assert_unchanged(before, run)
    # resume=auto (the default) with checkpointing off still starts over, and now says so.
    fresh = titan_train(capsys, monkeypatch, "checkpointing off beside checkpoints (silent)", *TINY,
                        "--training.steps=1", f"--job.run_dir={run}")
    assert fresh.code == 0, fresh.text
    assert "checkpointing is off (checkpoint.enable=false): starting from step 1, ignoring the checkpoints in" \
        in fresh.text


# ---- optimizer.param_groups rules that take no parameter ---------------------------------------------------------


@pytest.mark.parametrize(("rules", "says"), [
    ("[{name='emb', patterns=['tok_embedding.*'], lr_mult=0.1}]",
     "rule 'emb' (patterns ['tok_embedding.*']) takes no parameter: none of the model's 12 parameter names matches"),
    ("[{name='all', patterns=['*']}, {name='emb', patterns=['tok_embeddings.*'], lr_mult=0.1}]",
     "rule 'emb' (patterns ['tok_embeddings.*']) takes no parameter: every parameter it matches "
     "(tok_embeddings.weight, ...) is taken first by the earlier rule 'all'"),
])
def test_a_param_group_rule_that_takes_nothing_is_refused(rules: str, says: str, capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: exit 0 for the dry run and the run; the rule's lr_mult and weight decay applied to nothing."""
    result = titan_train(capsys, monkeypatch, f"param_groups={rules} (unused, exit 0)", *DRY,
                         f"--optimizer.param_groups={rules}")
    harness.assert_one_clean_error(result, f"optimizer.param_groups {says}")


def test_the_misspelt_pattern_is_shown_the_names_like_it(capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    result = titan_train(capsys, monkeypatch, "param_groups, misspelt", *DRY,
                         "--optimizer.param_groups=[{name='emb', patterns=['tok_embedding.*']}]")
    assert "Names are like tok_embeddings.weight" in result.text, result.text
    good = titan_train(capsys, monkeypatch, "param_groups, a rule that takes parameters", *DRY,
                       "--optimizer.param_groups=[{name='emb', patterns=['tok_embeddings.*'], lr_mult=0.1}]")
    assert good.code == 0 and "dry run: configuration valid" in good.text, good.text


# ---- flags that each choose what titan-train does ------------------------------------------------------------------


@pytest.mark.parametrize(("flags", "shown"), [
    (("--compare-baseline", "--dry-run", "--converters", "float8"), "--dry-run and --compare-baseline"),
    (("--print-config", "--dry-run"), "--print-config and --dry-run"),
    (("--schema", "--list"), "--list and --schema"),
    (("--compare-baseline", "--nproc-per-node", "2", "--rehearse-rank", "1"), "--compare-baseline and --rehearse-rank"),
])
def test_two_command_modes_are_refused(flags: tuple[str, ...], shown: str, capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the first in titan-train's order ran and the other was dropped without a word (exit 0)."""
    result = titan_train(capsys, monkeypatch, f"{' '.join(flags)} (one dropped, exit 0)", *TINY, *flags)
    harness.assert_one_clean_error(result, f"{shown} each choose what titan-train does, and only one can run")


# ---- a plugin named like the core's [fault_tolerance] section ----------------------------------------------------


def test_a_spec_named_fault_tolerance_is_refused(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: loaded, and its model section replaced the core's [fault_tolerance] (--fault_tolerance.local_replicas
    was an unknown key of the model)."""
    register_train_spec(dataclasses.replace(load_train_spec("llama3"), name="fault_tolerance"),
                        name="fault_tolerance")
    result = titan_train(capsys, monkeypatch, 'spec "fault_tolerance" (shadowed the core section)', "--spec",
                         "fault_tolerance", *DRY[2:])
    harness.assert_one_clean_error(result, 'is named "fault_tolerance", which is also the name of a core config '
                                           'section ([fault_tolerance])')


def test_every_core_section_is_reserved_for_plugin_names() -> None:
    from titan_core.config.job import JobConfig
    from titan_core.plugin.section_names import core_section_names

    assert set(core_section_names()) == set(JobConfig.model_fields)
    assert "fault_tolerance" in core_section_names()


def test_plugin_new_refuses_fault_tolerance(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from titan_core.commands.titan_plugin import main

    result = harness.tool(capsys, main, "new", "spec", "fault_tolerance", "--dir", str(tmp_path / "pkg"))
    TABLE.append(("titan-plugin new spec fault_tolerance (written, exit 0)", result.code,
                  harness.first_error_line(result)))
    harness.assert_one_clean_error(result, "fault_tolerance")
    assert not (tmp_path / "pkg").exists()


# ---- a dry run refuses what the run refuses -----------------------------------------------------------------------


@pytest.mark.parametrize(("args", "says"), [
    (("--spec", "deepseek_v3", "--flavor", "debugmoe", "--activation_checkpoint.mode=selective"),
     "activation_checkpoint.mode=selective with selective_every=0 (per-op) needs a list of ops to save, and this "
     "spec supplies none"),
    (("--spec", "llama3", "--flavor", "debugmodel", "--activation_checkpoint.mode=selective",
      "--activation_checkpoint.selective_save_ops=nosuch.op.default"),
     'activation_checkpoint.selective_save_ops: "nosuch.op.default" is not an operator overload'),
])
def test_a_dry_run_refuses_activation_checkpointing_the_run_refuses(
        args: tuple[str, ...], says: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: "dry run: configuration valid" (exit 0), and the run itself exited 2."""
    result = titan_train(capsys, monkeypatch, f"--dry-run {' '.join(args[-1:])} (valid, exit 0)", *args,
                         "--training.seq_len=32", "--training.local_batch_size=2", "--dry-run")
    harness.assert_one_clean_error(result, says)


def test_a_dry_run_still_passes_per_op_selective_with_the_specs_list(capsys: pytest.CaptureFixture[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    result = titan_train(capsys, monkeypatch, "--dry-run, llama3 per-op selective", *DRY,
                         "--activation_checkpoint.mode=selective")
    assert result.code == 0 and "dry run: configuration valid" in result.text, result.text


# ---- starting weights that lack modules a model setting adds -------------------------------------------------------


def test_starting_weights_without_the_modules_a_setting_adds_say_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: "does not fit this model (21 tensors differ ...); choose the flavor it was trained with" (the flavor
    is the checkpoint's), and for a Hugging Face folder "The folder is damaged or its config.json belongs to another
    checkpoint": the folders were whole, --deepseek_v3.mtp_layers=1 added a block they never held."""
    small = ("--spec", "deepseek_v3", "--flavor", "debugmoe", "--deepseek_v3.n_layers=2", "--training.seq_len=32",
             "--training.local_batch_size=2", "--metrics.report=false")
    source = tmp_path / "source"
    saved = titan_train(capsys, monkeypatch, "deepseek run without MTP, checkpoint and HF export", *small,
                        "--training.steps=1", "--checkpoint.enable=true", "--checkpoint.export_at_end=true",
                        "--checkpoint.export_format=hf", f"--job.run_dir={source}")
    assert saved.code == 0, saved.text
    checkpoint = source / "checkpoints" / "step-000001"
    titan = titan_train(capsys, monkeypatch, "initial_load=<titan checkpoint> + mtp_layers=1", *small,
                        f"--job.run_dir={tmp_path / 'a'}", f"--checkpoint.initial_load={checkpoint}",
                        "--deepseek_v3.mtp_layers=1", "--training.steps=1")
    harness.assert_one_clean_error(titan, f"checkpoint {checkpoint} holds no weights for ")
    assert "the model has modules the run that saved it had not" in titan.text
    assert "choose the flavor" not in titan.text
    hf = titan_train(capsys, monkeypatch, "initial_load=<HF folder> + mtp_layers=1", *small,
                     f"--job.run_dir={tmp_path / 'b'}", f"--checkpoint.initial_load={source / 'export' / 'hf'}",
                     "--deepseek_v3.mtp_layers=1", "--training.steps=1")
    harness.assert_one_clean_error(hf, "model tensor(s) are in no file")
    assert "or a model setting given beside its config.json adds modules it does not hold" in hf.text


# ---- settings given a value that does nothing here ----------------------------------------------------------------


@pytest.mark.parametrize(("flag", "says"), [
    ("--optimizer.muon_ns_steps=3", "optimizer.muon_ns_steps=3 does nothing with optimizer.name=AdamW (Muon only)"),
    ("--ema.interval=4", "ema.interval=4 does nothing without ema.decay (no EMA is kept)"),
    ("--lr_scheduler.decay_ratio=0.5", "lr_scheduler.decay_ratio=0.5 does nothing with lr_scheduler.decay_type=cosine"),
    ("--activation_checkpoint.selective_every=2", "activation_checkpoint.selective_every=2 does nothing with "
                                                  "activation_checkpoint.mode=none (selective only)"),
    ("--stability.spike_sigmas=3", "stability.spike_sigmas=3.0 does nothing without stability.spike_guard=true"),
    ("--checkpoint.export_format=hf", "checkpoint.export_format='hf' does nothing without checkpoint.export_at_end"),
])
def test_a_setting_that_does_nothing_here_is_named_once(flag: str, says: str, capsys: pytest.CaptureFixture[str],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: accepted and ignored without a word (the run trained without what the flag asked for)."""
    result = titan_train(capsys, monkeypatch, f"{flag} (ignored, silent)", *DRY, flag)
    assert result.code == 0, result.text
    assert result.text.count(f"[titan] warning: {says}") == 1, result.text


def test_settings_in_use_and_defaults_written_out_say_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    used = titan_train(capsys, monkeypatch, "settings in use", *DRY, "--optimizer.name=Muon",
                       "--optimizer.muon_ns_steps=3", "--ema.decay=0.99", "--ema.interval=4")
    assert used.code == 0 and "warning:" not in used.text, used.text
    printed = titan_train(capsys, monkeypatch, "--print-config", *TINY, "--print-config")
    (tmp_path / "all.toml").write_text(printed.out)  # every field written out, defaults included
    again = titan_train(capsys, monkeypatch, "a printed config given back", "--config", str(tmp_path / "all.toml"),
                        "--dry-run")
    assert again.code == 0 and "warning:" not in again.text, again.text
