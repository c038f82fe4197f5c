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
