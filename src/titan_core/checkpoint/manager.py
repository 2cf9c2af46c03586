"""CheckpointManager: save every ``interval`` steps, resume, all crash-safe.

One save, on every rank:

1. rank 0 creates ``<folder>/.tmp-step-N-<nonce>`` and tells the others its name;
2. DCP writes every rank's tensors as raw bytes and the coordinator writes
   ``tensor_index.json`` into it (in async mode in a background thread, after the
   state was copied to CPU); non-tensor state travels as JSON in that index;
3. the ranks digest the files (size + CRC-32), rank 0 writes
   ``titan_checkpoint.json`` and renames the folder to ``step-N`` (one atomic
   ``os.rename`` plus an fsync of the folder), then applies ``keep_latest_k``.

Before a save every rank checks its parameters are finite: a non-finite state is
never saved (``NonFiniteError``, as the trainer's own guard), so the newest
checkpoint always holds the last good state.

Resume (``config.resume``): ``auto`` loads the newest complete ``step-N`` whose
identity record agrees with its name (symlinks and renamed or copied folders are
ignored, with a message), ``never`` starts fresh, anything else is a checkpoint
path (as given, or relative to the checkpoint folder, e.g. ``step-000010``). Rank 0
checks completeness, that the folder holds exactly its manifest's files, and the
identity (spec, flavor, converters, full shapes) and tells the other ranks; all
ranks then verify their share of the file checksums, and only then parse the
tensor index and load. Nothing read from a checkpoint is ever unpickled. With
``allow_converter_change`` and a different converter list, only the model weights
(and schedule, data position, RNG, step) are loaded, never the optimizer state:
float8/MX linears subclass ``nn.Linear`` and keep the ``weight``/``bias`` fqns, so
the shape check still guards the weights, but optimizer state written under other
numerics (or for parameters a converter adds) is not trusted. With
``enable = false`` the manager does nothing, neither saving nor loading.

The collectives of a synchronous save (and of resuming) run on the default group,
between steps, on the training's thread. Only ``async_mode = "async"`` opens a
dedicated gloo group, so that the background save's collectives never interleave
with the training's; its connections open on demand (``background_group.py``), so
it never builds a full socket mesh over 1024+ ranks. Failures are agreed on by all ranks, so one rank's full disk
stops every rank with the same error instead of leaving the others waiting in a
collective.

``lone_rank=(R, W)`` (rehearsal: rank R of a W-rank layout trains alone under a
fake process group) runs every step of a save here without a collective: rank R
writes its own shards (``__R_0.distcp``), the tensor index of those and the
identity record, and publishes ``step-N``; the other ranks' files do not exist.
Its values came through collectives that moved nothing, so the finite check
before a save is left out.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import warnings
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, NoReturn, TypeVar, cast

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.tensor import DTensor

from ..config.sections import CheckpointSection
from ..errors import CheckpointError, NonFiniteError, TitanError
from . import integrity, layout, states as st, storage
from .background_group import open_background_group
from .identity import (
    CheckpointRecord,
    ResumeInfo,
    RunIdentity,
    check_data,
    check_identity,
    read_record,
    write_record,
)
from .stateful import MODEL, OPTIMIZER, PROGRESS, RNG, ModelState, Stateful, StepCounter, training_states
from .tensor_index import INDEX_FILE, TensorIndex, is_plain_name, read_index

T = TypeVar("T")


class CheckpointManager:
    """Saves and resumes named ``Stateful`` objects (``stateful.py``) and every rank's RNG streams.

    Construct it on every rank after the optimizer exists (with ``async_mode = "async"``
    the constructor is a collective when a process group exists). ``lone_rank`` (rank,
    world size): rehearsal, see the module's docstring. ``states["model"]`` is a ``ModelState``;
    every other state but the model and optimizer is identical on every rank. Without
    ``states["progress"]`` the manager keeps the step and tokens seen itself. ``extra_files``
    (name -> bytes) are written into every checkpoint before it is published and listed in
    its manifest, so a reader sees them with their checksums or not at all.

    The keyword arguments ``model_parts``, ``optimizer``, ``lr_schedulers`` and ``dataloader``
    (instead of ``states``) are the constructor of titan-core 0.x: deprecated, kept for one
    minor version.
    """

    def __init__(
        self,
        *,
        config: CheckpointSection,
        run_dir: Path,
        identity: RunIdentity,
        is_rank0: bool,
        states: Mapping[str, Stateful] | None = None,
        extra_files: Mapping[str, bytes] | None = None,
        model_parts: list[nn.Module] | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        lr_schedulers: Stateful | None = None,
        dataloader: Stateful | None = None,
        lone_rank: tuple[int, int] | None = None,
    ) -> None:
        if states is None:
            states = _legacy_states(model_parts, optimizer, lr_schedulers, dataloader)
        elif any(x is not None for x in (model_parts, optimizer, lr_schedulers, dataloader)):
            raise TypeError("CheckpointManager: pass states=..., or the deprecated model_parts/optimizer/"
                            "lr_schedulers/dataloader, not both")
        self.config = config
        self.folder = Path(run_dir) / config.folder
        # The last sentence of a failed save: the setting that moves it (a tool saving a checkpoint names its own).
        self.failure_advice = "Free disk space or point --checkpoint.folder at a writable location."
        self.identity = identity
        self.is_rank0 = is_rank0
        self.states = _checked_states(states)
        # Without a progress state of the caller's, the manager's own follows maybe_save's step.
        self._counter: StepCounter | None = None
        if PROGRESS not in self.states:
            self._counter = self.states[PROGRESS] = StepCounter()
        model = self.states[MODEL]
        assert isinstance(model, ModelState)  # checked by _checked_states
        self._view = model.view
        self._extra_files = _checked_extra_files(extra_files or {})
        self._pg: Any = None  # the group of the collectives; None: the default group
        self._shared = False  # whether other processes take part (the collectives run)
        self._rank, self._world = lone_rank or (0, 1)
        self._alone = lone_rank is not None
        if config.enable and not self._alone and dist.is_available() and dist.is_initialized():
            self._shared = True
            if config.async_mode == "async":
                # The background thread's collectives need a group of their own. Not one over a subset:
                # DCP's plan exchange and the digest gather involve every rank that holds a shard.
                self._pg = open_background_group()
            self._rank, self._world = dist.get_rank(self._pg), dist.get_world_size(self._pg)
        self._pending: Future[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._last_saved_step: int | None = None
        self._resumed_step: int | None = None
        self._published: set[Path] = set()  # this run's own saves: retention may delete these
        if config.enable and self._leads:
            for stale in layout.remove_stale(self.folder):
                self._log(f"removed the interrupted save {stale}")

    # ---- public API ---------------------------------------------------------------

    def resume(self, *, newest: bool = False) -> ResumeInfo | None:
        """Load the checkpoint ``config.resume`` names (``newest``: this run's newest trusted checkpoint, whatever
        ``config.resume`` says: the loss-spike guard's rollback); None when starting fresh.

        Creates the checkpoint folder first, so an unwritable folder stops the run
        before training rather than at the first save ``interval`` steps later.
        """
        if not self.config.enable:
            # Said, not silent: a rerun that forgot --checkpoint.enable=true starts over next to the checkpoints.
            with contextlib.suppress(OSError):  # an unreadable folder: nothing to say, nothing is read from it
                if self.is_rank0 and self.folder.is_dir() and layout.latest_checkpoint(self.folder) is not None:
                    self._log(f"checkpointing is off (checkpoint.enable=false): starting from step 1, ignoring the "
                              f"checkpoints in {self.folder} (--checkpoint.enable=true resumes from the newest)")
            return None
        self._agree_on_rank0(lambda: layout.ensure_folder(self.folder))
        decision = self._agree_on_rank0(lambda: self._decide_resume(newest=newest))
        if decision is None:
            return None
        path, record, weights_only = decision
        self._agree(integrity.verify_share(path, record.files, **self._share()))
        index: TensorIndex | None = None
        error: str | None = None
        try:  # parsed only now: every byte of it was verified against the manifest above
            index = read_index(path, record.files)
        except CheckpointError as exc:
            error = str(exc)
        self._agree(error)
        assert index is not None
        info = self._load(path, index, weights_only=weights_only)
        if info.step != record.step:
            raise CheckpointError(f"checkpoint {path} holds step {info.step} but its identity file says {record.step}")
        self._last_saved_step = self._resumed_step = info.step
        return info

    def maybe_save(self, step: int, *, tokens_seen: int, last: bool = False) -> None:
        """Save at every ``interval``-th step and at the last step (once per step)."""
        if self.saves_at(step, last=last):
            self._save(step, tokens_seen)

    def saves_at(self, step: int, *, last: bool = False) -> bool:
        """Whether ``maybe_save(step)`` would write a checkpoint."""
        if not self.config.enable or step == self._last_saved_step:
            return False
        return step % self.config.interval == 0 or last

    def wait(self) -> None:
        """Finish and publish a pending async save; raises its CheckpointError if it failed."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    # ---- saving -------------------------------------------------------------------

    def _save(self, step: int, tokens_seen: int) -> None:
        self.wait()  # the previous async save is published before the next begins
        self._require_finite(step)
        if self._counter is not None:
            self._counter.step, self._counter.tokens_seen = step, tokens_seen
        state = {name: held.state_dict() for name, held in self.states.items()}
        saved = int(state[PROGRESS]["step"])
        if saved != step:  # checked before anything is written
            raise ValueError(f"CheckpointManager: saving step {step}, but states['progress'] says step {saved}")
        # Per-rank keys: DCP writes a plain tensor present on several ranks only once.
        state[RNG] = {f"rank{self._rank}": st.rng_state()}
        tmp = self._agree_on_rank0(lambda: self._make_tmp(step))
        self._last_saved_step = step
        tensors, values, _ = storage.split_values(state)
        writer = storage.IndexedWriter(tmp, values=self._merged_values(step, tmp, values),
                                       file_rank=self._rank if self._alone else None)
        if self.config.async_mode == "async":
            try:  # staging (the copy to CPU) happens here; the writes in DCP's thread
                writing = dcp.async_save(tensors, storage_writer=writer, process_group=self._pg,
                                         no_dist=not self._shared)
            except (Exception, CheckpointException) as exc:
                self._fail(step, tmp, _describe(exc))
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="titan-checkpoint")
            self._pending = self._executor.submit(self._write_and_publish, step, tokens_seen, tmp, None, writing)
        else:
            self._write_and_publish(step, tokens_seen, tmp, (tensors, writer), None)

    def _merged_values(self, step: int, tmp: Path, values: dict[str, Any]) -> dict[str, Any]:
        """Every rank's non-tensor values, JSON-encoded, for the coordinator's index (a collective)."""
        error: str | None = None
        encoded: dict[str, Any] = {}
        try:
            encoded = storage.encode_values(values)
        except CheckpointError as exc:
            error = str(exc)
        shares = self._gather_or_fail(step, tmp, error, encoded)
        merged: dict[str, Any] = {}
        for share in shares:  # replicated values are equal on every rank; per-rank keys differ
            for key, value in share.items():
                merged.setdefault(key, value)
        return merged

    def _gather_or_fail(self, step: int, tmp: Path, error: str | None, share: dict[str, Any]) -> list[Any]:
        """Every rank's (error, share) (a collective); the first rank's error fails the save on all ranks."""
        shares = self._gather((error, share))
        errors = [e for e, _ in shares if e]
        if errors:
            self._fail(step, tmp, errors[0])
        return [s for _, s in shares]

    def _require_finite(self, step: int) -> None:
        """Refuse to save a state holding NaN or inf (every rank checks its own shards)."""
        if self._alone:
            return  # rehearsal: the values came through collectives that moved nothing
        bad: str | None = None
        with torch.no_grad():
            for name, param in self._view.named_parameters():
                local = param.to_local() if isinstance(param, DTensor) else param
                if local.is_floating_point() and not bool(torch.isfinite(local.detach()).all()):
                    bad = name
                    break
        names = [b for b in self._gather(bad) if b]
        if names:
            raise NonFiniteError(
                f"step {step}: parameter {names[0]!r} holds non-finite values (NaN or inf), so the checkpoint of "
                f"step {step} was not saved and the last checkpoint holds the last good state. Lower "
                f"optimizer.lr (or raise lr_scheduler.warmup_steps) and resume from that checkpoint."
            )

    def _make_tmp(self, step: int) -> Path:
        layout.ensure_folder(self.folder)
        tmp = self.folder / layout.tmp_dirname(step)
        try:
            tmp.mkdir()
        except OSError as exc:
            raise CheckpointError(f"cannot create {tmp} for the checkpoint of step {step}: {exc}") from exc
        for name, data in self._extra_files.items():  # digested with the tensor files, listed in the manifest
            (tmp / name).write_bytes(data)
        return tmp

    def _write_and_publish(
        self, step: int, tokens_seen: int, tmp: Path, sync: tuple[dict[str, Any], Any] | None, writing: Any
    ) -> None:
        """Runs on every rank (in the background thread in async mode)."""
        error: str | None = None
        try:
            if writing is not None:
                writing.result()
            else:
                assert sync is not None
                tensors, writer = sync
                dcp.save(tensors, storage_writer=writer, process_group=self._pg, no_dist=not self._shared)
        except (Exception, CheckpointException) as exc:  # DCP reports every rank's failure to all ranks
            error = _describe(exc)
        if error is not None:
            self._fail(step, tmp, error)
        digests: dict[str, tuple[int, int]] = {}
        try:
            digests = integrity.digest_share(tmp, **self._share())
        except OSError as exc:
            error = _describe(exc)
        shares = self._gather_or_fail(step, tmp, error, digests)
        files = {name: digest for share in shares for name, digest in share.items()}
        record = CheckpointRecord(self.identity, step, tokens_seen, self._world, files)
        self._agree_on_rank0(lambda: self._publish(tmp, record))

    def _publish(self, tmp: Path, record: CheckpointRecord) -> None:
        final = self.folder / layout.step_dirname(record.step)
        try:
            self._set_aside_if_foreign(final, record.step)
            write_record(tmp, record)
            layout.publish(tmp, final)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(self._failure_text(record.step, tmp, _describe(exc))) from exc
        self._published.add(final)
        for old in layout.apply_retention(self.folder, self.config.keep_latest_k, protect=final,
                                          deletable=self._may_delete):
            self._log(f"deleted {old} (keep_latest_k={self.config.keep_latest_k})")
        self._log(f"saved checkpoint {final}")
        if self._alone:
            print(f"[checkpoint] rehearsal: {final} holds rank {self._rank}'s shards only "
                  f"(__{self._rank}_0.distcp); the other {self._world - 1} ranks' files do not exist", flush=True)

    def _set_aside_if_foreign(self, final: Path, step: int) -> None:
        """A folder named for this step whose identity record says otherwise (a copy, a forgery: resume
        ignored it) is not this run's to delete: it is renamed aside and kept, never replaced."""
        if final.is_symlink() or not final.is_dir():
            return
        try:
            if read_record(final).step == step:
                return  # an earlier save of this very step: replaced, as a rerun of the step should
        except CheckpointError:
            pass
        import secrets

        aside = final.with_name(f"{final.name}.ignored-{secrets.token_hex(4)}")
        os.rename(final, aside)
        self._log(f"kept {final} (its identity file does not record step {step}) as {aside}")

    def _may_delete(self, step: int, path: Path) -> bool:
        """Retention deletes this run's own saves and checkpoints no newer than the one resumed, nothing else."""
        return path in self._published or (self._resumed_step is not None and step <= self._resumed_step)

    def _fail(self, step: int, tmp: Path, error: str) -> NoReturn:
        if self._leads:
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(self._failure_text(step, tmp, error))

    def _failure_text(self, step: int, tmp: Path, error: str) -> str:
        previous = layout.latest_checkpoint(self.folder)
        kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
        return (
            f"saving the checkpoint of step {step} to {tmp} failed: {error}. The partial save was discarded and "
            f"{kept}. {self.failure_advice}"
        )

    # ---- resuming -----------------------------------------------------------------

    def _decide_resume(self, *, newest: bool = False) -> tuple[Path, CheckpointRecord, bool] | None:
        """Rank 0: which checkpoint to load, checked for completeness, listing and identity."""
        mode = "auto" if newest else self.config.resume
        if mode == "never":
            if layout.latest_checkpoint(self.folder) is not None:
                self._log(f"checkpoint.resume=never: ignoring the checkpoints in {self.folder}")
            return None
        if mode == "auto":
            found = self._newest_trusted()
            if found is None:
                return None
            path, record = found
        else:
            path = Path(mode)
            if not path.exists() and (self.folder / mode).exists():
                path = self.folder / mode
            if path.is_symlink():
                raise CheckpointError(
                    f"checkpoint {path} is a symbolic link; titan-core resumes only from a real folder, so that "
                    f"what is verified is what is loaded. Pass the folder it points to, {path.resolve()}."
                )
            record = self._checked_record(path)
        try:
            integrity.check_listing(path, record.files)
        except (OSError, ValueError) as exc:
            raise CheckpointError(f"checkpoint {path} cannot be trusted: {exc}.") from exc
        weights_only = check_identity(
            record.identity, self.identity, path=path, allow_converter_change=self.config.allow_converter_change
        )
        change = check_data(record.identity, self.identity, path=path,
                            allow_data_change=self.config.allow_data_change)
        if change is not None:
            self._log(f"resuming {path} on changed data (checkpoint.allow_data_change=true): {change}")
        return path, record, weights_only

    def _checked_record(self, path: Path) -> CheckpointRecord:
        """The identity record of ``path``, whose step must be the one the folder's name claims."""
        if layout.is_legacy(path):
            raise layout.legacy_error(path)
        layout.require_complete(path)
        record = read_record(path)
        claimed = layout.step_of(path.name)
        if claimed is not None and claimed != record.step:
            raise CheckpointError(
                f"checkpoint folder {path} is named for step {claimed} but its identity file records step "
                f"{record.step}: the folder was renamed or copied. Resume from a folder named "
                f"{layout.step_dirname(record.step)}, or pass another checkpoint."
            )
        return record

    def _newest_trusted(self) -> tuple[Path, CheckpointRecord] | None:
        """``auto``: the newest step-N folder that is real, complete and agrees with its record."""
        for step, path in reversed(layout.step_folders(self.folder)):
            if path.is_symlink():
                self._log(f"ignoring {path}: a symbolic link is never resumed from (nor deleted by retention)")
                continue
            if not path.is_dir() or (layout.missing_parts(path) and not layout.is_legacy(path)):
                continue  # an incomplete save: never published, or damaged by hand
            record = self._checked_record_or_none(path, step)
            if record is not None:
                return path, record
        return None

    def _checked_record_or_none(self, path: Path, step: int) -> CheckpointRecord | None:
        if layout.is_legacy(path):
            raise layout.legacy_error(path)
        record = read_record(path)
        if record.step != step:
            self._log(f"ignoring {path}: its identity file records step {record.step} (a renamed or copied folder)")
            return None
        return record

    def _load(self, path: Path, index: TensorIndex, *, weights_only: bool) -> ResumeInfo:
        rng_key = f"rank{self._rank}"
        rng_template = {
            key.split(".", 2)[2]: torch.empty(entry.size, dtype=entry.dtype)  # sizes bounded by read_index
            for key, entry in index.tensors.items()
            if key.startswith(f"rng.{rng_key}.")
        }
        # The checkpoint's values are loaded into these templates in place (DCP), then handed to each state.
        state: dict[str, Any] = {name: held.state_dict() for name, held in self._loaded(weights_only, index)}
        if rng_template:
            state[RNG] = {rng_key: rng_template}
        tensors, values, mappings = storage.split_values(state)
        try:
            dcp.load(tensors, storage_reader=storage.IndexedReader(path, index), planner=storage.CheckedLoadPlanner(),
                     process_group=self._pg, no_dist=not self._shared)
        except (Exception, CheckpointException) as exc:
            cause = _root_cause(exc)
            if isinstance(cause, CheckpointError):
                raise cause from exc
            raise CheckpointError(
                f"cannot load checkpoint {path}: {_describe(exc)}. The checkpoint does not match this run's "
                f"model/optimizer/scheduler/data-loader state; resume from another checkpoint or start fresh "
                f"with --checkpoint.resume=never."
            ) from exc
        error: str | None = None
        try:  # bytes that passed every check can still be nonsense (a re-digested forgery): no traceback
            storage.restore_values(state, values, mappings, index, path=path)
            self._apply(path, state, weights_only=weights_only, has_rng=bool(rng_template))
        except TitanError as exc:
            error = str(exc)
        except Exception as exc:
            error = (f"checkpoint {path} holds a state this run cannot apply ({type(exc).__name__}: {exc}); it is "
                     f"damaged or was written by a different setup. Resume from another checkpoint or start fresh "
                     f"with --checkpoint.resume=never.")
        self._agree(error)
        step, tokens = int(state[PROGRESS]["step"]), int(state[PROGRESS]["tokens_seen"])
        return ResumeInfo(step=step, tokens_seen=tokens, path=path, optimizer_loaded=not weights_only)

    def _loaded(self, weights_only: bool, index: TensorIndex) -> list[tuple[str, Stateful]]:
        """The states a resume loads, in order (the model before the optimizer, whose state is keyed by it).
        A state marked ``optional_in_checkpoint`` (e.g. DiLoCo's outer state) that the checkpoint lacks
        is left as it is: a checkpoint of a run without it still resumes."""
        def present(name: str) -> bool:
            return any(key.startswith(f"{name}.") for key in (*index.tensors, *index.values))

        return [(name, held) for name, held in self.states.items() if not (weights_only and name == OPTIMIZER)
                and (present(name) or not getattr(held, "optional_in_checkpoint", False))]

    def _apply(self, path: Path, state: dict[str, Any], *, weights_only: bool, has_rng: bool) -> None:
        for name, held in self.states.items():
            if name not in state:  # not loaded (see _loaded)
                continue
            held.load_state_dict(state[name])
        if weights_only:
            self._log(f"converters changed ({list(self.identity.converters)}): loaded the model weights from {path}, "
                      f"not the optimizer state")
        if has_rng:
            st.set_rng_state(state[RNG][f"rank{self._rank}"])
        else:
            self._log(f"{path} has no RNG state for rank {self._rank} (saved with fewer ranks); keeping the seeded one")

    # ---- collectives on the checkpoint group ---------------------------------------

    @property
    def _leads(self) -> bool:
        """Whether this process does what rank 0 alone does (a rehearsed rank R is alone: its own rank 0)."""
        return self._rank == 0 or not self._shared

    def _share(self) -> dict[str, int]:
        """This rank's share of a checkpoint's files to digest or verify: all of them when it is alone."""
        return {"rank": self._rank, "world": self._world} if self._shared else {"rank": 0, "world": 1}

    def _gather(self, obj: object) -> list[Any]:
        if not self._shared:
            return [obj]
        out: list[Any] = [None] * self._world
        dist.all_gather_object(out, obj, group=self._pg)
        return out

    def _agree(self, error: str | None) -> None:
        """Raise the first rank's error on every rank (or nothing when none failed)."""
        errors = [e for e in self._gather(error) if e]
        if errors:
            raise CheckpointError(errors[0])

    def _agree_on_rank0(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on rank 0 only; every rank returns its result or raises its CheckpointError."""
        box: list[Any] = [None]
        failure: Exception | None = None
        if self._leads:
            try:
                box[0] = ("ok", fn())
            except Exception as exc:  # broadcast first, or the other ranks would wait forever
                failure = exc
                box[0] = ("error", str(exc) if isinstance(exc, CheckpointError) else _describe(exc))
        if self._shared:
            src = 0 if self._pg is None else dist.get_global_rank(self._pg, 0)
            dist.broadcast_object_list(box, src=src, group=self._pg)
        kind, value = box[0]
        if failure is not None:
            raise failure
        if kind == "error":
            raise CheckpointError(value)
        return cast(T, value)  # what fn returned on rank 0, broadcast

    def _log(self, message: str) -> None:
        if self.is_rank0:
            print(f"[checkpoint] {message}", flush=True)


def _legacy_states(model_parts: list[nn.Module] | None, optimizer: torch.optim.Optimizer | None,
                   lr_schedulers: Stateful | None, dataloader: Stateful | None) -> dict[str, Stateful]:
    """The deprecated constructor's arguments as named states (the manager keeps the progress)."""
    if model_parts is None or optimizer is None or lr_schedulers is None or dataloader is None:
        raise TypeError("CheckpointManager needs states=... (or the deprecated model_parts, optimizer, "
                        "lr_schedulers and dataloader together)")
    warnings.warn("CheckpointManager(model_parts=, optimizer=, lr_schedulers=, dataloader=) is deprecated and will "
                  "be removed in the next minor version; pass states=training_states(...) "
                  "(titan_core.checkpoint.stateful)", DeprecationWarning, stacklevel=3)
    return training_states(model_parts, optimizer, lr_schedulers=lr_schedulers, dataloader=dataloader)


def _checked_states(named: Mapping[str, Stateful]) -> dict[str, Stateful]:
    """``model`` is a ModelState; ``rng`` is the manager's own."""
    if not isinstance(named.get(MODEL), ModelState):
        raise TypeError(f'CheckpointManager: states["{MODEL}"] must be a ModelState (checkpoint.stateful)')
    if RNG in named:
        raise TypeError(f'CheckpointManager: "{RNG}" is the manager\'s own state (every rank\'s RNG streams)')
    return dict(named)


def _checked_extra_files(files: Mapping[str, bytes]) -> dict[str, bytes]:
    """Plain names that are not one of the files a save writes itself."""
    for name in files:
        if not is_plain_name(name) or name in (INDEX_FILE, layout.IDENTITY_FILE) or name.endswith(".distcp"):
            raise ValueError(f"CheckpointManager: extra file {name!r} must be a plain file name other than the "
                             f"checkpoint's own ({INDEX_FILE}, {layout.IDENTITY_FILE}, *.distcp)")
    return dict(files)


def _root_cause(exc: BaseException) -> BaseException:
    """The first rank's original exception inside DCP's CheckpointException."""
    if isinstance(exc, CheckpointException):
        causes = [pair[0] for pair in exc.failures.values()]
        if causes:
            return _root_cause(causes[0])
    return exc


def _describe(exc: BaseException) -> str:
    """The root cause: DCP wraps each rank's exception in a CheckpointException."""
    if isinstance(exc, CheckpointException):
        causes = [pair[0] for pair in exc.failures.values()]
        for cause in causes:
            if isinstance(cause, OSError):
                return _describe(cause)
        if causes:
            return _describe(causes[0])
    if isinstance(exc, CheckpointError):
        return str(exc)
    if isinstance(exc, OSError) and exc.filename:
        return f"{exc.strerror or exc} ({exc.filename})"
    return f"{type(exc).__name__}: {exc}"
