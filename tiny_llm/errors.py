"""User-facing errors: one line saying what is wrong and what to do."""

import re


class TinyLLMError(Exception):
    """An error caused by input a user can fix; the CLI prints it as one line, no traceback."""


class ConfigError(TinyLLMError):
    """An invalid recipe or workflow setting."""


class DataError(TinyLLMError):
    """A missing, corrupt or incompatible corpus, tokenizer or token cache."""


class RunStateError(TinyLLMError):
    """A run directory that cannot be started or resumed as asked (lock held, recipe changed...)."""


class DamagedFileError(TinyLLMError, ValueError):
    """A file that exists but cannot be read (truncated, altered, not valid JSON or YAML); the message names
    it and how to rebuild it. Also a ValueError, as a JSON decoding error is."""


class DiskFullError(TinyLLMError):
    """No space left on the device while a file was written; the file's previous content is intact."""


# How to rebuild a damaged file, for DamagedFileError messages (the commands that write them).
REBUILD_RESULT = (
    "delete it and rerun the same command: training that run again with --resume auto rewrites it from its "
    "final state"
)
REBUILD_TUNING = (
    "delete it and rerun the same command: `tiny-llm tune select` writes it again from the candidates' "
    "results"
)
REBUILD_CAMPAIGN = (
    "delete it and rerun the same command: `tiny-llm campaign plan` or `select` writes it again"
)


# How an out-of-memory reads when it does not come from the CUDA caching allocator (torch.OutOfMemoryError):
# a CUDA call failing ("CUDA error: out of memory"), cuBLAS or cuDNN workspace ("CUBLAS_STATUS_ALLOC_FAILED"),
# Triton loading a compiled module ("Triton Error [CUDA]: out of memory", "CUDA_ERROR_OUT_OF_MEMORY").
_OUT_OF_MEMORY = re.compile(r"out[ _]of[ _]memory|_STATUS_ALLOC_FAILED", re.IGNORECASE)


def out_of_memory_line(exc: BaseException) -> str | None:
    """The first line, in ``exc`` or the exceptions it wraps (a compiler's error around a kernel's), that
    says the device ran out of memory; None when none does."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for line in str(current).splitlines():
            if _OUT_OF_MEMORY.search(line):
                return line.strip()
        current = current.__cause__ or current.__context__
    return None
