"""A hostile-input survey of the Hugging Face interop: folders, config.json, safetensors files,
indexes and tokenizer files written by someone else.

Every case damages its own copy of a tiny saved ``LlamaForCausalLM`` folder (hidden 64,
2 layers, vocabulary 2048) and runs one entry point in this process: ``titan-convert
from-hf`` / ``to-hf``, ``titan-train --dry-run`` or a one-step ``titan-train`` with
``--checkpoint.initial_load`` / ``--data.tokenizer``. It asserts the exit code, the words
of the one message (the file, tensor or field, and the fix), no traceback, and that every
file that existed before is byte-identical afterwards (nothing already saved is changed).
A few cases must load (bf16/fp16 weights, a hub-cache symlink, a tied head a file still
carries) and check the values. ``pytest -s`` prints the table.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import CliResult
from hf_helpers import tiny_hf_llama

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
EMBED = "model.embed_tokens.weight"
Q0 = "model.layers.0.self_attn.q_proj.weight"
TABLE: list[tuple[str, int, float, str]] = []


# ---- raw safetensors editing -------------------------------------------------------------------

def read_st(file: Path) -> tuple[dict[str, Any], bytes]:
    raw = file.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    return json.loads(raw[8:8 + n]), raw[8 + n:]


def write_st(file: Path, header: bytes, data: bytes, *, length: int | None = None) -> None:
    file.write_bytes((len(header) if length is None else length).to_bytes(8, "little") + header + data)


def edit_header(folder: Path, edit: Callable[[dict[str, Any]], None], file: str = SINGLE) -> None:
    header, data = read_st(folder / file)
    edit(header)
    write_st(folder / file, json.dumps(header).encode(), data)


def set_tensor(folder: Path, name: str, change: Callable[[torch.Tensor], torch.Tensor | None]) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(folder / SINGLE))
    out = change(tensors[name])
    if out is not None:
        tensors[name] = out
    save_file(tensors, str(folder / SINGLE), metadata={"format": "pt"})


def edit_config(folder: Path, **changes: Any) -> None:
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is _DROP:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config))


_DROP = object()


# ---- damages (each gets the case's copy of the folder) --------------------------------------------

def header_longer_than_file(f: Path) -> None:
    header, data = read_st(f / SINGLE)
    write_st(f / SINGLE, json.dumps(header).encode(), data, length=10**9)


def header_not_json(f: Path) -> None:
    _, data = read_st(f / SINGLE)
    write_st(f / SINGLE, b"this is not json at all", data)


def header_not_utf8(f: Path) -> None:
    _, data = read_st(f / SINGLE)
    write_st(f / SINGLE, b'{"\xff\xfe": 1}', data)


def header_duplicate_keys(f: Path) -> None:
    header, data = read_st(f / SINGLE)
    text = json.dumps(header)
    # A second entry for the embedding that points at q_proj's bytes: a reader that keeps the
    # first and one that keeps the last disagree about what the tensor holds.
    duplicate = json.dumps({EMBED: header[Q0]})[1:-1]
    write_st(f / SINGLE, (text[:-1] + ", " + duplicate + "}").encode(), data)


def offsets_outside(f: Path) -> None:
    edit_header(f, lambda h: h[Q0].update(data_offsets=[10**9, 10**9 + 65536]))


def offsets_overlapping(f: Path) -> None:
    def edit(h: dict[str, Any]) -> None:
        h[Q0]["data_offsets"] = list(h[EMBED]["data_offsets"][:1]) * 1 + [h[EMBED]["data_offsets"][0] + 16384]
    edit_header(f, edit)


def offsets_reversed(f: Path) -> None:
    edit_header(f, lambda h: h[Q0].update(data_offsets=list(reversed(h[Q0]["data_offsets"]))))


def offsets_wrong_size(f: Path) -> None:
    edit_header(f, lambda h: h[Q0].update(shape=[64, 32]))


def dtype_unknown(f: Path) -> None:
    edit_header(f, lambda h: h[Q0].update(dtype="Q4_K"))


def dtype_fp8(f: Path) -> None:
    # A real safetensors dtype (one byte an element) that titan has no float type for.
    def edit(h: dict[str, Any]) -> None:
        h[Q0]["dtype"] = "F8_E4M3"
        h[Q0]["shape"] = [64, 256]
    edit_header(f, edit)


def dtype_integer(f: Path) -> None:
    set_tensor(f, Q0, lambda t: t.view(torch.int32).clone())


def shape_negative(f: Path) -> None:
    edit_header(f, lambda h: h[Q0].update(shape=[-64, -64]))


def shape_huge(f: Path) -> None:
    edit_header(f, lambda h: h[Q0].update(shape=[2**40, 2**30]))


def truncated(f: Path) -> None:
    raw = (f / SINGLE).read_bytes()
    (f / SINGLE).write_bytes(raw[:len(raw) // 2])


def zero_bytes(f: Path) -> None:
    (f / SINGLE).write_bytes(b"")


def weights_are_a_folder(f: Path) -> None:
    (f / SINGLE).unlink()
    (f / SINGLE).mkdir()


def weights_are_a_fifo(f: Path) -> None:
    (f / SINGLE).unlink()
    os.mkfifo(f / SINGLE)


def config_is_a_fifo(f: Path) -> None:
    (f / "config.json").unlink()
    os.mkfifo(f / "config.json")


def weights_link_to_dev_zero(f: Path) -> None:
    (f / SINGLE).unlink()
    (f / SINGLE).symlink_to("/dev/zero")


def weights_link_outside(f: Path) -> None:
    # The Hugging Face hub cache: snapshots/<rev>/model.safetensors -> ../../blobs/<sha>. Must load.
    blobs = f.parent / "blobs"
    blobs.mkdir()
    (f / SINGLE).rename(blobs / "abc123")
    (f / SINGLE).symlink_to(Path("..") / "blobs" / "abc123")


def index_of(f: Path) -> dict[str, Any]:
    return json.loads((f / INDEX).read_text())


def write_index(f: Path, index: Any) -> None:
    (f / INDEX).write_text(json.dumps(index))


def index_dotdot(f: Path) -> None:
    index = index_of(f)
    index["weight_map"][EMBED] = "../elsewhere/model-00001-of-00002.safetensors"
    write_index(f, index)


def index_absolute(f: Path) -> None:
    index = index_of(f)
    index["weight_map"][EMBED] = "/etc/passwd"
    write_index(f, index)


def index_is_a_list(f: Path) -> None:
    write_index(f, [index_of(f)])


def index_wrong_shard(f: Path) -> None:
    index = index_of(f)
    files = sorted(set(index["weight_map"].values()))
    index["weight_map"][EMBED] = next(x for x in files if x != index["weight_map"][EMBED])
    write_index(f, index)


def index_names_a_tensor_no_shard_has(f: Path) -> None:
    index = index_of(f)
    index["weight_map"]["model.layers.7.self_attn.q_proj.weight"] = index["weight_map"][EMBED]
    write_index(f, index)


def index_and_single_file(f: Path) -> None:
    # A stale single file beside the shards: transformers would load it, titan the index.
    other = tiny_hf_llama(f.parent / "other", seed=1)
    shutil.copy(other / SINGLE, f / SINGLE)


def config_not_json(f: Path) -> None:
    (f / "config.json").write_text("{ not json")


def config_list(f: Path) -> None:
    (f / "config.json").write_text("[1, 2]")


def config_missing_field(f: Path) -> None:
    edit_config(f, hidden_size=_DROP)


def config_string_int(f: Path) -> None:
    edit_config(f, num_hidden_layers="2")


def config_bool_int(f: Path) -> None:
    edit_config(f, num_hidden_layers=True)


def config_float_int(f: Path) -> None:
    edit_config(f, intermediate_size=160.0)


def config_zero_heads(f: Path) -> None:
    edit_config(f, num_attention_heads=0, head_dim=_DROP)


def config_negative_layers(f: Path) -> None:
    edit_config(f, num_hidden_layers=-2)


def config_zero_kv_heads(f: Path) -> None:
    edit_config(f, num_key_value_heads=0)


def config_heads_not_divisible(f: Path) -> None:
    edit_config(f, num_key_value_heads=3)


def config_hidden_not_divisible(f: Path) -> None:
    edit_config(f, num_attention_heads=3, head_dim=_DROP)


def config_huge_vocab(f: Path) -> None:
    edit_config(f, vocab_size=2**30)  # 256 GiB of embedding if it were allocated


def config_vocab_past_int64(f: Path) -> None:
    edit_config(f, vocab_size=10**30)


def config_many_layers(f: Path) -> None:
    edit_config(f, num_hidden_layers=10**5)  # a meta model of that many layers alone takes minutes


def config_huge_positions(f: Path) -> None:
    edit_config(f, max_position_embeddings=10**12)


def deeply_nested(text_file: str) -> Callable[[Path], None]:
    def damage(f: Path) -> None:
        if text_file.startswith("tokenizer"):
            tok_folder(f)
        (f / text_file).write_text("[" * 100_000 + "]" * 100_000)
    return damage


def config_mistral(f: Path) -> None:
    edit_config(f, model_type="mistral", architectures=["MistralForCausalLM"])


def config_no_model_type(f: Path) -> None:
    edit_config(f, model_type=_DROP, architectures=_DROP)


def rope_unknown_type(f: Path) -> None:
    edit_config(f, rope_scaling={"rope_type": "yarn", "factor": 4.0}, rope_parameters=_DROP)


def rope_missing_key(f: Path) -> None:
    edit_config(f, rope_scaling={"rope_type": "llama3", "factor": 8.0}, rope_parameters=_DROP)


def rope_not_a_number(f: Path) -> None:
    edit_config(f, rope_scaling={"rope_type": "llama3", "factor": "eight", "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
                rope_parameters=_DROP)


def rope_a_list(f: Path) -> None:
    edit_config(f, rope_scaling=["llama3", 8.0], rope_parameters=_DROP)


def eps_not_a_number(f: Path) -> None:
    edit_config(f, rms_norm_eps="tiny")


def tied_with_distinct_head(f: Path) -> None:
    edit_config(f, tie_word_embeddings=True)  # the file still holds its own (different) lm_head.weight


def untied_without_head(f: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(f / SINGLE))
    del tensors["lm_head.weight"]
    save_file(tensors, str(f / SINGLE), metadata={"format": "pt"})


def extra_tensor(f: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(f / SINGLE))
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(64)
    save_file(tensors, str(f / SINGLE), metadata={"format": "pt"})


def wrong_shape_tensor(f: Path) -> None:
    set_tensor(f, "model.layers.1.post_attention_layernorm.weight", lambda t: torch.ones(32))


def nan_weight(f: Path) -> None:
    def change(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t[3, 5] = float("nan")
        return t
    set_tensor(f, "model.layers.1.mlp.down_proj.weight", change)


def inf_weight(f: Path) -> None:
    def change(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t[0] = float("inf")
        return t
    set_tensor(f, "model.norm.weight", change)


def bf16_weights(f: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = {k: v.to(torch.bfloat16) for k, v in load_file(str(f / SINGLE)).items()}
    save_file(tensors, str(f / SINGLE), metadata={"format": "pt"})
    edit_config(f, torch_dtype="bfloat16")


def fp16_weights(f: Path) -> None:
    from safetensors.torch import load_file, save_file

    tensors = {k: v.to(torch.float16) for k, v in load_file(str(f / SINGLE)).items()}
    save_file(tensors, str(f / SINGLE), metadata={"format": "pt"})
    edit_config(f, dtype="float16")


# ---- tokenizer folders (the HF folder doubles as one) ---------------------------------------------

def tok_folder(f: Path) -> None:
    from titan_core.hf.tokenizer_json import write_hf_tokenizer
    from titan_core.plan.tokenizer import build_tokenizer

    write_hf_tokenizer(build_tokenizer("builtin"), f)


def tok_garbage_line(f: Path) -> None:
    tok_folder(f)
    with (f / "original" / "tokenizer.model").open("a") as out:
        out.write("garbage line here\n")


def tok_not_base64(f: Path) -> None:
    tok_folder(f)
    with (f / "original" / "tokenizer.model").open("a") as out:
        out.write("!!!notbase64!!! 99999\n")


def tok_duplicate_rank(f: Path) -> None:
    tok_folder(f)
    with (f / "original" / "tokenizer.model").open("a") as out:
        out.write("QUJDREVGRw== 5\n")


def tok_json_only_garbage(f: Path) -> None:
    (f / "tokenizer.json").write_text("{ not a tokenizer")


def tok_config_a_list(f: Path) -> None:
    tok_folder(f)
    shutil.rmtree(f / "original")
    (f / "tokenizer_config.json").write_text('["bos"]')


def tok_json_only(f: Path) -> None:
    tok_folder(f)
    shutil.rmtree(f / "original")


def export_is_a_file(f: Path) -> None:
    (f.parent.parent / "r").mkdir()
    (f.parent.parent / "r" / "export").write_text("not a folder")


def tok_json_is_a_list(f: Path) -> None:
    tok_folder(f)
    (f / "tokenizer.json").write_text("[]")


# ---- titan-convert inputs --------------------------------------------------------------------------

def titan_checkpoint(f: Path) -> None:
    """A titan checkpoint made from the folder (from-hf), at f/ckpt/step-000000, and a run folder around it."""
    from titan_core.commands.convert import main

    assert main(["from-hf", str(f), str(f.parent.parent / "run" / "checkpoints"), "--spec", "llama3"]) == 0


def garbage_hf_config_json(f: Path) -> None:
    titan_checkpoint(f)
    (f.parent.parent / "run" / "checkpoints" / "step-000000" / "hf_config.json").write_text("[not, json")


def edited_hf_config_json(f: Path) -> None:
    """A from-hf checkpoint whose shape file was edited after it was written (its digest no longer matches)."""
    titan_checkpoint(f)
    path = f.parent.parent / "run" / "checkpoints" / "step-000000" / "hf_config.json"
    path.write_text(path.read_text().replace('"rope_theta": 10000.0', '"rope_theta": 20000.0'))


@dataclass(frozen=True)
class Case:
    id: str
    damage: Callable[[Path], None] | None
    mode: str  # from-hf | dry | train | to-hf | tok | to-hf-run | to-hf-inside | from-hf-inside | out-under-file
    fragments: tuple[str, ...]
    code: int = 2
    sharded: bool = False
    extra: tuple[str, ...] = ()  # more titan-train flags ("{hf}", "{root}" filled in)


CASES = [
    # safetensors headers and bytes
    Case("header_longer_than_file", header_longer_than_file, "from-hf", (SINGLE, "re-download")),
    Case("header_not_json", header_not_json, "from-hf", (SINGLE, "re-download")),
    Case("header_not_utf8", header_not_utf8, "from-hf", (SINGLE, "re-download")),
    Case("header_duplicate_keys", header_duplicate_keys, "from-hf", (SINGLE, "re-download")),
    Case("offsets_outside_file", offsets_outside, "from-hf", (SINGLE, "re-download")),
    Case("offsets_overlapping", offsets_overlapping, "from-hf", (SINGLE, "re-download")),
    Case("offsets_reversed", offsets_reversed, "from-hf", (SINGLE, "re-download")),
    Case("offsets_not_shape_size", offsets_wrong_size, "from-hf", (SINGLE, "re-download")),
    Case("dtype_unknown", dtype_unknown, "from-hf", (SINGLE, "re-download")),
    Case("dtype_fp8", dtype_fp8, "from-hf", (SINGLE, Q0, "F8_E4M3")),
    Case("dtype_integer_weight", dtype_integer, "from-hf", (Q0, "int32", "floating-point")),
    Case("shape_negative", shape_negative, "from-hf", (SINGLE, "re-download")),
    Case("shape_huge", shape_huge, "from-hf", (SINGLE, "re-download")),
    Case("truncated", truncated, "from-hf", (SINGLE, "re-download")),
    Case("zero_bytes", zero_bytes, "from-hf", (SINGLE, "re-download")),
    Case("weights_are_a_folder", weights_are_a_folder, "from-hf", ("neither model.safetensors",)),
    Case("weights_are_a_fifo", weights_are_a_fifo, "from-hf", ("neither model.safetensors",)),
    Case("config_is_a_fifo", config_is_a_fifo, "dry", ("has no config.json",)),
    Case("weights_link_to_dev_zero", weights_link_to_dev_zero, "from-hf", ("neither model.safetensors",)),
    Case("weights_hub_cache_symlink", weights_link_outside, "from-hf", (), code=0),
    # the shard index
    Case("index_dotdot", index_dotdot, "from-hf", (INDEX, "plain file names"), sharded=True),
    Case("index_absolute", index_absolute, "dry", (INDEX, "/etc/passwd", "plain file names"), sharded=True),
    Case("index_is_a_list", index_is_a_list, "from-hf", (INDEX, "weight_map"), sharded=True),
    Case("index_wrong_shard", index_wrong_shard, "from-hf", (INDEX, EMBED, "does not hold it"), sharded=True),
    Case("index_names_a_tensor_no_shard_has", index_names_a_tensor_no_shard_has, "from-hf",
         ("model.layers.7.self_attn.q_proj.weight", "does not hold it"), sharded=True),
    Case("index_and_single_file", index_and_single_file, "dry", (INDEX, SINGLE, "both"), sharded=True),
    # config.json
    Case("config_not_json", config_not_json, "dry", ("config.json", "cannot read")),
    Case("config_a_list", config_list, "from-hf", ("config.json", "not a JSON object")),
    Case("config_missing_field", config_missing_field, "dry", ("hidden_size",)),
    Case("config_string_for_int", config_string_int, "from-hf", ("num_hidden_layers",)),
    Case("config_bool_for_int", config_bool_int, "dry", ("num_hidden_layers",)),
    Case("config_float_for_int", config_float_int, "dry", ("intermediate_size",)),
    Case("config_zero_heads", config_zero_heads, "dry", ("num_attention_heads",)),
    Case("config_negative_layers", config_negative_layers, "from-hf", ("num_hidden_layers=-2 (must be 1 or more)",)),
    Case("config_zero_kv_heads", config_zero_kv_heads, "dry", ("num_key_value_heads",)),
    Case("config_heads_not_divisible", config_heads_not_divisible, "dry", ("num_key_value_heads",)),
    Case("config_hidden_not_divisible", config_hidden_not_divisible, "from-hf", ("num_attention_heads",)),
    Case("config_huge_vocab_from_hf", config_huge_vocab, "from-hf", (EMBED, "config.json implies [1073741824, 64]")),
    Case("config_huge_vocab_train", config_huge_vocab, "train", (EMBED, "config.json implies [1073741824, 64]")),
    Case("config_vocab_past_int64", config_vocab_past_int64, "dry", ("vocab_size=1000000000000000000000000000000",
                                                                     "config.json is damaged")),
    Case("config_many_layers", config_many_layers, "from-hf", ("num_hidden_layers=100000 (more than 1,024",)),
    Case("config_huge_positions_train", config_huge_positions, "train", ("max_position_embeddings=1000000000000",)),
    Case("config_huge_positions_from_hf", config_huge_positions, "from-hf", ("max_position_embeddings",)),
    Case("config_deeply_nested", deeply_nested("config.json"), "dry", ("config.json", "recursion")),
    Case("index_deeply_nested", deeply_nested(INDEX), "from-hf", (INDEX, "weight_map"), sharded=True),
    Case("tokenizer_json_deeply_nested", deeply_nested("tokenizer.json"), "tok", ("tokenizer.json",)),
    Case("config_mistral", config_mistral, "dry", ('"mistral"', "Pick the spec")),
    Case("config_no_model_type", config_no_model_type, "from-hf", ("has no model_type",)),
    Case("rope_unknown_type", rope_unknown_type, "dry", ("rope_type='yarn'",)),
    Case("rope_missing_key", rope_missing_key, "dry", ("low_freq_factor",)),
    Case("rope_not_a_number", rope_not_a_number, "dry", ("factor", "'eight'")),
    Case("rope_a_list", rope_a_list, "from-hf", ("rope_scaling",)),
    Case("eps_not_a_number", eps_not_a_number, "dry", ("rms_norm_eps",)),
    # tensors against config.json
    Case("tied_with_distinct_head", tied_with_distinct_head, "from-hf", (), code=0),
    Case("untied_without_head", untied_without_head, "from-hf", ("output.weight", "in no file")),
    Case("extra_tensor", extra_tensor, "from-hf", ("model.layers.0.self_attn.q_proj.bias",)),
    Case("wrong_shape_tensor", wrong_shape_tensor, "train", ("model.layers.1.post_attention_layernorm.weight",)),
    Case("nan_weight_from_hf", nan_weight, "from-hf", ("model.layers.1.mlp.down_proj.weight", "NaN")),
    Case("inf_weight_train", inf_weight, "train", ("model.norm.weight", "NaN or inf")),
    Case("bf16_weights", bf16_weights, "from-hf", (), code=0),
    Case("fp16_weights", fp16_weights, "train", (), code=0),
    # tokenizer folders
    Case("tok_garbage_line", tok_garbage_line, "tok", ("tokenizer.model", "is not '<base64 token> <rank>'")),
    Case("tok_not_base64", tok_not_base64, "tok", ("tokenizer.model", "!!!notbase64!!!")),
    Case("tok_duplicate_rank", tok_duplicate_rank, "tok", ("tokenizer.model", "repeats rank 5")),
    Case("tok_json_only_garbage", tok_json_only_garbage, "tok", ("tokenizer.json", "cannot read")),
    Case("tok_config_a_list", tok_config_a_list, "tok", ("tokenizer_config.json", "not a JSON object")),
    Case("tok_json_a_list_beside_ranks", tok_json_is_a_list, "tok", ("tokenizer.json", "not a JSON object")),
    # titan-convert
    Case("to_hf_of_a_run_folder", titan_checkpoint, "to-hf-run", ("is a run folder", "checkpoints/step-000000")),
    Case("to_hf_out_inside_checkpoint", titan_checkpoint, "to-hf-inside", ("inside",)),
    Case("from_hf_out_inside_input", None, "from-hf-inside", ("inside",)),
    Case("from_hf_out_under_a_file", None, "out-under-file", ("a_file/out", "Not a directory")),
    Case("to_hf_out_is_a_file", titan_checkpoint, "to-hf-file", ("already exists",)),
    Case("to_hf_hf_config_json_edited", edited_hf_config_json, "to-hf-plain", ("hf_config.json", "checksum")),
    Case("initial_load_hf_config_json_edited", edited_hf_config_json, "train", ("hf_config.json", "checksum"),
         extra=("--checkpoint.initial_load={root}/run/checkpoints/step-000000",)),
    Case("to_hf_hf_config_json_garbage", garbage_hf_config_json, "to-hf-plain", ("hf_config.json",)),
    # titan-train flags around initial_load
    Case("flag_contradicts_vocab", None, "dry", ("llama3.vocab_size=4096 (config.json: 2048)",),
         extra=("--llama3.vocab_size=4096",)),
    Case("flag_contradicts_norm_eps", None, "dry", ("llama3.norm_eps=0.001 (config.json: 1e-05)",),
         extra=("--llama3.norm_eps=1e-3",)),
    Case("initial_load_is_config_json", None, "dry", ("config.json", "not a folder"),
         extra=("--checkpoint.initial_load={hf}/config.json",)),
    Case("initial_load_is_a_run_folder", titan_checkpoint, "dry", ("is a run folder", "checkpoints/step-000000"),
         extra=("--checkpoint.initial_load={root}/run",)),
    Case("export_hf_with_tokenizer_json_only", tok_json_only, "train", ("tiktoken ranks", "export_format=native"),
         extra=("--data.tokenizer={hf}", "--checkpoint.export_at_end=true", "--checkpoint.export_format=hf")),
    Case("export_hf_where_export_is_a_file", export_is_a_file, "train", ("r/export", "a path component is a file"),
         extra=("--checkpoint.export_at_end=true", "--checkpoint.export_format=hf")),
]


# ---- running -------------------------------------------------------------------------------------

TRAIN = ("--spec", "llama3", "--training.steps=1", "--training.seq_len=32", "--training.local_batch_size=2",
         "--metrics.log_freq=1", "--lr_scheduler.warmup_steps=1")


def snapshot(root: Path) -> dict[str, str]:
    out = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink() or not path.is_file():
            out[str(path.relative_to(root))] = "link" if path.is_symlink() else "dir" if path.is_dir() else "other"
        else:
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def invoke(case: Case, hf: Path, root: Path) -> tuple[CliResult, Callable[[], Any]]:
    """Run the case's entry point; (its result, a callable that checks a loaded result)."""
    from titan_core.commands.convert import main as convert_main
    from titan_core.commands.titan_train import main as train_main

    out, run = root / "out", root / "run"
    step = run / "checkpoints" / "step-000000"
    mode = case.mode
    extra = [a.format(hf=hf, root=root) for a in case.extra]
    if mode == "from-hf":
        return CliResult(convert_main(["from-hf", str(hf), str(out), "--spec", "llama3"]), "", ""), lambda: out
    if mode == "dry":
        return CliResult(train_main(["--dry-run", *TRAIN, f"--checkpoint.initial_load={hf}",
                                     f"--job.run_dir={run}", *extra]), "", ""), lambda: None
    if mode == "train":
        return CliResult(train_main([*TRAIN, f"--checkpoint.initial_load={hf}", f"--job.run_dir={root / 'r'}",
                                     *extra]), "", ""), lambda: None
    if mode == "tok":
        return CliResult(train_main(["--dry-run", *TRAIN, f"--data.tokenizer={hf}", f"--job.run_dir={run}"]),
                         "", ""), lambda: None
    if mode == "to-hf-run":
        return CliResult(convert_main(["to-hf", str(run), str(out)]), "", ""), lambda: None
    if mode == "to-hf-plain":
        return CliResult(convert_main(["to-hf", str(step), str(out)]), "", ""), lambda: None
    if mode == "to-hf-inside":
        return CliResult(convert_main(["to-hf", str(step), str(step / "hf")]), "", ""), lambda: None
    if mode == "to-hf-file":
        (root / "taken").write_text("mine")
        return CliResult(convert_main(["to-hf", str(step), str(root / "taken")]), "", ""), lambda: None
    if mode == "from-hf-inside":
        return CliResult(convert_main(["from-hf", str(hf), str(hf / "titan"), "--spec", "llama3"]), "", ""), \
            lambda: None
    if mode == "out-under-file":
        (root / "a_file").write_text("mine")
        return CliResult(convert_main(["from-hf", str(hf), str(root / "a_file" / "out"), "--spec", "llama3"]),
                         "", ""), lambda: None
    raise AssertionError(mode)


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hostile_hf")
    return {"single": tiny_hf_llama(root / "single", vocab=2048),
            "sharded": tiny_hf_llama(root / "sharded", vocab=2048, max_shard_size="300KB")}


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_hf_input(case: Case, sources: dict[str, Path], tmp_path: Path,
                          capsys: pytest.CaptureFixture[str]) -> None:
    hf = tmp_path / "snap" / "hf"
    shutil.copytree(sources["sharded" if case.sharded else "single"], hf)
    if case.damage is not None:
        case.damage(hf)
    before = snapshot(tmp_path)
    capsys.readouterr()
    start = time.perf_counter()
    result, _ = invoke(case, hf, tmp_path)
    seconds = time.perf_counter() - start
    captured = capsys.readouterr()
    result = CliResult(result.code, captured.out, captured.err)
    TABLE.append((case.id, result.code, seconds, next((line for line in result.err.splitlines() if "error:" in line), "")))
    assert result.code == case.code, result.text
    assert "Traceback" not in result.text, result.text
    for fragment in case.fragments:
        assert fragment in result.text, f"{fragment!r} not in:\n{result.text}"
    if case.code:
        assert result.err.count("error:") == 1, result.text
    after = snapshot(tmp_path)
    changed = [k for k, v in before.items() if after.get(k) != v]
    assert not changed, f"changed or removed: {changed}"
    if case.code:
        assert not (tmp_path / "out").exists()
    assert seconds < 30, seconds
    CHECKS.get(case.id, lambda *_: None)(hf, tmp_path)


# ---- what the cases that load must have loaded ------------------------------------------------------

def _hf_tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    out: dict[str, torch.Tensor] = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


def _round_trip(root: Path) -> dict[str, torch.Tensor]:
    from titan_core.commands.convert import main

    assert main(["to-hf", str(root / "out" / "step-000000"), str(root / "back")]) == 0
    return _hf_tensors(root / "back")


def check_bf16(hf: Path, root: Path) -> None:
    source, back = _hf_tensors(hf), _round_trip(root)
    assert sorted(source) == sorted(back)
    for name, value in source.items():
        assert back[name].dtype == torch.float32 and torch.equal(back[name], value.float()), name


def check_hub_cache(hf: Path, root: Path) -> None:
    source, back = _hf_tensors(hf), _round_trip(root)
    assert all(torch.equal(back[k], v) for k, v in source.items())


def check_tied_with_head(hf: Path, root: Path) -> None:
    # transformers ties lm_head to embed_tokens when tie_word_embeddings is true and ignores the
    # file's own lm_head.weight; titan does the same (the embedding is the source).
    back = _round_trip(root)
    assert "lm_head.weight" not in back
    assert torch.equal(back[EMBED], _hf_tensors(hf)[EMBED])


CHECKS: dict[str, Callable[[Path, Path], None]] = {
    "bf16_weights": check_bf16, "weights_hub_cache_symlink": check_hub_cache,
    "tied_with_distinct_head": check_tied_with_head,
}


def test_tokenizer_json_without_the_tokenizers_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from titan_core.commands.titan_train import main

    tok_folder(tmp_path / "tok")
    shutil.rmtree(tmp_path / "tok" / "original")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import tokenizers -> ImportError
    code = main(["--dry-run", *TRAIN, f"--data.tokenizer={tmp_path / 'tok'}", f"--job.run_dir={tmp_path / 'run'}"])
    text = capsys.readouterr().err
    assert code == 2 and "pip install 'titan-core[hf]'" in text and "Traceback" not in text, text


def test_traceback_flag_shows_where(sources: dict[str, Path], tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    from titan_core.commands.convert import main

    hf = tmp_path / "hf"
    shutil.copytree(sources["single"], hf)
    nan_weight(hf)
    assert main(["from-hf", str(hf), str(tmp_path / "out"), "--spec", "llama3", "--traceback"]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "NaN or inf" in err


# ---- two ranks: a damage that only one rank's slice holds ------------------------------------------

@pytest.mark.parametrize(("layout", "tensor", "row"), [
    (("--parallelism.dp_shard=2", "--training.local_batch_size=1"), EMBED, 2000),  # rank 1's rows only
    (("--parallelism.dp_shard=1", "--parallelism.pp=2", "--training.local_batch_size=2"),
     "model.layers.1.mlp.down_proj.weight", 3),  # the last stage's layer only
], ids=["fsdp2", "pp2"])
def test_a_nan_only_one_rank_reads_stops_every_rank_with_one_message(
        layout: tuple[str, ...], tensor: str, row: int, sources: dict[str, Path], tmp_path: Path) -> None:
    from hf_helpers import titan

    hf = tmp_path / "hf"
    shutil.copytree(sources["single"], hf)

    def change(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t[row, 0] = float("nan")
        return t
    set_tensor(hf, tensor, change)
    before = snapshot(tmp_path)
    start = time.perf_counter()
    run = titan(tmp_path / "run", f"--checkpoint.initial_load={hf}", "--training.steps=1",
                "--checkpoint.enable=true", *layout, nproc=2)
    seconds = time.perf_counter() - start
    TABLE.append((f"nan_on_one_rank_{'pp2' if '--parallelism.pp=2' in layout else 'fsdp2'}", run.code, seconds,
                  next((line for line in run.err.splitlines() if "error:" in line), "")))
    assert run.code == 2, run.text
    assert f"tensor {tensor}" in run.text and "NaN or inf" in run.text, run.text
    assert "Traceback" not in run.text and run.text.count("error:") == 1, run.text
    assert not (tmp_path / "run" / "checkpoints").exists() or not any((tmp_path / "run" / "checkpoints").iterdir())
    assert all(snapshot(tmp_path).get(k) == v for k, v in before.items())


def set_theta(folder: Path, theta: float) -> None:
    config = json.loads((folder / "config.json").read_text())
    config["rope_theta"] = theta
    if isinstance(config.get("rope_parameters"), dict):  # transformers 5 keeps it here
        config["rope_parameters"]["rope_theta"] = theta
    (folder / "config.json").write_text(json.dumps(config))


def test_a_resume_refuses_an_initial_load_config_json_edited_since_the_run_started(
        sources: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from titan_core.commands.titan_train import main

    hf = tmp_path / "hf"
    shutil.copytree(sources["single"], hf)
    run = tmp_path / "run"
    args = [*(a for a in TRAIN if not a.startswith("--training.steps")), "--checkpoint.enable=true",
            "--checkpoint.interval=1", f"--checkpoint.initial_load={hf}", f"--job.run_dir={run}"]
    assert main([*args, "--training.steps=1"]) == 0
    assert json.loads((run / "initial_load_config.json").read_text()) == json.loads((hf / "config.json").read_text())
    set_theta(hf, 20000.0)  # same shapes: the checkpoint alone cannot tell
    capsys.readouterr()
    before = snapshot(run)
    code = main([*args, "--training.steps=2"])
    err = capsys.readouterr().err
    TABLE.append(("resume_after_config_json_edit", code, 0.0, next((x for x in err.splitlines() if "error:" in x), "")))
    assert code == 2 and "has changed since this run started" in err and "rope_theta: 10000.0 then, 20000.0 now" in err
    assert "Traceback" not in err and err.count("error:") == 1, err
    assert snapshot(run) == before  # nothing trained, nothing rewritten
    # to-hf of the run's checkpoint takes the model the run trained, from the copy, not the edited file.
    from titan_core.commands.convert import main as convert

    assert convert(["to-hf", str(run / "checkpoints" / "step-000001"), str(tmp_path / "exported")]) == 0
    assert json.loads((tmp_path / "exported" / "config.json").read_text())["rope_theta"] == 10000.0
    set_theta(hf, 10000.0)  # restored: the resume goes on
    assert main([*args, "--training.steps=2"]) == 0


def test_print_table() -> None:
    """Last in the file: the table of every case above (``pytest -s``)."""
    for row in TABLE:
        print(f"{row[0]:40s} exit {row[1]}  {row[2]:6.2f}s  {row[3][:150]}")
