"""The fork server (tiny_llm.runtime.forkserver): a job forked from it is the job its client would have run.

The server here is the real one (``serve``) with torch preloaded, but its entry point is a probe that reports
what the job sees or waits for a signal; the client is ``forward`` in its own process, as ``tiny_llm`` runs
it. Every wait is on an event: the socket appearing, a line the job prints, a process ending.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tiny_llm.runtime.forkserver import FORK_SERVER_ENV, forward, supported

pytestmark = pytest.mark.skipif(not supported(), reason="the fork server is Linux only")

SERVER = textwrap.dedent(
    """
    import json, os, signal, subprocess, sys, time
    from tiny_llm.runtime.forkserver import preload, serve
    CLIENT = sys.argv[3]
    POOLS = []
    preload(["torch"])

    def probe(argv):
        import torch
        if argv[0] == "facts":
            print(json.dumps({"cwd": os.getcwd(), "umask": os.umask(0), "probe": os.environ.get("PROBE"),
                              "threads": torch.get_num_threads(), "pid": os.getpid(), "sid": os.getsid(0),
                              "argv": sys.argv}))
            return 0
        if argv[0] == "exit":
            return int(argv[1])
        if argv[0] == "die":
            os.kill(os.getpid(), signal.SIGKILL)
        if argv[0] == "wait":  # until SIGTERM, which ends it with status 3
            def stop(signum, frame):  # os.write: a print here can land inside the main thread's print
                os.write(1, f"got {signum}\\n".encode())
                sys.exit(3)
            signal.signal(signal.SIGTERM, stop)
            print("ready", os.getpid(), flush=True)
            while True:
                time.sleep(60)
        if argv[0] == "hold":  # busy in one C call that keeps the GIL: no thread of its own runs
            import re
            print("ready", os.getpid(), flush=True)
            re.match(r"(a+)+$", "a" * 64 + "b")
        if argv[0] == "exit-hooks":  # what a job leaves for the interpreter's exit, as compiling jobs do
            import atexit, concurrent.futures, threading
            POOLS.append(concurrent.futures.ThreadPoolExecutor(2))  # kept, as Inductor keeps its own
            POOLS[0].submit(print, "pool ran", flush=True).result()
            atexit.register(print, "atexit ran", flush=True)
            threading.Thread(target=lambda: (time.sleep(0.2), print("thread joined", flush=True))).start()
            return 4
        if argv[0] == "nested":  # the job itself hands a command on, then a process it starts does
            from tiny_llm.runtime.forkserver import forward
            itself = forward(os.environ["TINY_LLM_FORK_SERVER"], ["exit", "5"])
            started = subprocess.run([sys.executable, "-c", CLIENT, "exit", "6"]).returncode
            print(json.dumps([itself, started]))
            return 0
        raise RuntimeError("probe: " + " ".join(argv))

    sys.exit(serve(sys.argv[1], int(sys.argv[2]), run=probe, records=sys.stdout))
    """
)

CLIENT = textwrap.dedent(
    """
    import os, sys
    os.umask(0o027)
    from tiny_llm.runtime.forkserver import forward
    status = forward(os.environ["TINY_LLM_FORK_SERVER"], sys.argv[1:])
    sys.exit(99 if status is None else status)  # 99: no server took the job
    """
)


class Server:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(mode=0o700)
        self.socket = directory / "socket"
        self.records = directory.parent / "records.jsonl"
        env = dict(os.environ, OMP_NUM_THREADS="2")  # the jobs' own OMP_NUM_THREADS must win over this
        with open(self.records, "wb") as out:
            command = [sys.executable, "-c", SERVER, str(self.socket), str(os.getpid()), CLIENT]
            self.process = subprocess.Popen(command, stdout=out, env=env)
        wait_for(lambda: self.socket.exists() or self.process.poll() is not None, "the server's socket")
        assert self.process.poll() is None, self.records.read_text()

    def client(self, *argv: str, cwd: Path | None = None, **env: str) -> subprocess.Popen[str]:
        environ = dict(os.environ, OMP_NUM_THREADS="1", **env)
        environ[FORK_SERVER_ENV] = str(self.socket)
        return subprocess.Popen(
            [sys.executable, "-c", CLIENT, *argv],
            cwd=cwd,
            env=environ,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def lines(self) -> list[dict[str, object]]:
        """The server's records of ended jobs and refused connections."""
        records = [json.loads(line) for line in self.records.read_text().splitlines()]
        return [record for record in records if "started" not in record]

    def started(self) -> dict[int, int]:
        """Each client's job, from the server's records of started jobs."""
        records = [json.loads(line) for line in self.records.read_text().splitlines()]
        return {record["client"]: record["started"] for record in records if "started" in record}


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout  # a bound for a hung test, not a margin: the event ends the wait
    while not condition():
        assert time.monotonic() < deadline, f"no {what} in {timeout} s"
        time.sleep(0.05)


def gone(pid: int) -> bool:
    """Ended: no process, or a zombie its parent has not reaped yet."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):
        return True


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    started = Server(tmp_path / "private")
    yield started
    started.process.kill()
    started.process.wait()


def test_the_job_has_the_clients_directory_umask_environment_threads_and_its_own_session(
    server: Server, tmp_path: Path
) -> None:
    client = server.client("facts", "x", cwd=tmp_path, PROBE="from the client")
    out, err = client.communicate()
    assert client.returncode == 0, err
    facts = json.loads(out)
    assert facts["cwd"] == str(tmp_path)
    assert facts["umask"] == 0o027
    assert facts["probe"] == "from the client"
    assert facts["threads"] == 1  # the server's OpenMP was loaded with 2
    assert facts["sid"] == facts["pid"] != client.pid  # a forked process in its own session
    assert facts["argv"][1:] == ["facts", "x"]
    (record,) = server.lines()
    assert record["pid"] == facts["pid"] and record["argv"] == ["facts", "x"] and record["exit"] == 0
    assert record["cpu_s"] >= 0 and record["wall_s"] >= 0
    assert server.started() == {client.pid: facts["pid"]}


def test_the_job_ends_as_the_interpreter_ends_a_program(server: Server) -> None:
    """Left-over thread pools stopped, threads joined, then exit handlers: in that order, as Python does."""
    client = server.client("exit-hooks")
    out, err = client.communicate()
    assert client.returncode == 4, err
    assert out == "pool ran\nthread joined\natexit ran\n"


def test_a_job_runs_its_own_command_and_serves_the_processes_it_starts(server: Server) -> None:
    client = server.client("nested")
    out, err = client.communicate()
    assert client.returncode == 0, err
    assert json.loads(out) == [None, 6]  # itself: refused, so run by the caller; its subprocess: served
    records = server.lines()
    assert records[0]["refused"].startswith("a connection from its own job")
    assert [r["argv"] for r in records[1:]] == [["exit", "6"], ["nested"]]
    # each start names its client's parent: the served job that started the inner client, this test the outer
    starts = [json.loads(line) for line in server.records.read_text().splitlines()]
    parents = {tuple(r["argv"]): r["parent"] for r in starts if "started" in r}
    jobs = {tuple(r["argv"]): r["started"] for r in starts if "started" in r}
    assert parents == {("nested",): os.getpid(), ("exit", "6"): jobs["nested",]}


def test_the_client_exits_as_the_job_did(server: Server) -> None:
    status = server.client("exit", "7")
    assert status.wait() == 7
    failed = server.client("fail")
    _, err = failed.communicate()
    assert failed.returncode == 1 and "RuntimeError: probe: fail" in err  # the traceback, as run alone
    killed = server.client("die")
    assert killed.wait() == -signal.SIGKILL  # dies of the job's signal, as the shell would have seen
    assert [r.get("exit", r.get("signal")) for r in server.lines()] == [7, 1, signal.SIGKILL]


def test_a_signal_to_the_client_reaches_the_job(server: Server) -> None:
    client = server.client("wait")
    assert client.stdout is not None
    assert client.stdout.readline().startswith("ready")
    client.send_signal(signal.SIGTERM)
    out, err = client.communicate()
    assert (client.returncode, out) == (3, "got 15\n"), err


def test_the_job_dies_with_its_client(server: Server) -> None:
    client = server.client("wait")
    assert client.stdout is not None
    job = int(client.stdout.readline().split()[1])
    client.kill()
    client.wait()
    wait_for(lambda: gone(job), "end of the job after its client was killed")
    wait_for(lambda: len(server.lines()) == 1, "record of the killed job")
    assert server.lines()[0]["signal"] == signal.SIGKILL


def test_a_job_holding_the_gil_dies_with_its_client(server: Server) -> None:
    """The job's lifeline is a thread, which cannot run while the job holds the GIL; the server kills it."""
    client = server.client("hold")
    assert client.stdout is not None
    job = int(client.stdout.readline().split()[1])
    try:
        client.kill()
        client.wait()
        wait_for(lambda: gone(job), "end of the GIL-holding job after its client was killed")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job, signal.SIGKILL)


def test_the_job_dies_with_the_server_and_the_client_says_so(server: Server) -> None:
    client = server.client("wait")
    assert client.stdout is not None
    job = int(client.stdout.readline().split()[1])
    server.process.kill()
    _, err = client.communicate()
    assert client.returncode == 1
    assert err.strip() == f"error: the fork server ({server.socket}) stopped before this job ended"
    wait_for(lambda: gone(job), "end of the job after its server was killed")


def test_a_stopped_server_takes_no_new_job_and_exits_once_its_jobs_end(server: Server) -> None:
    client = server.client("wait")
    assert client.stdout is not None
    job = int(client.stdout.readline().split()[1])
    server.process.terminate()
    wait_for(lambda: not server.socket.exists(), "socket removal after SIGTERM")
    assert server.client("exit", "0").wait() == 99  # runs on its own
    assert not gone(job) and server.process.poll() is None
    client.send_signal(signal.SIGTERM)
    assert client.wait() == 3
    assert server.process.wait() == 0
    assert not server.socket.parent.exists()  # its private directory too


def test_a_connection_that_sends_nothing_is_closed_without_a_record(server: Server) -> None:
    """Another run's controller checks whether this server lives (controller.remove_dead_fork_servers)."""
    import socket

    with socket.socket(socket.AF_UNIX) as probe:
        probe.connect(str(server.socket))
    assert server.client("exit", "3").wait() == 3  # served after the probe: the records are in order
    assert [record.get("exit") for record in server.lines()] == [3]


def test_without_a_server_the_command_runs_on_its_own(tmp_path: Path) -> None:
    environ = dict(os.environ, **{FORK_SERVER_ENV: str(tmp_path / "missing")})
    assert subprocess.run([sys.executable, "-c", CLIENT, "exit", "0"], env=environ).returncode == 99
    stale = tmp_path / "stale"
    import socket

    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(stale))  # bound, never listening: a server that died without removing it
    environ[FORK_SERVER_ENV] = str(stale)
    assert subprocess.run([sys.executable, "-c", CLIENT, "exit", "0"], env=environ).returncode == 99


@pytest.mark.skipif(os.geteuid() != 0, reason="connecting as another user needs root")
def test_another_users_connection_is_refused() -> None:
    base = Path(tempfile.mkdtemp(prefix="forkserver-test-"))  # outside pytest's 0700 directories
    try:
        base.chmod(0o755)
        server = Server(base / "private")
        server.socket.parent.chmod(0o755)  # past the private directory, to reach the server's own check
        server.socket.chmod(0o777)
        pid = os.fork()  # this process's modules, as another user (who may not read this Python's files)
        if pid == 0:
            code = 98
            try:
                os.chdir("/")
                os.setgid(65534)
                os.setuid(65534)
                status = forward(str(server.socket), ["exit", "0"])
                code = 99 if status is None else status
            finally:
                os._exit(code)
        assert os.waitpid(pid, 0)[1] == 99 << 8  # not run by the server
        wait_for(lambda: server.lines() != [], "the server's record of the refusal")
        assert server.lines() == [{"refused": "a connection from uid 65534 with 4 descriptors"}]
        server.process.kill()
        server.process.wait()
    finally:
        shutil.rmtree(base)


def test_tiny_llm_hands_its_command_on_the_timed_workers_too_but_not_launch(server: Server) -> None:
    """`tiny_llm describe` and the timed workers reach the server (whose probe entry point fails them);
    launch runs on its own, as before: its help prints."""
    environ = dict(os.environ, **{FORK_SERVER_ENV: str(server.socket)})
    handed = ["describe", "benchmark-worker", "benchmark-packed-worker"]
    for command in handed:
        served = subprocess.run(
            [sys.executable, "-m", "tiny_llm", command, "--help"], env=environ, capture_output=True
        )
        assert served.returncode == 1 and f"RuntimeError: probe: {command} --help".encode() in served.stderr
    alone = subprocess.run([sys.executable, "-m", "tiny_llm", "launch", "--help"], env=environ)
    assert alone.returncode == 0
    assert [record["argv"] for record in server.lines()] == [[command, "--help"] for command in handed]
