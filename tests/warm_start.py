"""``python -m titan_core ARGS`` for the test suite, started from a warm interpreter instead of a cold one.

Most of a short run's time on these 2 cores is its start-up: importing torch, torch._dynamo (which the first
optimizer step imports) and the core, about 4 s of CPU, the same in every process. ``WarmStart`` starts a
server that imports them once and then forks itself for every command it is sent. A command is sent by a small
client process, which is what the test starts and waits for in place of ``python -m titan_core`` (or of the
``titan-train`` console script, for shells: ``WarmStart.bin``): it hands the
server its arguments, working folder, environment and its own stdin, stdout and stderr (file descriptors passed
over a Unix socket); the forked child takes all of them, becomes a session leader (as with
``start_new_session``), runs ``titan_core`` as ``-m`` runs it (or the console script, with the script's folder
first on sys.path, as its own interpreter would have), and its exit status becomes the client's. A
client that is killed (a test's timeout) takes the command's whole process group with it; the signals a process
is asked to stop with (SIGTERM, SIGINT, SIGHUP, ...) the client passes on to the command.

What a fork gives the command that a fresh process would not, and why it does not matter here:
- torch and the core already imported: the core reads its settings (environment variables included) when a
  command runs, not at import; ``OMP_NUM_THREADS``, which OpenMP reads when torch loads, is applied in the
  child with ``torch.set_num_threads``;
- one hash seed for all commands (a fresh process draws one): nothing here depends on set order across runs;
  ``random`` reseeds itself in a forked child.
Several commands may run at once (each has its own handler process), as they do as separate processes.
``TITAN_TEST_WARM=0`` starts every command cold.

The workers a command launches (``--nproc-per-node``: the local launcher's ``python -m titan_core`` per rank)
start warm too when the command's environment sets ``TITAN_TEST_WARM_WORKERS=1`` (``conftest.run_command``
does): each is one more fork of the server, which the launcher holds as a :class:`WarmWorker` in place of a
``subprocess.Popen``. It has the worker's real pid (signals and ``/proc`` reach the worker itself), polls and
waits on the exit status the server reports, and, as the launcher's own workers do (``ended_with_parent``), the
worker dies when the launcher does (the server kills it when the launcher's end of the connection closes).
What it does not give: the workers are not the launcher's children in the process tree; tests that look for
them there start their commands without the variable.

    with WarmStart(folder) as warm:
        subprocess.run(warm.command(["--spec", "llama3", "--dry-run"]), ...)
        env["PATH"] = f"{warm.bin}:{env['PATH']}"   # or: a `titan-train` client first on PATH
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import io
import json
import os
import runpy
import select
import signal
import site
import socket
import struct
import subprocess
import sys
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

HERE = Path(__file__).resolve()
HEADER = struct.Struct("!Q")  # the request's length in bytes, sent with the three descriptors
MODULE = "titan_core"  # what every command runs, as python -m does
PID_FILE_ENV = "WARM_START_PID_FILE"  # the client writes the command's pid there (tests/test_warm_start.py)
WORKERS_ENV = "TITAN_TEST_WARM_WORKERS"  # "1": a command's launched workers are forks of the server too
_ADDRESS: list[str] = []  # the server's address, in its forks


def enabled() -> bool:
    return os.environ.get("TITAN_TEST_WARM", "1") != "0"


def _recv_exact(conn: socket.socket, size: int) -> bytes:
    chunks = []
    while size:
        chunk = conn.recv(size)
        if not chunk:
            raise ConnectionError("the client went away mid-request")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _exit_code(exc: SystemExit) -> int:
    """The status the interpreter would exit with for ``exc`` (printing a string code, as it does)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def _fresh_streams(env: dict[str, str]) -> None:
    """stdout and stderr on the client's descriptors, buffered as a new interpreter would buffer them."""
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    for fd, name in ((1, "stdout"), (2, "stderr")):
        raw = io.FileIO(fd, "w", closefd=False)
        binary = raw if unbuffered else io.BufferedWriter(raw)
        stream = io.TextIOWrapper(binary, encoding="utf-8", errors="backslashreplace" if fd == 2 else "strict",
                                  line_buffering=fd == 2 and not unbuffered, write_through=unbuffered)
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)),
                                                 encoding="utf-8")


def _become_command(request: dict[str, object], fds: list[int]) -> None:
    """In the forked child: become the command, run it, exit with its code. Never returns."""
    code = 1
    try:
        os.setsid()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        env: dict[str, str] = dict(request["env"])  # type: ignore[call-overload]
        os.chdir(str(request["cwd"]))
        os.environ.clear()
        os.environ.update(env)
        _fresh_streams(env)
        # sys.path as the interpreter builds it: the working folder for `python -m`, the script's folder for a
        # console script, then PYTHONPATH's folders, then the rest.
        script = str(request["script"])
        pythonpath = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:0] = [os.getcwd() if script == "-m" else os.path.dirname(script), *pythonpath]
        # What pip installed since the server started: .pth files (editable installs) are read at start-up only,
        # and the import system caches folder listings.
        for folder in site.getsitepackages():
            site.addsitedir(folder)
        importlib.invalidate_caches()
        threads = env.get("OMP_NUM_THREADS", "").strip()
        if threads.isdigit() and int(threads) > 0:
            import torch

            torch.set_num_threads(int(threads))
        if request.get("worker"):
            # The launcher's own worker checks that its parent is the launcher before handing it its error
            # message (runtime/worker_errors.py); here the handler between them stands in for that parent.
            from titan_core.runtime.launch_env import LAUNCHER_ENV

            if LAUNCHER_ENV in env:
                os.environ[LAUNCHER_ENV] = str(os.getppid())
        elif env.get(WORKERS_ENV) == "1" and _ADDRESS:
            _launch_workers_warm(_ADDRESS[0])
            route_kit_runs(functools.partial(_client_command, _ADDRESS[0]))  # `titan-plugin check`'s runs
        sys.argv = [script, *request["argv"]]  # type: ignore[misc]  run_module puts the module's path first
        if script == "-m":
            runpy.run_module(MODULE, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            atexit._run_exitfuncs()  # what interpreter shutdown runs; the fork then leaves without the rest of it
        finally:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):  # a closed pipe: nothing more can be written anyway
                    stream.flush()
            os._exit(code)


def _send_request(conn: socket.socket, request: dict[str, object]) -> None:
    """A command for the server: its request, with this process's stdin, stdout and stderr."""
    payload = json.dumps(request).encode()
    socket.send_fds(conn, [HEADER.pack(len(payload))], [0, 1, 2])
    conn.sendall(payload)


class WarmWorker:
    """What the local launcher holds for a worker forked from the server: ``subprocess.Popen``'s ``pid``,
    ``returncode``, ``poll``, ``wait``, ``send_signal``, ``terminate`` and ``kill``."""

    def __init__(self, address: str, argv: list[str], *, env: dict[str, str] | None, cwd: str | None) -> None:
        self.conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.conn.connect(address)
        _send_request(self.conn, {"script": "-m", "argv": argv, "cwd": cwd or os.getcwd(), "worker": True,
                                  "env": dict(os.environ if env is None else env)})
        reply = b""
        while b"\n" not in reply:
            chunk = self.conn.recv(64)
            if not chunk:
                raise OSError("warm_start: the server did not start the worker")
            reply += chunk
        pid_text, _, self._status = reply.partition(b"\n")
        self.pid = int(pid_text)
        self.returncode: int | None = None
        self.args = [sys.executable, "-m", MODULE, *argv]

    def _finish(self) -> None:
        """Read the exit status to the end of the connection (the server closes it once sent)."""
        while chunk := self.conn.recv(64):
            self._status += chunk
        self.conn.close()
        self.returncode = int(self._status) if self._status else -signal.SIGKILL

    def poll(self) -> int | None:
        if self.returncode is None and select.select([self.conn], [], [], 0)[0]:
            self._finish()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            if not select.select([self.conn], [], [], timeout)[0]:
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
            self._finish()
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, number: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, number)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _titan_core_argv(cmd: object) -> list[str] | None:
    """ARGV when ``cmd`` is ``[python, "-m", "titan_core", *ARGV]`` with this interpreter, else None."""
    if isinstance(cmd, list) and cmd[:3] == [sys.executable, "-m", MODULE]:
        return [str(arg) for arg in cmd[3:]]
    return None


def _subprocess_with(**replaced: object) -> types.ModuleType:
    """A stand-in for the ``subprocess`` module of one caller: the real one with ``replaced`` names swapped."""
    shim = types.ModuleType("subprocess")
    shim.__dict__.update(subprocess.__dict__)
    shim.__dict__.update(replaced)
    return shim


def route_kit_runs(command: Callable[[list[str]], list[str]]) -> Callable[[], None]:
    """The conformance kit's training runs (``titan_core.testing.runs``: ``python -m titan_core ARGV`` through
    ``subprocess.run``) start as ``command(ARGV)`` (a warm client) instead, with their workers warm too; returns
    what undoes it."""
    from titan_core.testing import runs

    real = subprocess.run

    def run(cmd: Any, *args: Any, **kwargs: Any) -> Any:
        argv = _titan_core_argv(cmd)
        if argv is not None:
            cmd = command(argv)
            kwargs["env"] = {**(kwargs.get("env") or os.environ), WORKERS_ENV: "1"}
        return real(cmd, *args, **kwargs)

    runs.subprocess = _subprocess_with(run=run)  # type: ignore[attr-defined]

    def undo() -> None:
        runs.subprocess = subprocess  # type: ignore[attr-defined]

    return undo


def _launch_workers_warm(address: str) -> None:
    """In a command's fork: its local launcher starts each worker as a fork of the server (``WarmWorker``)."""
    from titan_core.runtime import local_launcher

    real = subprocess.Popen

    def popen(args: list[str], **kwargs: object) -> object:
        kwargs.pop("preexec_fn", None)  # ended_with_parent: the server ends the worker with the launcher instead
        kwargs.pop("start_new_session", None)  # every fork is a session leader
        argv = _titan_core_argv(args)
        if argv is not None and set(kwargs) <= {"env", "cwd"}:
            return WarmWorker(address, argv, env=kwargs.get("env"), cwd=kwargs.get("cwd"))  # type: ignore[arg-type]
        return real(args, **kwargs)  # type: ignore[call-overload]

    local_launcher.subprocess = _subprocess_with(Popen=popen)  # type: ignore[attr-defined]


def _handle(conn: socket.socket) -> None:
    """In a handler process: start the command, and report its exit status, or end it if the client goes."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    head, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
    (size,) = HEADER.unpack(head + _recv_exact(conn, HEADER.size - len(head)))
    request = json.loads(_recv_exact(conn, size))
    pid = os.fork()
    if pid == 0:
        conn.close()
        _become_command(request, fds)
    for fd in fds:
        os.close(fd)
    conn.sendall(f"{pid}\n".encode())  # the client forwards its signals there
    done = os.pidfd_open(pid)
    ready, _, _ = select.select([conn, done], [], [])
    if done not in ready:  # the client closed its end: it was killed; so is the command, workers and all
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    _, status = os.waitpid(pid, 0)
    with contextlib.suppress(OSError):  # the client is gone: nobody to tell
        conn.sendall(str(os.waitstatus_to_exitcode(status)).encode())


def serve(address: str) -> None:
    if sys.path and Path(sys.path[0]).resolve() == HERE.parent:  # run as a script: not the commands' path
        del sys.path[0]
    import torch
    import torch._dynamo  # noqa: F401  imported by the first optimizer step
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.tensor  # noqa: F401

    import titan_core.commands.titan_train  # noqa: F401
    import titan_core.plan.resolve  # noqa: F401  the config, the plugin boundary
    import titan_core.train.trainer  # noqa: F401

    del torch
    _ADDRESS.append(address)
    parent = os.getppid()
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # handlers are reaped by the kernel
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(address)
    server.listen(64)
    server.settimeout(1.0)
    print("ready", flush=True)
    while os.getppid() == parent:  # the test process that started this server is gone: so is the server
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        if os.fork() == 0:
            server.close()
            try:
                _handle(conn)
            finally:
                os._exit(0)
        conn.close()


# Signals a test (or a page's `kill $!`) sends the command's process: the client passes them on to the command.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def client(address: str, script: str, argv: list[str]) -> int:
    """Run ``python -m titan_core ARGV`` (script ``-m``) or the console script at path ``script`` with ARGV."""
    # Held until the command's pid is known, then passed on: none is lost in between.
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED)
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(address)
    _send_request(conn, {"script": script, "argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)})
    reply = b""
    while chunk := conn.recv(64):
        reply += chunk
        if b"\n" in reply:
            break
    pid_text, _, reply = reply.partition(b"\n")
    if pid_text:
        pid = int(pid_text)
        if os.environ.get(PID_FILE_ENV):  # for the harness's own test: which process runs the command
            Path(os.environ[PID_FILE_ENV]).write_text(str(pid))
        for number in FORWARDED:
            signal.signal(number, lambda received, _frame: os.kill(pid, received))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED)
    while chunk := conn.recv(64):
        reply += chunk
    if not reply:
        print("warm_start: the server ended the command without an exit status", file=sys.stderr)
        return 1
    code = int(reply)
    if code < 0:  # killed by a signal: end the same way, as the command's own process would have
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [-code])
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1)
    return code


def _client_command(address: str, argv: list[str], *, python: str = sys.executable) -> list[str]:
    return [python, str(HERE), "client", address, "-m", *argv]


# The client as a `titan-train` on PATH: a long interpreter path breaks a #! line, hence bash.
CLIENT = '#!/bin/bash\nexec "{python}" "{here}" client "{address}" "{script}" "$@"\n'


class WarmStart:
    """The server, and a folder ``bin`` holding its ``titan-train`` client; stopped on leaving."""

    def __init__(self, folder: Path, python: str = sys.executable) -> None:
        self.folder = folder
        self.python = python  # the interpreter (and so the environment) the commands run in
        self.bin = folder / "warm-bin"
        self.address = str(folder / "warm.sock")
        self.server: subprocess.Popen[str] | None = None

    def command(self, argv: list[str]) -> list[str]:
        """What to start in place of ``python -m titan_core ARGV``."""
        return _client_command(self.address, argv, python=self.python)

    def start(self) -> WarmStart:
        self.bin.mkdir(parents=True)
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OMP_NUM_THREADS")}
        self.server = subprocess.Popen([self.python, str(HERE), "serve", self.address], stdout=subprocess.PIPE,
                                       stdin=subprocess.DEVNULL, text=True, env=env)
        assert self.server.stdout is not None and self.server.stdout.readline() == "ready\n", "warm server failed"
        for name in ("titan-train", "titan-plugin"):
            console_script = Path(self.python).parent / name  # what it stands in for, run in the fork
            if console_script.exists():
                client_script = self.bin / name
                client_script.write_text(CLIENT.format(python=self.python, here=HERE, address=self.address,
                                                       script=console_script))
                client_script.chmod(0o755)
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.kill()
            self.server.wait()
            self.server = None

    def __enter__(self) -> WarmStart:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        sys.exit(client(sys.argv[2], sys.argv[3], sys.argv[4:]))
