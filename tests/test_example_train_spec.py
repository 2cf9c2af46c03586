"""The worked example plugin, examples/titan-tinygpt, as a model author would ship it.

The package is built into a real wheel and installed into a folder of its own;
the real CLI then finds the ``tinygpt`` entry point from that installed wheel
(not from this checkout), lists it, trains it, trains it again with FSDP2 on two
processes and under tensor parallelism on two processes (titan-core's default
parallelize_fn with the example's TP plan). The model-level tests import the
example's source directly and check its numbers against definitions.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from conftest import REPO, Wheels, titan_command

EXAMPLE = REPO / "examples" / "titan-tinygpt"
TRAIN_ARGS = (
    "--spec", "tinygpt", "--flavor", "debugmodel", "--training.steps=12", "--training.seq_len=64",
    "--metrics.log_freq=1",
)


@dataclasses.dataclass(frozen=True)
class Installed:
    wheel: Path
    site: Path
    root: Path


@pytest.fixture(scope="module")
def installed(wheels: Wheels, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    return Installed(wheels.wheel(EXAMPLE), wheels.site(EXAMPLE), tmp_path_factory.mktemp("tinygpt"))


def _titan(inst: Installed, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m titan_core ARGS`` with only the installed wheel added to the path."""
    env = {**os.environ, "PYTHONPATH": str(inst.site), "OMP_NUM_THREADS": "1"}
    # cwd outside the checkout, so nothing is imported from the example's source tree.
    return subprocess.run(titan_command(*args), cwd=inst.root, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _step_records(run_dir: Path) -> list[dict[str, float]]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "loss" in r]


@pytest.fixture(scope="module")
def single_run(installed: Installed) -> tuple[subprocess.CompletedProcess[str], list[dict[str, float]]]:
    run_dir = installed.root / "run"
    proc = _titan(installed, *TRAIN_ARGS, "--training.local_batch_size=4", f"--job.run_dir={run_dir}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc, _step_records(run_dir)


# ---- packaging and the real CLI ------------------------------------------------------------------
def test_wheel_declares_the_entry_point_and_dependencies(installed: Installed) -> None:
    with zipfile.ZipFile(installed.wheel) as whl:
        names = whl.namelist()
        entry_points = whl.read("titan_tinygpt-0.1.0.dist-info/entry_points.txt").decode()
        metadata = whl.read("titan_tinygpt-0.1.0.dist-info/METADATA").decode()
    assert "[titan.train_specs]\ntinygpt = titan_tinygpt.spec:tinygpt_spec" in entry_points
    assert {"titan_tinygpt/__init__.py", "titan_tinygpt/model.py", "titan_tinygpt/tp_plan.py",
            "titan_tinygpt/validate.py", "titan_tinygpt/spec.py"} <= set(names)
    requires = re.findall(r"^Requires-Dist: (.+)$", metadata, flags=re.M)
    assert sorted(requires) == ["pytest>=8; extra == 'test'", "titan-core<0.2,>=0.1", "torch>=2.11"]


def test_list_shows_tinygpt_from_the_installed_wheel(installed: Installed) -> None:
    proc = _titan(installed, "--list")
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^\s+tinygpt\s+titan-tinygpt 0\.1\.0\s+\(plugin API 1\.0\)$", proc.stdout, flags=re.M), proc.stdout


def test_trains_from_the_installed_wheel_and_the_loss_falls(single_run: Any) -> None:
    proc, records = single_run
    assert [int(r["step"]) for r in records] == list(range(1, 13))
    # Near-uniform predictions at init (std 0.02 head): the first loss is about ln(vocab) = ln(2048).
    assert abs(records[0]["loss"] - math.log(2048)) < 0.2, records[0]
    assert records[-1]["loss"] < records[0]["loss"] - 0.2, [r["loss"] for r in records]
    assert "model tinygpt/debugmodel: 395,008 parameters" in proc.stderr


def _two_process_losses(installed: Installed, name: str, *flags: str) -> list[float]:
    run_dir = installed.root / f"run_{name}"
    proc = _titan(installed, *TRAIN_ARGS, f"--job.run_dir={run_dir}", "--nproc-per-node", "2", *flags)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [r["loss"] for r in _step_records(run_dir)]


def test_fsdp2_on_two_processes_matches_one_process(installed: Installed, single_run: Any) -> None:
    """Same global batch (2 ranks x 2 sequences vs 1 x 4): the same loss at every step."""
    sharded = _two_process_losses(installed, "fsdp", "--training.local_batch_size=2", "--parallelism.dp_shard=2")
    single = [r["loss"] for r in single_run[1]]
    assert len(sharded) == 12
    assert sharded == pytest.approx(single, abs=2e-5)


def test_tensor_parallel_on_two_processes_matches_one_process(installed: Installed, single_run: Any) -> None:
    """The worked TP plan (tp_plan.py) through the core's default parallelize_fn: same batch, same losses."""
    tp = _two_process_losses(installed, "tp", "--training.local_batch_size=4", "--parallelism.tp=2")
    assert tp == pytest.approx([r["loss"] for r in single_run[1]], abs=2e-5)


def test_a_tp_degree_that_splits_no_head_is_refused_before_any_process_starts(installed: Installed) -> None:
    proc = _titan(installed, "--spec", "tinygpt", "--nproc-per-node", "3", "--parallelism.tp=3")
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "parallelism.tp=3 does not divide tinygpt n_heads=4" in proc.stderr
    assert "Traceback" not in proc.stderr


# ---- the model, from the example's source --------------------------------------------------------
@pytest.fixture(scope="module")
def tg() -> ModuleType:
    sys.path.insert(0, str(EXAMPLE / "src"))
    try:
        import titan_tinygpt
    finally:
        sys.path.remove(str(EXAMPLE / "src"))
    assert Path(titan_tinygpt.__file__).is_relative_to(EXAMPLE)
    return titan_tinygpt


def _args(tg: ModuleType, **changes: Any) -> Any:
    return dataclasses.replace(tg.flavors["debugmodel"], vocab_size=97, max_seq_len=32, **changes)


def test_meta_build_plus_init_equals_cpu_build_plus_init(tg: ModuleType) -> None:
    from titan_core.models.init import init_model_weights

    args = _args(tg)
    torch.manual_seed(123)  # the CPU build starts from torch's default init, which must all be overwritten
    on_cpu = tg.TinyGPT(args)
    init_model_weights(on_cpu, seed=7)
    with torch.device("meta"):
        on_meta = tg.TinyGPT(args)
    on_meta.to_empty(device="cpu")
    init_model_weights(on_meta, seed=7)
    a, b = on_cpu.state_dict(), on_meta.state_dict()
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)

    other = tg.TinyGPT(args)
    init_model_weights(other, seed=8)
    random = [k for k in a if not (k.endswith("bias") or ".ln_" in k or k.startswith("norm."))]
    assert all(not torch.equal(a[k], other.state_dict()[k]) for k in random)


def test_init_follows_the_documented_rules(tg: ModuleType) -> None:
    from titan_core.models.init import init_model_weights

    args = _args(tg, dim=128, n_layers=8)
    model = tg.TinyGPT(args)
    init_model_weights(model, seed=0)
    sd = model.state_dict()
    assert torch.equal(sd["layers.3.ln_1.weight"], torch.ones(128))
    assert torch.equal(sd["norm.bias"], torch.zeros(128))
    assert torch.equal(sd["layers.5.attn.wq.bias"], torch.zeros(128))
    assert sd["layers.0.mlp.fc_in.weight"].std().item() == pytest.approx(0.02, rel=0.02)
    assert sd["layers.0.attn.wo.weight"].std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.03)
    with pytest.raises(ValueError, match="no init rule for parameter 'layers.0.attn.extra.weight'"):
        model.init_parameter("layers.0.attn.extra.weight", torch.empty(2, 2), torch.Generator())


def test_attention_matches_its_definition(tg: ModuleType) -> None:
    torch.manual_seed(0)
    args = _args(tg)
    attn = tg.model.CausalSelfAttention(args)
    x = torch.randn(2, 9, args.dim)
    b, s, d, h = 2, 9, args.dim, args.n_heads

    def heads(t: torch.Tensor) -> torch.Tensor:
        return t.view(b, s, h, d // h).transpose(1, 2)

    q, k, v = heads(attn.wq(x)), heads(attn.wk(x)), heads(attn.wv(x))
    scores = q @ k.transpose(-1, -2) / math.sqrt(d // h)
    scores = scores.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), 1), float("-inf"))
    expected = attn.wo((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, d))
    torch.testing.assert_close(attn(x), expected, rtol=1e-5, atol=1e-6)


def test_model_is_causal_and_rejects_long_inputs(tg: ModuleType) -> None:
    torch.manual_seed(0)
    model = tg.TinyGPT(_args(tg))
    tokens = torch.randint(0, 97, (1, 16))
    changed = tokens.clone()
    changed[0, 10:] = (changed[0, 10:] + 1) % 97
    torch.testing.assert_close(model(tokens)[:, :10], model(changed)[:, :10])
    assert not torch.allclose(model(tokens)[:, 10:], model(changed)[:, 10:])
    with pytest.raises(ValueError, match="exceeds TinyGPTArgs.max_seq_len=32"):
        model(torch.zeros(1, 33, dtype=torch.long))


def test_flops_per_token_counts_every_linear_weight(tg: ModuleType) -> None:
    args = _args(tg)
    model = tg.TinyGPT(args)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    assert tg.model.matmul_params(args) == linear == 2 * (4 * 64 * 64 + 8 * 64 * 64) + 64 * 97
    assert tg.flops_per_token(args, 32) == 6 * linear + 12 * 2 * 64 * (32 + 1) / 2  # causal: unmasked keys only
    assert tg.flops_per_token(args, 32, full_attention=True) == 6 * linear + 12 * 2 * 64 * 32


def test_activation_checkpointing_recomputes_and_keeps_names_and_gradients(tg: ModuleType) -> None:
    from parallelize_helpers import parallelize_alone

    from titan_core.models.init import init_model_weights
    from titan_core.parallel import spec_parallelize_fn

    def build(mode: str) -> tuple[torch.nn.Module, list[int]]:
        model = tg.TinyGPT(_args(tg))
        calls = [0]
        # A pre-hook: non-reentrant checkpointing stops recomputing once it has every saved
        # tensor, so a (post) forward hook on the block's last module may never fire again.
        model.layers["1"].mlp.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
        parallelize_alone(spec_parallelize_fn(tg.tinygpt_spec), model, mode=mode)
        init_model_weights(model, seed=3)
        return model, calls

    tokens = torch.randint(0, 97, (2, 16), generator=torch.Generator().manual_seed(0))
    results = {}
    for mode in ("none", "full"):
        model, calls = build(mode)
        F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten()).backward()
        results[mode] = ({n: p.grad for n, p in model.named_parameters()}, calls[0])
    plain, checkpointed = results["none"], results["full"]
    assert plain[0].keys() == checkpointed[0].keys()
    assert all(torch.equal(plain[0][n], checkpointed[0][n]) for n in plain[0])
    assert (plain[1], checkpointed[1]) == (1, 2)  # the block's forward ran again in backward


def test_validate_fn_names_the_setting_and_the_fix(tg: ModuleType) -> None:
    from titan_core import ConfigError, ParallelismSection, TrainingSection

    args = tg.flavors["debugmodel"]
    validate = tg.tinygpt_spec.validate_fn
    with pytest.raises(ConfigError, match=r"training.seq_len=1024 is longer .* --tinygpt.max_seq_len=1024"):
        validate(args, parallelism=ParallelismSection(), training=TrainingSection(seq_len=1024), world_size=1)
    validate(args, parallelism=ParallelismSection(), training=TrainingSection(seq_len=512), world_size=1)


# ---- the guide stays true to the files it describes ----------------------------------------------
GUIDE = REPO / "docs" / "writing-a-train-spec.md"


def test_every_path_in_the_guide_exists() -> None:
    text = GUIDE.read_text()
    links = [(GUIDE.parent / target).resolve() for target in re.findall(r"\]\((\.\./[^)#]+)\)", text)]
    named = [REPO / p for p in re.findall(r"`((?:examples|src|plugins|tests|docs)/[\w./-]+)`", text)]
    assert len(links) >= 8 and len(named) >= 8
    missing = [str(p) for p in links + named if not p.exists()]
    assert not missing, missing


def test_every_excerpt_in_the_guide_is_verbatim_from_its_file() -> None:
    """A code block whose first line is ``# <path>`` must appear, as written, in that file."""
    blocks = re.findall(r"```(?:python|toml)\n# ((?:examples|src|plugins)/\S+)\n(.*?)```", GUIDE.read_text(), flags=re.S)
    assert len(blocks) >= 7
    for path, body in blocks:
        assert body in (REPO / path).read_text(), f"excerpt of {path} drifted:\n{body}"


def test_the_guide_shows_the_training_command_and_the_real_tp_error(tg: ModuleType) -> None:
    from titan_core import ConfigError, ParallelismSection, TrainingSection

    text = GUIDE.read_text()
    assert "titan-train --spec tinygpt --flavor debugmodel --training.steps=20\n" in text
    with pytest.raises(ConfigError) as err:
        tg.tinygpt_spec.validate_fn(tg.flavors["debugmodel"], parallelism=ParallelismSection(tp=3),
                                    training=TrainingSection(), world_size=3)
    assert f"titan-train: error: {err.value}\n" in text
