"""User-facing errors: one line saying what is wrong and what to do."""


class TinyLLMError(Exception):
    """An error caused by input a user can fix; the CLI prints it as one line, no traceback."""


class ConfigError(TinyLLMError):
    """An invalid recipe or workflow setting."""


class DataError(TinyLLMError):
    """A missing, corrupt or incompatible corpus, tokenizer or token cache."""


class RunStateError(TinyLLMError):
    """A run directory that cannot be started or resumed as asked (lock held, recipe changed...)."""
