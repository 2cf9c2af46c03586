"""The tokenizer processes of ``titan-data prepare``: each takes a task, tokenizes it and writes the
tokens to a piece file of its own in ``--out`` (``piece-<task>.tmp``); the parent hears back only the
task's number, its token count and its documents' lengths, places and digests (``repeats.py``). No token
array crosses a pipe.

Plain processes, one pipe each, rather than a multiprocessing.Pool (whose handler threads and
per-task bookkeeping cost the parent a noticeable share of a core). A task goes to whichever
worker has room (at most ``QUEUED`` waiting per worker), so a worker slowed by the machine's
other load does not hold the rest back; the parent puts the pieces in task order, so the bytes
written do not depend on how many workers there are or which one tokenized what. Every message
to a worker is small (the texts of a "texts" task go through a file), so the parent never blocks
on a send while that worker blocks on sending a result: there is no deadlock.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import TitanError
from ...runtime.parent_death import end_with_parent
from .tasks import Task, encode_documents, read_spilled_texts, read_task, spilled_texts

if TYPE_CHECKING:  # its module imports torch; prepare never needs it at run time
    from ...plugin.spec_factories import Tokenizer

# Seconds a worker has to end once asked (it is idle by then: every result was taken, or the run is stopping).
WORKER_EXIT_S = 5.0
QUEUED = 2  # tasks sent to one worker and not yet answered: one to work on, one ready behind it


def piece_path(out: Path, task: int) -> Path:
    return out / f"piece-{task:09d}.tmp"


@dataclass(frozen=True)
class Piece:
    """A finished task: its tokens are in ``piece_path(out, task)``; ``lengths`` and ``places`` are its
    documents' (int64 bytes), ``digests`` their texts' (uint64 bytes). Or the error that stopped it (a bad
    row), raised when the task's turn comes, so the error reported is the first in source order whatever the
    number of workers."""

    task: int
    tokens: int = 0
    lengths: bytes = b""
    places: bytes = b""
    digests: bytes = b""
    error: Exception | None = None


def _worker_main(conn: Connection, out: Path, dtype: str, text_field: str, tok: Tokenizer | None,
                 load_tokenizer: Callable[[str], Tokenizer], tokenizer: str, parent_pid: int) -> None:
    # A parent killed outright (SIGKILL, the OOM killer) closes no pipe a sibling still holds open: end with it.
    end_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles Ctrl+C and stops the workers
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        tok = tok if tok is not None else load_tokenizer(tokenizer)
        while (message := conn.recv()) is not None:
            index, task = message
            try:
                if task.kind == "texts-file":
                    path = Path(task.path)
                    task = Task("texts", start=task.start, texts=read_spilled_texts(path))
                    path.unlink()
                docs = read_task(task, text_field)
                tokens, lengths = encode_documents(docs.texts, tok, dtype)
                tokens.tofile(piece_path(out, index))
                piece = Piece(index, int(tokens.size), lengths.astype("<i8").tobytes(), docs.places.tobytes(),
                              docs.digests.tobytes())
            except (TitanError, OSError) as exc:  # a bad row, a full disk: the parent reports it
                piece = Piece(index, error=exc)
            conn.send(piece)
    except (EOFError, OSError, KeyboardInterrupt):  # the parent is gone or stopping us
        pass


def ended_how(exitcode: int | None) -> str:
    """How a process ended, in a message's words (``exitcode`` as multiprocessing reports it)."""
    if exitcode is None:
        return "stopped answering (its pipe closed, the process still runs)"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        why = " (the kernel's out-of-memory killer, or kill -9)" if -exitcode == signal.SIGKILL else ""
        return f"was killed by {name}{why}"
    return f"exited with code {exitcode}"


def describe_task(index: int, task: Task) -> str:
    """The input a task covers, for a message: a file and where in it, or the task's number for in-memory texts."""
    if task.kind == "lines":
        return f"{task.path} (bytes {task.start}..{task.end}, task {index})"
    if task.kind == "parquet":
        return f"{task.path} (row group {task.start}, task {index})"
    if task.path:
        return f"{task.path} (task {index})"
    return f"{len(task.texts)} documents held in memory (from the built-in corpus, an hf: source or a .json list; task {index})"


class Workers:
    """N tokenizer processes writing pieces into ``out``. ``submit`` a task when ``has_room``; ``finished``
    waits for answers (in any order)."""

    def __init__(self, n: int, *, out: Path, dtype: str, text_field: str, tok: Tokenizer,
                 load_tokenizer: Callable[[str], Tokenizer], tokenizer: str) -> None:
        fork = "fork" in mp.get_all_start_methods()
        ctx: Any = mp.get_context("fork" if fork else "spawn")  # its Process: typeshed knows it per context only
        self.out = out
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        self.queued: list[int] = []
        self.inputs: list[dict[int, str]] = [{} for _ in range(n)]  # per worker: its tasks in hand, described
        for _ in range(n):
            parent, child = ctx.Pipe()
            # Forked workers share the parent's tokenizer (a large vocabulary is not loaded N more times).
            proc = ctx.Process(target=_worker_main, daemon=True,
                               args=(child, out, dtype, text_field, tok if fork else None, load_tokenizer, tokenizer,
                                     os.getpid()))
            proc.start()
            child.close()
            self.conns.append(parent)
            self.procs.append(proc)
            self.queued.append(0)

    @property
    def busy(self) -> int:
        return sum(self.queued)

    def has_room(self) -> bool:
        return min(self.queued) < QUEUED

    def submit(self, index: int, task: Task) -> None:
        """Task ``index`` to the worker with the fewest tasks waiting (the first of them on a tie)."""
        described = describe_task(index, task)
        if task.kind == "texts":
            fd, name = tempfile.mkstemp(dir=self.out, prefix="task-", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                f.write(spilled_texts(task.texts))
            task = Task("texts-file", name, task.start)  # start: its first text's number in the source
        w = self.queued.index(min(self.queued))
        try:
            self.conns[w].send((index, task))
        except OSError:  # its pipe is closed: the worker died since its last answer
            raise self._died(w) from None
        self.inputs[w][index] = described
        self.queued[w] += 1

    def finished(self) -> list[Piece]:
        """The pieces finished since the last call, in any order (waits for at least one)."""
        waiting = [c for c, q in zip(self.conns, self.queued) if q]
        pieces: list[Piece] = []
        for ready in wait(waiting):
            w = next(i for i, c in enumerate(self.conns) if c is ready)
            try:
                piece: Piece = self.conns[w].recv()
            except (EOFError, OSError):  # EOF, or "Connection reset by peer": the worker is gone
                raise self._died(w) from None
            self.inputs[w].pop(piece.task, None)
            self.queued[w] -= 1
            pieces.append(piece)
        return pieces

    def _died(self, w: int) -> TitanError:
        """The error for worker ``w`` gone: which worker, how it ended, and the input it had in hand."""
        proc = self.procs[w]
        proc.join(timeout=WORKER_EXIT_S)  # its pipe closed as it ended: the exit code follows at once
        how = ended_how(proc.exitcode)
        held = self.inputs[w]
        on = f" while tokenizing {held[min(held)]}" if held else ""
        return TitanError(f"titan-data worker {w + 1} of {len(self.procs)} (pid {proc.pid}) {how}{on}; the finished "
                          f"shards in {self.out} are kept: run the same command again to continue (with fewer "
                          "--workers if memory is short).")

    def close(self, *, stop: bool) -> None:
        """Ask the workers to finish (``stop``: end them now), then wait for them."""
        for conn, proc in zip(self.conns, self.procs):
            if stop:
                # SIGKILL, not SIGTERM: a worker forked a moment ago still runs the caller's SIGTERM handler
                # (titan's, which raises), so a SIGTERM could make it report "stopped by SIGTERM" as if it
                # were the command itself (seen when prepare ran in a test process). Nothing it holds is needed.
                proc.kill()
            else:
                try:
                    conn.send(None)
                except OSError:
                    pass
        for conn, proc in zip(self.conns, self.procs):
            proc.join(timeout=WORKER_EXIT_S)
            if proc.is_alive():
                # A forked worker inherits the caller's SIGTERM handler until it installs its own, so a stop
                # that reaches it in its first moments can be swallowed (seen: a worker left waiting for
                # work, and this join waiting on it for ever). Nothing it holds is needed any more.
                proc.kill()
                proc.join()
            conn.close()
        for left in [*self.out.glob("task-*.tmp"), *self.out.glob("piece-*.tmp")]:  # what no one took (a stop)
            left.unlink(missing_ok=True)
