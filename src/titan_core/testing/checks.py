"""The conformance checks: one function per check, shared by ``titan-plugin check`` and the pytest classes.

Each check returns a ``CheckResult`` (pass / fail / skip, a figure, the seconds it
took). Training checks run ``python -m titan_core`` in subprocesses (gloo for the
multi-process ones) on the spec's ``debugmodel`` flavor (or, without one, its default or
smallest flavor, or the one named) with sequences of 64 tokens;
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..boundary.meta_model import meta_model
from ..boundary.plugin_boundary import SpecCalls, converter_calls
from ..errors import PluginHang, TitanError
from ..hf.adapter import row_map
from ..models.init import init_model_weights
from ..moe import GroupedExperts
from ..parallel.context_parallel import MODEL_HOOK as CONTEXT_PARALLEL_HOOK, supports_context_parallel
from ..plan.resolve import resolve_config
from ..plugin import discovery
from ..plugin.discovery import CONVERTERS, SPECS, discover, load_converter, load_train_spec
from ..plugin.guard import plugin_call, timeout_message
from ..runtime.torch_compat import grouped_mm_op
from ..train.build import build_converters
from ..train.trainer import Trainer
from . import runs

if TYPE_CHECKING:
    from ..plugin.protocols import TrainSpec

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


# Baseline runs (no converter) by their flags, shared by the converters of one process's checks.
_BASELINES: dict[tuple[str, ...], runs.Run] = {}


@dataclass
class Target:
    """What is checked: a converter (trained on ``spec``) or a spec."""

    kind: str  # "converter" or "spec"
    name: str
    spec: str = "tiny"
    compile: bool = False
    extra_flags: tuple[str, ...] = ()
    flavor: str | None = None  # None: debugmodel, else the spec's own default, else its smallest flavor
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="titan-plugin-check-")))
    _runs: dict[str, runs.Run] = field(default_factory=dict)

    @property
    def spec_name(self) -> str:
        return self.name if self.kind == "spec" else self.spec

    @property
    def flavor_name(self) -> str:
        if self.flavor is None:
            self.flavor = choose_flavor(self.spec_name)
        return self.flavor

    @property
    def seq_len(self) -> int:
        return checked_seq_len(self.spec_name, self.flavor_name)

    def base_flags(self, steps: int, *, converters: bool = True) -> list[str]:
        flags = [*(runs.TINY_IMPORT if self.spec_name == "tiny" else ()), "--spec", self.spec_name,
                 "--flavor", self.flavor_name, f"--training.seq_len={self.seq_len}", f"--training.steps={steps}"]
        if self.kind == "converter" and converters:
            flags += ["--converters", self.name]
        return flags + list(self.extra_flags)

    def run(self, key: str, steps: int, *extra: str, nproc: int = 1, converters: bool = True) -> runs.Run:
        """A memoized training run in ``workdir/key``; a run without this converter (a baseline) is the same
        for every converter checked on the same spec, so one ``titan-plugin check`` call trains it once."""
        if key not in self._runs:
            flags = self.base_flags(steps, converters=converters)
            shared = (key, *flags, *extra, str(nproc)) if self.kind == "converter" and not converters else None
            if shared is not None and shared in _BASELINES:
                self._runs[key] = _BASELINES[shared]
                return self._runs[key]
            run_dir = self.workdir / key
            shutil.rmtree(run_dir, ignore_errors=True)
            self._runs[key] = runs.train(run_dir, flags, *extra, nproc=nproc)
            if shared is not None:
                _BASELINES[shared] = self._runs[key]
        return self._runs[key]

    def reference(self, steps: int = 5) -> runs.Run:
        return self.run(f"single{steps}", steps, f"--training.local_batch_size={BATCH}")


def register_if_tiny(spec_name: str) -> None:
    """Register the core's tiny model when a check asks for it, and only then: registered in every
    process, it would be a second installed spec and ``model.spec`` could no longer default."""
    if spec_name == "tiny":
        from . import tiny_spec  # noqa: F401  (a side effect wanted only on request: it registers the spec)


def checked_seq_len(spec_name: str, flavor: str) -> int:
    """SEQ_LEN, or the flavor's own ``max_seq_len`` where that is shorter (a toy model of 32 positions)."""
    register_if_tiny(spec_name)
    limit = getattr(discovery.load_train_spec(spec_name).flavors.get(flavor), "max_seq_len", None)
    return min(SEQ_LEN, limit) if isinstance(limit, int) and limit > 0 else SEQ_LEN


def choose_flavor(spec_name: str) -> str:
    """The flavor the checks train: ``debugmodel`` (the docs ask every spec for one), else the flavor the
    spec's own ``defaults`` pick, else the one with the fewest parameters (counted on the meta device)."""
    register_if_tiny(spec_name)
    spec = discovery.load_train_spec(spec_name)
    flavors = list(spec.flavors)
    default = (spec.defaults.get("model") or {}).get("flavor")
    for preferred in ("debugmodel", default):
        if preferred in flavors:
            return str(preferred)
    sizes: dict[str, int] = {}
    for flavor in flavors:
        try:
            resolved = resolve_config(config_source=None, world_size=1, override_pairs=[
                ("model.spec", spec_name), ("model.flavor", flavor),
                ("training.seq_len", str(checked_seq_len(spec_name, flavor)))])
            sizes[flavor] = sum(p.numel() for p in meta_model(resolved.spec, resolved.model_args).parameters())
        except Exception:  # a flavor that cannot be built here is not a candidate; meta build reports it
            continue
    return min(sizes, key=lambda f: (sizes[f], f)) if sizes else (flavors[0] if flavors else "debugmodel")


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


# ---- both kinds -----------------------------------------------------------------------------------
IMPORT_TIMEOUT_S = 300.0  # an import that compiles an extension may take minutes; one that never returns fails


TIMED_OUT = "timed out"


def check_import(t: Target) -> str:
    """The plugin imports and is what its entry point promises (its import time is the row's time).

    The import runs in a daemon thread so that one which never returns fails the check instead of
    hanging the kit (the checks after a failed import are not run, so nothing waits on it)."""
    import threading


    outcome: dict[str, Any] = {}

    def load() -> None:
        try:
            outcome["obj"] = load_train_spec(t.name) if t.kind == "spec" else load_converter(t.name)
        except BaseException as exc:  # re-raised below, in the checking thread
            outcome["error"] = exc

    thread = threading.Thread(target=load, name=f"import {t.name}", daemon=True)
    thread.start()
    thread.join(IMPORT_TIMEOUT_S)
    if thread.is_alive():
        raise Failed(f"importing the {t.kind} {t.name!r} did not finish within {IMPORT_TIMEOUT_S:.0f} s; an "
                     f"entry point's import must not block (start servers, download or wait for input)", TIMED_OUT)
    if "error" in outcome:
        raise outcome["error"]
    obj = outcome["obj"]
    claims = discover(SPECS if t.kind == "spec" else CONVERTERS).get(t.name, [])
    source = f"{claims[0].distribution} {claims[0].version}" if claims else "registered in-process"
    return f"{source}, API {getattr(obj, 'plugin_api_version', '?')}"


# ---- converter checks -----------------------------------------------------------------------------
def check_config(t: Target) -> str:
    """Config defaults validate; a misspelled key is refused with a did-you-mean."""
    cls = load_converter(t.name)
    with _plugin_step(t, "Config()"):
        cls.Config()  # the defaults alone must validate
    fields = list(cls.Config.model_fields)
    typo = (fields[0][:-1] + fields[0][-1] * 2) if fields else "no_such_option"
    pairs = [("model.spec", t.spec_name), ("model.converters", t.name), (f"{t.name}.{typo}", "1")]
    register_if_tiny(t.spec_name)
    try:
        resolve_config(config_source=None, override_pairs=pairs, world_size=1)
    except TitanError as exc:
        message = str(exc)
        if fields and "did you mean" not in message.lower():
            raise Failed(f"--{t.name}.{typo} was refused without a did-you-mean: {message}") from exc
        return f"{len(fields)} fields"
    raise Failed(f"--{t.name}.{typo}=1 (a misspelled key) was accepted")


def _signature(module: torch.nn.Module) -> tuple[Any, ...]:
    """What a conversion can change about one module: its class; its own parameters and buffers
    (class, tensor subclass, dtype, shape, trainable: a converter may wrap weights in a tensor
    subclass, or cast them); an instance-level forward; the hooks registered on it."""
    params = tuple((n, type(p), type(getattr(p, "data", p)), p.dtype, tuple(p.shape), p.requires_grad)
                   for n, p in module.named_parameters(recurse=False))
    buffers = tuple((n, type(b), b.dtype, tuple(b.shape)) for n, b in module.named_buffers(recurse=False))
    hooks = tuple(len(getattr(module, h, {})) for h in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                                                        "_backward_pre_hooks"))
    return type(module), params, buffers, "forward" in vars(module), hooks


def _under(name: str, roots: set[str]) -> bool:
    return any(name == r or name.startswith(r + ".") for r in roots)


@contextlib.contextmanager
def _bounded(t: Target) -> Iterator[None]:
    """Calls into the plugin through the facade (``plugin_boundary``), each under ``model.plugin_timeout_s``
    (titan-plugin check --call-timeout): one that never returns fails the check, naming it, instead of
    hanging the kit."""
    try:
        yield
    except PluginHang as exc:
        message = timeout_message(f"{t.kind} {t.name!r}", exc.method, exc.seconds,
                                  setting="titan-plugin check --call-timeout")
        raise Failed(message, TIMED_OUT) from None


@contextlib.contextmanager
def _plugin_step(t: Target, method: str) -> Iterator[None]:
    """A call the kit makes into the plugin's code directly (not through the facade): guarded and under
    the same deadline, so that one that never returns fails the check, naming ``method``."""
    group = SPECS if t.kind == "spec" else CONVERTERS
    name = t.spec_name if t.kind == "spec" else t.name
    with _bounded(t), plugin_call(group, name, method, timed=True):
        yield


def check_select_convert(t: Target) -> str:
    """``select`` names existing modules only; ``convert`` changes exactly those (on meta)."""
    register_if_tiny(t.spec_name)
    # The flavor and sequence length the training checks use: a spec whose flavor is shorter than the
    # default seq_len was refused here while every training check passed.
    resolved = resolve_config(config_source=None, override_pairs=[
        ("model.spec", t.spec_name), ("model.flavor", t.flavor_name), ("model.converters", t.name),
        ("training.seq_len", str(t.seq_len))], world_size=1)
    spec = resolved.spec
    model = meta_model(spec, resolved.model_args)
    (conv,) = converter_calls(build_converters(resolved))
    with _bounded(t):
        conv.compatible_with(spec)
    objects_before = dict(model.named_modules())
    before = {name: _signature(m) for name, m in objects_before.items()}
    with _bounded(t):
        selected = conv.select(model)
    unknown = sorted(set(selected) - set(before))
    if unknown:
        raise Failed(f"select() named modules the model does not have: {unknown[:5]}")
    if not selected:
        raise Failed("select() chose no module of the model")
    with _bounded(t):
        conv.convert(model, list(selected))
    after = {name: _signature(m) for name, m in model.named_modules()}
    chosen = set(selected)
    # Modules added or removed outside the selected ones change the model's structure behind select()'s back.
    added = sorted(n for n in set(after) - set(before) if not _under(n, chosen))
    removed = sorted(n for n in set(before) - set(after) if not _under(n, chosen))
    if added or removed:
        raise Failed(f"convert() added modules {added[:5]} / removed modules {removed[:5]} outside the "
                     f"{len(chosen)} modules select() chose; a converter rewrites only the modules it selected",
                     f"{len(added)} added, {len(removed)} removed")
    objects_after = dict(model.named_modules())
    # Changed: a different module object at the name (replaced), or the same one rewritten.
    changed = {name for name in before if name in after
               and (after[name] != before[name] or objects_after[name] is not objects_before[name])}
    # A selected module counts as converted when it or anything inside it changed.
    untouched = sorted(r for r in chosen if not any(_under(n, {r}) for n in changed))
    outside_all = {n for n in changed if not _under(n, chosen)}
    outside = sorted(n for n in outside_all if not any(n.startswith(p + ".") for p in outside_all))
    if outside or untouched:
        what = []
        if outside:
            what.append(f"changed {len(outside)} module(s) select() did not choose: {outside[:5]}")
        if untouched:
            what.append(f"left {len(untouched)} selected module(s) unchanged: {untouched[:5]}")
        raise Failed(f"convert() {'; and '.join(what)} (a converter changes exactly the modules select() chose)",
                     f"{len(outside)} outside, {len(untouched)} unchanged")
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
    return f"loss {run.curve()[-1]:.4f}, gap {gap:+.1e}"


def check_hooks(t: Target) -> str:
    """Optimizer hooks run exactly once per step (in this process, 3 steps)."""
    register_if_tiny(t.spec_name)
    steps = 3
    resolved = resolve_config(config_source=None, world_size=1, override_pairs=[
        ("model.spec", t.spec_name), ("model.converters", t.name), ("model.flavor", t.flavor_name),
        ("training.steps", str(steps)), ("training.seq_len", str(t.seq_len)), ("training.local_batch_size", "2"),
        ("job.run_dir", str(t.workdir / "hooks")), ("metrics.log_freq", "100"),
    ])
    counts = {"pre": 0, "post": 0}
    ((name, cls),) = resolved.converters

    def counted(hook: str, fn: Callable[[list[Any]], None]) -> Callable[[list[Any]], None]:
        def wrapper(model_parts: list[Any]) -> None:
            counts[hook] += 1
            fn(model_parts)

        return wrapper

    class Counting(cls):  # type: ignore[valid-type, misc]
        def __init__(self, *args: object, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # A hook the converter set on the instance (only for some settings) shadows the methods below.
            for hook in ("pre", "post"):
                attr = f"{hook}_optimizer_hook"
                if attr in vars(self):
                    setattr(self, attr, counted(hook, vars(self)[attr]))

        def pre_optimizer_hook(self, model_parts: list[Any]) -> None:
            counts["pre"] += 1
            super().pre_optimizer_hook(model_parts)

        def post_optimizer_hook(self, model_parts: list[Any]) -> None:
            counts["post"] += 1
            super().post_optimizer_hook(model_parts)

    trainer = Trainer(dataclasses.replace(resolved, converters=[(name, Counting)]))
    # The run's own progress lines are not part of the check's report.
    # Every call into the plugin (convert, parallelize_fn, forward, the hooks) is under the call deadline.
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()), _bounded(t):
        trainer.setup()
        trainer.train()
    if counts != {"pre": steps, "post": steps}:
        extra = (" (the core registers a converter's pre/post_optimizer_hook on the optimizer: a converter that "
                 "also registers them itself runs them twice)" if max(counts.values()) > steps else "")
        raise Failed(f"over {steps} steps the hooks ran pre x{counts['pre']}, post x{counts['post']}, "
                     f"not once per step{extra}",
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


_TP_HINT = ("A converter that cannot run under tensor parallelism refuses in __init__ (parallel_dims.tp_enabled) "
            "with a TitanError, so the launcher reports it once before any worker starts; one that can keeps its "
            "modules usable by the spec's TP styles (nn.Linear subclasses) or supplies tensor_parallel_styles().")


def _error_line(output: str) -> str | None:
    """The first ``...error: message`` line of a run's output, without its ``[rankN]`` prefix."""
    for line in output.splitlines():
        if "error:" in line:
            return line.split("error:", 1)[1].strip()
    return None


def check_tp(t: Target) -> str:
    """TP 2 matches one process, or is refused with a clear message (exit 2, no traceback) before any worker starts."""
    ref = t.reference(5)
    _require_run(ref, "the one-process reference")  # else a refusal below could be any error
    flags = ("--parallelism.tp=2", f"--training.local_batch_size={BATCH}")
    run = t.run("tp2", 5, *flags, nproc=2)
    message = _error_line(run.output)
    if run.returncode == 2 and "Traceback" not in run.output and message is not None:
        # Workers prefix their lines with [rankN]; a refusal made by the launching process has none.
        workers_ran = any(line.startswith("[rank") for line in run.output.splitlines())
        if workers_ran:
            hint = f" {_TP_HINT}" if t.kind == "converter" else ""
            raise Failed(f"TP 2 failed after the workers started (exit 2): {message}{hint}", "failed in workers")
        if not any(word in message.lower() for word in ("tp", "tensor")):
            raise Failed(f"TP 2 was refused with a message that does not name tensor parallelism: {message}")
        if run.output.count(message) > 1:
            raise Failed(f"TP 2 was refused once per process instead of once, before the workers: {message}")
        return f"refused: {message[:60]}"
    figure = _matches_reference(t, "tp2", 2, *flags)
    # Matching numbers alone do not show TP ran: a parallelize_fn that ignores parallelism.tp trains a whole
    # copy on each rank, with the same numbers. The run's layout line says what was really sharded.
    sharded = _require_placed(run.output, "tp:S", run_name="TP 2", placed="sharded", mesh="tp",
                              advice="the parallelize_fn ignored parallelism.tp. Apply the TP plan there, or "
                              "refuse tp > 1 in the spec's validate_fn")
    return f"{figure}, {sharded} params sharded"


def _require_placed(output: str, placement: str, *, run_name: str, placed: str, mesh: str, advice: str) -> int:
    """How many parameters the run's ``[titan] parameters:`` layout line lists with ``placement``
    (e.g. ``tp:S`` sharded over tp); none is a failure: a run that trains with the same numbers
    may still have ignored the mesh (TP and EP both check this, with one message)."""
    layout = next((line.split("parameters:", 1)[1].strip() for line in output.splitlines()
                   if "[titan] parameters:" in line), "")
    count = sum(int(part.split(" x ", 1)[0]) for part in layout.split("; ") if placement in part)
    if not count:
        raise Failed(f"the {run_name} run trained, but no parameter is {placed} over the {mesh} mesh (layout: "
                     f"{layout or 'not reported'}): {advice}", f"nothing {placed}")
    return count


def check_cp(t: Target) -> str:
    """CP 2 matches one process (specs whose model declares ``use_context_parallel_attention``)."""
    if t.seq_len % 4:
        raise _Skip(f"seq_len {t.seq_len} does not split into 4 chunks (2 x cp 2)")
    figure = _matches_reference(t, "cp2", 2, "--parallelism.cp=2", f"--training.local_batch_size={BATCH}")
    return f"{figure}, each rank holding half of every sequence"


def check_pp(t: Target) -> str:
    """PP 2 matches one process (specs with a pipelining_fn)."""
    return _matches_reference(t, "pp2", 2, "--parallelism.pp=2", f"--training.local_batch_size={BATCH}")


def check_ep(t: Target) -> str:
    """EP 2 on 2 processes matches one process taking the same micro-batches, with the experts
    really split over ``ep`` (a flavor with ``titan_core.moe`` experts; skipped without)."""
    _, _, model = _spec_model(t)
    experts = [m for m in model.modules() if isinstance(m, GroupedExperts)]
    if not experts:
        raise _Skip(f"flavor {t.flavor_name} has no titan_core.moe experts (pick a MoE flavor with --flavor)")
    if any(m.num_experts % 2 for m in experts):
        raise _Skip(f"flavor {t.flavor_name} has an odd number of experts in a layer")
    half = f"--training.local_batch_size={BATCH // 2}"
    ref = t.run("single_accum", 5, half, f"--training.global_batch_size={BATCH}")  # shared with the FSDP2 check
    _require_run(ref, "the one-process reference (2 micro-batches)")
    run = t.run("ep2", 5, "--parallelism.ep=2", half, nproc=2)
    _require_run(run, "the EP 2 run")
    split = _require_placed(run.output, "ep:S(0)", run_name="EP 2", placed="split", mesh="ep",
                            advice="the spec's parallelize_fn must apply titan_core.parallel.apply_expert_parallel")
    return f"{_compare(run, ref, 'ep2', t)}, {split} params split"


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
def _spec_model(t: Target, *, device: str = "meta", seq_len: int | None = None) -> tuple[Any, Any, Any]:
    register_if_tiny(t.spec_name)
    resolved = resolve_config(config_source=None, world_size=1, override_pairs=[
        ("model.spec", t.spec_name), ("model.flavor", t.flavor_name),
        ("training.seq_len", str(t.seq_len if seq_len is None else min(seq_len, t.seq_len)))])
    spec, args = resolved.spec, resolved.model_args
    with torch.device(device), _plugin_step(t, "the model's constructor"):
        model = resolved.calls.build_model(args)
    return spec, args, model


def check_meta_build(t: Target) -> str:
    """The checked flavor (debugmodel unless told) builds on the meta device."""
    _, _, model = _spec_model(t)
    n = sum(p.numel() for p in model.parameters())
    if any(p.device.type != "meta" for p in model.parameters()):
        raise Failed("parameters left the meta device during construction")
    return f"{n:,} parameters" + ("" if t.flavor_name == "debugmodel" else f" (flavor {t.flavor_name})")


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
    """Initial weights identical across layouts: the first step (before any update) has the same loss and
    gradient norm under FSDP2 (and TP, PP) as in one process. The gradient norm sees every parameter,
    so one wrongly initialised tensor shows even where the loss barely moves."""
    diffs: dict[str, float] = {}
    # Each layout against the one-process run it is compared with elsewhere (same micro-batches).
    for key, ref_key in (("fsdp2", "single_accum"), ("tp2", "single5"), ("pp2", "single5"), ("ep2", "single_accum")):
        run, ref = t._runs.get(key), t._runs.get(ref_key)
        if run is None or ref is None or run.returncode or ref.returncode:
            continue
        pairs = [(run.losses.get(1), ref.losses.get(1)), (run.grad_norms.get(1), ref.grad_norms.get(1))]
        rel = [abs(a - b) / max(abs(b), 1e-12) for a, b in pairs if a is not None and b is not None]
        if rel:
            diffs[key] = max(rel)
    if not diffs:
        raise Failed("no multi-process layout ran (the FSDP2 check runs first)")
    worst = max(diffs, key=lambda k: diffs[k])
    if diffs[worst] > MATCH_REL:
        raise Failed(f"the first step's loss / gradient norm under {worst} differs from one process's by "
                     f"{diffs[worst]:.2e} (> {MATCH_REL:.0e}): the initial weights depend on the layout. "
                     f"init_parameter must fill the full tensor from the (seed, name) generator it is given, "
                     f"whatever the rank", f"{worst}: {diffs[worst]:.1e}")
    return f"{len(diffs) + 1} layouts, max rel {diffs[worst]:.1e}"


def check_flops(t: Target) -> str:
    """flops_per_token within 10% of 3 x the forward matmul FLOPs counted on the model (short sequence)."""
    from torch.utils.flop_counter import FlopCounterMode


    seq = 16  # short: the count sees matmuls, not every attention kernel, so keep attention's share small
    spec, args, model = _spec_model(t, device="cpu", seq_len=seq)
    if spec.flops_per_token_fn is None:
        raise _Skip("no flops_per_token_fn")
    with _plugin_step(t, "the model's init_parameter"):
        init_model_weights(model, seed=0)
    tokens = torch.zeros(1, seq, dtype=torch.long)
    # torch 2.13's counter has no formula for the grouped GEMM MoE experts run on (titan_core.moe):
    # x [tokens, in] times the stacked weights [experts, in, out] is 2 * tokens * in * out.
    op = grouped_mm_op()
    grouped = {op: _grouped_mm_flops} if op is not None else {}
    with FlopCounterMode(display=False, custom_mapping=grouped) as counter, torch.no_grad(), \
            _plugin_step(t, "the model's forward"):
        model(tokens)
    counted = 3.0 * counter.get_total_flops() / seq
    # FlopCounterMode charges attention over the full square: compare with that count.
    flops = SpecCalls(spec).flops_per_token(args, seq)
    assert flops is not None  # the spec has a flops_per_token_fn (checked above)
    declared = flops.full_attention
    rel = abs(declared - counted) / counted
    if rel > 0.10:
        raise Failed(f"flops_per_token {declared:,.0f} is {rel:.0%} off the counted {counted:,.0f}", f"{rel:.1%} off")
    return f"{rel:.1%} off"


def _grouped_mm_flops(x_shape: torch.Size, w_shape: torch.Size, *args: object, **kwargs: object) -> int:
    return 2 * x_shape[0] * x_shape[1] * w_shape[-1]


def check_hf_roundtrip(t: Target) -> str:
    """to_hf then from_hf gives back every tensor, and from_hf_rows (if any) agrees with from_hf."""

    spec, args, model = _spec_model(t, device="cpu")
    adapter = spec.state_dict_adapter
    if adapter is None:
        raise _Skip("no state_dict_adapter")
    with _plugin_step(t, "the model's init_parameter"):
        init_model_weights(model, seed=0)
    native = {k: v.detach() for k, v in model.state_dict().items()}
    # A persistent buffer the adapter does not export (a MoE routing bias: training state with no
    # Hugging Face counterpart) is not expected back; a parameter always is.
    params = {k for k, _ in model.named_parameters(remove_duplicate=False)}
    with _plugin_step(t, "state_dict_adapter's to_hf/from_hf/hf_config"):
        native = {k: v for k, v in native.items() if k in params or adapter.to_hf({k: v}, args)}
        # The shape must survive config.json too: the adapter rebuilds the args the tensors are read with.
        args_back = adapter.model_args_from_hf(adapter.hf_config(args))
        back = adapter.from_hf(adapter.to_hf(native, args), args_back)
    bad = sorted(k for k in native if k not in back or not torch.equal(native[k], back[k]))
    if bad or set(back) != set(native):
        raise Failed(f"round trip changed {bad[:5]} (keys back: {len(back)} of {len(native)})")
    # The optional row map must say what from_hf does: sharded loads read rows by it.
    disagree: list[str] = []
    with _plugin_step(t, "state_dict_adapter's from_hf/from_hf_rows"):
        for key, tensor in adapter.to_hf(native, args).items():
            out = adapter.from_hf({key: tensor}, args_back)
            if not out:
                continue
            (name, value), = out.items()
            rows = row_map(adapter, key, tuple(tensor.shape), tuple(value.shape), args_back)
            if rows is not None and not torch.equal(tensor[rows], value):
                disagree.append(key)
                break
    if disagree:
        raise Failed(f"from_hf_rows({disagree[0]!r}) does not match what from_hf does to that tensor")
    return f"{len(native)} tensors"


class _Skip(Exception):
    pass


@dataclass(frozen=True)
class Check:
    name: str
    fn: Callable[[Target], str]
    fast: bool
    applies: Callable[[Any], str | None] = lambda spec: None  # a reason to skip, or None


def _no_tp(spec: TrainSpec) -> str | None:
    has = spec.tp_plan_fn is not None or spec.parallelize_fn is not None
    return None if has else "no TP plan"


def _no_cp(spec: TrainSpec) -> str | None:
    return None if supports_context_parallel(spec.model_cls) else f"the model declares no {CONTEXT_PARALLEL_HOOK}()"


def _no_pp(spec: TrainSpec) -> str | None:
    return None if spec.pipelining_fn is not None else "no pipelining_fn"


# The checks both kits run, the same in each.
IMPORT_CHECK = Check("import", check_import, True)
FSDP_CHECK = Check("FSDP2 x2 = 1 process", check_fsdp, False)
RESUME_CHECK = Check("resume bit-exact", check_resume, False)

CONVERTER_CHECKS = [
    IMPORT_CHECK,
    Check("config defaults, did-you-mean", check_config, True),
    Check("select/convert on meta", check_select_convert, True),
    Check("5 steps, gap to baseline", check_train, True),
    Check("hooks once per step", check_hooks, True),
    FSDP_CHECK,
    Check("TP 2 works or refuses", check_tp, False),
    RESUME_CHECK,
]

SPEC_CHECKS = [
    IMPORT_CHECK,
    Check("meta build", check_meta_build, True),
    Check("FLOPs/token vs matmuls", check_flops, True),
    Check("HF round trip", check_hf_roundtrip, True),
    Check("loss falls over 30 steps", check_loss_falls, True),
    FSDP_CHECK,
    Check("TP 2 = 1 process", check_tp, False, _no_tp),
    Check("PP 2 = 1 process", check_pp, False, _no_pp),
    Check("CP 2 = 1 process", check_cp, False, _no_cp),
    Check("EP 2 = 1 process", check_ep, False),
    Check("init identical across layouts", check_init_layouts, False),
    RESUME_CHECK,
]

COMPILE_CHECK = Check("--compile", check_compile, False)


def checks_for(t: Target, *, fast: bool) -> list[Check]:
    chosen = CONVERTER_CHECKS if t.kind == "converter" else SPEC_CHECKS
    if t.compile:
        chosen = [*chosen, COMPILE_CHECK]
    # Asked for by name (--compile, compile = True), the compile check runs in the fast subset too.
    return [c for c in chosen if c.fast or not fast or c is COMPILE_CHECK]


def run_all(t: Target, *, fast: bool, announce: Callable[[Check], None] = lambda check: None) -> list[CheckResult]:
    """Every check that applies, in order; after a failed import the rest are not run (each would
    only repeat the import error)."""
    results: list[CheckResult] = []
    for check in checks_for(t, fast=fast):
        if results and results[0].name == IMPORT_CHECK.name and not results[0].ok:
            results.append(CheckResult(check.name, "skip", "not run: the import failed", 0.0))
            continue
        if any(r.figure == TIMED_OUT for r in results):  # every later check would wait out the same hang
            results.append(CheckResult(check.name, "skip", "not run: a call into the plugin did not return", 0.0))
            continue
        announce(check)
        results.append(run_check(t, check))
    return results


def run_check(t: Target, check: Check) -> CheckResult:
    start = time.perf_counter()
    try:
        if t.kind == "spec":
            register_if_tiny(t.spec_name)
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
