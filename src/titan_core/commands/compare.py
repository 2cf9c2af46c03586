"""``titan-train --compare-baseline``: train with and without the converters, report the loss gap.

Both runs use the same config (seed, data order, steps, optimizer) in this one
process; the only difference is ``model.converters`` (and the converters' own
sections, which the baseline's config does not have). Each run gets its own
subfolder of the run folder, so their metrics, conversion table and
checkpoints never mix:

    <run_dir>/converted/   the run with the requested converters
    <run_dir>/baseline/    the same run with model.converters = []
    <run_dir>/compare.jsonl  one record per run and step: {"run", "step", "loss"}
    <run_dir>/compare.png    both loss curves
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

from ..config.job import build_job_model
from ..console import progress
from ..errors import ConfigError, StopRequested
from ..parallel import distributed
from ..plan.resolve import ResolvedConfig
from ..runtime import signals
from ..runtime.folder_locks import acquire_run_folders
from ..runtime.launch_env import world_size_from_env
from ..runtime.run_files import atomic_write_bytes, atomic_write_text
from ..train.trainer import Trainer
from .train import trained

__all__ = ["LossCurve", "baseline_of", "compare_baseline", "format_comparison", "relative_gap", "with_run_dir"]


@dataclasses.dataclass(frozen=True)
class LossCurve:
    """The losses of one run, by optimizer step (1-based)."""

    run: str
    steps: list[int]
    losses: list[float]

    def by_step(self) -> dict[int, float]:
        return dict(zip(self.steps, self.losses))


def with_run_dir(resolved: ResolvedConfig, run_dir: Path) -> ResolvedConfig:
    """The same resolved config, writing into ``run_dir``."""
    config = resolved.config
    job = config.job.model_copy(update={"run_dir": str(run_dir)})
    return dataclasses.replace(resolved, config=config.model_copy(update={"job": job}))


def baseline_of(resolved: ResolvedConfig, run_dir: Path) -> ResolvedConfig:
    """``resolved`` without converters: ``model.converters=[]`` and no converter sections.

    The job model depends on which plugin sections a run has, so the baseline's
    config is validated by a model built for the spec's section alone.
    """
    spec = resolved.spec
    sections = {spec.name: spec.config_model} if spec.config_model is not None else {}
    job_model = build_job_model(sections)
    data = resolved.config.model_dump()
    for name, _ in resolved.converters:
        data.pop(name, None)
    data["model"]["converters"] = []
    data["job"]["run_dir"] = str(run_dir)
    config = job_model.model_validate(data, context={"world_size": resolved.world_size})
    return dataclasses.replace(resolved, config=config, converters=[], job_model=job_model)


def relative_gap(converted: float, baseline: float) -> float:
    """(converted - baseline) / |baseline|; positive when the converted run's loss is higher."""
    return (converted - baseline) / abs(baseline) if baseline else math.inf


def format_comparison(converted: LossCurve, baseline: LossCurve) -> str:
    """A per-step table over the steps both runs have, and the final relative gap."""
    conv, base = converted.by_step(), baseline.by_step()
    common = sorted(set(conv) & set(base))
    header = f"{'step':>6}  {'loss converted':>14}  {'loss baseline':>13}  {'difference':>10}"
    lines = [header, "-" * len(header)]
    for step in common:
        lines.append(f"{step:>6}  {conv[step]:>14.4f}  {base[step]:>13.4f}  {conv[step] - base[step]:>+10.4f}")
    if common:
        last = common[-1]
        gap = relative_gap(conv[last], base[last])
        lines.append(
            f"final relative gap (step {last}): {gap:+.3%} "
            f"(converted {conv[last]:.4f} vs baseline {base[last]:.4f})"
        )
    else:
        lines.append("no step in common: nothing to compare")
    return "\n".join(lines)


def write_jsonl(path: Path, curves: list[LossCurve]) -> None:
    atomic_write_text(path, "".join(json.dumps({"run": curve.run, "step": step, "loss": loss}) + "\n"
                                    for curve in curves for step, loss in zip(curve.steps, curve.losses)))


def plot_curves(path: Path, curves: list[LossCurve], title: str, labels: dict[str, str] | None = None) -> None:
    """Both loss curves in one PNG (matplotlib's Agg canvas: no display, no global pyplot state)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for curve in curves:
        label = (labels or {}).get(curve.run, curve.run)
        ax.plot(curve.steps, curve.losses, label=label, marker="." if len(curve.steps) <= 50 else None)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    import io


    buffer = io.BytesIO()  # drawn in memory, then published whole: never half a PNG
    fig.savefig(buffer, format="png")
    atomic_write_bytes(path, buffer.getvalue())


def require_matplotlib() -> None:
    """ConfigError naming the extra to install when matplotlib (the ``plot`` extra) is missing."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise ConfigError(
            "--compare-baseline draws the two loss curves with matplotlib, which is not installed. Install the "
            "plot extra first: pip install 'titan-core[plot]' (or pip install matplotlib); nothing was trained."
        )


def train_once(resolved: ResolvedConfig, run: str, trainer_class: type[Trainer] = Trainer) -> LossCurve:
    """One full Trainer run; its losses by step."""

    trainer = trainer_class(resolved)
    losses = trained(trainer)  # as a plain run: SIGTERM before the first step stops at once
    # A resumed run trains only the remaining steps; number them as the trainer did.
    first = trainer.step - len(losses) + 1
    return LossCurve(run, list(range(first, trainer.step + 1)), losses)


def compare_baseline(resolved: ResolvedConfig, *, trainer_class: type[Trainer] = Trainer) -> int:
    """Train the config with its converters, then without; print and write the comparison. Exit code 0."""
    names = [name for name, _ in resolved.converters]
    if not names:
        raise ConfigError(
            "--compare-baseline compares a run with converters against the same run without them, but no "
            "converters were requested. Add them with --converters NAME[,NAME...] (or model.converters); "
            "titan-train --list shows the installed ones."
        )
    if resolved.world_size > 1 or world_size_from_env() > 1:
        raise ConfigError(
            f"--compare-baseline runs both trainings in one process and supports a single process only, but "
            f"this run has world size {max(resolved.world_size, world_size_from_env())}. Drop "
            f"--nproc-per-node (and torchrun), or train each configuration separately and compare their "
            f"metrics.jsonl."
        )
    require_matplotlib()  # before training: a missing extra must not cost the two finished runs
    root = Path(resolved.config.job.run_dir)

    lock = acquire_run_folders(resolved.config, run_folder_only=True)  # both runs write below root: one comparison per folder at a time
    runs = [("converted", with_run_dir(resolved, root / "converted")), ("baseline", baseline_of(resolved, root / "baseline"))]
    curves: list[LossCurve] = []
    title = f"{resolved.spec.name}/{resolved.config.model.flavor}: {','.join(names)} vs baseline"
    # SIGTERM stops at a step boundary (143, a checkpoint when enabled) and SIGINT at once (130), as in a
    # plain run; the comparison files are written only after both runs, each whole or not at all.
    try:
        with signals.handlers_installed():
            for i, (run, config) in enumerate(runs, 1):
                what = f"converters {','.join(names)}" if config.converters else "no converters"
                progress(f"compare {i}/2: {run} ({what}) -> {config.config.job.run_dir}", is_rank0=True)
                curves.append(train_once(config, run, trainer_class))
            stop_if_requested(len(curves))
            with signals.no_interrupt():
                converted, baseline = curves
                print(format_comparison(converted, baseline), flush=True)
                root.mkdir(parents=True, exist_ok=True)
                write_jsonl(root / "compare.jsonl", curves)
                plot_curves(root / "compare.png", curves, title, labels={"converted": f"converted ({','.join(names)})"})
    finally:
        distributed.destroy()
        lock.release()
    print(f"[titan] compare: wrote {root / 'compare.jsonl'} and {root / 'compare.png'}", flush=True)
    return 0


def stop_if_requested(runs_done: int) -> None:
    """A SIGTERM that arrived after the last step (both runs finished): stop without writing the comparison."""
    signum = signals.requested_signal()
    if signum:
        import signal

        raise StopRequested(
            f"titan-train: stopped by {signal.Signals(signum).name} after {runs_done} of 2 runs; the comparison "
            f"files were not written (rerun the same command: both runs resume from their checkpoints when "
            f"checkpointing is on)", signum=signum)
