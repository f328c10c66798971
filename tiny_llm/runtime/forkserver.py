"""Shared start-up for a local workflow's jobs: one process imports torch once and forks every job.

A demo job spends about 4 s of its 15 importing torch and torch._dynamo before it trains, and a local run
has a hundred such jobs on two cores. The controller (tiny_llm/pipeline/controller.py) starts
``tiny_llm fork-server`` for a local run and puts its socket's path in ``TINY_LLM_FORK_SERVER``; a
``tiny_llm <command>`` started by a rule then hands its command line to the server (``forward``), which forks
a process that becomes the job: the client's argv, working directory, umask, environment and standard streams.
The client stays the job as Snakemake sees it: it passes its signals on and exits as the job exits. Where no
server answers, the command runs in its own process as before.

One Unix-socket connection per job:
- client -> server: a 4-byte length, then the JSON request, with four descriptors attached (SCM_RIGHTS):
  stdin, stdout, stderr, and the read end of a pipe whose write end only the client holds; after that one byte
  per signal the client receives, which the server sends to the job's process group.
- job -> client: ``{"pid": N}`` once the job has started; server -> client: ``{"exit": code}`` or
  ``{"signal": n}`` when it ends. The server writes one JSON line per job to its log (wall, CPU, peak memory).
- The job dies with its client, as a job the shell started dies when its process group is killed: the pipe
  reads EOF and the job kills its own process group, and the server, seeing the connection close, kills it too
  (a job busy in a call that holds the GIL runs no thread). A client whose server went away exits, and its job
  with it.
Only the server's user may connect (``SO_PEERCRED``); the socket lies in a 0700 directory. Linux only.
"""

from __future__ import annotations

import array
import atexit
import contextlib
import gc
import io
import json
import os
import selectors
import signal
import socket
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

FORK_SERVER_ENV = "TINY_LLM_FORK_SERVER"
"""The server's socket path, which the controller sets for a local run's jobs."""

FORWARDED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
_HEADER = struct.Struct("!I")
_NUM_FDS = 4  # stdin, stdout, stderr, the client's lifeline
_MAX_REQUEST_BYTES = 1 << 24
_REQUEST_TIMEOUT_S = 30.0


_served: list[bool] = []
"""Set in a job the server forked: it runs its command itself (the processes it starts may be served)."""


def supported() -> bool:
    return sys.platform == "linux"


def may_forward() -> bool:
    """Whether this process may hand its command to a fork server: not a job one forked, and on Linux."""
    return supported() and not _served


# --- client -----------------------------------------------------------------------------------------------


def forward(path: str, argv: Sequence[str]) -> int | None:
    """Run the command ``argv`` (without the program's name) as a fork of the server at ``path``; its exit
    status. None when no server took the job (none listening, or it refused): the caller runs it itself."""
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
    except OSError:
        return None
    relay = _Relay(sock)
    previous = {s: signal.signal(s, relay.handle) for s in FORWARDED_SIGNALS}
    try:
        taken, ended = _run_served(sock, argv, relay)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    if not taken:  # what arrived meanwhile reaches this process, which runs the command itself
        for signum in relay.pending:
            os.kill(os.getpid(), signum)
        return None
    return _exit_status(ended, path)


class _Relay:
    """The client's signal handler: a signal goes to the job once it runs, and is held until then."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.pending: list[int] = []
        self.started = False

    def handle(self, signum: int, frame: object) -> None:
        if self.started:
            self.send(signum)
        else:
            self.pending.append(signum)

    def start(self) -> None:
        self.started = True
        for signum in self.pending:
            self.send(signum)

    def send(self, signum: int) -> None:
        with contextlib.suppress(OSError):  # the server is gone: the job is being killed with it
            self.sock.send(bytes([signum]))


def _run_served(
    sock: socket.socket, argv: Sequence[str], relay: _Relay
) -> tuple[bool, dict[str, Any] | None]:
    """Whether the server took the job, and its end as the server reports it (None: the server went away)."""
    read_end, lifeline = os.pipe()
    try:  # the lifeline is held until the job's end: the job reads EOF when this process dies
        try:
            _send_request(sock, argv, [0, 1, 2, read_end])
        except OSError:
            return False, None
        finally:
            os.close(read_end)
        replies = sock.makefile("rb")
        if "pid" not in (_reply(replies) or {}):
            return False, None  # refused, or the server ended before the job started: nothing ran
        relay.start()
        return True, _reply(replies)
    finally:
        os.close(lifeline)


def _send_request(sock: socket.socket, argv: Sequence[str], fds: list[int]) -> None:
    request = {"argv": [sys.argv[0], *argv], "cwd": os.getcwd(), "umask": _umask(), "env": dict(os.environ)}
    payload = json.dumps(request).encode()
    payload = _HEADER.pack(len(payload)) + payload
    sent = sock.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    sock.sendall(payload[sent:])


def _umask() -> int:
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _reply(replies: IO[bytes]) -> dict[str, Any] | None:
    """The server's next message; None when it closed the connection (a reset too: it refused)."""
    try:
        line = replies.readline()
    except OSError:
        return None
    return json.loads(line) if line.endswith(b"\n") else None


def _exit_status(ended: dict[str, Any] | None, path: str) -> int:
    if ended is None:
        print(f"error: the fork server ({path}) stopped before this job ended", file=sys.stderr)
        return 1
    if "signal" in ended:  # die of the same signal, as the shell and Snakemake would have seen the job do
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(ended["signal"], signal.SIG_DFL)
        os.kill(os.getpid(), ended["signal"])
        return 128 + int(ended["signal"])
    return int(ended["exit"])


# --- server -----------------------------------------------------------------------------------------------


@dataclass
class _Job:
    conn: socket.socket
    argv: list[str]
    log: str
    started: float


class _Server:
    """The accept loop: fork each request, relay signals, report each end; exits when told to (SIGTERM,
    SIGINT) or when its parent, the controller, is gone, once its jobs have ended."""

    def __init__(self, path: str, parent: int, run: Callable[[list[str]], int], records: IO[str]) -> None:
        self.path, self.parent, self.run, self.records = path, parent, run, records
        self.pid = os.getpid()
        self.jobs: dict[int, _Job] = {}
        self.ended: set[socket.socket] = set()  # connections of ended jobs, until their clients close them
        self.stopping = False
        self.selector = selectors.DefaultSelector()
        self.wake_read, self.wake_write = os.pipe()
        self.listener: socket.socket | None = None

    def serve(self) -> int:
        for fd in (self.wake_read, self.wake_write):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.wake_write)
        signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # wakes the selector
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, self._stop)
        self.selector.register(self.wake_read, selectors.EVENT_READ)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(f"{self.path}.new")
        self.listener.listen(64)
        os.rename(f"{self.path}.new", self.path)  # the path appears once it listens
        self.selector.register(self.listener, selectors.EVENT_READ)
        try:
            while not (self.stopping and not self.jobs):
                self._step()
        finally:
            if os.getpid() == self.pid:  # a job that failed to start unwinds through here: not its to close
                self._close_listener()
        return 0

    def _stop(self, signum: int, frame: object) -> None:
        self.stopping = True

    def _step(self) -> None:
        for key, _ in self.selector.select(timeout=1.0):
            if key.fileobj is self.listener:
                self._accept()
            elif key.fileobj == self.wake_read:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.wake_read, 4096)
            else:
                self._relay(key.fileobj, key.data)  # type: ignore[arg-type]
        self._reap()
        if os.getppid() != self.parent:
            self.stopping = True
        if self.stopping:
            self._close_listener()

    def _close_listener(self) -> None:
        if self.listener is None:
            return
        self.selector.unregister(self.listener)
        self.listener.close()
        self.listener = None
        with contextlib.suppress(OSError):
            os.unlink(self.path)
            os.rmdir(os.path.dirname(self.path))  # the private directory made for this socket, if empty

    def _accept(self) -> None:
        assert self.listener is not None
        with contextlib.suppress(BlockingIOError):
            conn, _ = self.listener.accept()
            try:
                client, parent, request, fds = _read_request(conn)
            except _Probe:  # another run's controller checking that this server lives
                conn.close()
                return
            except (OSError, ValueError) as exc:
                print(json.dumps({"refused": str(exc)}), file=self.records, flush=True)
                conn.close()
                return
            self._fork(conn, client, parent, request, fds)

    def _fork(
        self, conn: socket.socket, client: int, parent: int | None, request: dict[str, Any], fds: list[int]
    ) -> None:
        log = _fd_path(fds[1])
        for stream in (sys.stdout, sys.stderr, self.records):
            stream.flush()
        gc.freeze()  # the server's objects: a job's collections then leave the pages it shares alone
        pid = os.fork()
        if pid == 0:
            _become_job(request, fds, conn, self._inherited(), self.run)
        for fd in fds:
            os.close(fd)
        self.jobs[pid] = _Job(conn, list(request["argv"]), log, time.monotonic())
        self.selector.register(conn, selectors.EVENT_READ, pid)
        # the client's parent is a served job where one of them started the client (the tuner's timed worker)
        started = {
            "started": pid,
            "client": client,
            "parent": parent,
            "argv": request["argv"][1:],
            "log": log,
        }
        print(json.dumps(started), file=self.records, flush=True)  # which process is whose job

    def _inherited(self) -> list[Callable[[], None]]:
        """What a job closes of the server's: the listener, the wake-up pipe, other jobs' connections."""
        closers: list[Callable[[], None]] = [self.selector.close]
        closers += [job.conn.close for job in self.jobs.values()] + [conn.close for conn in self.ended]
        if self.listener is not None:
            closers.append(self.listener.close)
        closers += [lambda: os.close(self.wake_read), lambda: os.close(self.wake_write)]
        return closers

    def _relay(self, conn: socket.socket, pid: int | None) -> None:
        try:
            data = conn.recv(64)
        except OSError:
            data = b""
        if not data:  # the client is gone: its job dies with it
            self.selector.unregister(conn)
            if pid is None:
                self.ended.discard(conn)
                conn.close()
            else:  # as the job's lifeline does, but also where the job's threads cannot run (the GIL held)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)
            return
        if pid is None:  # a signal that came after the job's end: nothing to send it to
            return
        for signum in data:
            with contextlib.suppress(ProcessLookupError, PermissionError, ValueError):
                os.killpg(pid, signum)

    def _reap(self) -> None:
        while True:
            try:
                pid, status, usage = os.wait4(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            job = self.jobs.pop(pid, None)
            if job is not None:
                self._report(pid, job, status, usage)

    def _report(self, pid: int, job: _Job, status: int, usage: Any) -> None:
        ended = {"exit": os.waitstatus_to_exitcode(status)}
        if os.WIFSIGNALED(status):
            ended = {"signal": os.WTERMSIG(status)}
        record = {
            "pid": pid,
            "argv": job.argv[1:],
            "log": job.log,
            **ended,
            "wall_s": round(time.monotonic() - job.started, 3),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 3),
            "max_rss_mb": round(usage.ru_maxrss / 1024, 1),
        }
        print(json.dumps(record), file=self.records, flush=True)  # before the client exits
        try:  # closed by the client first: a close here with its last signal unread would reset the status
            job.conn.sendall(json.dumps(ended).encode() + b"\n")
            job.conn.shutdown(socket.SHUT_WR)
            self.selector.modify(job.conn, selectors.EVENT_READ, None)
            self.ended.add(job.conn)
        except (OSError, KeyError, ValueError):
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(job.conn)
            job.conn.close()


def serve(path: str, parent: int, run: Callable[[list[str]], int], records: IO[str]) -> int:
    """Serve jobs on the Unix socket ``path`` until told to stop or ``parent`` is gone; ``run(argv)`` is the
    command line's entry point, called in each job's process."""
    return _Server(path, parent, run, records).serve()


def _read_request(conn: socket.socket) -> tuple[int, int | None, dict[str, Any], list[int]]:
    """The client's pid and its parent's, its request, and the descriptors it sent."""
    conn.settimeout(_REQUEST_TIMEOUT_S)
    credentials = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    peer, uid, _ = struct.unpack("3i", credentials)
    parent = _parent_of(peer)
    if parent == os.getpid():  # a job handing on its own command (code of another version)
        raise ValueError(f"a connection from its own job {peer}")
    fds = array.array("i")
    data, ancillary, _, _ = conn.recvmsg(1 << 16, socket.CMSG_SPACE(_NUM_FDS * fds.itemsize))
    if not data and not ancillary:
        raise _Probe
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    if uid != os.getuid() or len(fds) != _NUM_FDS:
        for fd in fds:
            os.close(fd)
        raise ValueError(f"a connection from uid {uid} with {len(fds)} descriptors")
    size = _HEADER.unpack(data[: _HEADER.size])[0] if len(data) >= _HEADER.size else _MAX_REQUEST_BYTES + 1
    if size > _MAX_REQUEST_BYTES:
        raise ValueError(f"a request of {size} bytes")
    while len(data) < _HEADER.size + size:
        chunk = conn.recv(_HEADER.size + size - len(data))
        if not chunk:
            raise ValueError("a request cut short")
        data += chunk
    conn.settimeout(None)
    return peer, parent, json.loads(data[_HEADER.size :]), list(fds)


class _Probe(Exception):
    """A connection closed without a request."""


def _parent_of(pid: int) -> int | None:
    with contextlib.suppress(OSError, IndexError, ValueError):
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return None


def _fd_path(fd: int) -> str:
    with contextlib.suppress(OSError):
        return os.readlink(f"/proc/self/fd/{fd}")
    return ""


# --- the job's side of the fork -----------------------------------------------------------------------------


def _become_job(
    request: dict[str, Any],
    fds: list[int],
    conn: socket.socket,
    inherited: list[Callable[[], None]],
    run: Callable[[list[str]], int],
) -> NoReturn:
    """In the forked process: take the client's streams, place and environment, then run its command."""
    _served.append(True)
    os.setsid()  # its own process group: what a relayed signal and the lifeline's kill reach
    signal.set_wakeup_fd(-1)
    for signum in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for close in inherited:
        with contextlib.suppress(OSError):
            close()
    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
        os.close(fd)
    os.set_inheritable(fds[3], False)  # the job's own subprocesses need not hold it
    _die_with_client(fds[3])
    os.chdir(request["cwd"])
    os.umask(request["umask"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # TMPDIR may differ from the server's
    _reopen_streams()
    _match_threads()
    sys.argv = list(request["argv"])
    conn.sendall(json.dumps({"pid": os.getpid()}).encode() + b"\n")
    conn.close()
    os._exit(_run_to_exit(run, sys.argv[1:]))


def _run_to_exit(run: Callable[[list[str]], int], argv: list[str]) -> int:
    """Run the job and end it as the interpreter ends a program (threads joined, exit handlers run, streams
    flushed), but without the teardown of every module, which in a process holding torch costs about a
    second of CPU (writing to every page it shares with the server)."""
    try:
        code: object = run(argv)
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    # What the interpreter does at its exit, in its order, as multiprocessing's forked children do: the
    # threading module's exit hooks (thread pools told to stop), its non-daemon threads joined, then the
    # atexit handlers (loggers, weakref finalizers, process pools).
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"), as Python prints and exits it
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    return code


def _die_with_client(lifeline: int) -> None:
    """Kill this job's process group when the client exits, as a shell's job dies with its process group."""

    def watch() -> None:
        with contextlib.suppress(OSError):
            while os.read(lifeline, 1):
                pass
        os.killpg(0, signal.SIGKILL)

    threading.Thread(target=watch, name="fork-server-lifeline", daemon=True).start()


def _reopen_streams() -> None:
    """New sys.stdin/stdout/stderr on descriptors 0-2, buffered as Python buffers them at start-up."""
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        old = getattr(sys, name)
        raw = io.FileIO(fd, "r" if fd == 0 else "w", closefd=False)
        buffered = io.BufferedReader(raw) if fd == 0 else io.BufferedWriter(raw)
        stream = io.TextIOWrapper(
            buffered,
            encoding=old.encoding,
            errors=old.errors,
            line_buffering=fd > 0 and (fd == 2 or raw.isatty()),
            write_through=unbuffered and fd > 0,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _match_threads() -> None:
    """The job's OMP_NUM_THREADS (Snakemake sets the rule's threads); OpenMP read the server's at load."""
    threads = os.environ.get("OMP_NUM_THREADS", "")
    torch = sys.modules.get("torch")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def preload(modules: Sequence[str]) -> None:
    """Import what jobs would each import, without running anything: no thread may exist when a job forks."""
    import importlib

    for name in modules:
        importlib.import_module(name)
    if threading.active_count() != 1:
        raise RuntimeError(f"threads after preloading: {[t.name for t in threading.enumerate()]}")
