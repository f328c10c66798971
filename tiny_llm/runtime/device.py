"""Device selection, threads, determinism, precision, SDPA kernel choice, compile set-up.

Shared by training, evaluation and the benchmark workers so a benchmark
measures exactly what training runs.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import os
import platform
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from tiny_llm.config import RecipeConfig
from tiny_llm.errors import ConfigError, RunStateError
from tiny_llm.io import note_lock_holder, open_lock_file, private_directory
from tiny_llm.runtime.compile_cache import setup_compile_cache

# Lock files that keep parallel local jobs on different GPUs; held for the life of the process.
_GPU_LOCKS: list[int] = []
# Lock file -> its fd in _GPU_LOCKS, for the slots select_device took: a second call in the same process
# (train, then evaluate) finds its own GPU, not a GPU taken by someone else.
_HELD_GPU_LOCKS: dict[Path, int] = {}
# Forcing one of these is a CUDA request; on the CPU `auto` already picks PyTorch's CPU flash kernel.
GPU_KERNELS_ONLY = ("flash", "cudnn", "efficient")
# Set (to 1) in a job given a GPU (the workflow's GPU jobs): `auto` then refuses to run on the CPU.
REQUIRE_CUDA_ENV = "TINY_LLM_REQUIRE_CUDA"
# Set by `tiny_llm launch` for its ranks: it holds their GPU slots (CUDA_VISIBLE_DEVICES names those GPUs).
SLOTS_HELD_ENV = "TINY_LLM_GPU_SLOTS_HELD"


def default_cpu_threads() -> int:
    """SLURM_CPUS_PER_TASK when set, else the CPUs this process may run on."""
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        return int(slurm)
    return len(os.sched_getaffinity(0))


def gpu_lock_dir() -> Path:
    """TINY_LLM_GPU_LOCK_DIR, else a private directory of this user's (0700, owner checked) under
    XDG_RUNTIME_DIR when set, else under the system temp directory.

    Private, so that no other user can plant files or links in it on a shared host; a Slurm job's GPU is its
    own anyway. Name one shared directory to coordinate users: when missing it is made as /tmp is (mode 1777,
    see ``shared_lock_directory``).
    """
    explicit = os.environ.get("TINY_LLM_GPU_LOCK_DIR")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return Path(base) / f"tiny-llm-gpu-locks-{os.getuid()}"


class GpuLocksUnavailable(OSError):
    """The lock directory or a lock file cannot be created or opened (read-only, another user's)."""


def _open_lock(path: Path) -> int:
    """An fd to flock ``path`` with, never through a symbolic link: read-write, else (in a shared
    TINY_LLM_GPU_LOCK_DIR) read-only, since flock needs no write access. The default directory is private:
    another user's, or a link, is refused."""
    shared = bool(os.environ.get("TINY_LLM_GPU_LOCK_DIR"))
    try:
        if shared:
            shared_lock_directory(path.parent)
        else:
            private_directory(path.parent)
        return open_lock_file(path, 0o644 if shared else 0o600)
    except OSError as exc:
        if not shared or exc.errno in (errno.ELOOP, errno.EINVAL):
            raise GpuLocksUnavailable(exc.errno, f"{exc.strerror}: {exc.filename or path}") from exc
        try:  # another user's lock file in a shared directory
            return os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            raise GpuLocksUnavailable(exc.errno, f"{exc.strerror}: {path}") from exc


def shared_lock_directory(directory: Path) -> None:
    """Make a missing TINY_LLM_GPU_LOCK_DIR as /tmp is, mode 1777: every user may add lock files (and take
    theirs read-only, which flock needs no more than), and the sticky bit keeps anyone from removing or
    replacing another's. One that exists is used as it is."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(directory, 0o700)
    except FileExistsError:
        return
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, 0o1777)  # the umask would narrow a mode given to mkdir
    finally:
        os.close(fd)


def claim_first_free(lock_paths: Sequence[Path]) -> int | None:
    """Take an exclusive flock on the first free lock file; return its index (fd kept open) or None.

    GpuLocksUnavailable when a lock file can be neither created nor opened.
    """
    for index, path in enumerate(lock_paths):
        fd = _open_lock(path)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        except OSError as exc:  # e.g. a read-only fd on a file system that locks by byte ranges (NFS)
            os.close(fd)
            raise GpuLocksUnavailable(exc.errno, f"{exc.strerror}: {path}") from exc
        with contextlib.suppress(OSError):  # the holder's pid, for people; read-only fds skip it
            note_lock_holder(fd)
        _GPU_LOCKS.append(fd)
        return index
    return None


def _gpu_lock_name(index: int) -> str:
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return f"gpu-{uuid or index}.lock"


def _claim_gpu(indices: Sequence[int]) -> int | None:
    """The first of ``indices`` whose slot this process holds or can take; None when others hold them all."""
    paths = [gpu_lock_dir() / _gpu_lock_name(i) for i in indices]
    for index, path in zip(indices, paths, strict=True):
        if path in _HELD_GPU_LOCKS:
            return index
    found = claim_first_free(paths)
    if found is None:
        return None
    _HELD_GPU_LOCKS[paths[found]] = _GPU_LOCKS[-1]
    return indices[found]


def cuda_required() -> bool:
    """Whether this process was given a GPU (``TINY_LLM_REQUIRE_CUDA``): no CUDA is then an error."""
    return os.environ.get(REQUIRE_CUDA_ENV, "") not in ("", "0")


def no_cuda_message(what: str) -> str:
    """One line: ``what`` needs CUDA, which torch build was found, and how to get a CUDA one."""
    if torch.version.cuda is None:
        found = f"torch {torch.__version__} here is a CPU-only build"
    else:
        cuda = torch.version.cuda
        found = f"torch {torch.__version__} (CUDA {cuda}) sees no GPU (the driver? CUDA_VISIBLE_DEVICES?)"
    return (
        f"{what}, but {found}; install a CUDA build of torch for {platform.machine()} (docs/cluster.md, "
        "'A CUDA torch'), or set runtime.device cpu"
    )


def select_device(requested: str) -> torch.device:
    """'auto' -> CUDA when present (the first GPU no other tiny-llm process holds), else CPU (an error in a
    job given a GPU: ``cuda_required``).

    Every CUDA device is taken through a lock file named by the GPU's UUID, also when one GPU is visible
    (local jobs on a one-GPU machine; Slurm jobs see their own GPU as cuda:0, and the UUID tells them apart).
    An explicit cuda:N takes its slot too, so that auto jobs keep off it; if another process holds it, the two
    share it, as asked, with a warning. The ranks of `tiny_llm launch` take none: it holds theirs. Where no
    lock can be made, the device is used uncoordinated (warning).
    """
    if requested == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        if requested == "auto" and not cuda_required():
            return torch.device("cpu")
        what = f"runtime.device: '{requested}' asks for CUDA"
        if requested == "auto":
            what = f"this job was given a GPU ({REQUIRE_CUDA_ENV}=1)"
        raise ConfigError(no_cuda_message(what))
    count = torch.cuda.device_count()
    explicit = requested.startswith("cuda:")
    if explicit:
        index = int(requested[5:])
        if index >= count:
            raise ConfigError(f"runtime.device: {requested} but only {count} GPU(s) visible")
        if os.environ.get(SLOTS_HELD_ENV):
            return torch.device(requested)
        candidates = [index]
    else:
        candidates = list(range(count))
    try:
        claimed = _claim_gpu(candidates)
    except GpuLocksUnavailable as exc:
        _warn_uncoordinated(exc)
        return torch.device(f"cuda:{candidates[0]}")
    if claimed is not None:
        return torch.device(f"cuda:{claimed}")
    if explicit:
        print(
            f"warning: {requested} is in use by another tiny-llm process (locks in {gpu_lock_dir()}); "
            "sharing it as runtime.device asks",
            file=sys.stderr,
        )
        return torch.device(requested)
    raise RunStateError(
        f"all {count} visible GPUs are taken by other tiny-llm processes (locks in {gpu_lock_dir()}); "
        "run fewer jobs at once or set runtime.device"
    )


def _warn_uncoordinated(exc: OSError) -> None:
    print(
        f"warning: GPU slots are not coordinated ({exc}); set TINY_LLM_GPU_LOCK_DIR to a writable "
        "directory to keep parallel jobs on different GPUs",
        file=sys.stderr,
    )


def claim_gpu_slots(count: int) -> list[int]:
    """``count`` free GPU slots among the visible GPUs (their indices), held for this process's life: the
    launcher of a job's ranks takes them all before any rank starts. RunStateError when fewer are free."""
    visible = torch.cuda.device_count()
    if count > visible:
        raise ConfigError(f"runtime.num_gpus: {count} ranks but only {visible} GPU(s) visible to this job")
    taken: list[int] = []
    try:
        for _ in range(count):
            found = _claim_gpu([i for i in range(visible) if i not in taken])
            if found is None:
                raise RunStateError(
                    f"{count} GPUs wanted but only {len(taken)} of the {visible} visible are free (locks in "
                    f"{gpu_lock_dir()}); run fewer jobs at once"
                )
            taken.append(found)
    except GpuLocksUnavailable as exc:
        _warn_uncoordinated(exc)
        return list(range(count))
    return taken


def check_sdpa_backend(recipe: RecipeConfig, device: torch.device) -> None:
    backend = recipe.runtime.sdpa_backend
    if device.type == "cpu" and backend in GPU_KERNELS_ONLY:
        raise ConfigError(
            f"runtime.sdpa_backend: '{backend}' is a GPU-only kernel and the device is the CPU; "
            "use auto (PyTorch's CPU flash kernel) or math"
        )


def check_cuda_graph(recipe: RecipeConfig, device: torch.device) -> None:
    """A training run (or benchmark) asking for runtime.cuda_graph must have a CUDA device. Only training
    checks it: evaluating or exporting such a run's states needs no graph, and runs on any device."""
    if recipe.runtime.cuda_graph and device.type != "cuda":
        raise ConfigError(
            f"runtime.cuda_graph: needs a CUDA device, and this run's device is {device.type}; set it false"
        )


def keep_cpu_heap() -> bool:
    """Stop glibc from mmap-ing and unmapping large blocks on every step (CPU training only).

    Activations of a CPU step are large; by default glibc serves them with fresh mmaps and unmaps them on
    free, so every step page-faults its memory in again. Serving them from a never-trimmed heap removes that
    cost (the effect of THP_MEM_ALLOC_ENABLE=1 or MALLOC_MMAP_MAX_=0 set before start). No-op elsewhere.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_top_pad, m_mmap_max = -1, -2, -4
    return bool(
        mallopt(m_mmap_max, 0) and mallopt(m_trim_threshold, 2**31 - 1) and mallopt(m_top_pad, 256 << 20)
    )


def setup_runtime(recipe: RecipeConfig) -> torch.device:
    """Pick the device and apply threads, determinism and matmul precision; return the device."""
    rt = recipe.runtime
    setup_compile_cache()  # before anything compiles: Inductor and Triton read it when they first need it
    device = select_device(rt.device)
    check_sdpa_backend(recipe, device)
    # More threads than usable cores only oversubscribes (GPU presets ask for 8 on any machine).
    torch.set_num_threads(min(rt.cpu_threads or default_cpu_threads(), len(os.sched_getaffinity(0))))
    if device.type == "cpu" and os.environ.get("TINY_LLM_CPU_HEAP", "1") == "1":
        keep_cpu_heap()
    if rt.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
    if device.type == "cuda":
        torch.cuda.set_device(device)
        # TF32 for FP32 matmuls (IEEE when deterministic). Not the per-backend fp32_precision setters: in
        # torch 2.13 one write through them makes torch.get_float32_matmul_precision() raise ("mix of the
        # legacy and new APIs"), and Inductor's GEMM autotuning (max-autotune) reads it. This call sets both
        # views alike (torch.backends.cuda.matmul.fp32_precision reads "tf32"), without a warning.
        torch.set_float32_matmul_precision("highest" if rt.deterministic else "high")
    return device


def uses_reference_attention(recipe: RecipeConfig) -> bool:
    return recipe.runtime.attention_backend == "reference" or recipe.runtime.deterministic


def uses_compile(recipe: RecipeConfig) -> bool:
    return recipe.runtime.compile and not recipe.runtime.deterministic


# compile modes whose compiled functions run as CUDA graphs (torch's graph trees) on a CUDA device
GRAPH_COMPILE_MODES = ("reduce-overhead", "max-autotune")


def compiles_cuda_graphs(recipe: RecipeConfig, device: torch.device) -> bool:
    """Whether the compiled loss runs as CUDA graphs: recorded in the first updates, then replayed from a
    private memory pool whose use the allocator's peak statistics no longer show."""
    return (
        device.type == "cuda" and uses_compile(recipe) and recipe.runtime.compile_mode in GRAPH_COMPILE_MODES
    )


def compile_loss(fn: Callable[..., torch.Tensor], recipe: RecipeConfig) -> Callable[..., torch.Tensor]:
    """``fn`` with the recipe's forced SDPA kernel entered inside it (``with_forced_kernel``), under
    torch.compile with the recipe's compile_mode when compiling."""
    fn = with_forced_kernel(fn, recipe)
    if not uses_compile(recipe):
        return fn
    mode = None if recipe.runtime.compile_mode == "default" else recipe.runtime.compile_mode
    return torch.compile(fn, mode=mode)


def with_forced_kernel(fn: Callable[..., torch.Tensor], recipe: RecipeConfig) -> Callable[..., torch.Tensor]:
    """``fn`` entering the recipe's forced SDPA kernel itself; ``fn`` unchanged for auto / the reference.

    A compiled graph keeps the kernel it was traced with and does not guard on a restriction entered
    around the call, so a forced kernel must be entered inside the compiled function, never only outside.
    """
    if forced_sdpa_kernel(recipe) is None:
        return fn

    @functools.wraps(fn)
    def forced(*args: Any, **kwargs: Any) -> torch.Tensor:
        with sdpa_context(recipe):
            return fn(*args, **kwargs)

    return forced


def uses_fused_optimizer(recipe: RecipeConfig, device: torch.device) -> bool:
    return recipe.runtime.fused_optimizer and not recipe.runtime.deterministic


def autocast_dtype(recipe: RecipeConfig, device: torch.device) -> torch.dtype | None:
    """BF16 autocast on CUDA when runtime.amp, on CPU only when runtime.cpu_amp."""
    enabled = recipe.runtime.amp if device.type == "cuda" else recipe.runtime.cpu_amp
    return torch.bfloat16 if enabled else None


@contextlib.contextmanager
def compute_context(recipe: RecipeConfig, device: torch.device) -> Iterator[None]:
    """Autocast and the SDPA kernel restriction for forward passes."""
    with contextlib.ExitStack() as stack:
        dtype = autocast_dtype(recipe, device)
        if dtype is not None:
            stack.enter_context(torch.autocast(device_type=device.type, dtype=dtype))
        stack.enter_context(sdpa_context(recipe))
        yield


def forced_sdpa_kernel(recipe: RecipeConfig) -> str | None:
    """The SDPA kernel the recipe forces; None for auto or the reference attention (which has no SDPA)."""
    if recipe.runtime.sdpa_backend == "auto" or uses_reference_attention(recipe):
        return None
    return recipe.runtime.sdpa_backend


def sdpa_context(recipe: RecipeConfig) -> contextlib.AbstractContextManager[None]:
    """The forced SDPA kernel of the recipe, or nothing for auto / the reference attention."""
    kernel = forced_sdpa_kernel(recipe)
    return contextlib.nullcontext() if kernel is None else sdpa_restriction(kernel)


def sdpa_restriction(backend: str) -> contextlib.AbstractContextManager[None]:
    """Only the named kernel: an unsupported forced kernel raises instead of falling back."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    kernels = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }
    return sdpa_kernel([kernels[backend]])


@contextlib.contextmanager
def quiet_profile(cuda: bool, **options: Any) -> Iterator[torch.profiler.profile]:
    """``torch.profiler.profile`` (CPU, plus CUDA when ``cuda``) without the lines it prints on its own.

    Kineto logs every start and stop to stderr (``USDT: ... SyncActivityProfilerHandler.cpp:52]
    profiler_start``) at its highest level, 5, above its errors (4), so only level 6 silences it; it reads the
    level when it first starts. And torch warns on CUDA that a profiler "clears events at the end of each
    cycle", which says nothing about a one-cycle profile. Both would land in every training log. A
    KINETO_LOG_LEVEL set by the user is kept.
    """
    from torch.profiler import ProfilerActivity, profile

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*Profiler clears events", category=UserWarning)
        with profile(activities=activities, **options) as prof:
            yield prof


# Name parts of attention operators and device kernels: SDPA's, and the reference attention's softmax.
ATTENTION_KEYS = ("attention", "sdpa", "flash", "softmax", "fmha", "cudnn_attn", "efficient_attn")


def attention_kernels(prof: torch.profiler.profile) -> list[str]:
    """Names of the attention operators and device kernels a profile recorded. Autograd graph nodes only
    wrap the operators, so they are left out."""
    names = set()
    for event in prof.key_averages():
        key = event.key
        if key.startswith("autograd::") or key.endswith(("Backward0", "Backward1")):
            continue
        if any(k in key.lower() for k in ATTENTION_KEYS):
            names.add(key)
    return sorted(names)


def dispatched_attention_kernels(run_forward_backward: Callable[[], Any]) -> list[str]:
    """Names of the attention operators one profiled forward+backward actually ran."""
    with quiet_profile(torch.cuda.is_available()) as prof:
        run_forward_backward()
    return attention_kernels(prof)


def peak_memory_bytes(device: torch.device) -> int:
    """Peak device memory (CUDA allocator) since the last ``reset_peak_memory``, or the peak resident set
    size of this process (CPU; it cannot be reset, so it covers the whole process). On Linux that is VmHWM:
    ``ru_maxrss`` keeps the peak of the program this process replaced at exec, so a worker started by a
    10 GB parent (a test runner, a controller) would report the parent's peak as its own."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    from tiny_llm.runtime.memory import status_bytes

    try:
        return status_bytes("VmHWM")
    except OSError:  # no /proc (not Linux)
        import resource

        return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak for ``peak_memory_bytes`` (CUDA; the CPU figure cannot be reset)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def pin_for(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` in pinned host memory when it is bound for a CUDA device (else unchanged): only from
    pinned memory is a ``non_blocking`` copy asynchronous; from pageable memory the host waits for it.
    The block comes from PyTorch's caching host allocator, which keeps it until the copy has finished."""
    if device.type == "cuda" and tensor.device.type == "cpu" and not tensor.is_pinned():
        return tensor.pin_memory()
    return tensor


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A host batch copied to ``device`` without making the host wait (CUDA: through pinned memory)."""
    return pin_for(tensor, device).to(device, non_blocking=True)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class DeviceTimer:
    """What a run's clock needs of its device: the wall time, a wait for the queued work, the peak memory.
    The tests put an asynchronous stand-in in its place, where a CPU's synchronize would cost nothing."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def now(self) -> float:
        return time.perf_counter()

    def synchronize(self) -> None:
        synchronize(self.device)

    def reset_peak(self) -> None:
        reset_peak_memory(self.device)

    def peak(self) -> int:
        return peak_memory_bytes(self.device)
