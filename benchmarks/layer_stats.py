"""What ``metrics.layer_stats`` costs: the step time with it against without, at ``metrics.log_freq=10``.

One process trains the llama3 debugmodel (fp32) with ``metrics.layer_stats=true`` and turns the
statistics off in every other logging window of ten steps (the window's logging step is its last), so
windows with and without alternate in the same process and machine noise hits both alike. Each step's
``train_step`` is timed; a window's time is the sum of its ten steps. The first two windows (start-up)
are left out. Printed: the median window time of each variant per step, and their ratio with / without
(target <= 1.03).

    python benchmarks/layer_stats.py                 # 120 steps: 5 windows of each after the start-up
    python benchmarks/layer_stats.py --steps 60 --seq-len 64
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import Table, int_parser

LOG_FREQ = 10
WARMUP_WINDOWS = 2


def window_times(run_dir: Path, steps: int, seq_len: int) -> tuple[dict[bool, list[float]], dict[bool, list[float]]]:
    """Per variant (with statistics or not), the time of each of its windows after the start-up, and of
    each of its logging steps (the one step of a window that measures)."""
    from titan_core import Trainer
    from titan_core.plan.resolve import resolve_config

    pairs = {"model.spec": "llama3", "model.flavor": "debugmodel", "training.steps": str(steps),
             "training.seq_len": str(seq_len), "training.local_batch_size": "4", "metrics.log_freq": str(LOG_FREQ),
             "metrics.layer_stats": "true", "metrics.report": "false", "job.run_dir": str(run_dir)}
    trainer = Trainer(resolve_config(config_source=None, override_pairs=list(pairs.items())))
    trainer.setup()
    stats = trainer.layer_stats
    windows: dict[int, float] = {}
    logging: dict[int, float] = {}
    step = trainer.train_step

    def timed(batches: Any) -> Any:
        window = trainer.step // LOG_FREQ  # steps 1-10 are window 0, whose logging step is 10
        trainer.layer_stats = stats if window % 2 else None
        start = time.perf_counter()
        result = step(batches)
        took = time.perf_counter() - start
        windows[window] = windows.get(window, 0.0) + took
        if trainer.step % LOG_FREQ == 0:
            logging[window] = took
        return result

    trainer.train_step = timed  # type: ignore[method-assign]
    trainer.train()
    full = {w: t for w, t in windows.items() if w >= WARMUP_WINDOWS and (w + 1) * LOG_FREQ <= steps}
    measured = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    if not any(k.startswith("layer/") for r in measured for k in r):
        raise SystemExit("the windows with metrics.layer_stats recorded no layer/* figures")
    logged = {w: t for w, t in logging.items() if w in full}
    return ({True: [t for w, t in full.items() if w % 2], False: [t for w, t in full.items() if not w % 2]},
            {True: [t for w, t in logged.items() if w % 2], False: [t for w, t in logged.items() if not w % 2]})


def main() -> None:
    parser = int_parser(__doc__, steps=120, seq_len=128)
    args = parser.parse_args()
    if args.steps < (WARMUP_WINDOWS + 2) * LOG_FREQ:
        parser.error(f"--steps {args.steps}: give at least {(WARMUP_WINDOWS + 2) * LOG_FREQ} (the start-up windows, "
                     f"then one window of {LOG_FREQ} steps with and one without)")
    with tempfile.TemporaryDirectory() as name:
        times, logging = window_times(Path(name) / "run", args.steps, args.seq_len)
    with_stats, without = statistics.median(times[True]) / LOG_FREQ, statistics.median(times[False]) / LOG_FREQ
    print(f"metrics.layer_stats at log_freq {LOG_FREQ}, llama3 debugmodel, 1 process, seq_len {args.seq_len}, "
          f"{args.steps} steps: {len(times[True])} windows with, {len(times[False])} without, alternating")
    log_with, log_without = statistics.median(logging[True]), statistics.median(logging[False])
    table = Table(("layer_stats", "<14"), ("ms/step", ">10"), ("logging step ms", ">17"))
    table.print_header()
    table.print_row("off", f"{without * 1000:.2f}", f"{log_without * 1000:.2f}")
    table.print_row("on", f"{with_stats * 1000:.2f}", f"{log_with * 1000:.2f}")
    ratio = with_stats / without
    # The cost is paid on the logging step only: its extra time spread over the window, a steadier figure
    # than the ratio of two noisy window sums.
    from_logging = 1 + (log_with - log_without) / (LOG_FREQ * without)
    print(f"step-time ratio with / without: {ratio:.3f} (target <= 1.03)")
    print(f"from the logging steps alone: 1 + (on - off) / ({LOG_FREQ} x off ms/step) = {from_logging:.3f}")
    print(json.dumps({"without_s": without, "with_s": with_stats, "ratio": ratio, "logging_step_without_s": log_without,
                      "logging_step_with_s": log_with, "ratio_from_logging_steps": from_logging}))


if __name__ == "__main__":
    main()
