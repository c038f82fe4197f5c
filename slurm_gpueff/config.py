"""Configuration: one TOML file, validated up front with errors that name the file, section and key.

Stdlib only (tomllib), because the Slurm hooks load it on every job start and end.

Lookup order: ``--config PATH`` > ``$GPUEFF_CONFIG`` > ``/etc/slurm-gpueff/gpueff.toml``. A missing
default file is not an error (every key has a default, so a node works out of the box); a missing file
that the user named explicitly is. The annotated example in ``etc/gpueff.toml`` documents every key.
"""

from __future__ import annotations

import os
import tomllib

from .errors import ConfigError

# Annotation-only imports: typing costs ~2 ms at start-up, which every Prolog/Epilog would pay.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

DEFAULT_PATH = "/etc/slurm-gpueff/gpueff.toml"
ENV_VAR = "GPUEFF_CONFIG"

BACKENDS = ("auto", "nvml", "dcgm", "simulated", "none")

# section -> key -> (type(s), default).  float keys accept ints too.
SCHEMA: dict[str, dict[str, tuple[Any, Any]]] = {
    "site": {
        "cluster": (str, "cluster"),
    },
    "paths": {
        "spool_dir": (str, "/var/spool/slurm-gpueff"),
        "state_dir": (str, "/run/slurm-gpueff"),
        "database": (str, "sqlite:////var/lib/slurm-gpueff/gpueff.db"),
    },
    "collector": {
        "backend": (str, "auto"),
        "hook_timeout_s": (float, 10.0),
        "agent_stale_s": (float, 30.0),
    },
    "agent": {
        "interval_s": (float, 5.0),
        "timeline_interval_s": (float, 60.0),
        "timeline_keep_h": (float, 168.0),
    },
    "simulated": {
        "profile": (str, "bf16-healthy"),
        "gpus_per_node": (int, 4),
        "model": (str, "Simulated H100 80GB"),
    },
    "analysis": {
        "never_used_kernel_pct": (float, 5.0),
        "starved_kernel_pct": (float, 50.0),
        "busy_kernel_pct": (float, 80.0),
        "busy_sm_pct": (float, 30.0),
        "busy_efficiency_pct": (float, 10.0),
        "tensor_idle_sm_pct": (float, 30.0),
        "tensor_idle_tensor_pct": (float, 2.0),
        "tensor_idle_fp32_pct": (float, 10.0),
        "memory_bound_dram_pct": (float, 50.0),
        "memory_bound_tensor_pct": (float, 20.0),
        "oversized_memory_pct": (float, 25.0),
        "oversized_sm_pct": (float, 40.0),
        "min_gpu_hours": (float, 0.0),
    },
}


class Section:
    """Attribute access to one validated section (``cfg.paths.spool_dir``)."""

    def __init__(self, name: str, values: dict[str, Any]):
        self._name = name
        self.__dict__.update(values)

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if not k.startswith("_")}

    def __repr__(self) -> str:
        return f"Section({self._name!r}, {self.as_dict()!r})"


class Config:
    """The validated configuration; every section from SCHEMA is present with defaults filled in."""

    site: Section
    paths: Section
    collector: Section
    agent: Section
    simulated: Section
    analysis: Section

    def __init__(self, data: dict[str, Any] | None = None, source: str = "<defaults>"):
        self.source = source
        data = data or {}
        where = f"{source}"
        for section in data:
            if section not in SCHEMA:
                raise ConfigError(f"{where}: unknown section [{section}]{_hint(section, SCHEMA)}")
        for section, keys in SCHEMA.items():
            given = data.get(section, {})
            if not isinstance(given, dict):
                raise ConfigError(f"{where}: [{section}] must be a table, not {type(given).__name__}")
            values: dict[str, Any] = {}
            for key in given:
                if key not in keys:
                    raise ConfigError(f"{where}: unknown key {section}.{key}{_hint(key, keys)}")
            for key, (typ, default) in keys.items():
                values[key] = _check(where, section, key, given.get(key, default), typ)
            setattr(self, section, Section(section, values))
        self._validate(where)

    def _validate(self, where: str) -> None:
        if self.collector.backend not in BACKENDS:
            raise ConfigError(
                f"{where}: collector.backend = {self.collector.backend!r}; expected one of {', '.join(BACKENDS)}"
            )
        for section, key in (("collector", "hook_timeout_s"), ("agent", "interval_s"),
                             ("agent", "timeline_interval_s"), ("collector", "agent_stale_s")):
            if getattr(self, section).__dict__[key] <= 0:
                raise ConfigError(f"{where}: {section}.{key} must be > 0")
        if self.agent.interval_s < 1.0:
            # GPM returns zeros / NaN for windows shorter than ~1 s (measured on H100).
            raise ConfigError(f"{where}: agent.interval_s must be >= 1 s (GPM needs >= 1 s windows)")
        for key, value in self.analysis.as_dict().items():
            if key.endswith("_pct") and not 0 <= value <= 100:
                raise ConfigError(f"{where}: analysis.{key} = {value} is not a percentage (0-100)")
        if self.simulated.gpus_per_node < 1:
            raise ConfigError(f"{where}: simulated.gpus_per_node must be >= 1")

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {s: getattr(self, s).as_dict() for s in SCHEMA}


def _hint(word: str, choices: Any) -> str:
    import difflib  # only on the error path: keeps the hooks' start-up lean

    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _check(where: str, section: str, key: str, value: Any, typ: Any) -> Any:
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
        raise ConfigError(
            f"{where}: {section}.{key} must be {typ.__name__}, got {type(value).__name__} ({value!r})"
        )
    return value


def config_path(explicit: str | None = None) -> tuple[str, bool]:
    """Return (path, was_named): named paths must exist, the default one may be absent."""
    if explicit:
        return explicit, True
    env = os.environ.get(ENV_VAR)
    if env:
        return env, True
    return DEFAULT_PATH, False


def load(explicit: str | None = None) -> Config:
    """Load and validate the config; raise ConfigError with a one-line explanation on any problem."""
    path, named = config_path(explicit)
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        if named:
            raise ConfigError(f"config file {path} does not exist") from None
        return Config(None, source="<defaults>")
    except PermissionError:
        raise ConfigError(f"config file {path} is not readable by this user") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return Config(data, source=path)
