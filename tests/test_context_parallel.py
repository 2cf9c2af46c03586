"""Context parallelism (``parallelism.cp``): each sequence split over ranks, attention exact across them.

The kernel is checked in one process against ``F.scaled_dot_product_attention`` in float64
(forward and every gradient, grouped-query heads, packed documents). The runs go through the
real CLI in real gloo processes: every layout must reproduce the per-step loss and gradient norm
of one process on the same global batch of packed short documents, with and without document
masking (documents then cross chunk boundaries); a CP 2 checkpoint resumes on one process; bad
settings are refused up front.

Run with ``-s`` to see the measured differences per layout.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from titan_core.parallel import context_attention
from titan_core.parallel.context_attention import attention_pairs, context_parallel_attention
from titan_core.parallel.context_layout import ContextLayout

from conftest import Run, run_main, titan, write_uneven_corpus

TOLERANCE = 1e-6  # the bound: fp32 losses and gradient norms, relative
STEPS = 5
SEQ_LEN = 256  # 4 chunks at cp 2, 8 at cp 4: with masking, chunks cross document boundaries of the corpus below
COMMON = (f"--training.seq_len={SEQ_LEN}", f"--training.steps={STEPS}", "--metrics.log_freq=1",
          "--lr_scheduler.warmup_steps=1", "--lr_scheduler.decay_type=constant", "--training.max_norm=1.0",
          "--training.seed=0")
MODELS = {
    "llama3": ("--spec", "llama3", "--flavor", "debugmodel", "--llama3.n_layers=2"),
    "qwen3": ("--spec", "qwen3", "--flavor", "debugmodel", "--qwen3.n_layers=2"),
    # With the sequence-wise auxiliary loss: the cp ranks sum each sequence's counts (moe/balance.py).
    "qwen3_moe": ("--spec", "qwen3", "--flavor", "debugmoe", "--qwen3.n_layers=2", "--qwen3.moe_aux_loss_coeff=0.1"),
}


# ---- the kernel, in one process --------------------------------------------------------------------


def _reference_mask(starts: torch.Tensor) -> torch.Tensor:
    index = torch.arange(starts.shape[1])
    return ((index[None, :] <= index[:, None])[None] & (index[None, None, :] >= starts[:, :, None]))[:, None]


@pytest.mark.fast
@pytest.mark.parametrize("tile_scores", [context_attention.TILE_SCORES, 40], ids=["whole_blocks", "row_tiles"])
@pytest.mark.parametrize("documents", [False, True], ids=["causal", "documents"])
@pytest.mark.parametrize("load_balance", [True, False], ids=["balanced", "contiguous"])
def test_kernel_equals_sdpa_forward_and_backward_in_float64(documents: bool, load_balance: bool, tile_scores: int,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Row tiles: 40 scores per tile is one query row at a time (the long-sequence path)."""
    monkeypatch.setattr(context_attention, "TILE_SCORES", tile_scores)
    torch.manual_seed(0)
    b, hq, hkv, s, d = 2, 4, 2, 16, 8
    q, k, v = (torch.randn(b, h, s, d, dtype=torch.float64, requires_grad=True) for h in (hq, hkv, hkv))
    starts = None
    if documents:  # row 0: documents of 5, 7 and 4 tokens; row 1: 14 and 2
        positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3], [*range(14), 0, 1]])
        starts = torch.arange(s) - positions
    layout = ContextLayout(1, 0, s, load_balance)
    out = context_parallel_attention(q, k, v, layout=layout, starts=starts)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=None if starts is None else _reference_mask(starts),
                                         is_causal=starts is None, enable_gqa=True)
    grad = torch.randn_like(out)
    ours, theirs = torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(ref, (q, k, v), grad)
    assert (out - ref).abs().max() < 1e-12
    for name, a, r in zip("qkv", ours, theirs):
        assert (a - r).abs().max() < 1e-12, name


@pytest.mark.fast
def test_layout_holds_a_head_and_a_mirrored_tail_chunk_per_rank() -> None:
    layouts = [ContextLayout(4, r, 64) for r in range(4)]
    assert [lay.local_chunks for lay in layouts] == [(0, 7), (1, 6), (2, 5), (3, 4)]
    assert layouts[1].global_index().tolist() == [*range(8, 16), *range(48, 56)]
    row = torch.arange(64)[None]
    assert torch.cat([lay.shard(row) for lay in layouts], dim=1).sort().values.tolist() == row.tolist()
    assert ContextLayout(4, 1, 64, load_balance=False).global_index().tolist() == list(range(16, 32))
    with pytest.raises(ValueError, match="not divisible into 8 equal chunks"):
        ContextLayout(4, 0, 60)


@pytest.mark.fast
def test_attention_work_is_even_over_ranks_only_with_load_balancing() -> None:
    """Max / mean over cp 4 ranks of the query-key pairs each computes (the kernel's own block list)."""

    def balance(load_balance: bool) -> float:
        pairs = [attention_pairs(ContextLayout(4, r, 1024, load_balance)) for r in range(4)]
        return max(pairs) / (sum(pairs) / len(pairs))

    assert balance(True) == pytest.approx(1.0, abs=1e-12)
    assert balance(False) == pytest.approx(1.75, rel=0.01)


# ---- real runs against one process ---------------------------------------------------------------


@functools.cache
def _corpus(root: Path) -> Path:
    return write_uneven_corpus(root / "docs.jsonl", seed=0, documents=300, longest=50)


def _run(tmp: Path, name: str, model: str, *args: str, masking: bool = True, nproc: int | None = None,
         steps: int = STEPS) -> Run:
    corpus = _corpus(tmp.parent)
    return titan(tmp / name, *MODELS[model], *COMMON, f"--data.source={corpus}", f"--training.steps={steps}",
                 f"--data.document_masking={str(masking).lower()}", *args, nproc=nproc)


class References:
    """One process, global batch 2, per (model, document masking): the curves the layouts must reproduce,
    each run once per module, when first asked for."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.curves: dict[str, list[dict[str, float]]] = {}

    def __call__(self, model: str, masking: bool) -> list[dict[str, float]]:
        key = f"{model}_{'masked' if masking else 'plain'}"
        if key not in self.curves:
            run = _run(self.root, key, model, "--training.local_batch_size=2", masking=masking)
            self.curves[key] = run.step_records(key, STEPS)
        return self.curves[key]


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> References:
    return References(tmp_path_factory.mktemp("cp_reference"))


def _max_rel(records: list[dict[str, float]], reference: list[dict[str, float]], key: str) -> float:
    return max(abs(r[key] - ref[key]) / abs(ref[key]) for r, ref in zip(records, reference))


# llama3 CP 2 with masking is the resume test's first run below. qwen3 runs once dense (masked: the boolean
# mask it builds is replaced) and once MoE (plain: its is_causal call); the attention code is the same in both.
LAYOUTS = {  # name: (model, document masking, processes, local batch, flags)
    "llama3_cp4_masked": ("llama3", True, 4, 2, ("--parallelism.cp=4",)),
    # compiled blocks (the cross-rank attention breaks each block's graph and runs eagerly)
    "llama3_cp2_contiguous_compiled": ("llama3", False, 2, 2, ("--parallelism.cp=2", "--parallelism.cp_load_balance=false",
                                                               "--compile.enable=true")),
    # compiled too: the checkpoint stays eager (it recomputes under the redirect) around compiled sub-modules
    "llama3_fsdp2_cp2_ac_compiled_masked": ("llama3", True, 4, 1, ("--parallelism.cp=2", "--parallelism.dp_shard=2",
                                                                   "--activation_checkpoint.mode=full",
                                                                   "--compile.enable=true")),
    "llama3_tp2_cp2": ("llama3", False, 4, 2, ("--parallelism.cp=2", "--parallelism.tp=2")),
    # 2 micro-batches of 1 row, each with its own documents (checkpointed: the recompute takes its forward's)
    "llama3_pp2_cp2_ac_masked": ("llama3", True, 4, 2, ("--parallelism.cp=2", "--parallelism.pp=2",
                                                        "--activation_checkpoint.mode=full")),
    "qwen3_cp4_masked": ("qwen3", True, 4, 2, ("--parallelism.cp=4",)),
    # MoE with expert parallelism: the cp ranks join the ep group (alone: ep = cp; with FSDP2: ep 4 over 2 x 2).
    "qwen3_moe_cp2_ep2": ("qwen3_moe", False, 2, 2, ("--parallelism.cp=2", "--parallelism.ep=2")),
    "qwen3_moe_fsdp2_cp2_ep4_masked": ("qwen3_moe", True, 4, 1, ("--parallelism.cp=2", "--parallelism.dp_shard=2",
                                                                 "--parallelism.ep=4")),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_losses_and_gradient_norms_match_one_process(layout: str, references: References, tmp_path: Path) -> None:
    model, masking, nproc, local_batch, flags = LAYOUTS[layout]
    run = _run(tmp_path, layout, model, f"--training.local_batch_size={local_batch}", *flags, masking=masking,
               nproc=nproc)
    records, reference = run.step_records(layout, STEPS), references(model, masking)
    loss, norm = _max_rel(records, reference, "loss"), _max_rel(records, reference, "grad_norm")
    print(f"{layout}: loss rel diff {loss:.2e}, grad_norm rel diff {norm:.2e}")
    assert loss <= TOLERANCE and norm <= TOLERANCE, (layout, loss, norm)
    assert "dp_shard_cp:S(0)" in run.text, "the parameters were not sharded over dp_shard x cp:\n" + run.text
    if any(flag.startswith("--parallelism.ep=") for flag in flags):
        assert "ep:S(0)" in run.text, "the experts were not split over ep:\n" + run.text
    if "--compile.enable=true" in flags:  # whole blocks, or a checkpointed block's parts around its eager checkpoint
        compiled = re.search(r"compiled: (\d+) modules \((.*)\)", run.text)
        assert compiled is not None and int(compiled[1]) > 0, run.text
        assert ("Attention" in compiled[2]) == ("--activation_checkpoint.mode=full" in flags), compiled[0]
    if model == "qwen3_moe":
        aux = _max_rel(records, reference, "moe_aux_loss")
        print(f"{layout}: moe_aux_loss rel diff {aux:.2e}")
        assert aux <= TOLERANCE, (layout, aux)


def test_a_cp2_checkpoint_resumes_on_one_process_exactly(references: References, tmp_path: Path) -> None:
    """llama3 CP 2 with document masking: steps 1-3 on 2 cp ranks match one process; saved at step 3 and resumed
    by one process, steps 4-5 are the uninterrupted run's (a constant learning rate after warmup, so the shorter
    first run follows the same schedule)."""
    flags = ("--training.local_batch_size=2", "--checkpoint.enable=true", "--checkpoint.interval=3")
    reference = references("llama3", True)
    first = _run(tmp_path, "run", "llama3", *flags, "--parallelism.cp=2", nproc=2, steps=3)
    head = first.step_records("cp2 steps 1-3", 3)
    assert "dp_shard_cp:S(0)" in first.text, first.text
    for key in ("loss", "grad_norm"):
        assert _max_rel(head, reference[:3], key) <= TOLERANCE, (key, head, reference[:3])
    resumed = _run(tmp_path, "run", "llama3", *flags)
    assert "resuming from" in resumed.text and "at step 3" in resumed.text, resumed.text
    tail = resumed.step_records("resumed on one process", STEPS)[3:]
    for key in ("loss", "grad_norm"):
        assert _max_rel(tail, reference[3:], key) <= TOLERANCE, (key, tail, reference[3:])


@pytest.mark.parametrize("converter, converted", [("float8", "Float8Linear"), ("mx", "MXFP8")])
def test_low_precision_under_cp2_stays_within_its_own_noise_of_one_process(converter: str, converted: str,
                                                                           tmp_path: Path) -> None:
    """float8 / MX (emulated) x CP 2 against the same converter on one process: each cp rank scales its own
    tokens' activations (MX's blocks of 32 run along the tokens in the weight gradient), as each FSDP2 rank does,
    so the curves differ by the format's rounding (measured 1.4e-4 float8, 3.8e-6 MX, relative), not more."""
    flags = ("--training.local_batch_size=2", "--converters", converter)
    one = _run(tmp_path, "one", "llama3", *flags)
    cp = _run(tmp_path, "cp2", "llama3", *flags, "--parallelism.cp=2", nproc=2)
    assert converted in cp.text and "dp_shard_cp:S(0)" in cp.text, cp.text
    reference, records = one.step_records(f"{converter} one process", STEPS), cp.step_records(f"{converter} cp 2", STEPS)
    for key in ("loss", "grad_norm"):
        assert _max_rel(records, reference, key) <= 2e-3, (key, records, reference)


# ---- refusals ------------------------------------------------------------------------------------

REFUSALS = [
    (("--spec", "llama3", "--training.seq_len=66", "--parallelism.cp=2"),
     "training.seq_len=66 must split into 4 equal chunks"),
    (("--spec", "qwen3", "--flavor", "debugmoe", "--parallelism.cp=2", "--parallelism.ep=3", "--parallelism.dp_shard=2"),
     "parallelism.ep=3 with parallelism.cp=2: the cp ranks of a data-parallel rank exchange their tokens"),
    (("--spec", "deepseek_v3", "--parallelism.cp=2"), "does not declare context-parallelism support"),
    (("--spec", "llama3", "--parallelism.cp=2", "--metrics.layer_stats=true"),
     "parallelism.cp=2 with metrics.layer_stats"),
    (("--spec", "llama3", "--parallelism.cp=0"), "parallelism.cp"),
    (("--spec", "llama3", "--parallelism.cp=3"), "does not divide world size 2"),
]


@pytest.mark.fast
@pytest.mark.parametrize(("args", "message"), REFUSALS, ids=[m[:30] for _, m in REFUSALS])
def test_unservable_settings_are_one_message_before_any_worker(args: tuple[str, ...], message: str, tmp_path: Path,
                                                               capsys) -> None:
    wide = any(flag.startswith(("--parallelism.ep=", "--parallelism.etp=")) for flag in args)
    result = run_main(capsys, "--nproc-per-node", "4" if wide else "2", *args,
                      "--training.steps=1", f"--job.run_dir={tmp_path / 'run'}")
    assert result.code == 2, result.out + result.err
    assert message in result.err, result.err
    assert "Traceback" not in result.out + result.err
    assert not (tmp_path / "run").exists()
