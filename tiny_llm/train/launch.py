"""The ranks of one training job on this node (``runtime.num_gpus`` K): ``python -m tiny_llm launch
--nproc-per-node K -m tiny_llm train ...`` does what ``torchrun --standalone`` does for a one-node job,
without its rendezvous port on every interface.

- Rendezvous: the ranks meet in a ``FileStore`` (``TINY_LLM_RANK_STORE``) in a fresh directory only this
  user can use (0700, removed at the end), so no TCP store listens anywhere; gloo's and NCCL's own sockets
  are bound to the loopback interface (``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``): nothing of the job
  listens on an address another host can reach (docs/safety.md says what remains).
- GPU slots: when the ranks train on GPUs, K free slots (``runtime.device.claim_gpu_slots``) are taken before
  any rank starts and held until the last one ends, and ``CUDA_VISIBLE_DEVICES`` names those K GPUs; rank r
  trains on cuda:r and takes no lock of its own (``SLOTS_HELD_ENV``). Two K-rank jobs on one box get
  different GPUs.
- Each rank gets torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE), its followers'
  scratch directories go below the job's directory (removed with it, also after a SIGKILL of a rank), and
  ``compile_workers`` Inductor compile workers (cores / K, at least 2; ``TORCHINDUCTOR_COMPILE_THREADS``
  unless set): K ranks compiling at once would otherwise start up to 32 each.
- Signals: SIGINT and SIGTERM are passed on to every rank (the ranks agree on the update to stop at and rank
  0 saves); ranks still running ``shutdown_timeout`` seconds later are killed. A rank that fails (an exit
  other than 0 or 130, or a signal) gives the others the same time to end on their own (each fails in its next
  collective, in one line), then they get SIGTERM and, ``KILL_GRACE`` seconds later, SIGKILL. A rank that
  ends normally (0, or 130 after a stop) never stops another: rank 0 may still be saving.
- Exit status: 0 when every rank ended 0, 130 when each ended 0 or 130, else 1, with one line per rank that
  failed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import FrameType

from tiny_llm.io import private_directory
from tiny_llm.runtime.device import SLOTS_HELD_ENV, claim_gpu_slots, default_cpu_threads
from tiny_llm.runtime.forkserver import FORK_SERVER_ENV

STORE_ENV = "TINY_LLM_RANK_STORE"
"""The ranks' FileStore (a file in the launcher's private directory)."""
SCRATCH_ENV = "TINY_LLM_RANK_SCRATCH"
"""Where followers make their private run directories."""
JOB_PREFIX = "tiny-llm-ranks-"
KILL_GRACE = 10.0
"""Seconds between SIGTERM and SIGKILL for ranks left running after a failure."""
EXIT_INTERRUPTED = 130
POLL_SECONDS = 0.05


def compile_workers(world_size: int) -> int:
    """Inductor compile workers per rank: the job's cores / K, but at least 2. Inductor's default (up to 32
    per process) oversubscribes K ranks compiling at once; 1 turns its worker pool off and compiles the
    kernels one after another, which was slower even on 2 cores (benchmarks/README.md, "DDP compile time at
    2 ranks")."""
    return max(2, default_cpu_threads() // world_size)


def loopback_interface() -> str | None:
    """The loopback interface's name (``lo`` on Linux), None where there is none."""
    names = [name for _, name in socket.if_nameindex()]
    return "lo" if "lo" in names else None


def rank_environment(
    base: dict[str, str], rank: int, world_size: int, job: Path, visible: Sequence[str] | None
) -> dict[str, str]:
    """Rank ``rank``'s environment: torchrun's variables, the FileStore, loopback sockets, the GPUs."""
    env = dict(base)
    env.pop(FORK_SERVER_ENV, None)  # each rank starts on its own, with the variables set here
    env.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",  # for code that reads it; the store is a file, nothing listens on it
        **{STORE_ENV: str(job / "store"), SCRATCH_ENV: str(job / "scratch")},
    )
    interface = loopback_interface()
    if interface is not None:
        env.setdefault("GLOO_SOCKET_IFNAME", interface)
        env.setdefault("NCCL_SOCKET_IFNAME", interface)
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", str(compile_workers(world_size)))
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(visible)
        env[SLOTS_HELD_ENV] = str(os.getpid())
    return env


def visible_gpus(claimed: Sequence[int], environ: dict[str, str]) -> list[str]:
    """The CUDA_VISIBLE_DEVICES entries of the claimed visible indices (the job's own list where it has one:
    Slurm's, in indices or UUIDs)."""
    given = environ.get("CUDA_VISIBLE_DEVICES")
    entries = [e.strip() for e in given.split(",")] if given else None
    return [entries[i] if entries else str(i) for i in claimed]


def remove_stale_jobs(root: Path, prefix: str) -> None:
    """Directories ``<prefix><pid>-*`` of this user under ``root`` whose process is gone (killed before it
    could clean up)."""
    with contextlib.suppress(OSError):
        for path in root.glob(f"{prefix}*"):
            pid = path.name[len(prefix) :].split("-", 1)[0]
            if not pid.isdigit() or _alive(int(pid)):
                continue
            with contextlib.suppress(OSError):
                if path.is_dir() and not path.is_symlink() and path.stat().st_uid == os.getuid():
                    shutil.rmtree(path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@contextlib.contextmanager
def job_directory() -> Iterator[Path]:
    """A fresh private directory for the ranks' store and scratch, removed at the end."""
    root = Path(tempfile.gettempdir())
    remove_stale_jobs(root, JOB_PREFIX)
    job = Path(tempfile.mkdtemp(prefix=f"{JOB_PREFIX}{os.getpid()}-", dir=root))  # 0700, unpredictable
    try:
        private_directory(job / "scratch")
        yield job
    finally:
        shutil.rmtree(job, ignore_errors=True)


def launch(command: Sequence[str], world_size: int, *, gpus: bool, shutdown_timeout: float = 100.0) -> int:
    """Run ``command`` as ranks 0..world_size-1 on this node (see the module doc); the job's exit status."""
    visible = visible_gpus(claim_gpu_slots(world_size), dict(os.environ)) if gpus else None
    with job_directory() as job:
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for rank in range(world_size):
                env = rank_environment(dict(os.environ), rank, world_size, job, visible)
                procs.append(subprocess.Popen(list(command), env=env))
        except BaseException:
            for proc in procs:  # a rank that cannot start: the others would wait for it
                proc.kill()
                proc.wait()
            raise
        return Ranks(procs).supervise(shutdown_timeout)


class Ranks:
    """The rank processes, their signals and their ends."""

    def __init__(self, procs: list[subprocess.Popen[bytes]]) -> None:
        self.procs = procs
        self.deadline: float | None = None
        """When ranks still running are stopped (set by a signal or a failed rank)."""
        self.terminated = False
        """Whether the ranks have had their SIGTERM: the next stop is a SIGKILL."""
        self.timeout = 100.0

    def _forward(self, signum: int, frame: FrameType | None) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signum)
        self.terminated = True
        if self.deadline is None:
            self.deadline = time.monotonic() + self.timeout

    def supervise(self, shutdown_timeout: float) -> int:
        """Wait for every rank (passing SIGINT/SIGTERM on); stop the rest after a failure; the exit status."""
        self.timeout = shutdown_timeout
        previous = {s: signal.signal(s, self._forward) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while [proc for proc in self.procs if proc.poll() is None]:  # every rank polled, every round
                if self.deadline is None and any(_failed(p.returncode) for p in self.procs):
                    self.deadline = time.monotonic() + shutdown_timeout
                if self.deadline is not None and time.monotonic() > self.deadline:
                    self._stop()
                time.sleep(POLL_SECONDS)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self._status()

    def _stop(self) -> None:
        """SIGTERM to the ranks left, SIGKILL ``KILL_GRACE`` seconds later."""
        signum = signal.SIGKILL if self.terminated else signal.SIGTERM
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signum)
        self.terminated = True
        self.deadline = time.monotonic() + KILL_GRACE

    def _status(self) -> int:
        codes = [proc.returncode for proc in self.procs]
        for rank, (proc, code) in enumerate(zip(self.procs, codes, strict=True)):
            if _failed(code):
                print(f"launch: rank {rank} (pid {proc.pid}) {_how(code)}", file=sys.stderr)
        if all(code == 0 for code in codes):
            return 0
        return EXIT_INTERRUPTED if all(code in (0, EXIT_INTERRUPTED) for code in codes) else 1


def _how(code: int) -> str:
    if code >= 0:
        return f"exited with code {code}"
    with contextlib.suppress(ValueError):
        return f"was killed by {signal.Signals(-code).name}"
    return f"was killed by signal {-code}"


def _failed(code: int | None) -> bool:
    return code is not None and code not in (0, EXIT_INTERRUPTED)
