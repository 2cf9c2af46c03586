"""Data-path figures: start-up and memory on big shard sets, data_ms (``titan-data prepare``'s
throughput and start-up: ``benchmarks/prepare.py``).

    python benchmarks/data.py startup [--big 2000000000] [--small 20000000] [--rounds 2]
        a 5-step run on shard sets of --big and --small tokens: seconds from launch to the
        first step's metrics line, and peak RSS. The shard sets are synthetic (see below) and
        deleted afterwards. Target: big / small <= 1.1 for both.
    python benchmarks/data.py data-ms [--steps 4] [--seq-len 2048] [--batch 8]
        debugmodel on CPU over shards: data_ms against the step time. Target: <= 1%.
    python benchmarks/data.py reads [--batches 2000] [--seq-len 32] [--batch 2]
        the loader's shard reads (``os.pread`` per window piece, what a run does since reads stopped
        memory-mapping: a truncated shard was a SIGBUS) against a ``numpy.memmap`` of the same shards
        (the earlier reader), microseconds per batch, and both against one step of the 1-layer debugmodel
        at that shape. Target: the difference under 1% of a step.

Synthetic shard sets: ``--big`` tokens of 2 billion would take hours to tokenize on two
cores, so the startup benchmark writes the shard files directly as sparse files of token id
0 (a valid id), documents of 1024 tokens in ``documents.bin``, and an index with the built-in
tokenizer's fingerprint: exactly the files ``titan-data prepare`` writes, with other token
values. The two sets are made the same way, so their ratio measures what grows with the
corpus (index, document table, memory maps), not disk speed.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = [sys.executable, "-m", "titan_core", "--spec", "llama3", "--flavor", "debugmodel"]


def write_synthetic(folder: Path, tokens: int, *, shard_tokens: int = 1 << 26, doc_tokens: int = 1024) -> None:
    """A valid shard set of ``tokens`` tokens of id 0 (sparse files), see the module docstring."""
    import numpy as np

    from titan_core.data.shard_format import FORMAT, VERSION, shard_name
    from titan_core.plan.tokenizer import build_tokenizer

    tok = build_tokenizer("builtin")
    folder.mkdir(parents=True)
    shards, mtimes, hashes = [], {}, {}
    for i, start in enumerate(range(0, tokens, shard_tokens)):
        n = min(shard_tokens, tokens - start)
        path = folder / shard_name(i)
        with path.open("wb") as f:
            f.truncate(2 * n)  # a sparse file: zeros, no disk used
        if n not in hashes:  # every full shard has the same bytes
            digest = hashlib.sha256()
            zeros = bytes(1 << 24)
            left = 2 * n
            while left:
                digest.update(zeros[: min(left, len(zeros))])
                left -= min(left, len(zeros))
            hashes[n] = digest.hexdigest()
        shards.append({"file": path.name, "tokens": n, "sha256": hashes[n]})
        mtimes[path.name] = path.stat().st_mtime_ns
    offsets = np.append(np.arange(0, tokens, doc_tokens, dtype="<i8"), np.int64(tokens)).astype("<i8")
    (folder / "documents.bin").write_bytes(offsets.tobytes())
    mtimes["documents.bin"] = (folder / "documents.bin").stat().st_mtime_ns
    index = {"format": FORMAT, "version": VERSION, "dtype": "uint16", "shard_tokens": shard_tokens,
             "tokenizer": {"fingerprint": tok.fingerprint, "name": "builtin", "vocab_size": tok.vocab_size,
                           "bos_id": tok.bos_id, "eos_id": tok.eos_id},
             "num_tokens": tokens, "num_documents": int(offsets.size - 1), "shards": shards,
             "documents": {"file": "documents.bin", "sha256": hashlib.sha256(offsets.tobytes()).hexdigest()},
             "inputs": {"synthetic": True}}
    (folder / ".verified.json").write_text(json.dumps(mtimes))
    (folder / "index.json").write_text(json.dumps(index))


def timed_run(shards: Path, run_dir: Path, extra: list[str]) -> tuple[float, float, list[dict[str, float]]]:
    """(seconds from launch to the first metrics line, peak RSS GiB at the end, records)."""
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    cmd = [*TRAIN, f"--data.source=tokens:{shards}", f"--job.run_dir={run_dir}", "--metrics.log_freq=1", *extra]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    first = None
    assert proc.stdout is not None
    for line in proc.stdout:
        if first is None and line.startswith("step      1 |"):
            first = time.perf_counter() - start
    if proc.wait() != 0 or first is None:
        raise SystemExit(f"the run failed: {' '.join(cmd)}")
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return first, records[-1]["mem_peak_rss_gib"], records


LOADER_ONLY = (
    "import resource, sys, time\n"
    "from titan_core.data import build_dataloader\n"
    "from titan_core.plan.tokenizer import build_tokenizer\n"
    "tok = build_tokenizer('builtin')\n"
    "rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
    "start = time.perf_counter()\n"
    "loader = build_dataloader(source='tokens:' + sys.argv[1], tokenizer=tok, seq_len=256, local_batch_size=4)\n"
    "next(loader)\n"
    "print(time.perf_counter() - start, (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss) / 1024)\n"
)


def loader_only(folder: Path) -> tuple[float, float]:
    """(seconds to open the shard set, split it and read the first batch; MiB of peak RSS that added)."""
    out = subprocess.run([sys.executable, "-c", LOADER_ONLY, str(folder)], capture_output=True, text=True, check=True)
    seconds, mib = out.stdout.split()
    return float(seconds), float(mib)


def bench_startup(args: argparse.Namespace) -> None:
    extra = ["--llama3.n_layers=2", "--training.seq_len=256", "--training.local_batch_size=4", "--training.steps=5"]
    with tempfile.TemporaryDirectory(prefix="titan-bench-", dir=args.dir) as tmp:
        sets = {"small": Path(tmp) / "small", "big": Path(tmp) / "big"}
        write_synthetic(sets["small"], args.small)
        write_synthetic(sets["big"], args.big)
        results: dict[str, list[tuple[float, float]]] = {"small": [], "big": []}
        loader: dict[str, list[tuple[float, float]]] = {"small": [], "big": []}
        for r in range(args.rounds):
            for name, folder in sets.items():
                first, rss, _ = timed_run(folder, Path(tmp) / f"run-{name}-{r}", extra)
                results[name].append((first, rss))
                loader[name].append(loader_only(folder))
    print(f"5-step runs (debugmodel, 2 layers, batch 4 x 256), {args.rounds} rounds alternating; median-free: min")
    print(f"{'shard set':<28} {'to first step s':>16} {'peak RSS GiB':>13}")
    rows = {}
    for name, tokens in (("small", args.small), ("big", args.big)):
        first = min(x[0] for x in results[name])
        rss = min(x[1] for x in results[name])
        rows[name] = (first, rss)
        print(f"{f'{tokens:,} tokens':<28} {first:>16.2f} {rss:>13.3f}")
    print(f"big / small: start-up {rows['big'][0] / rows['small'][0]:.3f}x, peak RSS {rows['big'][1] / rows['small'][1]:.3f}x")
    print("the data loader alone (open + check + split + first batch, in a fresh process; min of the rounds):")
    for name, tokens in (("small", args.small), ("big", args.big)):
        print(f"{f'{tokens:,} tokens':<28} {min(x[0] for x in loader[name]):>10.3f} s {min(x[1] for x in loader[name]):>8.1f} MiB")


def bench_data_ms(args: argparse.Namespace) -> None:
    extra = [f"--training.seq_len={args.seq_len}", f"--training.local_batch_size={args.batch}",
             f"--training.steps={args.steps}", "--training.device=cpu"]
    with tempfile.TemporaryDirectory(prefix="titan-bench-", dir=args.dir) as tmp:
        folder = Path(tmp) / "shards"
        subprocess.run([sys.executable, "-m", "titan_core.commands.data_prepare", "prepare", "builtin", "--tokenizer",
                        "builtin", "--out", str(folder), "--quiet"], check=True, stdout=subprocess.DEVNULL)
        _, _, records = timed_run(folder, Path(tmp) / "run", extra)
    steady = records[1:] or records  # step 1 builds kernels
    step_ms = sum(r["step_time_s"] for r in steady) / len(steady) * 1000
    data_ms = sum(r["data_ms"] for r in steady) / len(steady)
    print(f"debugmodel, batch {args.batch} x {args.seq_len}, CPU, shards of the built-in corpus; steps 2..{args.steps}")
    print(f"{'step ms':>10} {'data_ms':>10} {'data / step':>12}")
    print(f"{step_ms:>10.1f} {data_ms:>10.3f} {data_ms / step_ms:>11.4%}")


def bench_reads(args: argparse.Namespace) -> None:
    import numpy as np
    import torch

    from titan_core.data.shards import open_shard_set, split_windows
    from titan_core.plan.tokenizer import build_tokenizer

    window = args.seq_len + 1
    with tempfile.TemporaryDirectory(prefix="titan-bench-", dir=args.dir) as tmp:
        folder = Path(tmp) / "shards"
        subprocess.run([sys.executable, "-m", "titan_core.commands.data_prepare", "prepare", "builtin", "--tokenizer",
                        "builtin", "--out", str(folder), "--quiet", "--shard-tokens", "65536"], check=True,
                       stdout=subprocess.DEVNULL)
        view = split_windows(open_shard_set(str(folder), build_tokenizer("builtin")), split="train", val_fraction=0.0)
        shard_set = view.shard_set
        maps = [np.memmap(s.path, dtype=shard_set.dtype, mode="r", shape=(s.tokens,)) for s in shard_set.shards]

        def mapped(rows: torch.Tensor) -> torch.Tensor:  # the earlier reader (one segment: val_fraction 0)
            out = np.empty((len(rows), window), dtype=np.int64)
            for r, row in enumerate(rows.tolist()):
                pos, filled = row * window, 0
                while filled < window:
                    i = int(np.searchsorted(shard_set.starts, pos, side="right")) - 1
                    lo = pos - int(shard_set.starts[i])
                    take = min(window - filled, shard_set.shards[i].tokens - lo)
                    out[r, filled : filled + take] = maps[i][lo : lo + take]
                    filled, pos = filled + take, pos + take
            return torch.from_numpy(out)

        num_windows = view.numel() // window
        batches = [torch.randint(0, num_windows, (args.batch,), generator=torch.Generator().manual_seed(b))
                   for b in range(args.batches)]
        assert all(torch.equal(view.read_windows(b, window), mapped(b)) for b in batches[:50])
        timings = {}
        for name, read in (("pread (now)", lambda b: view.read_windows(b, window)), ("memmap (before)", mapped)):
            best = math.inf
            for _ in range(3):
                start = time.perf_counter()
                for b in batches:
                    read(b)
                best = min(best, time.perf_counter() - start)
            timings[name] = best / len(batches) * 1e6
        _, _, records = timed_run(folder, Path(tmp) / "run", ["--llama3.n_layers=1", f"--training.seq_len={args.seq_len}",
                                                              f"--training.local_batch_size={args.batch}",
                                                              "--training.steps=6", "--training.device=cpu"])
    steady = records[1:] or records
    step_us = sum(r["step_time_s"] for r in steady) / len(steady) * 1e6
    print(f"shard reads, batch {args.batch} x {window} tokens, {args.batches} random batches, best of 3; "
          f"1-layer debugmodel step at that shape {step_us / 1000:.1f} ms (steps 2..6)")
    print(f"{'reader':<18} {'us / batch':>11} {'of a step':>10}")
    for name, us in timings.items():
        print(f"{name:<18} {us:>11.1f} {us / step_us:>10.4%}")
    difference = timings["pread (now)"] - timings["memmap (before)"]
    print(f"pread - memmap: {difference:+.1f} us per batch, {difference / step_us:+.4%} of a step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    s = sub.add_parser("startup")
    s.add_argument("--big", type=int, default=2_000_000_000)
    s.add_argument("--small", type=int, default=20_000_000)
    s.add_argument("--rounds", type=int, default=2)
    s.add_argument("--dir", default=None, help="where the shard sets are written (default: the temp folder)")
    d = sub.add_parser("data-ms")
    d.add_argument("--steps", type=int, default=4)
    d.add_argument("--seq-len", type=int, default=2048)
    d.add_argument("--batch", type=int, default=8)
    d.add_argument("--dir", default=None)
    r = sub.add_parser("reads")
    r.add_argument("--batches", type=int, default=2000)
    r.add_argument("--seq-len", type=int, default=32)
    r.add_argument("--batch", type=int, default=2)
    r.add_argument("--dir", default=None)
    args = parser.parse_args()
    {"startup": bench_startup, "data-ms": bench_data_ms, "reads": bench_reads}[args.what](args)


if __name__ == "__main__":
    main()
