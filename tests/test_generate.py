"""titan-generate: greedy tokens equal transformers' greedy ``generate`` on the HF export of the same
weights (fp32, token for token); the KV cache changes no token; sampling is reproducible; bad input
is one message and exit 2.

One short training run (2 layers, 3 steps) saves both a titan checkpoint and an HF export of the
same weights at its end; every test reads those.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from titan_core.commands import generate as generate_cli
from titan_core.models.sampling import Sampling, sample, takes_cache
from titan_core.train.whole_model import WholeModel, load_titan_checkpoint

from conftest import REPO

BIN = Path(sys.executable).parent
PROMPTS = ["Once upon a time", "def main():", "The quick brown fox jumps over"]
NEW = 20


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("gen") / "run"
    cmd = [str(BIN / "titan-train"), "--spec", "llama3", "--flavor", "debugmodel_gqa", "--llama3.n_layers=2",
           "--training.steps=3", "--training.seq_len=32", "--training.local_batch_size=2", "--metrics.report=false",
           "--checkpoint.enable=true", "--checkpoint.export_at_end=true", "--checkpoint.export_format=hf",
           f"--job.run_dir={run}"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=REPO,
                          env={"OMP_NUM_THREADS": "1", "PATH": f"{BIN}:/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run


@pytest.fixture(scope="module")
def titan_model(run_dir: Path) -> WholeModel:
    return load_titan_checkpoint(run_dir / "checkpoints" / "step-000003")


def _prompt_ids(whole: WholeModel, text: str) -> list[int]:
    return whole.tokenizer.encode(text, bos=True)


def _hf_greedy(folder: Path, prompt: list[int], new: int) -> list[int]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, do_sample=False)
    return [int(t) for t in out[0, len(prompt):]]


def test_greedy_equals_transformers_generate_on_the_hf_export(run_dir: Path, titan_model: WholeModel) -> None:
    hf = run_dir / "export" / "hf"
    assert json.loads((hf / "config.json").read_text())["max_position_embeddings"] >= 32
    for text in PROMPTS:
        prompt = _prompt_ids(titan_model, text)
        new = min(NEW, titan_model.model_args.max_seq_len - len(prompt))
        ours = sample(titan_model.model, prompt, Sampling(max_new_tokens=new), eos_id=titan_model.tokenizer.eos_id)
        theirs = _hf_greedy(hf, prompt, new)
        assert ours == theirs, text
        assert len(ours) >= 10  # a real continuation, not one token that happened to be eos


def test_kv_cache_and_full_prefix_give_the_same_tokens(titan_model: WholeModel) -> None:
    assert takes_cache(titan_model.model)
    prompt = _prompt_ids(titan_model, PROMPTS[0])
    eos = titan_model.tokenizer.eos_id
    for settings in (Sampling(max_new_tokens=12), Sampling(max_new_tokens=12, temperature=1.0, top_k=50, seed=3)):
        cached = sample(titan_model.model, prompt, settings, eos_id=eos, use_cache=True)
        full = sample(titan_model.model, prompt, settings, eos_id=eos, use_cache=False)
        assert cached == full


def test_sampling_is_reproducible_per_seed_and_top_k_1_is_greedy(titan_model: WholeModel) -> None:
    prompt = _prompt_ids(titan_model, PROMPTS[1])
    eos = titan_model.tokenizer.eos_id
    greedy = sample(titan_model.model, prompt, Sampling(max_new_tokens=12), eos_id=eos)
    top1 = sample(titan_model.model, prompt, Sampling(max_new_tokens=12, temperature=0.7, top_k=1, seed=5), eos_id=eos)
    assert top1 == greedy
    hot = [sample(titan_model.model, prompt, Sampling(max_new_tokens=12, temperature=2.0, seed=s), eos_id=eos)
           for s in (1, 1, 2)]
    assert hot[0] == hot[1] and hot[0] != hot[2]


def test_cli_prints_the_prompt_and_the_greedy_continuation(run_dir: Path, titan_model: WholeModel,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """The console script on the run folder (its newest checkpoint), and the CLI on the HF export: the
    same text, which is transformers' greedy continuation decoded."""
    text = PROMPTS[2]
    prompt = _prompt_ids(titan_model, text)
    expected_ids = _hf_greedy(run_dir / "export" / "hf", prompt, NEW)
    expected = text + titan_model.tokenizer.decode([t for t in expected_ids if t != titan_model.tokenizer.eos_id])
    proc = subprocess.run([str(BIN / "titan-generate"), str(run_dir), "--prompt", text, "--max-new-tokens", str(NEW)],
                          capture_output=True, text=True, timeout=300, env={"OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == expected + "\n"
    assert "step-000003 (titan checkpoint, spec llama3)" in proc.stderr and "greedy, with a KV cache" in proc.stderr
    assert generate_cli.main([str(run_dir / "export" / "hf"), "--prompt", text, "--max-new-tokens", str(NEW)]) == 0
    captured = capsys.readouterr()
    assert captured.out == expected + "\n"
    assert "hf (Hugging Face folder, spec llama3)" in captured.err


class _NoCacheModel(nn.Module):
    """A plugin model written without the cache contract: ``forward(tokens)`` only."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.inner(tokens)


def test_a_model_without_the_cache_argument_recomputes_the_prefix_and_says_so(
        run_dir: Path, titan_model: WholeModel, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    wrapped = _NoCacheModel(titan_model.model)
    assert not takes_cache(wrapped)
    prompt = _prompt_ids(titan_model, PROMPTS[0])
    eos = titan_model.tokenizer.eos_id
    assert sample(wrapped, prompt, Sampling(max_new_tokens=8), eos_id=eos, use_cache=False) == \
        sample(titan_model.model, prompt, Sampling(max_new_tokens=8), eos_id=eos)
    # Patched where the command looks it up (commands/model_source.py imports the loader at module level).
    from titan_core.commands import model_source

    monkeypatch.setattr(model_source, "load_titan_checkpoint",
                        lambda folder, config=None: WholeModel(wrapped, titan_model.spec, titan_model.model_args,
                                                               titan_model.tokenizer))
    assert generate_cli.main([str(run_dir), "--prompt", PROMPTS[0], "--max-new-tokens", "8"]) == 0
    err = capsys.readouterr().err
    assert "without a KV cache: the model's forward takes no cache argument" in err


def _garbage_checkpoint(tmp: Path) -> Path:
    ckpt = tmp / "step-000001"
    ckpt.mkdir()
    (ckpt / "titan_checkpoint.json").write_text("{not json")
    return ckpt


@pytest.mark.parametrize(("case", "message"), [
    ("missing", "does not exist; give a titan checkpoint"),
    ("garbage", "step-000001"),
    ("not-a-model", "is not a titan checkpoint (no titan_checkpoint.json), nor a run folder"),
    ("long-prompt", "leaving no room for a new token; shorten the prompt"),
    ("top-k-0", "--top-k must be a positive number of tokens, got 0"),
    ("temperature-nan", "--temperature must be a finite number >= 0 (0 = greedy), got nan"),
    ("temperature-inf", "--temperature must be a finite number >= 0 (0 = greedy), got inf"),
    ("no-tokens", "--max-new-tokens must be a positive number of tokens, got 0"),
])
def test_bad_input_is_one_message_and_exit_2(case: str, message: str, run_dir: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    source, extra = str(run_dir), ["--prompt", "hello"]
    if case == "missing":
        source = str(tmp_path / "nope")
    elif case == "garbage":
        source = str(_garbage_checkpoint(tmp_path))
    elif case == "not-a-model":
        source = str(tmp_path)
    elif case == "long-prompt":
        extra = ["--prompt", "word " * 2100]  # the flavor's 2048 positions
    elif case == "top-k-0":
        extra += ["--temperature", "1", "--top-k", "0"]
    elif case == "temperature-nan":
        extra += ["--temperature", "nan"]
    elif case == "temperature-inf":
        extra += ["--temperature", "inf"]
    elif case == "no-tokens":
        extra += ["--max-new-tokens", "0"]
    assert generate_cli.main([source, *extra]) == 2
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("titan-generate: error:")]
    assert len(errors) == 1 and message in errors[0], captured.err
    assert "Traceback" not in captured.err and captured.out == ""


def test_cached_chunks_give_the_logits_of_one_full_forward(titan_model: WholeModel) -> None:
    """Several new tokens after a past (the shifted causal mask) and one at a time, against no cache."""
    from titan_core import KVCache

    model = titan_model.model.eval()
    tokens = torch.tensor([_prompt_ids(titan_model, PROMPTS[2] + " and then some more words")])
    with torch.no_grad():
        full = model(tokens)
        cache = KVCache(tokens.shape[1])
        pieces = []
        for start, end in ((0, 4), (4, 9), (9, 10), (10, tokens.shape[1])):
            pieces.append(model(tokens[:, start:end], cache=cache))
            cache.advance(end - start)
    assert torch.allclose(torch.cat(pieces, dim=1), full, atol=1e-5, rtol=0)
