"""Exception types shared by every layer (stdlib only, safe on the hook path)."""


class GpueffError(Exception):
    """Base class: an error we can explain to the user in one sentence."""

    exit_code = 1


class ConfigError(GpueffError):
    """The TOML config is missing, malformed or has an invalid value."""

    exit_code = 2


class JobIdError(GpueffError):
    """A job id the user typed is not a Slurm job id we understand."""

    exit_code = 2


class RecordError(GpueffError):
    """A spool record is malformed (bad JSON, wrong schema, impossible values)."""


class CollectorError(GpueffError):
    """A collector backend could not measure (NVML missing, agent not running, ...)."""


class SlurmCommandError(GpueffError):
    """A Slurm client command is missing, failed or did not answer in time (slurm/runner.py).

    ``why`` says which, for callers that word it their own way: ``"missing"`` (not found), ``"unrunnable"``
    (the system would not start it; ``oserror`` holds why), ``"timeout"`` or ``"failed"`` (a non-zero exit;
    ``returncode`` and ``first_line`` of its message). Errors raised with a message alone are ``"failed"``.
    """

    def __init__(self, message: str, *, why: str = "failed", command: str = "", exe: str | None = None,
                 returncode: int | None = None, first_line: str = "", timeout_s: float | None = None,
                 oserror: OSError | None = None) -> None:
        super().__init__(message)
        self.why, self.command, self.exe = why, command, exe
        self.returncode, self.first_line, self.timeout_s, self.oserror = returncode, first_line, timeout_s, oserror
