"""Hostile inputs, wave 11, the deepseek_v3 plugin: yarn RoPE settings that divided by zero (rope_theta=1: a
ZeroDivisionError traceback in titan-generate, blamed on the plugin by titan-train) or were read as another
value (a beta_fast of 0 became 32), and settings a shape ignores without a word (MoE-only settings on the dense
flavor, mtp_loss_weight without the prediction block).

Every case runs a CLI's ``main`` in this process: titan-train with --dry-run, titan-convert from-hf on a folder
of a config.json and one dummy tensor (refused before any tensor is read).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import hostile_harness as harness
import pytest
import torch
from safetensors.torch import save_file

from titan_deepseek.flavors import deepseek_v3_flavors
from titan_deepseek.hf_adapter import DeepSeekV3StateDictAdapter
from titan_deepseek.model import DeepSeekV3Args

from conftest import CliResult

ADAPTER = DeepSeekV3StateDictAdapter()
DRY = ("--spec", "deepseek_v3", "--training.seq_len=32", "--training.local_batch_size=2", "--dry-run")


def titan_train(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str) -> CliResult:
    harness.isolate(monkeypatch)
    return harness.run_in_process(capsys, *args)


def from_hf(capsys: pytest.CaptureFixture[str], tmp_path: Path, config: dict[str, Any]) -> CliResult:
    """titan-convert from-hf on a folder holding ``config`` and one dummy tensor."""
    from titan_core.commands.convert import main as convert_main

    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    save_file({"dummy": torch.zeros(1)}, str(folder / "model.safetensors"))
    return harness.tool(capsys, convert_main, "from-hf", "--spec", "deepseek_v3", str(folder), str(tmp_path / "out"))


def yarn_config(**rope: Any) -> dict[str, Any]:
    """config.json of the debugmoe shape (yarn), its rope_parameters edited (None: the key removed)."""
    config = ADAPTER.hf_config(dataclasses.replace(deepseek_v3_flavors["debugmoe"], vocab_size=256))
    params = {**config["rope_parameters"], **rope}
    config["rope_parameters"] = {k: v for k, v in params.items() if v is not None}
    config.pop("rope_scaling", None)  # one place for the rope fields
    config["rope_theta"] = config["rope_parameters"]["rope_theta"]  # the two must agree
    return config


# ---- yarn RoPE ------------------------------------------------------------------------------------------------


def test_a_yarn_rope_theta_of_1_is_refused_by_the_dry_run(capsys: pytest.CaptureFixture[str],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: the dry run said "configuration valid" and the real run blamed the plugin (ZeroDivisionError)."""
    result = titan_train(capsys, monkeypatch, *DRY, "--flavor", "debugmoe", "--deepseek_v3.rope_theta=1")
    harness.assert_one_clean_error(result, "rope_theta=1.0 with rope_type='yarn': yarn's correction range divides "
                                           "by log(rope_theta)")


@pytest.mark.parametrize(("rope", "fragment"), [
    # before: converted, then titan-generate ended with a ZeroDivisionError traceback
    pytest.param({"rope_theta": 1.0}, "divides by log(rope_theta)", id="theta-1"),
    pytest.param({"rope_theta": 0.5}, "divides by log(rope_theta)", id="theta-below-1"),
    # before: transformers' `or 32` read the explicit 0 as 32
    pytest.param({"beta_fast": 0}, "beta_fast=0 (a positive number)", id="beta_fast-0"),
    pytest.param({"beta_slow": 0}, "beta_slow=0 (a positive number)", id="beta_slow-0"),
    # before: accepted, the ramp ran backwards / the context was shrunk
    pytest.param({"beta_fast": 0.5}, "rope_beta_fast=0.5 is below rope_beta_slow=1.0", id="beta_fast-below-slow"),
    pytest.param({"factor": 0.5}, "rope_factor=0.5 (config.json: rope_scaling.factor)", id="factor-half"),
    # before: an explicit 0 was taken as absent and derived; transformers uses it (a zero rotary table)
    pytest.param({"attention_factor": 0}, "attention_factor=0 (a positive number)", id="attention_factor-0"),
])
def test_a_yarn_field_that_divides_by_zero_or_means_another_model_is_refused(
        rope: dict[str, Any], fragment: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    result = from_hf(capsys, tmp_path, yarn_config(**rope))
    harness.assert_one_clean_error(result, fragment)
    assert not (tmp_path / "out").exists()


def test_a_negative_mscale_is_refused_by_the_model_args() -> None:
    """Before: accepted; mscale_all_dim=-10/ln(4) made the attention temperature 0 (a division by zero)."""
    with pytest.raises(ValueError, match=r"rope_mscale_all_dim=-7\.0 \(config.json: mscale_all_dim\) must be a finite "
                                         r"number >= 0"):
        dataclasses.replace(deepseek_v3_flavors["debugmoe"], rope_mscale_all_dim=-7.0)


def test_absent_betas_still_take_transformers_defaults() -> None:
    """The guard of the beta change (passes before too): absent betas are 32 and 1, as transformers reads them."""
    args = ADAPTER.model_args_from_hf(yarn_config(beta_fast=None, beta_slow=None))
    assert (args.rope_beta_fast, args.rope_beta_slow) == (32.0, 1.0)


# ---- settings the shape ignores -------------------------------------------------------------------------------


@pytest.mark.parametrize("setting", ["moe_aux_loss_coeff=0.1", "routed_scaling_factor=2.0",
                                     "moe_bias_update_rate=0.01", "first_k_dense_replace=1"])
def test_a_moe_only_setting_on_the_dense_flavor_is_refused(setting: str, capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: accepted and ignored (the same losses as without it)."""
    result = titan_train(capsys, monkeypatch, *DRY, "--flavor", "debugmodel", f"--deepseek_v3.{setting}")
    harness.assert_one_clean_error(result, f"{setting} only act on MoE layers, and this shape has none "
                                           f"(n_routed_experts=0, a dense flavor): the setting would do nothing")


def test_an_mtp_loss_weight_without_the_prediction_block_is_refused(capsys: pytest.CaptureFixture[str],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: accepted and ignored (mtp_layers=0 builds no block)."""
    result = titan_train(capsys, monkeypatch, *DRY, "--flavor", "debugmodel", "--deepseek_v3.mtp_loss_weight=0.5")
    harness.assert_one_clean_error(result, "deepseek_v3.mtp_loss_weight=0.5 weighs the multi-token-prediction loss, "
                                           "but mtp_layers=0 builds no prediction block")
    assert "--deepseek_v3.mtp_layers=1" in result.text


# ---- what must still load -------------------------------------------------------------------------------------


@pytest.mark.parametrize("flavor", sorted(deepseek_v3_flavors))
def test_the_shipped_flavors_still_load(flavor: str) -> None:
    """Each flavor builds, and goes through a Hugging Face config.json and back (the run-time fields, which
    config.json does not hold, taken from the flavor, as a run's section applies them)."""
    args = dataclasses.replace(deepseek_v3_flavors[flavor], vocab_size=256)
    read = ADAPTER.model_args_from_hf(ADAPTER.hf_config(args))
    assert dataclasses.replace(read, **{k: getattr(args, k) for k in ADAPTER.runtime_fields}) == args


@pytest.mark.parametrize("args", [("--flavor", "debugmodel"), ("--flavor", "debugmoe"),
                                  ("--flavor", "debugmodel", "--deepseek_v3.mtp_layers=1",
                                   "--deepseek_v3.mtp_loss_weight=0.1")])
def test_the_debug_flavors_still_pass_the_dry_run(args: tuple[str, ...], capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    result = titan_train(capsys, monkeypatch, *DRY, *args)
    assert result.code == 0 and "configuration valid" in result.text, result.text


def test_a_dense_hf_config_carrying_moe_fields_still_loads_dense() -> None:
    """transformers' DeepseekV3Config carries MoE fields whatever the layers: a dense one (first_k_dense_replace
    >= layers) with non-default values (routed_scaling_factor 2.5, ...) loads, as a dense model with defaults."""
    dense = DeepSeekV3Args(dim=64, n_layers=2, n_heads=4, vocab_size=99, intermediate_size=96)
    config = {**ADAPTER.hf_config(dense), "routed_scaling_factor": 2.5, "n_shared_experts": 1, "n_group": 8,
              "topk_group": 4, "num_experts_per_tok": 8, "n_routed_experts": 256, "first_k_dense_replace": 3}
    assert ADAPTER.model_args_from_hf(config) == dense
