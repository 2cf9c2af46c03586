"""The conformance checks: one function per check, shared by ``titan-plugin check`` and the pytest classes.

Each check returns a ``CheckResult`` (pass / fail / skip, a figure, the seconds it
took). Training checks run ``python -m titan_core`` in subprocesses (gloo for the
multi-process ones) on the spec's ``debugmodel`` flavor with sequences of 64 tokens;
converters are trained on the core's own tiny model (``tiny_spec``) unless a spec is
named. Runs are memoized per target, so two checks that need the one-process
reference share it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import math
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..errors import TitanError
from ..metrics import call_flops_fn
from . import runs

SEQ_LEN = 64
BATCH = 4  # the global batch of every run: layouts with 2 data-parallel ranks take 2 each
MATCH_REL = 1e-4  # multi-process losses against one process (reduction order differs)
# Low-precision rounding amplifies that noise (float8 tensorwise, TP 2: 8e-5 over 5 steps, measured).
CONVERTER_MATCH_REL = 5e-4


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: str  # "pass", "fail" or "skip"
    figure: str
    seconds: float
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status != "fail"


@dataclass
class Target:
    """What is checked: a converter (trained on ``spec``) or a spec."""

    kind: str  # "converter" or "spec"
    name: str
    spec: str = "tiny"
    compile: bool = False
    extra_flags: tuple[str, ...] = ()
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="titan-plugin-check-")))
    _runs: dict[str, runs.Run] = field(default_factory=dict)

    @property
    def spec_name(self) -> str:
        return self.name if self.kind == "spec" else self.spec

    def base_flags(self, steps: int, *, converters: bool = True) -> list[str]:
        flags = [*(runs.TINY_IMPORT if self.spec_name == "tiny" else ()), "--spec", self.spec_name,
                 "--flavor", "debugmodel", f"--training.seq_len={SEQ_LEN}", f"--training.steps={steps}"]
        if self.kind == "converter" and converters:
            flags += ["--converters", self.name]
        return flags + list(self.extra_flags)

    def run(self, key: str, steps: int, *extra: str, nproc: int = 1, converters: bool = True) -> runs.Run:
        """A memoized training run in ``workdir/key``."""
        if key not in self._runs:
            run_dir = self.workdir / key
            shutil.rmtree(run_dir, ignore_errors=True)
            self._runs[key] = runs.train(run_dir, self.base_flags(steps, converters=converters), *extra, nproc=nproc)
        return self._runs[key]

    def reference(self, steps: int = 5) -> runs.Run:
        return self.run(f"single{steps}", steps, f"--training.local_batch_size={BATCH}")


class Failed(Exception):
    """A check's failure, with the figure measured so far."""

    def __init__(self, message: str, figure: str = "") -> None:
        super().__init__(message)
        self.figure = figure


def _require_run(run: runs.Run, what: str) -> None:
    if run.returncode != 0:
        raise Failed(f"{what} exited {run.returncode}:\n{runs.tail(run.output)}", f"exit {run.returncode}")
    if not run.losses:
        raise Failed(f"{what} recorded no losses:\n{runs.tail(run.output)}")
    if not all(math.isfinite(v) for v in run.losses.values()):
        raise Failed(f"{what} has non-finite losses: {run.curve()}")


def _matches_reference(t: Target, key: str, nproc: int, *flags: str, steps: int = 5) -> str:
    ref = t.reference(steps)
    _require_run(ref, "the one-process reference")
    run = t.run(key, steps, *flags, nproc=nproc)
    _require_run(run, f"the {key} run")
    return _compare(run, ref, key, t)


def _compare(run: runs.Run, ref: runs.Run, key: str, t: Target) -> str:
    diff = runs.max_rel_diff(run.curve(), ref.curve())
    figure = f"max rel diff {diff:.1e}"
    bound = CONVERTER_MATCH_REL if t.kind == "converter" else MATCH_REL
    if diff > bound:
        raise Failed(f"{key} losses {run.curve()} differ from one process's {ref.curve()} by {diff:.2e} "
                     f"(> {bound:.0e})", figure)
    return figure


# ---- converter checks -----------------------------------------------------------------------------
def check_config(t: Target) -> str:
    """Config defaults validate; a misspelled key is refused with a did-you-mean."""
    from ..config.resolve import resolve_config
    from ..discovery import load_converter

    cls = load_converter(t.name)
    cls.Config()  # the defaults alone must validate
    fields = list(cls.Config.model_fields)
    typo = (fields[0][:-1] + fields[0][-1] * 2) if fields else "no_such_option"
    pairs = [("model.spec", t.spec_name), ("model.converters", t.name), (f"{t.name}.{typo}", "1")]
    if t.spec_name == "tiny":
        from . import tiny_spec  # noqa: F401  (registers the core's tiny model)
    try:
        resolve_config(config_source=None, override_pairs=pairs, world_size=1)
    except TitanError as exc:
        message = str(exc)
        if fields and f"did you mean" not in message.lower():
            raise Failed(f"--{t.name}.{typo} was refused without a did-you-mean: {message}")
        return f"{len(fields)} fields"
    raise Failed(f"--{t.name}.{typo}=1 (a misspelled key) was accepted")


def _signature(module: torch.nn.Module) -> tuple[Any, ...]:
    """What a conversion can change about one module: its class, its own parameters' classes
    (a converter may wrap weights in a tensor subclass instead), and an instance-level forward."""
    params = tuple((n, type(p), type(getattr(p, "data", p))) for n, p in module.named_parameters(recurse=False))
    return type(module), params, "forward" in vars(module)


def check_select_convert(t: Target) -> str:
    """``select`` names existing modules only; ``convert`` changes exactly those (on meta)."""
    from ..config.resolve import resolve_config
    from ..discovery import load_train_spec
    from ..parallel_dims import ParallelDims
    from ..preflight import build_converters
    from ..tokenizer import build_tokenizer

    if t.spec_name == "tiny":
        from . import tiny_spec  # noqa: F401
    resolved = resolve_config(config_source=None, override_pairs=[("model.spec", t.spec_name),
                              ("model.converters", t.name)], world_size=1)
    spec = load_train_spec(t.spec_name)
    c = resolved.config
    tok = (spec.build_tokenizer_fn or (lambda d: build_tokenizer(d.tokenizer)))(c.data)
    args = spec.model_args(c.model.flavor, getattr(c, spec.name, None), vocab_size=tok.vocab_size)
    with torch.device("meta"):
        model = spec.model_cls(args)
    dims = ParallelDims.resolve(dp_replicate=1, dp_shard=1, tp=1, pp=1, world_size=1)
    ((_, conv),) = build_converters(resolved, dims)
    conv.compatible_with(spec)
    before = {name: _signature(m) for name, m in model.named_modules()}
    selected = conv.select(model)
    unknown = sorted(set(selected) - set(before))
    if unknown:
        raise Failed(f"select() named modules the model does not have: {unknown[:5]}")
    if not selected:
        raise Failed("select() chose no module of the model")
    conv.convert(model, list(selected))
    after = {name: _signature(m) for name, m in model.named_modules()}
    changed = {name for name in before if name in after and after[name] != before[name]}
    top_changed = {n for n in changed if not any(n.startswith(p + ".") for p in changed)}
    if top_changed != set(selected):
        raise Failed(f"convert() changed {sorted(top_changed)[:5]}... but select() chose {sorted(selected)[:5]}...")
    on_meta = all(p.device.type == "meta" for p in model.parameters())
    if not on_meta:
        raise Failed("convert() moved parameters off the meta device")
    return f"{len(selected)} modules"


def check_train(t: Target) -> str:
    """5 steps train with finite losses; the gap to the unconverted baseline is reported."""
    run = t.reference(5)
    _require_run(run, "the converted run")
    base = t.run("baseline5", 5, f"--training.local_batch_size={BATCH}", converters=False)
    _require_run(base, "the baseline run")
    gap = (run.curve()[-1] - base.curve()[-1]) / base.curve()[-1]
    return f"loss {run.curve()[-1]:.3f}, gap {gap:+.2%}"


def check_hooks(t: Target) -> str:
    """Optimizer hooks run exactly once per step (in this process, 3 steps)."""
    from ..config.resolve import resolve_config
    from ..trainer import Trainer

    if t.spec_name == "tiny":
        from . import tiny_spec  # noqa: F401
    steps = 3
    resolved = resolve_config(config_source=None, world_size=1, override_pairs=[
        ("model.spec", t.spec_name), ("model.converters", t.name), ("model.flavor", "debugmodel"),
        ("training.steps", str(steps)), ("training.seq_len", str(SEQ_LEN)), ("training.local_batch_size", "2"),
        ("job.run_dir", str(t.workdir / "hooks")), ("metrics.log_freq", "100"),
    ])
    counts = {"pre": 0, "post": 0}
    ((name, cls),) = resolved.converters

    class Counting(cls):  # type: ignore[valid-type, misc]
        def pre_optimizer_hook(self, model_parts: list[Any]) -> None:
            counts["pre"] += 1
            super().pre_optimizer_hook(model_parts)

        def post_optimizer_hook(self, model_parts: list[Any]) -> None:
            counts["post"] += 1
            super().post_optimizer_hook(model_parts)

    trainer = Trainer(dataclasses.replace(resolved, converters=[(name, Counting)]))
    # The run's own progress lines are not part of the check's report.
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        trainer.setup()
        trainer.train()
    if counts != {"pre": steps, "post": steps}:
        raise Failed(f"over {steps} steps the hooks ran pre x{counts['pre']}, post x{counts['post']}",
                     f"pre {counts['pre']}, post {counts['post']}")
    return f"{steps} steps: pre {counts['pre']}, post {counts['post']}"


def check_fsdp(t: Target) -> str:
    """FSDP2 on 2 processes matches one process taking the same micro-batches (gradient accumulation).

    The reference accumulates two micro-batches of the ranks' size: a converter that scales
    each micro-batch by its own statistics (float8 tensorwise) legitimately differs from one
    batch of the global size.
    """
    half = f"--training.local_batch_size={BATCH // 2}"
    ref = t.run("single_accum", 5, half, f"--training.global_batch_size={BATCH}")
    _require_run(ref, "the one-process reference (2 micro-batches)")
    run = t.run("fsdp2", 5, "--parallelism.dp_shard=2", half, nproc=2)
    _require_run(run, "the fsdp2 run")
    return _compare(run, ref, "fsdp2", t)


def check_tp(t: Target) -> str:
    """TP 2 matches one process, or is refused with a clear message (exit 2, no traceback)."""
    ref = t.reference(5)
    _require_run(ref, "the one-process reference")  # else a refusal below could be any error
    run = t.run("tp2", 5, "--parallelism.tp=2", f"--training.local_batch_size={BATCH}", nproc=2)
    if run.returncode == 2 and "Traceback" not in run.output and "error:" in run.output:
        message = next(line for line in run.output.splitlines() if "error:" in line).split("error:", 1)[1].strip()
        if not any(word in message.lower() for word in ("tp", "tensor")):
            raise Failed(f"TP 2 was refused with a message that does not name tensor parallelism: {message}")
        if run.output.count(message) > 1:
            raise Failed(f"TP 2 was refused once per process instead of once, before the workers: {message}")
        return f"refused: {message[:60]}"
    return _matches_reference(t, "tp2", 2, "--parallelism.tp=2", f"--training.local_batch_size={BATCH}")


def check_pp(t: Target) -> str:
    """PP 2 matches one process (specs with a pipelining_fn)."""
    return _matches_reference(t, "pp2", 2, "--parallelism.pp=2", f"--training.local_batch_size={BATCH}")


def check_resume(t: Target) -> str:
    """Resume from the step-2 checkpoint of a 4-step run: steps 3-4 are bit-exact with the unbroken run."""
    flags = ("--checkpoint.enable=true", "--checkpoint.interval=2", "--checkpoint.keep_latest_k=0",
             f"--training.local_batch_size={BATCH}")
    whole = t.run("resume_whole", 4, *flags)
    _require_run(whole, "the unbroken run")
    step2 = t.workdir / "resume_whole" / "checkpoints" / "step-000002"
    if not step2.is_dir():
        raise Failed(f"the unbroken run saved no checkpoint at {step2}")
    # Same command (same 4-step LR schedule), started from that checkpoint in a folder of its own.
    resumed = t.run("resume_from_2", 4, *flags, f"--checkpoint.resume={step2}")
    _require_run(resumed, "the resumed run")
    if sorted(resumed.losses) != [3, 4]:
        raise Failed(f"the resumed run trained steps {sorted(resumed.losses)}, not 3-4:\n{runs.tail(resumed.output)}")
    a, b = [whole.losses[s] for s in (3, 4)], [resumed.losses[s] for s in (3, 4)]
    if a != b:
        raise Failed(f"resumed losses {b} differ from the unbroken run's {a}", "not bit-exact")
    return "steps 3-4 bit-exact"


def check_compile(t: Target) -> str:
    """``--compile.enable=true`` trains 5 finite steps."""
    run = t.run("compile", 5, "--compile.enable=true", f"--training.local_batch_size={BATCH}")
    _require_run(run, "the compiled run")
    return f"loss {run.curve()[-1]:.3f}"


# ---- spec checks ----------------------------------------------------------------------------------
def _spec_model(t: Target, *, device: str = "meta", seq_len: int = SEQ_LEN) -> tuple[Any, Any, Any]:
    from ..config.resolve import resolve_config
    from ..tokenizer import build_tokenizer

    if t.spec_name == "tiny":
        from . import tiny_spec  # noqa: F401
    resolved = resolve_config(config_source=None, world_size=1, override_pairs=[
        ("model.spec", t.spec_name), ("model.flavor", "debugmodel"), ("training.seq_len", str(seq_len))])
    spec, c = resolved.spec, resolved.config
    tok = (spec.build_tokenizer_fn or (lambda d: build_tokenizer(d.tokenizer)))(c.data)
    args = spec.model_args(c.model.flavor, getattr(c, spec.name, None), vocab_size=tok.vocab_size)
    with torch.device(device):
        model = spec.model_cls(args)
    return spec, args, model


def check_meta_build(t: Target) -> str:
    """The debugmodel flavor builds on the meta device."""
    _, _, model = _spec_model(t)
    n = sum(p.numel() for p in model.parameters())
    if any(p.device.type != "meta" for p in model.parameters()):
        raise Failed("parameters left the meta device during construction")
    return f"{n:,} parameters"


def check_loss_falls(t: Target) -> str:
    """Loss falls over 30 steps (last 5 below first 5)."""
    run = t.run("single30", 30, f"--training.local_batch_size={BATCH}")
    _require_run(run, "the 30-step run")
    c = run.curve()
    first, last = sum(c[:5]) / 5, sum(c[-5:]) / 5
    if not last < first:
        raise Failed(f"the loss did not fall: first 5 mean {first:.4f}, last 5 mean {last:.4f}", f"{first:.3f} -> {last:.3f}")
    return f"{first:.3f} -> {last:.3f}"


def check_init_layouts(t: Target) -> str:
    """Initial weights identical across layouts: the first step's loss is the same under FSDP2 (and TP)."""
    ref = t.reference(5)
    _require_run(ref, "the one-process reference")
    diffs = []
    for key in ("fsdp2", "tp2", "pp2"):
        run = t._runs.get(key)
        if run is not None and run.returncode == 0 and 1 in run.losses:
            diffs.append(abs(run.losses[1] - ref.losses[1]) / abs(ref.losses[1]))
    if not diffs:
        raise Failed("no multi-process layout ran (the FSDP2 check runs first)")
    if max(diffs) > MATCH_REL:
        raise Failed(f"first-step losses differ by {max(diffs):.2e} across layouts", f"{max(diffs):.1e}")
    return f"{len(diffs) + 1} layouts, max rel {max(diffs):.1e}"


def check_flops(t: Target) -> str:
    """flops_per_token within 10% of 3 x the forward matmul FLOPs counted on the model (short sequence)."""
    from torch.utils.flop_counter import FlopCounterMode

    from ..init import init_model_weights

    seq = 16  # short: the count sees matmuls, not every attention kernel, so keep attention's share small
    spec, args, model = _spec_model(t, device="cpu", seq_len=seq)
    if spec.flops_per_token_fn is None:
        raise _Skip("no flops_per_token_fn")
    init_model_weights(model, seed=0)
    tokens = torch.zeros(1, seq, dtype=torch.long)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model(tokens)
    counted = 3.0 * counter.get_total_flops() / seq
    # FlopCounterMode charges attention over the full square: compare with that count.
    declared = call_flops_fn(spec.flops_per_token_fn, args, seq, full_attention=True)
    rel = abs(declared - counted) / counted
    if rel > 0.10:
        raise Failed(f"flops_per_token {declared:,.0f} is {rel:.0%} off the counted {counted:,.0f}", f"{rel:.1%} off")
    return f"{rel:.1%} off"


def check_hf_roundtrip(t: Target) -> str:
    """to_hf then from_hf gives back every tensor, and from_hf_rows (if any) agrees with from_hf."""
    from ..init import init_model_weights

    spec, args, model = _spec_model(t, device="cpu")
    adapter = spec.state_dict_adapter
    if adapter is None:
        raise _Skip("no state_dict_adapter")
    init_model_weights(model, seed=0)
    native = {k: v.detach() for k, v in model.state_dict().items()}
    # The shape must survive config.json too: the adapter rebuilds the args the tensors are read with.
    args_back = adapter.model_args_from_hf(adapter.hf_config(args))
    back = adapter.from_hf(adapter.to_hf(native, args), args_back)
    bad = sorted(k for k in native if k not in back or not torch.equal(native[k], back[k]))
    if bad or set(back) != set(native):
        raise Failed(f"round trip changed {bad[:5]} (keys back: {len(back)} of {len(native)})")
    # The optional row map must say what from_hf does: sharded loads read rows by it.
    from ..hf.adapter import row_map

    for key, tensor in adapter.to_hf(native, args).items():
        out = adapter.from_hf({key: tensor}, args_back)
        if not out:
            continue
        (name, value), = out.items()
        rows = row_map(adapter, key, tuple(tensor.shape), tuple(value.shape), args_back)
        if rows is not None and not torch.equal(tensor[rows], value):
            raise Failed(f"from_hf_rows({key!r}) does not match what from_hf does to that tensor")
    return f"{len(native)} tensors"


class _Skip(Exception):
    pass


@dataclass(frozen=True)
class Check:
    name: str
    fn: Callable[[Target], str]
    fast: bool
    applies: Callable[[Any], str | None] = lambda spec: None  # a reason to skip, or None


def _no_tp(spec: Any) -> str | None:
    has = spec.tp_plan_fn is not None or spec.parallelize_fn is not None
    return None if has else "no TP plan"


def _no_pp(spec: Any) -> str | None:
    return None if spec.pipelining_fn is not None else "no pipelining_fn"


CONVERTER_CHECKS = [
    Check("config defaults, did-you-mean", check_config, True),
    Check("select/convert on meta", check_select_convert, True),
    Check("5 steps, gap to baseline", check_train, True),
    Check("hooks once per step", check_hooks, True),
    Check("FSDP2 x2 = 1 process", check_fsdp, False),
    Check("TP 2 works or refuses", check_tp, False),
    Check("resume bit-exact", check_resume, False),
]

SPEC_CHECKS = [
    Check("meta build", check_meta_build, True),
    Check("FLOPs/token vs matmuls", check_flops, True),
    Check("HF round trip", check_hf_roundtrip, True),
    Check("loss falls over 30 steps", check_loss_falls, True),
    Check("FSDP2 x2 = 1 process", check_fsdp, False),
    Check("TP 2 = 1 process", check_tp, False, _no_tp),
    Check("PP 2 = 1 process", check_pp, False, _no_pp),
    Check("init identical across layouts", check_init_layouts, False),
    Check("resume bit-exact", check_resume, False),
]

COMPILE_CHECK = Check("--compile", check_compile, False)


def checks_for(t: Target, *, fast: bool) -> list[Check]:
    chosen = CONVERTER_CHECKS if t.kind == "converter" else SPEC_CHECKS
    if t.compile:
        chosen = [*chosen, COMPILE_CHECK]
    return [c for c in chosen if c.fast or not fast]


def run_check(t: Target, check: Check) -> CheckResult:
    start = time.perf_counter()
    try:
        if t.kind == "spec":
            from ..discovery import load_train_spec

            if t.spec_name == "tiny":
                from . import tiny_spec  # noqa: F401
            reason = check.applies(load_train_spec(t.spec_name))
            if reason is not None:
                return CheckResult(check.name, "skip", reason, time.perf_counter() - start)
        figure = check.fn(t)
        return CheckResult(check.name, "pass", figure, time.perf_counter() - start)
    except _Skip as exc:
        return CheckResult(check.name, "skip", str(exc), time.perf_counter() - start)
    except Failed as exc:
        return CheckResult(check.name, "fail", exc.figure or "-", time.perf_counter() - start, str(exc))
    except Exception as exc:  # a plugin's own error is a failed check, reported, not a crash of the kit
        return CheckResult(check.name, "fail", type(exc).__name__, time.perf_counter() - start, f"{type(exc).__name__}: {exc}")
