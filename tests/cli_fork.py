"""``sqlsdc`` commands as real processes without the second of imports each: a fork server.

Run as a script, this module imports sqlsdc and the libraries its commands use, then waits on a
Unix socket. For each request it forks; the child takes the request's stdin, stdout, stderr, working
folder, environment and arguments, and runs ``python -m sqlsdc.cli ARGS`` from there
(:func:`runpy.run_module`): its own process with its own file descriptors, file locks and exit
status, ended by the interpreter as any ``python -m`` run is (``atexit``, threads, finalizers).
What it saves is the interpreter start and the imports (about 0.8 s of CPU of the 1 s a typical
command costs). Only the entry point (``sqlsdc`` on PATH) and the start-up itself are not
exercised; tests of those (the time zone, how stdin is decoded, the memory high-water mark) and
of Ctrl-C sent to a child (it inherits the server's SIGINT disposition) use :mod:`subprocess`.
SIGTERM and SIGKILL reach a forked child as any other; ``limits`` sets resource limits in the
child before its command runs, as a ``preexec_fn`` does before ``exec``.

Imported, it is the client: :func:`run` and :func:`popen` stand for ``subprocess.run`` and
``subprocess.Popen`` of ``[sys.executable, "-m", "sqlsdc.cli", *args]``, and with ``code=`` of
``[sys.executable, "-c", code, *args]`` (a script that uses sqlsdc in a process of its own: one
killed in the middle of a charge, a README example); the server starts on first use, one
per test process.
"""

from __future__ import annotations

import json
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile

_HEADER = struct.Struct("!I")  # length of the JSON request that follows the file descriptors

# sqlsdc's modules a command may import (all but the Spark engine's), and the libraries they
# import inside functions
_SKIP = {
    "sqlsdc.engines.spark",
    "sqlsdc.engines.spark_portable",
    "sqlsdc.engines.spark_semantics",
    "sqlsdc.engines.spark_translate",
    "sqlsdc.engines.spark_types",
    "sqlsdc.guard.spark",
}
_LIBRARIES = (
    "pandas",
    "pandas.io.formats.string",
    "pyarrow",
    "pyarrow.pandas_compat",
    "pyarrow.parquet",
    "scipy.sparse",
    "scipy.stats",
    "yaml",
    "sqlsdc.schemas",
)


# --- server ------------------------------------------------------------------------------------


def _preload() -> None:
    import importlib
    import pkgutil

    import sqlsdc.cli.main  # noqa: F401 - the commands' modules

    import sqlsdc

    for info in pkgutil.walk_packages(sqlsdc.__path__, "sqlsdc."):
        if info.name not in _SKIP:
            importlib.import_module(info.name)
    for name in _LIBRARIES:
        importlib.import_module(name)


def _warm() -> None:
    """Fill the caches that a command's first query fills the same way whatever it asks, so
    that each child does not do it again: the names of DuckDB's built-in functions (an
    in-memory instance's catalog read, ~45 ms of CPU), the shipped demo policy validated
    (its p-tables generated and checked; the JSON-schema validator built: ~50 ms) and
    sqlglot's tables of generator methods for DuckDB and sqlsdc's DuckDB (~5 ms). A forked
    query command took 0.18-0.23 s of CPU without, 0.11-0.12 s with. The in-memory instance
    is closed before any fork: a DuckDB instance does not survive into a child."""
    import sqlglot

    from sqlsdc.demo.build import demo_policy
    from sqlsdc.engines import duckdb as engine
    from sqlsdc.engines.duckdb_sql import to_sql

    engine.builtin_functions()
    demo_policy()
    tree = sqlglot.parse_one("SELECT a, COUNT(*) FROM t GROUP BY a", read="duckdb")
    to_sql(tree), tree.sql("duckdb")  # sqlglot builds each generator's dispatch on first use
    engine.close_scratch()


def _serve(address: str) -> dict:
    """Accept requests until stdin closes (the test process ended); in each forked child,
    return its request. Only the parent loops."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(address)
    listener.listen(64)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(sys.stdin, selectors.EVENT_READ, "stdin")
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            if key.data == "stdin":
                if not os.read(sys.stdin.fileno(), 4096):  # EOF: the client is gone
                    os._exit(0)  # (a normal exit would tear down the frozen objects)
            elif key.data == "accept":
                conn, _ = listener.accept()
                request = _receive(conn)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    for other in list(selector.get_map().values()):
                        if isinstance(other.data, tuple):  # another child's pidfd and client
                            os.close(other.fd)
                            other.data[1].close()
                    selector.close()
                    listener.close()
                    conn.close()
                    return request
                for fd in request["fds"]:
                    os.close(fd)
                conn.sendall(f"pid {pid}\n".encode())
                selector.register(os.pidfd_open(pid), selectors.EVENT_READ, (pid, conn))
            else:
                pid, conn = key.data
                selector.unregister(key.fileobj)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                try:
                    conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                except OSError:  # the client stopped waiting
                    pass
                conn.close()


def _receive(conn: socket.socket) -> dict:
    header, fds, _, _ = socket.recv_fds(conn, _HEADER.size, 3)
    (size,) = _HEADER.unpack(header)
    data = b""
    while len(data) < size:
        data += conn.recv(size - len(data))
    request = json.loads(data)
    request["fds"] = fds
    return request


def _become(request: dict) -> None:
    """In the child: the request's descriptors, folder, environment and arguments."""
    for target, fd in enumerate(request["fds"]):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    for name, (soft, hard) in request.get("limits", {}).items():
        import resource

        resource.setrlimit(getattr(resource, name), (soft, hard))
    os.environ.clear()
    os.environ.update(request["env"])
    _new_standard_streams()
    if request.get("code") is None:
        sys.path[0] = os.getcwd()  # as `python -m` has it
        sys.argv = ["-m", *request["args"]]
    else:
        sys.path[0] = ""  # as `python -c` has it
        sys.argv = ["-c", *request["args"]]


def _new_standard_streams() -> None:
    """``sys.stdin``, ``sys.stdout`` and ``sys.stderr`` made anew over descriptors 0-2, as an
    interpreter's start makes them: the server's were made for its own descriptors (under
    pytest's capture a file, so a pipe given to a child failed: "illegal seek"), and the
    request's PYTHONUNBUFFERED had no effect."""
    import io

    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "w" if fd else "r", closefd=False)
        if fd and unbuffered:
            binary = raw
        else:
            binary = io.BufferedWriter(raw) if fd else io.BufferedReader(raw)
        stream = io.TextIOWrapper(
            binary, encoding=old.encoding, errors=old.errors, newline="\n",
            line_buffering=fd == 2 or (fd == 1 and raw.isatty()),
            write_through=bool(fd and unbuffered),
        )  # fmt: skip
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _run_command(code: str | None) -> int:
    """``python -m sqlsdc.cli`` (or ``python -c code``) in this process; its exit status, as the
    interpreter gives it."""
    import runpy
    import types

    try:
        if code is None:
            runpy.run_module("sqlsdc.cli", run_name="__main__", alter_sys=True)
        else:
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(code, "<string>", "exec"), main.__dict__)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - as the interpreter: the traceback, exit status 1
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def _exit(code: int) -> None:
    """End the child as the interpreter ends a ``python -m`` run: wait for its threads, run its
    ``atexit`` functions, collect its garbage (finalizers of what the command made), flush. The
    preloaded modules are not torn down (objects frozen before the fork; tearing them down
    would copy every page of the fork server for nothing)."""
    import atexit
    import gc
    import threading

    threading._shutdown()  # what Py_FinalizeEx does first
    atexit._run_exitfuncs()
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120  # as the interpreter does when stdout cannot be flushed
    os._exit(code)


if __name__ == "__main__":
    _preload()
    _warm()
    from sqlsdc.guard import statement_rate

    # as conftest.py lifts it in the test process: the minute of long statements is read from
    # the audit log, which the test process's statements to the shared databases fill
    statement_rate.CHARACTERS_PER_MINUTE = 2**62
    import gc

    gc.collect()
    gc.freeze()  # the children's collections skip the preloaded objects
    request = _serve(sys.argv[1])
    _become(request)
    _exit(_run_command(request.get("code")))


# --- client ------------------------------------------------------------------------------------

_server: dict = {}  # this test process's fork server: its process and socket folder


def _address() -> str:
    """The server's socket, the server started on first use."""
    if "process" not in _server:
        folder = tempfile.mkdtemp(prefix="sqlsdc-fork-")
        process = subprocess.Popen(
            [sys.executable, __file__, os.path.join(folder, "socket")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        if process.stdout.readline().strip() != "ready":
            raise RuntimeError("the sqlsdc fork server did not start (its error is above)")
        _server.update(process=process, folder=folder)
    return os.path.join(_server["folder"], "socket")


def close() -> None:
    """Stop this process's fork server, if it was started (it also stops when this process
    ends: its stdin closes)."""
    process = _server.pop("process", None)
    if process is not None:
        process.stdin.close()
        process.wait(30)
        shutil.rmtree(_server.pop("folder"), ignore_errors=True)


def popen(args, *, stdin=None, stdout=None, stderr=None, cwd=None, env=None, text=False,
          code=None, limits=None):  # fmt: skip
    """``subprocess.Popen([python, -m, sqlsdc.cli, *args], ...)`` as a forked process, or with
    ``code``, ``subprocess.Popen([python, -c, code, *args], ...)``.

    ``stdin``, ``stdout`` and ``stderr`` are None (this process's), ``subprocess.PIPE``,
    ``subprocess.DEVNULL`` or an open file. ``limits``: ``{"RLIMIT_FSIZE": (soft, hard)}``,
    set by the child before its command (SIGXFSZ is ignored there, as in any interpreter)."""
    address = _address()
    ends, mine = [], []
    for number, spec in enumerate((stdin, stdout, stderr)):
        if spec is subprocess.PIPE:
            read, write = os.pipe()
            child, parent = (read, write) if number == 0 else (write, read)
            ends.append(child)
            mine.append(os.fdopen(parent, ("w" if number == 0 else "r") + ("" if text else "b")))
        else:
            ends.append(
                os.open(os.devnull, os.O_RDWR)
                if spec is subprocess.DEVNULL
                else os.dup(number if spec is None else spec.fileno())
            )
            mine.append(None)
    request = json.dumps({
        "args": [str(a) for a in args],
        "cwd": str(cwd or os.getcwd()),
        "env": dict(os.environ if env is None else env),
        "code": code,
        "limits": limits or {},
    }).encode()  # fmt: skip
    conn = socket.socket(socket.AF_UNIX)
    try:
        conn.connect(address)
        socket.send_fds(conn, [_HEADER.pack(len(request))], ends)
        conn.sendall(request)
    finally:
        for fd in ends:
            os.close(fd)
    return ForkedProcess(conn, *mine)


def run(args, *, input=None, cwd=None, env=None, timeout=None, check=False, code=None,
        limits=None):  # fmt: skip
    """``subprocess.run([python, -m, sqlsdc.cli, *args], capture_output=True, text=True, ...)``
    as a forked process (with ``code``, of ``[python, -c, code, *args]``; ``limits`` as
    :func:`popen`'s)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.TemporaryFile() as given:  # fmt: skip
        given.write((input or "").encode())
        given.seek(0)
        process = popen(args, stdin=given, stdout=out, stderr=err, cwd=cwd, env=env, code=code,
                        limits=limits)  # fmt: skip
        try:
            status = process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
        texts = []
        for file in (out, err):
            file.seek(0)
            with open(file.fileno(), closefd=False) as reader:  # decoded as text=True does
                texts.append(reader.read())
    argv = ["sqlsdc"] if code is None else ["python", "-c", code]
    done = subprocess.CompletedProcess([*argv, *map(str, args)], status, *texts)
    if check:
        done.check_returncode()
    return done


class ForkedProcess:
    """The ``subprocess.Popen`` methods the tests use, for a forked ``sqlsdc`` process (a child
    of the fork server: its exit status comes from there)."""

    def __init__(self, conn: socket.socket, stdin, stdout, stderr):
        self._conn, self._buffer = conn, b""
        self.stdin, self.stdout, self.stderr = stdin, stdout, stderr
        self.pid = int(self._line().split()[1])
        self.returncode: int | None = None

    def _line(self, timeout: float | None = None) -> str:
        self._conn.settimeout(timeout)
        while b"\n" not in self._buffer:
            try:
                chunk = self._conn.recv(64)
            except TimeoutError:
                raise subprocess.TimeoutExpired(["sqlsdc"], timeout) from None
            if not chunk:
                raise RuntimeError("the sqlsdc fork server went away")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode()

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = int(self._line(timeout).split()[1])
            self._conn.close()
        return self.returncode

    def poll(self) -> int | None:
        try:
            return self.wait(0.0001)
        except subprocess.TimeoutExpired:
            return None

    def send_signal(self, number: int) -> None:
        """As ``Popen.send_signal``: nothing once the process has ended."""
        if self.poll() is None:
            try:
                os.kill(self.pid, number)
            except ProcessLookupError:  # ended and reaped since the poll
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
