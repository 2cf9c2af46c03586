"""The Llama model against a plain reference written from the formulas, plus its contracts.

The reference runs in float64 from the model's own weights: explicit softmax with a
causal mask, RoPE as a rotation of consecutive channel pairs, RMSNorm, SwiGLU and
repeat-kv by their definitions. The model (float32) must match it in logits and in
every parameter's gradient.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from titan_llama.flavors import llama3_flavors
from titan_llama.model import LlamaArgs, RMSNorm, RopeScaling, Transformer, flops_per_token, rope_frequencies

# theta 10000 with head_dim 16 puts the 8 wavelengths (6.3 .. 19869) in all three
# regions of the 3.1 scaling for an original context of 8192: kept, blended, slowed.
SCALING = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)


def tiny_args(n_kv_heads: int | None = None, scaling: RopeScaling | None = None, **kw: object) -> LlamaArgs:
    base = dict(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=n_kv_heads, vocab_size=97, multiple_of=32,
        ffn_dim_multiplier=1.3, norm_eps=1e-5, rope_theta=10000.0, rope_scaling=scaling, max_seq_len=32,
    )
    base.update(kw)
    return LlamaArgs(**base)  # type: ignore[arg-type]


def built(args: LlamaArgs, seed: int = 0) -> Transformer:
    model = Transformer(args)
    model.init_weights(seed)
    return model


# ---------------------------------------------------------------- the reference


def ref_frequencies(head_dim: int, theta: float, s: RopeScaling | None) -> list[float]:
    out = []
    for i in range(head_dim // 2):
        freq = theta ** (-2 * i / head_dim)
        if s is not None:
            wavelen = 2 * math.pi / freq
            ctx = s.original_max_position_embeddings
            if wavelen > ctx / s.low_freq_factor:
                freq = freq / s.factor
            elif wavelen >= ctx / s.high_freq_factor:
                smooth = (ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
                freq = (1 - smooth) * freq / s.factor + smooth * freq
        out.append(freq)
    return out


def ref_rope(x: torch.Tensor, freqs: list[float]) -> torch.Tensor:
    """x [b, s, h, d]: rotate (x[2i], x[2i+1]) at position p by the angle p * freqs[i]."""
    out = torch.empty_like(x)
    pos = torch.arange(x.shape[1], dtype=x.dtype)[None, :, None]
    for i, f in enumerate(freqs):
        cos, sin = torch.cos(pos * f), torch.sin(pos * f)
        a, b = x[..., 2 * i], x[..., 2 * i + 1]
        out[..., 2 * i] = a * cos - b * sin
        out[..., 2 * i + 1] = a * sin + b * cos
    return out


def ref_rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * w


def ref_forward(p: dict[str, torch.Tensor], args: LlamaArgs, tokens: torch.Tensor) -> torch.Tensor:
    b, s = tokens.shape
    hd, nh, nkv = args.head_dim, args.n_heads, args.kv_heads
    freqs = ref_frequencies(hd, args.rope_theta, args.rope_scaling)
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    h = p["tok_embeddings.weight"][tokens]
    for layer in range(args.n_layers):
        w = {k.removeprefix(f"layers.{layer}."): v for k, v in p.items() if k.startswith(f"layers.{layer}.")}
        x = ref_rmsnorm(h, w["attention_norm.weight"], args.norm_eps)
        q = ref_rope((x @ w["attention.wq.weight"].T).view(b, s, nh, hd), freqs)
        k = ref_rope((x @ w["attention.wk.weight"].T).view(b, s, nkv, hd), freqs)
        v = (x @ w["attention.wv.weight"].T).view(b, s, nkv, hd)
        k = k.repeat_interleave(nh // nkv, dim=2)  # query head j reads kv head j // (nh/nkv)
        v = v.repeat_interleave(nh // nkv, dim=2)
        scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(hd)
        scores = scores.masked_fill(~causal, float("-inf"))
        probs = torch.exp(scores - scores.amax(-1, keepdim=True))
        probs = probs / probs.sum(-1, keepdim=True)
        att = torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(b, s, nh * hd)
        h = h + att @ w["attention.wo.weight"].T
        x = ref_rmsnorm(h, w["ffn_norm.weight"], args.norm_eps)
        gate = x @ w["feed_forward.w1.weight"].T
        swiglu = gate * torch.sigmoid(gate) * (x @ w["feed_forward.w3.weight"].T)
        h = h + swiglu @ w["feed_forward.w2.weight"].T
    return ref_rmsnorm(h, p["norm.weight"], args.norm_eps) @ p["output.weight"].T


# ---------------------------------------------------------------- numerics


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1], ids=["mha", "gqa2", "mqa"])
@pytest.mark.parametrize("scaling", [None, SCALING], ids=["plain_rope", "llama31_scaling"])
def test_logits_and_gradients_match_reference(n_kv_heads: int | None, scaling: RopeScaling | None) -> None:
    args = tiny_args(n_kv_heads, scaling)
    torch.manual_seed(0)
    model = built(args, seed=3)
    # Random norm weights, so a wrong norm backward or a wrong weight broadcast shows.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    tokens = torch.randint(0, args.vocab_size, (2, 24))
    targets = torch.randint(0, args.vocab_size, (2, 24))
    ref_params = {n: p.detach().double().requires_grad_() for n, p in model.named_parameters()}

    logits = model(tokens)
    ref_logits = ref_forward(ref_params, args, tokens)
    assert logits.dtype == torch.float32 and logits.shape == (2, 24, args.vocab_size)
    torch.testing.assert_close(logits.double(), ref_logits, atol=1e-5, rtol=0)

    torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()
    torch.nn.functional.cross_entropy(ref_logits.flatten(0, 1), targets.flatten()).backward()
    for name, param in model.named_parameters():
        ref_grad = ref_params[name].grad
        assert param.grad is not None and ref_grad is not None, name
        torch.testing.assert_close(param.grad.double(), ref_grad, atol=1e-6, rtol=1e-4, msg=name)


def test_scaled_frequencies_follow_the_llama31_formula() -> None:
    # Llama's own head_dim 128 / theta 500000 has channels in every region, including
    # wavelengths just above the low-frequency cut (where a wrong cut would blend).
    wavelens = [2 * math.pi / f for f in ref_frequencies(128, 500000.0, None)]
    assert any(8192 < w < 2 * 8192 for w in wavelens) and any(2048 <= w <= 8192 for w in wavelens)
    for head_dim, theta in ((16, 10000.0), (128, 500000.0)):
        for scaling in (None, SCALING, RopeScaling(factor=32.0)):
            got = rope_frequencies(head_dim, theta, scaling).double()
            want = torch.tensor(ref_frequencies(head_dim, theta, scaling), dtype=torch.float64)
            torch.testing.assert_close(got, want, rtol=1e-6, atol=0)
    plain = rope_frequencies(16, 10000.0, None)
    scaled = rope_frequencies(16, 10000.0, SCALING)
    # The fastest channels are kept, the slowest divided by the factor, one in between.
    assert torch.equal(scaled[:6], plain[:6])
    torch.testing.assert_close(scaled[7], plain[7] / 8)
    assert plain[6] / 8 < scaled[6] < plain[6]


def test_rmsnorm_matches_its_formula_forward_and_backward() -> None:
    torch.manual_seed(0)
    norm = RMSNorm(48, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0)
    x = (torch.randn(3, 5, 48) * 3).requires_grad_()
    grad_out = torch.randn(3, 5, 48)
    y = norm(x)
    y.backward(grad_out)
    x64, w64 = x.detach().double().requires_grad_(), norm.weight.detach().double().requires_grad_()
    y64 = ref_rmsnorm(x64, w64, 1e-6)
    y64.backward(grad_out.double())
    torch.testing.assert_close(y.double(), y64, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(x.grad.double(), x64.grad, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(norm.weight.grad.double(), w64.grad, atol=1e-5, rtol=1e-5)


def test_sequence_longer_than_the_rope_table_is_refused() -> None:
    model = built(tiny_args(max_seq_len=8))
    with pytest.raises(ValueError, match="exceeds the rotary table's max_seq_len 8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_a_rotary_table_cast_to_a_real_dtype_is_refused() -> None:
    model = built(tiny_args())
    with pytest.warns(UserWarning, match="imaginary part"):
        model.to(torch.bfloat16)  # casts the complex table to a real one
    with pytest.raises(ValueError, match="rotary table is torch.bfloat16, not complex"):
        model(torch.zeros(1, 4, dtype=torch.long))
    model.init_buffers()
    assert model.freqs_cis.dtype == torch.complex64
    assert model(torch.zeros(1, 4, dtype=torch.long)).dtype == torch.bfloat16


def test_invalid_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="not divisible by n_kv_heads=3"):
        tiny_args(n_kv_heads=3)
    with pytest.raises(ValueError, match="dim=64 is not divisible by n_heads=5"):
        tiny_args(n_heads=5)
    with pytest.raises(ValueError, match="vocab_size is None"):
        Transformer(tiny_args(vocab_size=None))


# ---------------------------------------------------------------- init contract


def test_meta_build_then_init_equals_cpu_build_and_seed_matters() -> None:
    args = tiny_args(2, SCALING)
    with torch.device("meta"):
        meta_model = Transformer(args)
    assert all(p.is_meta for p in meta_model.parameters()) and meta_model.freqs_cis.is_meta
    meta_model.to_empty(device="cpu")
    meta_model.init_weights(seed=7)
    cpu_model = built(args, seed=7)
    other_seed = built(args, seed=8)

    meta_state, cpu_state = meta_model.state_dict(), cpu_model.state_dict()
    assert "freqs_cis" not in cpu_state  # non-persistent: never in checkpoints
    assert meta_state.keys() == cpu_state.keys()
    for name, value in cpu_state.items():
        assert torch.equal(meta_state[name], value), name
    assert torch.equal(meta_model.freqs_cis, cpu_model.freqs_cis)
    for name, value in other_seed.state_dict().items():
        if not name.endswith("norm.weight"):  # norms are ones whatever the seed
            assert not torch.equal(value, cpu_state[name]), name


def test_init_rules() -> None:
    args = LlamaArgs(dim=256, n_layers=4, n_heads=4, vocab_size=512, multiple_of=64)
    params = dict(built(args, seed=0).named_parameters())
    assert torch.equal(params["norm.weight"], torch.ones(256))
    assert torch.equal(params["layers.2.ffn_norm.weight"], torch.ones(256))
    assert abs(params["tok_embeddings.weight"].std().item() - 1.0) < 0.02
    # truncated at 3 std, so the sample std is ~0.986 of the nominal one
    for name, std in [
        ("layers.0.attention.wq.weight", 0.02),
        ("layers.3.feed_forward.w1.weight", 0.02),
        ("layers.0.attention.wo.weight", 0.02 / math.sqrt(2)),
        ("layers.3.feed_forward.w2.weight", 0.02 / math.sqrt(8)),
        ("output.weight", 256**-0.5),
    ]:
        value = params[name]
        assert abs(value.std().item() / std - 0.986) < 0.03, name
        assert value.abs().max().item() <= 3 * std + 1e-7, name


def test_init_parameter_refuses_an_unknown_name() -> None:
    model = Transformer(tiny_args())
    plain = torch.empty(64, 64)
    with pytest.raises(ValueError, match="no init rule for parameter 'layers.0.mystery.weight'"):
        model.init_parameter("layers.0.mystery.weight", plain, torch.Generator())


# ---------------------------------------------------------------- flops, pipeline, flavors


def test_flops_per_token_hand_count() -> None:
    # dim 64, 4 heads of 16, 2 kv heads, hidden: int(2*256/3)=170 -> int(1.3*170)=221 -> 224
    args = tiny_args(n_kv_heads=2)
    assert args.ffn_hidden_dim == 224
    attention = 64 * 64 + 64 * 32 + 64 * 32 + 64 * 64  # wq, wk, wv, wo
    per_layer = attention + 3 * 64 * 224 + 2 * 64  # + w1, w2, w3 + two norms
    non_embedding = 2 * per_layer + 64 + 64 * 97  # + final norm + output head
    model = Transformer(args)
    counted = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("tok_embeddings"))
    assert counted == non_embedding
    # causal attention: each query attends to the unmasked keys of the causal mask, on average
    keys_per_query = torch.ones(24, 24).tril().sum().item() / 24
    assert keys_per_query == 12.5
    assert flops_per_token(args, 24) == 6 * non_embedding + 12 * 2 * 4 * 16 * keys_per_query
    assert flops_per_token(args, 24, full_attention=True) == 6 * non_embedding + 12 * 2 * 4 * 16 * 24


def test_pipeline_stages_reproduce_the_full_forward() -> None:
    args = tiny_args(2, SCALING, n_layers=4)
    full = built(args, seed=5)
    tokens = torch.randint(0, args.vocab_size, (2, 16))
    first, last = built(args, seed=5), built(args, seed=5)
    # What the pipeline splitter does: drop the other stage's layers and ends.
    first.norm = None
    first.output = None
    del first.layers["2"], first.layers["3"]
    last.tok_embeddings = None
    del last.layers["0"], last.layers["1"]

    hidden = first(tokens)
    assert hidden.shape == (2, 16, args.dim)
    torch.testing.assert_close(last(hidden), full(tokens), atol=0, rtol=0)


def test_8b_flavor_parameter_count_on_meta() -> None:
    args = llama3_flavors["8B"]
    with torch.device("meta"):
        model = Transformer(args)
    total = sum(p.numel() for p in model.parameters())
    assert total == 8_030_261_248
    assert args.vocab_size == 128256 and args.ffn_hidden_dim == 14336 and args.head_dim == 128


@pytest.mark.parametrize(
    ("name", "total", "shape"),
    [
        # the published Llama 3.1 counts (untied output head, vocab 128256)
        ("70B", 70_553_706_496, (8192, 80, 64, 8, 28672, 128)),
        ("405B", 405_853_388_800, (16384, 126, 128, 8, 53248, 128)),
        # the CPU debug shape of the issue, here with the built-in tokenizer's 2048 tokens
        ("debugmodel", 6_163_712, (256, 6, 16, 16, 768, 16)),
    ],
)
def test_flavor_shapes_and_parameter_counts(name: str, total: int, shape: tuple[int, ...]) -> None:
    args = llama3_flavors[name]
    if args.vocab_size is None:
        args = dataclasses.replace(args, vocab_size=2048)
    with torch.device("meta"):
        model = Transformer(args)
    assert (args.dim, args.n_layers, args.n_heads, args.kv_heads, args.ffn_hidden_dim, args.head_dim) == shape
    assert sum(p.numel() for p in model.parameters()) == total


@pytest.mark.parametrize("name", sorted(llama3_flavors))
def test_every_flavor_builds_on_meta(name: str) -> None:
    args = llama3_flavors[name]
    if args.vocab_size is None:
        args = dataclasses.replace(args, vocab_size=2048)
    # only a few layers: the shapes of one block are what can be wrong
    with torch.device("meta"):
        model = Transformer(dataclasses.replace(args, n_layers=2))
    assert model.freqs_cis.shape == (args.max_seq_len, args.head_dim // 2)
    assert model.layers["1"].attention.wk.weight.shape == (args.kv_heads * args.head_dim, args.dim)


def _attention_ops(args: LlamaArgs) -> set[str]:
    model = built(args)
    tokens = torch.randint(0, 97, (1, 16))
    with torch.profiler.profile() as prof:
        model(tokens).sum().backward()
    return {event.key for event in prof.key_averages()}


FUSED = {"titan_llama::causal_attention", "titan_llama::causal_attention_backward"}
FLASH = {"aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}
SLOW = {"aten::_scaled_dot_product_attention_math", "aten::softmax", "aten::repeat_interleave"}


@pytest.mark.parametrize("n_kv_heads", [None, 2], ids=["mha", "gqa"])
def test_attention_fused_setting_runs_the_fused_cpu_kernel(n_kv_heads: int | None) -> None:
    # The CPU speed of the model on AVX-512 hosts rests on this: no mask, no math fallback, no repeated kv.
    ops = _attention_ops(tiny_args(n_kv_heads, attention_kernel="fused"))
    assert FUSED <= ops
    assert not (SLOW | FLASH) & ops


@pytest.mark.parametrize("avx512", [True, False])
def test_auto_takes_the_fused_kernel_only_where_it_is_the_faster(avx512: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """AVX-512: the fused kernel (measured 1.4x ATen's flash kernel); AVX2 only: ATen's flash kernel (the fused
    one measured 0.10-0.17x of it on a Zen 3 host)."""
    from titan_llama import cpu_attention

    monkeypatch.setattr(cpu_attention, "faster_than_aten", lambda: avx512)
    ops = _attention_ops(tiny_args(2))
    assert (FUSED if avx512 else FLASH) <= ops
    assert not (SLOW | (FLASH if avx512 else FUSED)) & ops


def test_faster_than_aten_reads_the_cpu_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    from titan_llama import cpu_attention

    for flags, expected in (("x86_64 flags : fpu avx2 fma", False), ("x86_64 flags : fpu avx2 avx512f avx512bw", True)):
        cpu_attention.faster_than_aten.cache_clear()
        monkeypatch.setattr(cpu_attention, "_cpu_signature", lambda flags=flags: flags)
        assert cpu_attention.faster_than_aten() is expected
    cpu_attention.faster_than_aten.cache_clear()


@pytest.mark.parametrize("n_kv_heads", [None, 2], ids=["mha", "gqa"])
def test_attention_sdpa_setting_runs_the_flash_kernel(n_kv_heads: int | None) -> None:
    ops = _attention_ops(tiny_args(n_kv_heads, attention_kernel="sdpa"))
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops
    assert "aten::_scaled_dot_product_flash_attention_for_cpu_backward" in ops
    assert not {"aten::_scaled_dot_product_attention_math", "aten::softmax", "aten::repeat_interleave",
                "titan_llama::causal_attention"} & ops


def test_attention_kernels_agree_in_logits_and_gradients() -> None:
    grads = []
    for kernel in ("fused", "sdpa"):
        model = built(tiny_args(2, attention_kernel=kernel))
        tokens = torch.randint(0, 97, (2, 32), generator=torch.Generator().manual_seed(1))
        logits = model(tokens)
        logits.square().mean().backward()
        grads.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (la, ga), (lb, gb) = grads
    assert (la - lb).abs().max().item() < 1e-5
    for name in ga:
        assert (ga[name] - gb[name]).abs().max().item() < 1e-5 * max(1.0, gb[name].abs().max().item()), name


def test_unknown_attention_kernel_is_rejected() -> None:
    with pytest.raises(ValueError, match="attention_kernel='flash' is not one of"):
        tiny_args(attention_kernel="flash")
