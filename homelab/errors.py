"""The homelab exception tree.

Every error a user can see derives from :class:`HomelabError` and carries a message that
says what was wrong and what to do. Errors from dependencies (llama.cpp, NVML, HTTP) are
mapped to these types at the boundary with ``raise ... from exc``.

    HomelabError
    ├── ModelFileError        a GGUF file is missing, unreadable or malformed
    ├── HardwareError         hardware detection failed in a way we cannot report around
    ├── PlanError             no configuration fits, or the requested knobs are impossible
    ├── EngineError           llama.cpp failed to load, decode or sample
    │   ├── OutOfMemoryError  loading or context creation ran out of memory
    │   ├── ContextLengthError  prompt + max_tokens exceed a slot's context
    │   ├── BusyError         the request queue is full
    │   └── EngineClosedError the engine (or embedder) is shut down: it serves nothing more
    ├── HubError              the Hugging Face hub (or its stand-in) failed or lied
    ├── ConfigError           a config or keys file is invalid (names the file)
    └── BenchError            a benchmark or quality run could not be carried out
"""

from __future__ import annotations


class HomelabError(Exception):
    """Base of every user-facing homelab error.

    ``title`` is a short heading for the TUI; ``str(error)`` is the full message.
    """

    title = "homelab error"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if hint is None else f"{_sentence(message)} {hint}")


def _sentence(text: str) -> str:
    """End ``text`` with punctuation so a hint can follow it."""
    return text if text.rstrip().endswith((".", "!", "?", ":")) else f"{text.rstrip()}."


class ModelFileError(HomelabError):
    title = "Model file problem"

    def __init__(self, path: object, problem: str, *, hint: str | None = None) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}", hint=hint)


class HardwareError(HomelabError):
    title = "Hardware detection problem"


class PlanError(HomelabError):
    title = "Cannot plan"


class EngineError(HomelabError):
    title = "Inference engine error"


class OutOfMemoryError(EngineError):
    title = "Out of memory"


class ContextLengthError(EngineError):
    title = "Context length exceeded"


class BusyError(EngineError):
    title = "Busy"


class EngineClosedError(EngineError):
    title = "Engine closed"


class HubError(HomelabError):
    title = "Hugging Face hub problem"


class ConfigError(HomelabError):
    title = "Configuration problem"


class BenchError(HomelabError):
    title = "Benchmark problem"
