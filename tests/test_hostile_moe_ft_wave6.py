"""A hostile-input survey of the MoE and fault-tolerance features: qwen3's MoE flavors and their
``[qwen3]`` knobs, expert parallelism, float8 / mx ``moe_fqns``, Qwen3-MoE Hugging Face folders
(config.json and per-expert safetensors tensors), and the ``[fault_tolerance]`` section.

Every case runs in this process (the CLI's ``main``, ``titan-convert``'s ``main`` or the one
function that reads the input) and asserts the project's rule for bad input: the exit code, one
``error:`` line naming the culprit and the fix, no traceback, nothing already saved changed, and
no hang (each case has a time limit far above its real cost). The rows marked "was:" failed
before this survey; the others guard what already held. ``pytest -s`` prints the table.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from hostile_harness import (
    HostileCase as Case,  # the hostile suites' one case type (id, args, message fragment, exit code)
    assert_one_clean_error,
    assert_unchanged,
    error_lines,
    isolate,
    run_in_process,
    snapshot,
    table_printer,
)

from conftest import CliResult, run_cli

QWEN3_MOE = ("--spec", "qwen3", "--flavor", "debugmoe", "--training.steps=2", "--training.seq_len=32",
             "--training.local_batch_size=2", "--dry-run")
FT = ("--fault_tolerance.enable=true",)
TABLE: list[tuple[str, int, str]] = []
table = table_printer(TABLE, "MoE / fault-tolerance input")


CLI_CASES = [
    # ---- [fault_tolerance] ----------------------------------------------------------------------------
    # was: OverflowError traceback from timedelta (and a 10^33 ms join timeout handed to the lighthouse)
    Case("quorum timeout 1e30 s", (*FT, "--fault_tolerance.lighthouse=http://127.0.0.1:29510",
                                   "--fault_tolerance.quorum_timeout_s=1e30"), "fault_tolerance.quorum_timeout_s"),
    # was: exit 5 "cannot reach the lighthouse" after waiting the quorum timeout, for an address that is no address
    Case("lighthouse http:// only", (*FT, "--fault_tolerance.lighthouse=http://"),
         "'http://' is not a lighthouse address: it names no host. Write it as http://HOST:PORT"),
    Case("lighthouse :::", (*FT, "--fault_tolerance.lighthouse=:::"),
         "':::' is not a lighthouse address: it does not start with http://"),
    Case("lighthouse port 99999", (*FT, "--fault_tolerance.lighthouse=http://127.0.0.1:99999"),
         "its port is not a number from 1 to 65535"),
    Case("lighthouse without scheme", (*FT, "--fault_tolerance.lighthouse=localhost:29510"),
         "it does not start with http://"),
    Case("lighthouse with a space", (*FT, "--fault_tolerance.lighthouse=http://a b:1"),
         "it contains spaces or control characters"),
    Case("lighthouse without port", (*FT, "--fault_tolerance.lighthouse=http://127.0.0.1"), "it names no port"),
    # was: a valid dry run, then 100000 training processes started on one machine
    Case("local_replicas 100000", ("--fault_tolerance.local_replicas=100000",), "fault_tolerance.local_replicas"),
    Case("replica_id >= group_size", (*FT, "--fault_tolerance.group_size=2", "--fault_tolerance.replica_id=2"),
         "replica_id=2 is outside 0..1"),
    Case("sync_steps 0", ("--fault_tolerance.sync_steps=0",), "fault_tolerance.sync_steps"),
    Case("outer_lr NaN", ("--fault_tolerance.outer_lr=nan",), "fault_tolerance.outer_lr = nan"),
    Case("outer_momentum 1 with the local supervisor", ("--fault_tolerance.local_replicas=2", "--fault_tolerance.outer_momentum=1"),
         "fault_tolerance.outer_momentum"),
    Case("semi_sync unknown", ("--fault_tolerance.semi_sync=async",), "fault_tolerance.semi_sync"),
    # was: accepted, and the run trained as one plain group without a word
    Case("semi_sync diloco without replica groups", ("--fault_tolerance.semi_sync=diloco",),
         "semi_sync=diloco synchronises replica groups, but there are none"),
    Case("min_replicas > local_replicas", ("--fault_tolerance.local_replicas=2", "--fault_tolerance.min_replicas=3"),
         "min_replicas=3 is more than group_size=2"),
    # ---- [qwen3] MoE knobs, expert parallelism, moe_fqns ----------------------------------------------------
    # was: silently ignored (no layer -1 or 6 in a 6-layer model), the flag did nothing
    Case("mlp_only_layers [-1]", ("--qwen3.mlp_only_layers=[-1]",),
         "mlp_only_layers names layer -1, but the layers are numbered 0..5"),
    Case("mlp_only_layers [6]", ("--qwen3.mlp_only_layers=[6]",), "mlp_only_layers names layer 6"),
    # was: true read as layer 1
    Case("mlp_only_layers [true]", ("--qwen3.mlp_only_layers=[true]",), "qwen3.mlp_only_layers"),
    # was: a "MoE" model with no MoE layer, trained as a dense one without a word
    Case("decoder_sparse_step past the last layer", ("--qwen3.decoder_sparse_step=100",),
         "none of the 6 layers has experts"),
    Case("every layer mlp_only", ("--qwen3.mlp_only_layers=[0,1,2,3,4,5]",), "none of the 6 layers has experts"),
    Case("moe_aux_loss_coeff NaN", ("--qwen3.moe_aux_loss_coeff=nan",), "qwen3.moe_aux_loss_coeff = nan"),
    Case("float8.moe_fqns matching no experts", ("--converters", "float8", '--float8.moe_fqns=["attention"]'),
         "float8.moe_fqns entries ['attention'] match no GroupedExperts of this model"),
    Case("moe_bias_update_rate negative", ("--qwen3.moe_bias_update_rate=-0.1",), "qwen3.moe_bias_update_rate"),
    Case("decoder_sparse_step 0", ("--qwen3.decoder_sparse_step=0",), "qwen3.decoder_sparse_step"),
    Case("mx.moe_fqns matching no experts", ("--converters", "mx", '--mx.fqns=["attention"]', '--mx.moe_fqns=["router"]'),
         "mx.moe_fqns entries ['router'] match no GroupedExperts"),
    Case("ep 3 with one rank", ("--parallelism.ep=3",), "parallelism.ep=3 does not divide the data-parallel shard degree"),
    Case("ep 0", ("--parallelism.ep=0",), "parallelism.ep"),
]


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.id for c in CLI_CASES])
def test_config_case_is_one_clean_error(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    isolate(monkeypatch)
    start = time.monotonic()
    result = run_in_process(capsys, *QWEN3_MOE, f"--job.run_dir={tmp_path / 'run'}", *case.args)
    record(case.id, result)
    assert_one_clean_error(result, case.fragment, case.code)
    assert time.monotonic() - start < 30, "a config error must not wait on anything"


def test_a_good_lighthouse_address_and_moe_settings_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """The checks refuse only what is wrong: an http://HOST:PORT address (IPv6 too) and in-range layer ids pass."""
    isolate(monkeypatch)
    for address in ("http://127.0.0.1:29510", "http://[::1]:29510", "http://lighthouse.example:80/"):
        result = run_in_process(capsys, *QWEN3_MOE[:-1], f"--job.run_dir={tmp_path / 'run'}", "--print-config",
                                *FT, f"--fault_tolerance.lighthouse={address}", "--qwen3.mlp_only_layers=[0,5]",
                                "--fault_tolerance.quorum_timeout_s=86400")
        assert result.code == 0 and not error_lines(result), result.text
        assert f'lighthouse = "{address}"' in result.text


def test_a_garbage_lighthouse_variable_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """was: TORCHFT_LIGHTHOUSE=':::' reached torchft and came back as exit 5 "cannot reach the lighthouse"."""
    from titan_core import ConfigError
    from titan_core.config.fault_tolerance import FaultToleranceSection
    from titan_core.fault_tolerance.replica import ReplicaGroup

    monkeypatch.setenv("TORCHFT_LIGHTHOUSE", ":::")
    with pytest.raises(ConfigError, match=r"TORCHFT_LIGHTHOUSE=':::' is not a lighthouse address: it does not "
                                          r"start with http://\. Set it"):
        ReplicaGroup(FaultToleranceSection(enable=True), group_rank=0, group_world_size=1,
                     state_dict=dict, load_state_dict=lambda state: None)


@pytest.mark.parametrize("mode", ["sync", "diloco"])
def test_a_moe_flavor_under_fault_tolerance_balances_its_experts(mode: str, tmp_path: Path) -> None:
    """was: the fault-tolerant step skipped the MoE monitor, so debugmoe's routing bias never moved and the
    load figures were missing; then each group moved its bias from its own tokens only, so the groups' biases
    (buffers, which neither the gradient average nor DiLoCo's outer step touches) drifted apart. Now the sync
    step averages the tokens per expert over the groups and DiLoCo averages the biases at each sync: after
    the last step (a sync step) every group holds the same, moved, biases."""
    from titan_core.checkpoint.reading import read_checkpoint_tensors

    run = tmp_path / "ft"
    diloco = ("--fault_tolerance.semi_sync=diloco", "--fault_tolerance.sync_steps=3") if mode == "diloco" else ()
    result = run_cli("--spec", "qwen3", "--flavor", "debugmoe", "--qwen3.n_layers=2", "--training.steps=3",
                     "--training.seq_len=32", "--training.local_batch_size=2", "--metrics.log_freq=1",
                     "--metrics.report=false", "--fault_tolerance.local_replicas=2", "--checkpoint.enable=true",
                     "--checkpoint.interval=3", *diloco, f"--job.run_dir={run}", timeout=300)
    assert result.code == 0, result.text[-3000:]
    biases = []
    for group in (0, 1):
        records = [json.loads(line) for line in (run / f"replica_{group}" / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in records if "loss" in r]
        assert [r["step"] for r in steps] == [1, 2, 3]
        assert all(r["moe_load_imbalance"] >= 1.0 and r["ft_replicas"] == 2 for r in steps), steps
        [checkpoint] = (run / f"replica_{group}" / "checkpoints").glob("step-*3")
        tensors = read_checkpoint_tensors(checkpoint)
        biases.append({k: v for k, v in tensors.items() if k.endswith("expert_bias")})
    assert sorted(biases[0]) == sorted(biases[1]) and len(biases[0]) == 2  # one per MoE layer
    for name, bias in biases[0].items():
        assert bias.abs().max() > 0, name  # the update ran
        assert torch.equal(bias, biases[1][name]), (name, bias, biases[1][name])


# ---- Qwen3-MoE Hugging Face folders --------------------------------------------------------------------

ST = "model.safetensors"
EXPERTS = "model.layers.0.mlp.experts"


@pytest.fixture(scope="module")
def hf_moe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen3-MoE folder as transformers saves it: 4 experts of 2 per token, one tensor per expert."""
    from safetensors.torch import save_file

    from titan_core.hf.stacks import unstack
    from titan_qwen3.hf_adapter import Qwen3StateDictAdapter
    from titan_qwen3.model import Qwen3Args, Transformer

    args = Qwen3Args(dim=32, n_layers=2, n_heads=2, n_kv_heads=1, head_dim=16, vocab_size=64, intermediate_size=48,
                     max_seq_len=64, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
    adapter = Qwen3StateDictAdapter()
    with torch.device("meta"):
        model = Transformer(args)
    gen = torch.Generator().manual_seed(0)
    state = {k: torch.randn(v.shape, generator=gen) * 0.02 for k, v in model.state_dict().items()
             if "expert_bias" not in k}
    folder = tmp_path_factory.mktemp("hf_moe") / "good"
    folder.mkdir()
    save_file(unstack(adapter, adapter.to_hf(state, args)), str(folder / ST), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(adapter.hf_config(args)))
    return folder


def edit_header(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    """Rename or add entries of the safetensors header; the data bytes stay as they are."""
    def damage(folder: Path) -> None:
        raw = (folder / ST).read_bytes()
        n = int.from_bytes(raw[:8], "little")
        header = json.loads(raw[8:8 + n])
        edit(header)
        text = json.dumps(header).encode()
        (folder / ST).write_bytes(len(text).to_bytes(8, "little") + text + raw[8 + n:])
    return damage


def edit_tensors(edit: Callable[[dict[str, torch.Tensor]], None]) -> Callable[[Path], None]:
    """Add or drop tensors and save the file again (a header edit would leave a gap in the data)."""
    def damage(folder: Path) -> None:
        from safetensors.torch import load_file, save_file

        tensors = load_file(str(folder / ST))
        edit(tensors)
        save_file(tensors, str(folder / ST), metadata={"format": "pt"})
    return damage


def rename(old: str, new: str) -> Callable[[dict], None]:
    return lambda header: header.__setitem__(new, header.pop(old))


def edit_config(**changes: object) -> Callable[[Path], None]:
    def damage(folder: Path) -> None:
        config = json.loads((folder / "config.json").read_text())
        config.update(changes)
        (folder / "config.json").write_text(json.dumps(config))
    return damage


@dataclass(frozen=True)
class HFCase:
    id: str
    damage: Callable[[Path], None]
    fragment: str


HF_CASES = [
    # was: a hang (and gigabytes) walking every index up to the forged one
    HFCase("expert index 99999999999", edit_header(rename(f"{EXPERTS}.3.gate_proj.weight",
                                                           f"{EXPERTS}.99999999999.gate_proj.weight")),
           "holds 4 expert tensors of model.layers.0.mlp.experts.gate_proj.weight but not expert 3"),
    # was: "failed in state_dict_adapter.from_hf: KeyError ... a problem in the plugin ..., not in your data"
    HFCase("fused gate_up_proj tensor",
           edit_tensors(lambda t: t.__setitem__(f"{EXPERTS}.gate_up_proj", torch.zeros(4, 32, 32))),
           "model.layers.0.mlp.experts.gate_up_proj is not a tensor of this model"),
    HFCase("negative expert index", edit_header(rename(f"{EXPERTS}.3.gate_proj.weight",
                                                       f"{EXPERTS}.-1.gate_proj.weight")),
           "model.layers.0.mlp.experts.-1.gate_proj.weight is not a tensor of this model"),
    # was: read as expert 3 (a second spelling of an index; with both present one was dropped silently)
    HFCase("expert index with a leading zero", edit_header(rename(f"{EXPERTS}.3.gate_proj.weight",
                                                                  f"{EXPERTS}.03.gate_proj.weight")),
           "model.layers.0.mlp.experts.03.gate_proj.weight is not a tensor of this model"),
    HFCase("expert index in Arabic-Indic digits", edit_header(rename(f"{EXPERTS}.3.gate_proj.weight",
                                                                     f"{EXPERTS}.\u0663.gate_proj.weight")),
           "is not a tensor of this model"),
    HFCase("expert 1 missing",
           edit_tensors(lambda t: [t.pop(f"{EXPERTS}.1.{p}_proj.weight") for p in ("gate", "up", "down")]),
           "but not expert 1; the folder is incomplete, re-download it"),
    HFCase("one expert of another shape", edit_header(lambda h: h[f"{EXPERTS}.2.up_proj.weight"].update(shape=[8, 64])),
           "experts of one layer must have one shape"),
    HFCase("num_experts 8 for 4 stored", edit_config(num_experts=8), "but config.json implies [8, 16, 32]"),
    HFCase("num_experts a string", edit_config(num_experts="4"), "config.json lacks the integer field(s) num_experts"),
    HFCase("num_experts_per_tok above num_experts", edit_config(num_experts_per_tok=5),
           "num_experts_per_tok=5 is more than num_experts=4"),
    HFCase("norm_topk_prob a string", edit_config(norm_topk_prob="true"), "norm_topk_prob='true' (true or false)"),
    HFCase("mlp_only_layers beyond the model", edit_config(mlp_only_layers=[7]),
           "mlp_only_layers names layer 7, but the layers are numbered 0..1"),
]


@pytest.mark.parametrize("case", HF_CASES, ids=[c.id for c in HF_CASES])
def test_qwen3_moe_folder_case_is_one_clean_error(case: HFCase, hf_moe: Path, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from titan_core.commands.convert import main as convert_main

    folder = tmp_path / "hf"
    shutil.copytree(hf_moe, folder)
    case.damage(folder)
    before = snapshot(folder)
    start = time.monotonic()
    result = CliResult(convert_main(["from-hf", str(folder), str(tmp_path / "out"), "--spec", "qwen3"]), "", "")
    captured = capsys.readouterr()
    result = CliResult(result.code, captured.out, captured.err)
    record(case.id, result)
    assert time.monotonic() - start < 30, "reading a header must not walk the indexes it names"
    assert_one_clean_error(result, case.fragment)
    assert "problem in the plugin" not in result.text, result.text
    assert_unchanged(before, folder)
    assert not (tmp_path / "out").exists()


def test_the_good_folder_converts(hf_moe: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The guard of the guards: the undamaged folder converts, so every refusal above is the damage's."""
    from titan_core.commands.convert import main as convert_main

    assert convert_main(["from-hf", str(hf_moe), str(tmp_path / "out"), "--spec", "qwen3"]) == 0, capsys.readouterr()
    assert (tmp_path / "out" / "step-000000").is_dir()


def record(name: str, result: CliResult) -> None:
    errors = error_lines(result)
    TABLE.append((name, result.code, errors[0] if errors else result.text.strip().splitlines()[-1][:200]))
