"""Data-path figures: ``titan-data prepare`` throughput, start-up and memory on big shard sets, data_ms.

    python benchmarks/data.py prepare [--mb 40] [--rounds 2]
        tokens/s of the tokenizer alone on one core, then of prepare with 1 and 2 workers
        (in alternating order), per round and best of the rounds, with the load average.
        Targets: 2 workers >= 1.7x 1 worker; per worker >= 80% of the tokenizer's
        single-core rate.
    python benchmarks/data.py startup [--big 2000000000] [--small 20000000] [--rounds 2]
        a 5-step run on shard sets of --big and --small tokens: seconds from launch to the
        first step's metrics line, and peak RSS. The shard sets are synthetic (see below) and
        deleted afterwards. Target: big / small <= 1.1 for both.
    python benchmarks/data.py data-ms [--steps 4] [--seq-len 2048] [--batch 8]
        debugmodel on CPU over shards: data_ms against the step time. Target: <= 1%.

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
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TRAIN = [sys.executable, "-m", "titan_core", "--spec", "llama3", "--flavor", "debugmodel"]


def _corpus(folder: Path, mb: float) -> tuple[Path, list[str]]:
    from titan_core.data.corpus import builtin_documents

    docs, size = [], 0
    base = builtin_documents()
    while size < mb * 1e6:
        for d in base:
            text = d[:20000]  # documents of web-page size
            docs.append(text)
            size += len(text)
            if size >= mb * 1e6:
                break
    path = folder / "corpus.jsonl"
    with path.open("w") as f:
        for d in docs:
            f.write(json.dumps({"text": d}) + "\n")
    return path, docs


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def bench_prepare(args: argparse.Namespace) -> None:
    """Rounds of: the tokenizer alone, then prepare with 1 and 2 workers (their order alternating),
    so a change of the machine's load hits each figure alike; ratios are taken within a round."""
    from titan_core.commands.prepare_shards import PrepareRequest, prepare
    from titan_core.plan.tokenizer import build_tokenizer

    tok = build_tokenizer("builtin")
    rounds: list[dict[str, float]] = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="titan-bench-") as tmp:
        path, docs = _corpus(Path(tmp), args.mb)
        for r in range(args.rounds):
            rates: dict[str, float] = {}
            start, cpu = time.perf_counter(), time.process_time()
            n = sum(len(tok.encode(d)) + 2 for d in docs)
            rates["tokenizer alone, 1 core"] = n / (time.perf_counter() - start)
            rates["tokenizer cpu"] = n / (time.process_time() - cpu)
            for workers in ((1, 2) if r % 2 == 0 else (2, 1)):
                out = Path(tmp) / f"out{workers}"
                shutil.rmtree(out, ignore_errors=True)
                start, parent, children = time.perf_counter(), _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
                index = prepare(PrepareRequest(sources=[str(path)], tokenizer="builtin", out=out, workers=workers,
                                               shard_tokens=args.shard_tokens, progress=False))
                rates[f"prepare --workers {workers}"] = index["num_tokens"] / (time.perf_counter() - start)
                # CPU seconds, which the load does not stretch: the workers' (reaped when the pool
                # closes) per token against the tokenizer's own, and the parent's against the workers'.
                rates[f"{workers}w worker cpu"] = index["num_tokens"] / (_cpu(resource.RUSAGE_CHILDREN) - children)
                rates[f"{workers}w parent cpu"] = _cpu(resource.RUSAGE_SELF) - parent
                rates[f"{workers}w workers cpu s"] = index["num_tokens"] / rates[f"{workers}w worker cpu"]
            rounds.append(rates)
    load_after = os.getloadavg()
    print(f"corpus: {args.mb} MB of text, {len(docs)} documents, {n:,} tokens; {args.rounds} rounds; "
          f"shards of {args.shard_tokens:,} tokens")
    print(f"load average (1, 5, 15 min) before: {', '.join(f'{x:.2f}' for x in load_before)}; "
          f"after: {', '.join(f'{x:.2f}' for x in load_after)}")
    print(f"{'round':<6} {'tokenizer tok/s':>16} {'1 worker tok/s':>15} {'2 workers tok/s':>16} "
          f"{'2w / 1w':>8} {'1w / tok':>9} {'2w per worker / tok':>20}")
    for r, rates in enumerate(rounds):
        single, one, two = (rates["tokenizer alone, 1 core"], rates["prepare --workers 1"],
                            rates["prepare --workers 2"])
        print(f"{r + 1:<6} {single:>16,.0f} {one:>15,.0f} {two:>16,.0f} {two / one:>8.2f} {one / single:>9.2f} "
              f"{two / 2 / single:>20.2f}")
    print("CPU time (not stretched by the load): tokens per worker CPU-second / the tokenizer's tokens per "
          "CPU-second; the parent's CPU seconds / the workers'")
    for r, rates in enumerate(rounds):
        print(f"round {r + 1}: " + "; ".join(
            f"{w} worker(s): worker efficiency {rates[f'{w}w worker cpu'] / rates['tokenizer cpu']:.2f}, parent / "
            f"workers {rates[f'{w}w parent cpu'] / rates[f'{w}w workers cpu s']:.3f}" for w in (1, 2)))
    keys = ["tokenizer alone, 1 core", "prepare --workers 1", "prepare --workers 2"]
    best = {key: max(rates[key] for rates in rounds) for key in keys}
    single = best["tokenizer alone, 1 core"]
    print(f"best of {args.rounds} rounds:")
    print(f"{'what':<26} {'tokens/s':>12} {'per worker / tokenizer':>24}")
    for key, rate in best.items():
        workers = 1 if "alone" in key else int(key.split()[-1])
        print(f"{key:<26} {rate:>12,.0f} {rate / workers / single:>24.2f}")
    print(f"2 workers / 1 worker (best of each): {best['prepare --workers 2'] / best['prepare --workers 1']:.2f}x")


def write_synthetic(folder: Path, tokens: int, *, shard_tokens: int = 1 << 26, doc_tokens: int = 1024) -> None:
    """A valid shard set of ``tokens`` tokens of id 0 (sparse files), see the module docstring."""
    import numpy as np

    from titan_core.data.shards import FORMAT, VERSION, shard_name
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--mb", type=float, default=40.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--shard-tokens", type=int, default=1 << 22,
                   help="tokens per shard (prepare's default is 1 << 26; smaller here so a 40 MB corpus writes several)")
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
    args = parser.parse_args()
    {"prepare": bench_prepare, "startup": bench_startup, "data-ms": bench_data_ms}[args.what](args)


if __name__ == "__main__":
    main()
