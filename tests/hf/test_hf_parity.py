"""The llama3 adapter against transformers' LlamaForCausalLM: logits both ways, config both ways.

Shapes: grouped-query attention, llama3 RoPE scaling or none, tied or untied head, an
odd vocabulary. fp32 on CPU; the bound is 1e-5 absolute on every logit.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from titan_core import ConfigError
from titan_llama.hf_adapter import LlamaStateDictAdapter
from titan_llama.model import Transformer

from hf_helpers import tiny_hf_llama

ADAPTER = LlamaStateDictAdapter()
CASES = [
    pytest.param(dict(tied=False, rope_scaling=True, vocab=1001, n_kv_heads=2), id="gqa-llama3rope-untied-oddvocab"),
    pytest.param(dict(tied=True, rope_scaling=False, vocab=2048, n_kv_heads=4), id="mha-plainrope-tied"),
    pytest.param(dict(tied=True, rope_scaling=True, vocab=777, n_kv_heads=1), id="mqa-llama3rope-tied-oddvocab"),
]


def _tokens(vocab: int) -> torch.Tensor:
    return torch.randint(0, vocab, (2, 40), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("case", CASES)
def test_hf_to_titan_logits_match(tmp_path: Path, case: dict) -> None:
    from transformers import LlamaForCausalLM

    folder = tiny_hf_llama(tmp_path / "hf", **case)
    config = json.loads((folder / "config.json").read_text())
    args = ADAPTER.model_args_from_hf(config)
    assert args.kv_heads == case["n_kv_heads"] and args.tie_embeddings == case["tied"]
    assert (args.rope_scaling is not None) == case["rope_scaling"]
    model = Transformer(args)
    state = ADAPTER.from_hf(load_file(folder / "model.safetensors"), args)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # A tied head has no tensor of its own: it is loaded through its source, the embedding.
    assert unexpected == [] and missing == (["output.weight"] if case["tied"] else [])
    if case["tied"]:
        assert model.output.weight is model.tok_embeddings.weight
    reference = LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokens = _tokens(args.vocab_size)
    with torch.no_grad():
        ours, theirs = model(tokens), reference(tokens).logits
    assert (ours - theirs).abs().max().item() <= 1e-5


@pytest.mark.parametrize("case", CASES)
def test_titan_to_hf_logits_match(case: dict) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    # The titan side starts from its own seeded init, with norms moved away from 1.
    reference_args = ADAPTER.model_args_from_hf({
        "model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": case["n_kv_heads"], "intermediate_size": 160, "vocab_size": case["vocab"],
        "tie_word_embeddings": case["tied"], "max_position_embeddings": 128, "rms_norm_eps": 1e-5,
        "rope_parameters": ({"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 16}
                            if case["rope_scaling"] else {"rope_type": "default", "rope_theta": 10000.0}),
    })
    model = Transformer(reference_args)
    model.init_weights(seed=3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(len(name)))
    hf_state = ADAPTER.to_hf(model.state_dict(), reference_args)
    assert ("lm_head.weight" in hf_state) == (not case["tied"])
    config = ADAPTER.hf_config(reference_args)
    hf_model = LlamaForCausalLM(LlamaConfig(**config)).float().eval()
    missing, unexpected = hf_model.load_state_dict(hf_state, strict=False)
    assert unexpected == [] and set(missing) <= {"lm_head.weight"}
    assert ADAPTER.model_args_from_hf(config) == reference_args  # config round trip
    tokens = _tokens(reference_args.vocab_size)
    with torch.no_grad():
        ours, theirs = model(tokens), hf_model(tokens).logits
    assert (ours - theirs).abs().max().item() <= 1e-5
    # And the tensors come back bit-identical.
    back = ADAPTER.from_hf(hf_state, reference_args)
    for key, value in model.state_dict().items():
        if key == "output.weight" and case["tied"]:
            continue
        assert torch.equal(back[key], value), key


@pytest.mark.parametrize("config, message", [
    ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, 'describes a "gpt2" model (GPT2LMHeadModel)'),
    ({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "intermediate_size": 96, "vocab_size": 10, "attention_bias": True,
      "rope_parameters": {"rope_type": "yarn", "factor": 4.0}},
     "attention_bias=true (this model has no biases); rope_type='yarn'"),
    ({"model_type": "llama", "hidden_size": 64}, "lacks the integer field(s) num_hidden_layers, num_attention_heads"),
])
def test_configs_the_adapter_cannot_express_are_named(config: dict, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        ADAPTER.model_args_from_hf(config)
    assert message in str(info.value)
