"""One warm interpreter for many short ``titan-train`` commands run from a shell, each in a process of its own.

Most of a dry run's ~3.5 s is importing torch and the core, the same in every command. ``WarmStart`` starts a
server process that imports them once and then forks itself for each command. The command is still typed in
the shell as written: ``titan-train`` on PATH is a small client that hands the server its arguments, working
folder, environment and its own stdin, stdout and stderr (file descriptors passed over a Unix socket); the
forked child takes all of them, runs what the console script runs (``titan_core.commands.titan_train.main``),
and its exit code becomes the client's. Each command gets a fresh copy of the server: nothing one command
changes reaches the next. What the fork cannot give a command: a different interpreter or torch (none of
these commands asks for one), and environment variables read while the core is imported (the core reads its
settings when a command runs, and the tests that use this compare every output with the page's).

    with WarmStart(folder) as warm:
        env["PATH"] = f"{warm.bin}:{env['PATH']}"   # a `titan-train` client first on PATH
"""

from __future__ import annotations

import importlib
import json
import os
import site
import socket
import struct
import subprocess
import sys
import traceback
from pathlib import Path
from types import TracebackType

HERE = Path(__file__).resolve()
HEADER = struct.Struct("!Q")  # the request's length in bytes, sent with the three descriptors


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


def _run_child(request: dict[str, object], fds: list[int]) -> None:
    """In the forked child: become the command, run it, exit with its code. Never returns."""
    code = 1
    try:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        os.chdir(str(request["cwd"]))
        env = dict(request["env"])  # type: ignore[call-overload]
        os.environ.clear()
        os.environ.update(env)
        # The interpreter puts PYTHONPATH's folders first on sys.path; the server started without the command's.
        sys.path[:0] = [os.path.abspath(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        # What pip installed since the server started: .pth files (editable installs) are read at start-up only,
        # and the import system caches folder listings.
        for folder in site.getsitepackages():
            site.addsitedir(folder)
        importlib.invalidate_caches()
        sys.argv = ["titan-train", *request["argv"]]  # type: ignore[misc]
        from titan_core.commands.titan_train import main

        code = main()
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        os._exit(code if isinstance(code, int) else 1)


def serve(address: str) -> None:
    if sys.path and Path(sys.path[0]).resolve() == HERE.parent:  # run as a script: not the commands' path
        del sys.path[0]
    import torch  # noqa: F401  what every command imports first
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.tensor  # noqa: F401

    import titan_core.commands.titan_train  # noqa: F401
    import titan_core.plan.resolve  # noqa: F401  the config, the plugin boundary, the trainer's modules

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(address)
    server.listen()
    print("ready", flush=True)
    while True:
        conn, _ = server.accept()
        with conn:
            head, fds, _, _ = socket.recv_fds(conn, HEADER.size, 3)
            (size,) = HEADER.unpack(head + _recv_exact(conn, HEADER.size - len(head)))
            request = json.loads(_recv_exact(conn, size))
            pid = os.fork()
            if pid == 0:
                server.close()
                _run_child(request, fds)
            for fd in fds:
                os.close(fd)
            _, status = os.waitpid(pid, 0)
            conn.sendall(str(os.waitstatus_to_exitcode(status)).encode())


def client(address: str, argv: list[str]) -> int:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.connect(address)
    payload = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    socket.send_fds(conn, [HEADER.pack(len(payload))], [0, 1, 2])
    conn.sendall(payload)
    conn.shutdown(socket.SHUT_WR)
    reply = b""
    while chunk := conn.recv(64):
        reply += chunk
    return int(reply) if reply else 1


# The client as the `titan-train` on PATH: a long interpreter path breaks a #! line, hence bash.
CLIENT = '#!/bin/bash\nexec "{python}" "{here}" client "{address}" "$@"\n'


class WarmStart:
    """The server, and a folder ``bin`` holding its ``titan-train`` client; stopped on leaving."""

    def __init__(self, folder: Path, python: str = sys.executable) -> None:
        self.folder = folder
        self.python = python  # the interpreter (and so the environment) the commands run in
        self.bin = folder / "warm-bin"
        self.address = str(folder / "warm.sock")
        self.server: subprocess.Popen[str] | None = None

    def __enter__(self) -> WarmStart:
        self.bin.mkdir(parents=True)
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        env.pop("PYTHONPATH", None)  # each command brings its own
        self.server = subprocess.Popen([self.python, str(HERE), "serve", self.address], stdout=subprocess.PIPE,
                                       text=True, env=env)
        assert self.server.stdout is not None and self.server.stdout.readline() == "ready\n", "warm server failed"
        client_script = self.bin / "titan-train"
        client_script.write_text(CLIENT.format(python=self.python, here=HERE, address=self.address))
        client_script.chmod(0o755)
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.server is not None:
            self.server.kill()
            self.server.wait()


if __name__ == "__main__":
    if sys.argv[1] == "serve":
        serve(sys.argv[2])
    else:
        sys.exit(client(sys.argv[2], sys.argv[3:]))
