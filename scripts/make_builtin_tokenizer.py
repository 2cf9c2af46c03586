"""Train the built-in tokenizer and write src/titan_core/assets/builtin_tokenizer.model.

A byte-level BPE trained on the built-in corpus (titan_core.data.corpus):
the text is split into pre-tokens with Llama 3's pattern, every pre-token starts
as its UTF-8 bytes (ranks 0..255 are the 256 single bytes, so any text encodes),
and the most frequent adjacent pair is merged until the mergeable vocabulary
plus the built-in special tokens is exactly BUILTIN_VOCAB_SIZE (2048).

Pair counts are updated incrementally (only the pre-tokens that contain the
merged pair are rewritten) and the best pair comes from a lazy max-heap, so the
whole run takes a few seconds. Ties break on the pair's token ids, so the output
is the same on every run with the same corpus.

Usage: python scripts/make_builtin_tokenizer.py [--out PATH]
"""

from __future__ import annotations

import argparse
import collections
import heapq
import time
from pathlib import Path

import regex

from titan_core.data.corpus import builtin_documents
from titan_core.data.tokenizer import (
    BUILTIN_PATH,
    BUILTIN_SPECIAL_TOKENS,
    BUILTIN_VOCAB_SIZE,
    LLAMA3_PATTERN,
    TiktokenTokenizer,
    write_bpe_ranks,
)

Pair = tuple[int, int]


def count_pretokens(docs: tuple[str, ...]) -> collections.Counter[bytes]:
    """Frequency of every pre-token (as UTF-8 bytes) under Llama 3's split pattern."""
    pattern = regex.compile(LLAMA3_PATTERN)
    counts: collections.Counter[bytes] = collections.Counter()
    for doc in docs:
        counts.update(m.encode("utf-8") for m in pattern.findall(doc))
    return counts


def train_bpe(word_counts: collections.Counter[bytes], num_tokens: int) -> dict[bytes, int]:
    """Merge pairs until there are ``num_tokens`` mergeable tokens; returns token -> rank."""
    vocab: list[bytes] = [bytes([b]) for b in range(256)]
    ranks: dict[bytes, int] = {tok: i for i, tok in enumerate(vocab)}
    words: list[list[int]] = [list(w) for w in word_counts]
    freqs: list[int] = list(word_counts.values())

    pair_counts: collections.Counter[Pair] = collections.Counter()
    where: dict[Pair, set[int]] = collections.defaultdict(set)
    for i, word in enumerate(words):
        for pair in zip(word, word[1:]):
            pair_counts[pair] += freqs[i]
            where[pair].add(i)
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)

    while len(ranks) < num_tokens and heap:
        neg, pair = heapq.heappop(heap)
        if pair_counts.get(pair, 0) != -neg:
            continue  # stale heap entry: the count changed after it was pushed
        if -neg <= 0:
            break
        merged = vocab[pair[0]] + vocab[pair[1]]
        # Two different pairs can spell the same bytes ("a"+"bc", "ab"+"c"): reuse the token.
        new_id = ranks.get(merged)
        if new_id is None:
            new_id = len(ranks)
            ranks[merged] = new_id
            vocab.append(merged)
        changed: set[Pair] = set()
        for i in where.pop(pair):
            word, freq = words[i], freqs[i]
            for old in zip(word, word[1:]):
                pair_counts[old] -= freq
                changed.add(old)
            out: list[int] = []
            j = 0
            while j < len(word):
                if j + 1 < len(word) and word[j] == pair[0] and word[j + 1] == pair[1]:
                    out.append(new_id)
                    j += 2
                else:
                    out.append(word[j])
                    j += 1
            words[i] = out
            for new in zip(out, out[1:]):
                pair_counts[new] += freq
                where[new].add(i)
                changed.add(new)
        pair_counts.pop(pair, None)
        for p in changed:
            if p != pair and pair_counts.get(p, 0) > 0:
                heapq.heappush(heap, (-pair_counts[p], p))
    if len(ranks) < num_tokens:
        raise SystemExit(f"corpus too small: only {len(ranks)} tokens after exhausting all pairs")
    return ranks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=BUILTIN_PATH)
    args = parser.parse_args()

    start = time.perf_counter()
    docs = builtin_documents()
    word_counts = count_pretokens(docs)
    ranks = train_bpe(word_counts, BUILTIN_VOCAB_SIZE - len(BUILTIN_SPECIAL_TOKENS))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_bpe_ranks(args.out, ranks)
    tok = TiktokenTokenizer.from_file(args.out, special_tokens=BUILTIN_SPECIAL_TOKENS)
    n_bytes = sum(len(d.encode("utf-8")) for d in docs)
    n_tokens = sum(len(ids) for ids in tok.encode_batch(list(docs)))
    print(
        f"wrote {args.out}: vocab {tok.vocab_size} ({len(ranks)} mergeable + {len(BUILTIN_SPECIAL_TOKENS)} special); "
        f"corpus {len(docs)} documents, {n_bytes} bytes -> {n_tokens} tokens "
        f"({n_bytes / n_tokens:.2f} bytes/token); {time.perf_counter() - start:.1f}s"
    )


if __name__ == "__main__":
    main()
