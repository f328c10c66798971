"""User-facing errors: one line saying what is wrong and what to do."""


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
