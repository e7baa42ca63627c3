"""One error family, so the CLI can print a message a person can act on instead of a traceback.

Exit codes follow the CLI contract: 2 for input the user can fix (config, flags, files),
1 for failures of the world (AWS, Kubernetes, a tool, a training run).
"""

from __future__ import annotations


class RaydlcError(Exception):
    """Base of every error raydlc raises on purpose; `hint` says what to do next."""

    exit_code: int = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"

    def __reduce__(self) -> tuple[object, ...]:
        """Pickled whole (message, hint, class, fields): a worker's error reaches the driver as it was raised.

        Exception's own pickling replays `__init__(*args)`, which loses the hint and breaks
        subclasses whose `__init__` takes other arguments (ConfigError's problem list).
        """
        return (_restore, (type(self), self.message, self.hint, dict(self.__dict__)))


def _restore(cls: type[RaydlcError], message: str, hint: str | None, state: dict[str, object]) -> RaydlcError:
    e = cls.__new__(cls)
    RaydlcError.__init__(e, message, hint=hint)
    e.__dict__.update(state)
    return e


class InputError(RaydlcError):
    """Bad input a person can correct: a flag, a file, a path."""

    exit_code = 2


class ConfigError(InputError):
    """An invalid configuration value; the message names the field and where it came from."""

    def __init__(self, problems: list[str], *, hint: str | None = None) -> None:
        self.problems = list(problems)
        head = "invalid configuration" if len(problems) != 1 else "invalid configuration:"
        body = problems[0] if len(problems) == 1 else "\n".join(f"  - {p}" for p in problems)
        sep = " " if len(problems) == 1 else ":\n"
        super().__init__(f"{head}{sep}{body}", hint=hint)


class MachineError(RaydlcError):
    """The machine failed us (disk full, I/O error, out of file handles), not the input."""


class ToolMissingError(RaydlcError):
    """An external program (eksctl, helm, kubectl) is not on PATH."""


class CredentialsError(RaydlcError):
    """No usable cloud credentials; raised before any call is made."""

    exit_code = 2


class AwsError(RaydlcError):
    """An AWS call failed in a way the user has to act on (permissions, quota, region)."""


class KubeError(RaydlcError):
    """A Kubernetes API call failed."""


class TrainError(RaydlcError):
    """A training run failed or cannot start."""


class LoRAExportError(TrainError):
    """A LoRA run's weights cannot be exported (an adapter without its pair or base weight, shapes that disagree,
    a folder that is not an earlier export); the message names the key or path, and nothing was written."""


class CheckpointError(RaydlcError):
    """A checkpoint is missing, partial or corrupt; never half-loaded."""


class RayError(RaydlcError):
    """Ray could not be started or reached (an address, a port-forward, a local head)."""


class Stopped(RaydlcError):
    """Ctrl-C: the command stopped; the message says what was stopped and what is kept."""

    exit_code = 130
