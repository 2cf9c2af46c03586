"""``titan-train --fault_tolerance.local_replicas=K``: a lighthouse and K replica groups on this machine.

Each replica group is the same ``titan-train`` command as a child process, with its
own ``replica_id`` and run folder (``<run_dir>/replica_<i>``). A group that dies is
started again (up to ``max_restarts`` times) and rejoins from a live peer; the
others keep training. One ``[ft]`` line per membership change. Exit codes:
0 all groups finished; 2 a group refused its config; 5 the lighthouse was lost;
6 a group died more than ``max_restarts`` times; 130/143 after SIGINT/SIGTERM.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from ..config.job import JobConfig
from ..errors import GAVE_UP_EXIT, LIGHTHOUSE_LOST_EXIT, ConfigError
from ..runtime.ft_events import append_event
from ..runtime.parent_death import ended_with_parent
from ..runtime.run_lock import acquire_run_lock
from .replica import RESTARTED_ENV

# Children see this and leave the one lighthouse message to the supervisor.
SUPERVISED_ENV = "TITAN_FT_SUPERVISED"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Seconds, past fault_tolerance.quorum_timeout_s, that the groups have to end once the run is stopping
# (the lighthouse lost, a signal, a group that gave up) before they are killed.
STOP_GRACE_S = 30.0


def stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP, SIGTSTP, a debugger): it will not answer until someone continues it."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:  # gone, or no /proc: not known to be stopped
        return False
    return stat[stat.rfind(b")") + 2 : stat.rfind(b")") + 3] in (b"T", b"t")


def _signal_name(rc: int) -> str:
    if rc < 0:
        try:
            return signal.Signals(-rc).name
        except ValueError:
            return f"signal {-rc}"
    return f"exit {rc}"


def last_logged_step(run_dir: Path) -> int | None:
    """The step of the last whole record in a group's ``metrics.jsonl`` (None: none yet, or unreadable)."""
    try:
        with (run_dir / "metrics.jsonl").open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 65536))
            tail = f.read().splitlines()
    except OSError:
        return None
    for raw in reversed(tail):
        try:
            step = json.loads(raw).get("step")
        except (ValueError, AttributeError):  # a half-written last line, or not an object
            continue
        if isinstance(step, int) and not isinstance(step, bool):
            return step
    return None


def lighthouse_program() -> str:
    """torchft's console script next to this interpreter (its Rust argument parser reads the OS argv)."""
    beside = Path(sys.executable).parent / "torchft_lighthouse"
    found = str(beside) if beside.exists() else shutil.which("torchft_lighthouse")
    if found is None:
        raise ConfigError("fault_tolerance.local_replicas needs torchft's torchft_lighthouse program, which is not "
                          "installed; install titan-core[ft] (pip install 'titan-core[ft]').")
    return found


@dataclass
class Group:
    replica_id: int
    proc: subprocess.Popen[str]
    restarts: int = 0
    started: float = field(default_factory=time.monotonic)
    left: str | None = None  # why it died, until the others' first step without it is seen
    done: int | None = None  # its final exit code


class Supervisor:
    def __init__(self, config: JobConfig, argv: list[str]) -> None:
        self.ft = config.fault_tolerance
        self.k = self.ft.local_replicas
        self.run_dir = Path(config.job.run_dir)
        self.argv = argv
        self.port = _free_port()
        self.groups: dict[int, Group] = {}
        self.lock = threading.Lock()
        self.live = self.k
        self.stop_signal = 0
        self.lighthouse_lost = False
        self.spare: subprocess.Popen[str] | None = None  # spare.py: a process with its imports done
        # Every child is started from the main thread: a child ends with the thread that started it
        # (parent_death.py), and the output threads end with their replica. They ask for a spare here.
        self.spare_wanted = False
        self.spare_started = threading.Event()  # set by the main thread once a wanted spare runs
        self.stopped_since: dict[int, float] = {}  # pid -> when it was first seen stopped
        self.stopping_since: float | None = None  # when the run began to stop (every group must end by then + ...)

    # ---- processes --------------------------------------------------------------------------------
    def start_lighthouse(self) -> subprocess.Popen[bytes]:
        # A dead group stops heartbeating and leaves the quorum after heartbeat_timeout; a live but slow
        # one (a loaded machine) is waited for up to the quorum timeout instead of being dropped and healed.
        cmd = [lighthouse_program(), "--min_replicas", str(self.ft.min_replicas), "--bind", f"[::]:{self.port}",
               "--join_timeout_ms", str(int(self.ft.quorum_timeout_s * 1000)), "--heartbeat_timeout_ms", "2000", "--quorum_tick_ms", "10"]
        log = open(self.run_dir / "lighthouse.log", "w")  # noqa: SIM115 (the child keeps it)
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=ended_with_parent(), env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "info")})

    def child_command(self, replica_id: int) -> list[str]:
        return [sys.executable, "-m", "titan_core", *self.argv,
                "--fault_tolerance.local_replicas=0", "--fault_tolerance.enable=true",
                f"--fault_tolerance.group_size={self.k}", f"--fault_tolerance.replica_id={replica_id}",
                f"--fault_tolerance.lighthouse=http://127.0.0.1:{self.port}",
                f"--job.run_dir={self.run_dir / f'replica_{replica_id}'}"]

    def group_env(self) -> dict[str, str]:
        return {**os.environ, SUPERVISED_ENV: "1", "RUST_LOG": os.environ.get("RUST_LOG", "error"),
                # K groups share this machine's cores (torch would give each group all of them).
                "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // self.k)))}

    def start_group(self, replica_id: int, *, restart: bool = False) -> subprocess.Popen[str]:
        spare, self.spare = self.spare, None
        if restart and spare is not None and spare.poll() is None and spare.stdin is not None:
            # The spare has its imports done: it becomes the group (a restart in about half the time).
            proc = spare
            assert spare.stdin is not None
            spare.stdin.write(json.dumps({"argv": self.child_command(replica_id)[3:], "env": {RESTARTED_ENV: "1"}}) + "\n")
            spare.stdin.close()
        else:
            if spare is not None:
                spare.kill()
            env = {**self.group_env(), **({RESTARTED_ENV: "1"} if restart else {})}
            proc = subprocess.Popen(self.child_command(replica_id), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, env=env, start_new_session=True, preexec_fn=ended_with_parent())
        assert proc.stdout is not None
        threading.Thread(target=self.forward, args=(replica_id, proc.stdout), daemon=True).start()
        (self.run_dir / f"replica_{replica_id}.pid").write_text(f"{proc.pid}\n")  # what to kill to try it
        if not restart and replica_id == self.k - 1:
            self.spare = self.start_spare()  # ready for the first restart (the next one after a rejoin)
        return proc

    def start_spare(self) -> subprocess.Popen[str]:
        spare = subprocess.Popen([sys.executable, "-m", "titan_core.fault_tolerance.spare"], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=self.group_env(),
                                 start_new_session=True, preexec_fn=ended_with_parent())
        (self.run_dir / "spare.pid").write_text(f"{spare.pid}\n")
        return spare

    # ---- output -----------------------------------------------------------------------------------
    def forward(self, replica_id: int, stream: IO[str]) -> None:
        for line in stream:
            if '"GET /checkpoint/' in line:  # torchft's HTTP server logs each transfer
                continue
            if line.startswith("[ft-status] "):
                self.on_status(replica_id, line.split()[1:])
            else:
                print(f"[replica {replica_id}] {line}", end="", flush=True)

    def record(self, event: str, **fields: object) -> None:
        """The same fact as the [ft] line beside it, for titan-report (ft_events.jsonl)."""
        append_event(self.run_dir, event, **fields)

    def on_status(self, replica_id: int, words: list[str]) -> None:
        with self.lock:
            if words[2] == "participants":  # "step N participants P of K"
                step, n = int(words[1]), int(words[3])
                if n < self.live:
                    for g in self.groups.values():
                        if g.left is not None:
                            print(f"[ft] step {step}: replica {g.replica_id} left ({g.left}); "
                                  f"{n} of {self.k} replicas training", flush=True)
                            self.record("left", replica=g.replica_id, step=step, how=g.left, live=n, groups=self.k)
                            g.left = None
                self.live = n
            elif words[2] == "nothing-to-rejoin":  # "step N nothing-to-rejoin I"
                print(f"[ft] replica {words[3]} came back after the other groups had finished: nothing to "
                      "rejoin; it stops (its run folder keeps its last state)", flush=True)
                self.record("nothing_to_rejoin", replica=int(words[3]), step=int(words[1]))
            elif words[2] == "rejoined":  # "step N rejoined I from J"
                g = self.groups[int(words[3])]
                if not g.restarts:  # the first step's weight sync, not a rejoin
                    return
                after = time.monotonic() - g.started
                if g.left is not None:  # back before the others committed a step without it: still a change
                    self.live = min(self.live, self.k - 1)
                    print(f"[ft] step {words[1]}: replica {g.replica_id} left ({g.left}); "
                          f"{self.live} of {self.k} replicas training", flush=True)
                    self.record("left", replica=g.replica_id, step=int(words[1]), how=g.left, live=self.live,
                                groups=self.k)
                    g.left = None
                self.live = min(self.k, self.live + 1)
                if self.spare is None and not self.stop_signal:  # started now, not beside the restarting group
                    # by the main thread (a child ends with the thread that started it); the line below says
                    # the group is back only once the next spare exists, so spare.pid names it, not the old one
                    self.spare_started.clear()
                    self.spare_wanted = True
                    self.spare_started.wait(timeout=10)
                print(f"[ft] step {words[1]}: replica {words[3]} rejoined from replica {words[5]} "
                      f"({after:.1f}s after its restart); {self.live} of {self.k} replicas training", flush=True)
                self.record("rejoined", replica=int(words[3]), step=int(words[1]), peer=int(words[5]),
                            after_s=round(after, 1), live=self.live, groups=self.k)

    # ---- the loop ---------------------------------------------------------------------------------
    def forward_signal(self, signum: int, _frame: object) -> None:
        self.stop_signal = signum
        for g in self.groups.values():
            if g.done is None:
                g.proc.send_signal(signum)

    def run(self) -> int:
        lighthouse = self.start_lighthouse()
        (self.run_dir / "lighthouse.pid").write_text(f"{lighthouse.pid}\n")
        old = {s: signal.signal(s, self.forward_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        print(f"[ft] lighthouse on port {self.port} (pid {lighthouse.pid}); {self.k} replica groups, "
              f"min_replicas={self.ft.min_replicas}", flush=True)
        self.record("start", groups=self.k, min_replicas=self.ft.min_replicas, max_restarts=self.ft.max_restarts)
        try:
            for i in range(self.k):
                self.groups[i] = Group(i, self.start_group(i))
            code = self.watch(lighthouse)
            self.record("end", exit=code)
            return code
        finally:
            for g in self.groups.values():
                if g.proc.poll() is None:
                    g.proc.kill()
                    g.proc.wait()
            if self.spare is not None:
                self.spare.kill()
                self.spare.wait()
            if lighthouse.poll() is None:
                lighthouse.terminate()
                lighthouse.wait()
            for s, h in old.items():
                signal.signal(s, h)

    def frozen_for(self, proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> float:
        """Seconds ``proc`` has been seen stopped without a break (0 while it runs)."""
        if proc.poll() is not None or not stopped(proc.pid):
            self.stopped_since.pop(proc.pid, None)
            return 0.0
        return time.monotonic() - self.stopped_since.setdefault(proc.pid, time.monotonic())

    def end_stopped(self, lighthouse: subprocess.Popen[bytes]) -> None:
        """A stopped lighthouse or group answers nobody: past quorum_timeout_s it is killed, and named. A killed
        group is then restarted like any dead one; a killed lighthouse stops the run (exit 5)."""
        limit = self.ft.quorum_timeout_s
        if not self.lighthouse_lost and self.frozen_for(lighthouse) > limit:
            print(f"[ft] the lighthouse (pid {lighthouse.pid}) has been stopped (SIGSTOP?) for more than "
                  f"fault_tolerance.quorum_timeout_s={limit:g}s; killing it.", file=sys.stderr, flush=True)
            lighthouse.kill()
            self.record("frozen_killed", what="lighthouse")
        for g in self.groups.values():
            if g.done is None and self.frozen_for(g.proc) > limit:
                print(f"[ft] replica {g.replica_id} (pid {g.proc.pid}) has been stopped (SIGSTOP?) for more than "
                      f"fault_tolerance.quorum_timeout_s={limit:g}s; killing it.", file=sys.stderr, flush=True)
                self.stopped_since.pop(g.proc.pid, None)
                g.proc.kill()
                self.record("frozen_killed", what="replica", replica=g.replica_id)

    def end_stragglers(self) -> None:
        """Once the run is stopping, every group has quorum_timeout_s + STOP_GRACE_S to end; then it is killed."""
        if not (self.lighthouse_lost or self.stop_signal or self.stopping_since is not None):
            return
        now = time.monotonic()
        self.stopping_since = self.stopping_since if self.stopping_since is not None else now
        limit = self.ft.quorum_timeout_s + STOP_GRACE_S
        if now - self.stopping_since <= limit:
            return
        for g in self.groups.values():
            if g.done is None and g.proc.poll() is None:
                print(f"[ft] replica {g.replica_id} (pid {g.proc.pid}) did not stop within {limit:g}s "
                      f"(fault_tolerance.quorum_timeout_s + {STOP_GRACE_S:g}s) of the run stopping; killing it.",
                      file=sys.stderr, flush=True)
                g.proc.kill()

    def watch(self, lighthouse: subprocess.Popen[bytes]) -> int:
        gave_up = refused = False
        while any(g.done is None for g in self.groups.values()):
            time.sleep(0.1)
            if self.spare_wanted and self.spare is None and not self.stop_signal:
                self.spare_wanted, self.spare = False, self.start_spare()
                self.spare_started.set()
            self.end_stopped(lighthouse)
            self.end_stragglers()
            if lighthouse.poll() is not None and not self.lighthouse_lost and not self.stop_signal:
                self.lighthouse_lost = True
                print(f"[ft] the lighthouse died ({_signal_name(lighthouse.returncode)}); every replica group stops "
                      f"within fault_tolerance.quorum_timeout_s={self.ft.quorum_timeout_s:g}s. Run the same command "
                      "again to resume from the groups' checkpoints.", file=sys.stderr, flush=True)
                self.record("lighthouse_lost", how=_signal_name(lighthouse.returncode))
            for g in self.groups.values():
                rc = g.proc.poll()
                if g.done is not None or rc is None:
                    continue
                g.proc.wait()
                finished = any(o.done == 0 for o in self.groups.values())  # the run is over: no restart
                if rc == 0 or finished or self.stop_signal or self.lighthouse_lost or rc in (2, LIGHTHOUSE_LOST_EXIT):
                    g.done = rc
                    refused |= rc == 2
                elif g.restarts < self.ft.max_restarts:
                    g.restarts += 1
                    g.left = _signal_name(rc)
                    self.record("died", replica=g.replica_id, how=g.left, restart=g.restarts,
                                max_restarts=self.ft.max_restarts,
                                last_logged_step=last_logged_step(self.run_dir / f"replica_{g.replica_id}"))
                    g.proc, g.started = self.start_group(g.replica_id, restart=True), time.monotonic()
                    print(f"[ft] replica {g.replica_id} died ({g.left}); restart {g.restarts} of "
                          f"{self.ft.max_restarts}", flush=True)
                else:
                    g.done = rc
                    gave_up = True
                    self.record("gave_up", replica=g.replica_id, how=_signal_name(rc), restarts=g.restarts,
                                last_logged_step=last_logged_step(self.run_dir / f"replica_{g.replica_id}"))
                    print(f"[ft] replica {g.replica_id} died ({_signal_name(rc)}) after {g.restarts} restarts "
                          f"(fault_tolerance.max_restarts={self.ft.max_restarts}); stopping the run.",
                          file=sys.stderr, flush=True)
                    self.forward_signal(signal.SIGTERM, None)
                    self.stop_signal = 0
                    self.stopping_since = time.monotonic()
        if self.stop_signal:
            return 128 + self.stop_signal
        if self.lighthouse_lost:
            return LIGHTHOUSE_LOST_EXIT
        if refused:
            return 2
        if gave_up:
            return GAVE_UP_EXIT
        unfinished = [g for g in self.groups.values() if g.done != 0]
        if unfinished:  # ended after another group had finished the run: not restarted, and once not a word said
            ended = ", ".join(f"replica {g.replica_id} ({_signal_name(g.done or 0)})" for g in unfinished)
            print(f"[ft] the run reached its last step, but {ended} ended without finishing it (its output is "
                  f"above, its files in {self.run_dir}/replica_N); run the same command again to finish those "
                  "groups from their checkpoints.", file=sys.stderr, flush=True)
            return GAVE_UP_EXIT
        return 0


def supervise(config: JobConfig, argv: list[str]) -> int:
    run_dir = Path(config.job.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = acquire_run_lock(run_dir)
    try:
        return Supervisor(config, argv).run()
    finally:
        lock.release()
