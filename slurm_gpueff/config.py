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
        "metrics_address": (str, "127.0.0.1"),
        "metrics_port": (int, 0),
    },
    "dcgm": {
        "bindings_path": (str, ""),
        "hostengine": (str, "127.0.0.1:5555"),
        "connect_timeout_s": (float, 1.0),
        "update_interval_s": (float, 5.0),
        "keep_age_s": (float, 691200.0),
        "profiling": (bool, True),
        "exporter_mapping": (bool, False),
        "exporter_mapping_dir": (str, "/run/dcgm-exporter/job-mapping"),
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
    # Reports (issue 5): SMTP delivery, then who gets which per-job card and monthly summary.
    "mail": {
        "host": (str, "localhost"),
        "port": (int, 25),
        "security": (str, "none"),
        "username": (str, ""),
        "password_file": (str, ""),
        "from_address": (str, "slurm-gpueff@localhost"),
        "reply_to": (str, ""),
        "timeout_s": (float, 30.0),
        "retries": (int, 3),
        "backoff_s": (float, 2.0),
        "retry_after_s": (float, 900.0),
        "max_attempts": (int, 8),
        "dry_run": (bool, False),
    },
    "reports": {
        "dir": (str, "/var/lib/slurm-gpueff/reports"),
        "cards": (bool, False),
        "address_pattern": (str, "{user}"),
        "addresses": (dict, {}),
        "card_min_gpu_hours": (float, 1.0),
        "card_only_unhealthy": (bool, True),
        "card_max_per_user_per_day": (int, 3),
        "card_lookback_h": (float, 48.0),
        "optout_file": (str, ""),
        "monthly": (bool, False),
        "leads": (dict, {}),
        "admins": (list, []),
        "price_per_gpu_hour": (dict, {}),
        "currency": (str, "EUR"),
        "contact": (str, ""),
    },
    # Slurm accounting (issue 3): the sacct reader behind `gpueff enrich` / `gpueff backfill`.
    "sacct": {
        "command": (str, "sacct"),
        "format": (str, "auto"),
        "timeout_s": (float, 60.0),
        "batch_size": (int, 500),
        "enrich_window_days": (float, 14.0),
        "backfill_grace_s": (float, 600.0),
        "settle_s": (float, 120.0),
    },
    # seff-gpu privacy (issue 3): like sacct with PrivateData=jobs.
    "privacy": {
        "enabled": (bool, True),
        "admins": (list, []),
    },
    # The service host (issue 4): `gpueff serve` schedules (seconds; 0 disables a task), /metrics, and the
    # node-side `gpueff forward`.
    "service": {
        "ingest_interval_s": (float, 60.0),
        "ingest_workers": (int, 0),
        "enrich_interval_s": (float, 300.0),
        "rollup_interval_s": (float, 600.0),
        "rollup_full_interval_s": (float, 86400.0),
        "retention_interval_s": (float, 86400.0),
        "timeline_retention_days": (float, 180.0),
        "cards_interval_s": (float, 300.0),
        "monthly_report_hour": (int, 6),
        "misfire_grace_s": (float, 3600.0),
        "plugins": (list, []),
        "metrics_address": (str, "127.0.0.1"),
        "metrics_port": (int, 9817),
        "metrics_top_users": (int, 50),
        "metrics_top_accounts": (int, 200),
        "forward_interval_s": (float, 30.0),
        "forward_max_backoff_s": (float, 600.0),
    },
}
MAIL_SECURITY = ("none", "starttls", "ssl")


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
    dcgm: Section
    simulated: Section
    analysis: Section
    service: Section
    mail: Section
    reports: Section
    sacct: Section
    privacy: Section

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
        if not 0 <= self.agent.metrics_port < 65536:
            raise ConfigError(f"{where}: agent.metrics_port = {self.agent.metrics_port} is not a TCP port (0 = off)")
        for key, value in self.analysis.as_dict().items():
            if key.endswith("_pct") and not 0 <= value <= 100:
                raise ConfigError(f"{where}: analysis.{key} = {value} is not a percentage (0-100)")
        for key in ("connect_timeout_s", "update_interval_s", "keep_age_s"):
            if self.dcgm.__dict__[key] <= 0:
                raise ConfigError(f"{where}: dcgm.{key} must be > 0")
        if self.simulated.gpus_per_node < 1:
            raise ConfigError(f"{where}: simulated.gpus_per_node must be >= 1")
        self._validate_reports(where)
        self._validate_service(where)
        self._validate_slurm(where)

    def _validate_slurm(self, where: str) -> None:
        """[sacct] and [privacy] (issue 3)."""
        if self.sacct.format not in ("auto", "json", "parsable"):
            raise ConfigError(f"{where}: sacct.format = {self.sacct.format!r}; expected auto, json or parsable")
        if self.sacct.settle_s < 0:
            raise ConfigError(f"{where}: sacct.settle_s must be >= 0, got {self.sacct.settle_s}")
        if self.sacct.timeout_s <= 0 or self.sacct.batch_size < 1 or self.sacct.enrich_window_days <= 0:
            raise ConfigError(f"{where}: sacct.timeout_s, sacct.batch_size and sacct.enrich_window_days must be > 0")
        if self.sacct.backfill_grace_s < 0:
            raise ConfigError(f"{where}: sacct.backfill_grace_s must be >= 0")
        if not all(isinstance(a, str) and a for a in self.privacy.admins):
            raise ConfigError(f"{where}: privacy.admins must be a list of user names")

    def _validate_service(self, where: str) -> None:
        """[service] (issue 4): non-negative schedules, a real port, positive caps."""
        sv = self.service
        for key, value in sv.as_dict().items():
            if isinstance(value, float) and value < 0:
                raise ConfigError(f"{where}: service.{key} must be >= 0")
        if not 0 <= sv.metrics_port < 65536:
            raise ConfigError(f"{where}: service.metrics_port = {sv.metrics_port} is not a TCP port (0 = off)")
        if not 0 <= sv.monthly_report_hour <= 23:
            raise ConfigError(f"{where}: service.monthly_report_hour must be 0-23")
        if sv.metrics_top_users < 0 or sv.metrics_top_accounts < 0:
            raise ConfigError(f"{where}: service.metrics_top_users and metrics_top_accounts must be >= 0")
        if not 0 <= sv.ingest_workers <= 64:
            raise ConfigError(f"{where}: service.ingest_workers must be 0 (automatic) to 64")
        if sv.forward_interval_s <= 0:
            raise ConfigError(f"{where}: service.forward_interval_s must be > 0")
        if not all(isinstance(m, str) and m for m in sv.plugins):
            raise ConfigError(f"{where}: service.plugins must be a list of module names")

    def _validate_reports(self, where: str) -> None:
        """[mail] and [reports]: choices, ranges, and the shapes of the maps (issue 5)."""
        mail, rep = self.mail, self.reports
        if mail.security not in MAIL_SECURITY:
            raise ConfigError(f"{where}: mail.security = {mail.security!r}; expected one of "
                              f"{', '.join(MAIL_SECURITY)}")
        if not 0 < mail.port < 65536:
            raise ConfigError(f"{where}: mail.port = {mail.port} is not a TCP port")
        for key in ("retries", "max_attempts"):
            if getattr(mail, key) < 1:
                raise ConfigError(f"{where}: mail.{key} must be >= 1")
        for key in ("timeout_s", "backoff_s", "retry_after_s"):
            if getattr(mail, key) < 0:
                raise ConfigError(f"{where}: mail.{key} must be >= 0")
        if rep.card_max_per_user_per_day < 0 or rep.card_min_gpu_hours < 0 or rep.card_lookback_h <= 0:
            raise ConfigError(f"{where}: reports.card_max_per_user_per_day and card_min_gpu_hours must be "
                              ">= 0, card_lookback_h > 0")
        if "{user}" not in rep.address_pattern:
            raise ConfigError(f"{where}: reports.address_pattern must contain {{user}}, e.g. "
                              "\"{user}@example.org\"")
        for user, addr in rep.addresses.items():
            if not isinstance(addr, str) or "\n" in addr:
                raise ConfigError(f"{where}: reports.addresses.{user} must be one address (a string)")
        for account, addrs in rep.leads.items():
            if isinstance(addrs, str):
                addrs = [addrs]
            if not isinstance(addrs, list) or not all(isinstance(a, str) for a in addrs):
                raise ConfigError(f"{where}: reports.leads.{account} must be an address or a list of them")
        if not all(isinstance(a, str) for a in rep.admins):
            raise ConfigError(f"{where}: reports.admins must be a list of addresses")
        for model, price in rep.price_per_gpu_hour.items():
            if isinstance(price, bool) or not isinstance(price, int | float) or price < 0:
                raise ConfigError(f"{where}: reports.price_per_gpu_hour.{model!r} must be a number >= 0")

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
