"""Configuration: one TOML file, validated up front with errors that name the file and the key.

A class per ``[section]``, an annotated attribute per key (type, default and, through ``_key``, its check);
``[leads]``, whose keys are the site's Slurm accounts, is a table of its own on ``Config``. ``Config(data)``
refuses unknown names (a key that moved says where to), wrong types, NaN and infinities, out-of-range
values and keys that cannot work together. ``etc/gpueff.toml`` documents every key. The hooks load this on
every job, so it is stdlib only: the sections are frozen dataclasses to type checkers
(``dataclass_transform``) without the costly ``dataclasses`` import. Annotations are not postponed, so
``_typed`` reads them as classes.

Lookup order: ``--config PATH`` > ``$GPUEFF_CONFIG`` > ``/etc/slurm-gpueff/gpueff.toml``; only the
default file may be missing (every key has a default).
"""

import math
import os
import stat
import tomllib
import types
from collections.abc import Callable, Iterable, Mapping
from typing import ClassVar, NamedTuple, NoReturn, TypeVar, cast, dataclass_transform

from .errors import ConfigError, GpueffError

T = TypeVar("T")
Check = Callable[[object, str], str | None]  # (value, unit) -> what is wrong, or None

DB_SCHEMES = ("sqlite", "postgresql", "postgresql+psycopg")  # what storage.db can open
DAY = 86400.0
YEAR = 366 * DAY


def _n(x: float, unit: str = "") -> str:
    days = f" ({x / DAY:.15g} days)" if unit == " s" and x >= DAY else ""
    return f"{x:.15g}{unit}{days}"


def _range(lo: float, hi: float | None, *, above: bool = False, off: bool = False, text: str = "") -> Check:
    """lo <= value <= hi (lo < value with ``above``; 0 too with ``off``, where 0 switches a thing off)."""
    def check(v: object, unit: str) -> str | None:
        if not isinstance(v, int | float) or (off and v == 0):
            return None
        if (v > lo if above else v >= lo) and (hi is None or v <= hi):
            return None
        if text:
            return text.format(v=v)
        span = f"{'>' if above else '>='} {_n(lo, unit)}" + (f" and <= {_n(hi, unit)}" if hi is not None else "")
        return f" must be {'0 (off) or ' if off else ''}{span}, got {v}"
    return check


def _one_of(choices: tuple[str, ...]) -> Check:
    def check(v: object, unit: str) -> str | None:
        return None if v in choices else f" = {v!r}; expected one of {', '.join(choices)}"
    return check


def _not_empty(v: object, unit: str) -> str | None:
    return " must not be empty" if v == "" else " must not hold a NUL byte" if "\0" in str(v) else None


def _absolute_or_off(v: object, unit: str) -> str | None:
    """"" (off) or an absolute path: a relative one would depend on whichever directory a command runs in."""
    text = str(v)
    if text == "" or (text.startswith("/") and "\0" not in text):
        return None
    return f" = {text!r}: expected an absolute path, or \"\" (none)"


def _must(needles: tuple[str, ...], what: str, present: bool = True) -> Check:
    return lambda v, unit: None if not isinstance(v, str) or any(n in v for n in needles) is present else what


def _all(*checks: Check) -> Check:
    """Every check, the first problem found."""
    return lambda v, unit: next((p for c in checks if (p := c(v, unit))), None)


def _database(v: object, unit: str) -> str | None:
    scheme, sep, rest = str(v).partition("://")
    userinfo = rest.split("/", 1)[0].rpartition("@")[0]
    if sep and ":" in userinfo:  # users read this file: a password here is everyone's
        return (" must not hold a password (every user reads this file): put the password in a file "
                "named by paths.database_password_file, readable only by the service account")
    if sep and scheme == "sqlite" and rest.strip("/") in ("", ":memory:"):
        return f" = {v!r}: an in-memory database keeps nothing; name a file (sqlite:////PATH)"
    if sep and scheme == "sqlite" and not rest.split("?", 1)[0].startswith("//"):
        return (f" = {v!r}: a relative path (relative to whichever directory a command runs in); name the "
                f"file by its absolute path: sqlite:////ABSOLUTE/PATH (four slashes)")
    if not sep and not str(v).startswith("/") and str(v):
        return f" = {v!r}: a relative path (relative to whichever directory a command runs in); use an absolute path"
    if not sep or scheme in DB_SCHEMES:  # a plain path, or a URL storage.db can open
        return _not_empty(v, unit)
    return (f" = {v!r}: unsupported database {scheme!r}; use a file path, sqlite:////PATH or "
            "postgresql+psycopg://USER@HOST/DB")


def _address(url: bool) -> Check:
    """"" (off, or derived), ``unix:/ABSOLUTE/PATH``, and ``HOST:PORT`` to listen on or ``http(s)://`` to reach."""
    def check(v: object, unit: str) -> str | None:
        text = str(v)
        host, sep, port = text.rpartition(":")
        if text == "" or (text.startswith("unix:/") and len(text) > 6) or (text.startswith(("http://", "https://"))
                if url else bool(sep and host and port.isascii() and port.isdigit() and 0 < int(port) < 65536)):
            return None
        return f" = {text!r}: expected {'http://' if url else ''}HOST:PORT, unix:/ABSOLUTE/PATH or \"\""
    return check


_PCT = _range(0, 100, text=" = {v} is not a percentage (0-100)")
# mail headers and what goes into them: a CR or LF would end the header and start another
_ONE_LINE = _must(("\n", "\r", "\0"), " must be one line (no CR, LF or NUL: it goes into a mail header)", False)
_PORT_OR_OFF = _range(0, 65535, text=" = {v} is not a TCP port (0 = off)")
_SCHEDULE = _range(1, YEAR, off=True)  # a task of ``gpueff serve``: 0 disables it; under 1 s is a busy loop


class _Key(NamedTuple):
    """A key's default, what its value must pass beyond its type (each item's, for a table or a list)
    and, for a table or a list, the words its error messages use for a valid value."""

    default: object
    check: Check | None = None
    what: str = ""


def _key(default: T, check: Check | None = None, what: str = "") -> T:
    return cast(T, _Key(default, check, what))  # typed as the value: Section swaps it for the default


class FrozenError(AttributeError):
    """The configuration is read-only: build a new ``Config`` to change a value."""


def _read_only(self: object, name: str, value: object = None) -> NoReturn:
    raise FrozenError(f"cannot change {type(self).__name__}.{name}: the configuration is read-only")


@dataclass_transform(frozen_default=True)
class Section:
    """Base of the section classes: each annotated class attribute is a key, its value the default or a _key."""

    KEYS: ClassVar[dict[str, tuple[object, _Key]]]  # key -> (type, _Key), in the class's order
    MOVED: ClassVar[dict[str, str]] = {}  # a key that went elsewhere -> where, for its error message
    REMOVED: ClassVar[dict[str, str]] = {}  # a key that is gone -> why, for its error message

    def __init_subclass__(cls) -> None:
        cls.KEYS = {}
        for name, tp in cls.__annotations__.items():
            spec = cls.__dict__.get(name)
            spec = spec if isinstance(spec, _Key) else _Key(spec)
            cls.KEYS[name] = (tp, spec)
            setattr(cls, name, spec.default)  # the default, readable on the class

    def __init__(self, **values: object) -> None:
        for name, (_tp, spec) in self.KEYS.items():
            value = values.pop(name, spec.default)
            object.__setattr__(self, name, type(value)(value) if isinstance(value, dict | list) else value)
        if values:
            raise TypeError(f"{type(self).__name__} has no key {', '.join(values)}")

    __setattr__ = __delattr__ = _read_only

    def as_dict(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.KEYS}

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and isinstance(other, Section) and other.as_dict() == self.as_dict()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in self.as_dict().items())})"

DEFAULT_PATH = "/etc/slurm-gpueff/gpueff.toml"
ENV_VAR = "GPUEFF_CONFIG"
__all__ = ["DAY", "YEAR", "FrozenError", "Section"]


class SiteConfig(Section):
    """[site]: the cluster's name, recorded with every job."""
    cluster: str = "cluster"


class PathsConfig(Section):
    """[paths]: spool, runtime state and the database."""
    spool_dir: str = _key("/var/spool/slurm-gpueff", _not_empty)
    state_dir: str = _key("/run/slurm-gpueff", _not_empty)
    spool_fallback_dir: str = _key("", _absolute_or_off)
    database: str = _key("sqlite:////var/lib/slurm-gpueff/gpueff.db", _database)
    database_password_file: str = ""


class SpoolConfig(Section):
    """[spool]: which files in the spool ingest and forward trust."""
    owner: str = ""
    max_file_mb: float = _key(64.0, _range(0, 4096, above=True))
    stuck_h: float = _key(1.0, _range(0, YEAR / 3600, above=True))


class CollectorConfig(Section):
    """[collector]: which backend measures the GPUs, and the hooks' time bound."""
    backend: str = _key("auto", _one_of(("auto", "nvml", "dcgm", "simulated", "none")))
    hook_timeout_s: float = _key(10.0, _range(0, 300, above=True))
    agent_stale_s: float = _key(30.0, _range(0, 3600, above=True))
    tick_wait_s: float = _key(1.5, _range(0, 10))
    dev_dir: str = _key("/dev", _not_empty)


class AgentConfig(Section):
    """[agent]: the node agent's sampling, timelines and live gauges."""
    interval_s: float = _key(5.0, _range(1, 3600, text=" must be >= 1 s (GPM needs windows of at least 1 s)"
                                                       " and <= 3600 s, got {v}"))
    timeline_interval_s: float = _key(60.0, _range(0, DAY, above=True))
    timeline_keep_h: float = _key(168.0, _range(0, YEAR / 3600, above=True))
    metrics_address: str = "127.0.0.1"
    metrics_port: int = _key(0, _PORT_OR_OFF)
    metrics_per_user: bool = False
    metrics_token_file: str = ""
    live_interval_s: float = _key(300.0, _range(10, DAY, off=True))


class DcgmConfig(Section):
    """[dcgm]: the DCGM backend's hostengine and watches."""
    bindings_path: str = ""
    hostengine: str = "127.0.0.1:5555"
    connect_timeout_s: float = _key(1.0, _range(0, 60, above=True))
    update_interval_s: float = _key(5.0, _range(0, 3600, above=True))
    keep_age_s: float = _key(691200.0, _range(0, YEAR, above=True))
    profiling: bool = True
    exporter_mapping: bool = False
    exporter_mapping_dir: str = _key("/run/dcgm-exporter/job-mapping", _not_empty)


class SimulatedConfig(Section):
    """[simulated]: synthetic GPUs for tests and demos."""
    REMOVED = {"gpus_per_node": "it did nothing (a simulated job has the GPUs Slurm gave it)"}
    profile: str = "bf16-healthy"
    model: str = "Simulated H100 80GB"


class AnalysisConfig(Section):
    """[analysis]: the verdicts' thresholds (percent)."""
    never_used_kernel_pct: float = _key(5.0, _PCT)
    starved_kernel_pct: float = _key(50.0, _PCT)
    busy_kernel_pct: float = _key(80.0, _PCT)
    busy_sm_pct: float = _key(30.0, _PCT)
    busy_efficiency_pct: float = _key(10.0, _PCT)
    tensor_idle_sm_pct: float = _key(30.0, _PCT)
    tensor_idle_tensor_pct: float = _key(2.0, _PCT)
    tensor_idle_fp32_pct: float = _key(10.0, _PCT)
    memory_bound_dram_pct: float = _key(50.0, _PCT)
    memory_bound_tensor_pct: float = _key(20.0, _PCT)
    oversized_memory_pct: float = _key(25.0, _PCT)
    oversized_sm_pct: float = _key(40.0, _PCT)
    min_gpu_hours: float = _key(0.0, _range(0, None))
    short_job_s: float = _key(60.0, _range(0, DAY))
    starved_cpu_busy_pct: float = _key(80.0, _PCT)
    starved_cpu_idle_pct: float = _key(50.0, _PCT)


class MailConfig(Section):
    """[mail]: SMTP delivery of reports."""
    host: str = "localhost"
    port: int = _key(25, _range(1, 65535, text=" = {v} is not a TCP port"))
    security: str = _key("none", _one_of(("none", "starttls", "ssl")))
    username: str = ""
    password_file: str = ""
    from_address: str = _key("slurm-gpueff@localhost", _ONE_LINE)
    reply_to: str = _key("", _ONE_LINE)
    timeout_s: float = _key(30.0, _range(0, 600, above=True))
    retries: int = _key(3, _range(1, 10))
    backoff_s: float = _key(2.0, _range(0, 600))
    retry_after_s: float = _key(900.0, _range(0, 7 * DAY))
    max_attempts: int = _key(8, _range(1, 100))
    dry_run: bool = False


# Where [reports] leads (addresses) and [privacy] leads (user names) went: one map for both.
_LEADS_MOVED = ("[leads] (account = [user names]), who see the account's jobs and get its monthly summary; "
                "their mail addresses come from reports.addresses / reports.address_pattern")


class ReportsConfig(Section):
    """[reports]: who gets which per-job card and monthly summary (an account's: [leads])."""
    MOVED = {"leads": _LEADS_MOVED}
    dir: str = _key("/var/lib/slurm-gpueff/reports", _not_empty)
    cards: bool = False
    address_pattern: str = _key("{user}", _all(_ONE_LINE, _must(("{user}",), ' must contain {user}, e.g. '
                                                                '"{user}@example.org"')))
    addresses: dict[str, str] = _key({}, _ONE_LINE, "one address (a string)")
    card_min_gpu_hours: float = _key(1.0, _range(0, None))
    card_only_unhealthy: bool = True
    card_max_per_user_per_day: int = _key(3, _range(0, 1000))
    card_lookback_h: float = _key(48.0, _range(0, YEAR / 3600, above=True))
    optout_file: str = ""
    monthly: bool = False
    coordinators_as_leads: bool = True
    admins: list[str] = _key([], _ONE_LINE, "a list of addresses")
    price_per_gpu_hour: dict[str, float] = _key({}, _range(0, None), "a number >= 0")
    currency: str = "EUR"
    contact: str = _key("", _ONE_LINE)


class SacctConfig(Section):
    """[sacct]: the Slurm accounting reader behind enrich and backfill."""
    accounting: bool = True
    command: str = _key("sacct", _not_empty)
    format: str = _key("auto", _one_of(("auto", "json", "parsable")))
    timeout_s: float = _key(60.0, _range(0, 3600, above=True))
    batch_size: int = _key(500, _range(1, 10000))
    enrich_window_days: float = _key(14.0, _range(0, 366, above=True))
    backfill_grace_s: float = _key(600.0, _range(0, DAY))
    settle_s: float = _key(120.0, _range(0, DAY))


class PrivacyConfig(Section):
    """[privacy]: seff-gpu shows users only their own jobs, like sacct with PrivateData=jobs (and an
    account's jobs to its [leads])."""
    MOVED = {"leads": _LEADS_MOVED}
    enabled: bool = True
    admins: list[str] = _key([], _not_empty, "a list of user names")
    coordinators: bool = True


class ServiceConfig(Section):
    """[service]: ``gpueff serve``'s schedules (0 disables a task), /metrics, ``gpueff forward``."""
    REMOVED = {"ingest_workers": "it did nothing (ingest runs in one process)",
               "plugins": "gpueff serve runs its own tasks only (a site's own job belongs in cron or a systemd timer)"}
    ingest_interval_s: float = _key(60.0, _SCHEDULE)
    enrich_interval_s: float = _key(300.0, _SCHEDULE)
    rollup_interval_s: float = _key(600.0, _SCHEDULE)
    rollup_full_interval_s: float = _key(86400.0, _SCHEDULE)
    retention_interval_s: float = _key(86400.0, _SCHEDULE)
    timeline_retention_days: float = _key(180.0, _range(0, 36600))
    cards_interval_s: float = _key(300.0, _SCHEDULE)
    monthly_report_hour: int = _key(6, _range(0, 23))
    integrity_interval_s: float = _key(86400.0, _SCHEDULE)
    integrity_limit_s: float = _key(300.0, _range(1, DAY))
    misfire_grace_s: float = _key(3600.0, _range(0, DAY))
    metrics_address: str = "127.0.0.1"
    metrics_port: int = _key(9817, _PORT_OR_OFF)
    metrics_top_users: int = _key(50, _range(0, 100000))
    metrics_top_accounts: int = _key(200, _range(0, 100000))
    metrics_per_user: bool = False
    metrics_token_file: str = ""
    push_users: list[str] = _key([], _not_empty, "a list of user names or uids")
    push_max_mb: float = _key(64.0, _range(1, 1024))
    push_slots: int = _key(2, _range(1, 64))
    push_wait_s: float = _key(4.0, _range(0, 300, above=True))
    forward_interval_s: float = _key(15.0, _range(0, 3600, above=True))
    forward_max_backoff_s: float = _key(120.0, _range(0, DAY))
    api_listen: str = _key("", _address(url=False))
    api_url: str = _key("", _address(url=True))
    api_timeout_s: float = _key(10.0, _range(0, 600, above=True))
    user: str = _key("root", _not_empty)
    munge_socket: str = ""


class AlertsConfig(Section):
    """[alerts]: ``gpueff serve``'s idle-GPU policy for running jobs. Off by default; even on, it only
    warns unless ``cancel`` is true. Judged over the last ``window_min`` of each GPU, never the whole job."""
    enabled: bool = False
    interval_s: float = _key(300.0, _range(1, DAY))
    dry_run: bool = False
    window_min: float = _key(60.0, _range(0, 10080, above=True))
    kernel_pct: float = _key(5.0, _PCT)
    sm_pct: float = _key(1.0, _PCT)
    min_coverage_pct: float = _key(80.0, _PCT)
    grace_min: float = _key(30.0, _range(0, 10080))
    stale_min: float = _key(20.0, _range(1, 10080))
    warn_again_min: float = _key(30.0, _range(0, 10080, above=True))
    cancel: bool = False
    cancel_after_min: float = _key(30.0, _range(0, 10080))
    max_mails_per_user_per_day: int = _key(10, _range(1, 1000))
    exempt_interactive: bool = True
    exempt_partitions: list[str] = _key([], _not_empty, "a list of partition names")
    exempt_qos: list[str] = _key([], _not_empty, "a list of QOS names")
    exempt_accounts: list[str] = _key([], _not_empty, "a list of account names")
    exempt_users: list[str] = _key([], _not_empty, "a list of user names")


class Config:
    """The validated configuration, read-only; ``source`` is the file it came from. ``leads``: Slurm account
    -> the user names who lead it; they see its jobs and get its monthly summary."""

    site: SiteConfig
    paths: PathsConfig
    spool: SpoolConfig
    collector: CollectorConfig
    agent: AgentConfig
    dcgm: DcgmConfig
    simulated: SimulatedConfig
    analysis: AnalysisConfig
    mail: MailConfig
    reports: ReportsConfig
    sacct: SacctConfig
    privacy: PrivacyConfig
    leads: dict[str, list[str]]
    service: ServiceConfig
    alerts: AlertsConfig
    source: str

    def __init__(self, data: Mapping[str, object] | None = None, source: str = "<defaults>") -> None:
        data = data or {}
        for name in data:
            if name not in SECTIONS and name != "leads":
                raise ConfigError(f"{source}: unknown section [{_name(name)}]{_hint(name, [*SECTIONS, 'leads'])}")
        for name, cls in SECTIONS.items():
            object.__setattr__(self, name, _section(cls, name, data.get(name, {}), source))
        object.__setattr__(self, "leads", _leads(data.get("leads", {}), source))
        object.__setattr__(self, "source", source)
        problem = _relations(self)
        if problem:
            raise ConfigError(f"{source}: {problem}")

    __setattr__ = __delattr__ = _read_only

    def as_dict(self) -> dict[str, dict[str, object]]:
        out: dict[str, dict[str, object]] = {name: getattr(self, name).as_dict() for name in SECTIONS}
        out["leads"] = {account: list(users) for account, users in self.leads.items()}
        return out

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and other.as_dict() == self.as_dict()

    def __repr__(self) -> str:
        return f"Config({self.source!r}, {self.as_dict()!r})"


SECTIONS: dict[str, type[Section]] = {
    name: tp for name, tp in Config.__annotations__.items() if isinstance(tp, type) and issubclass(tp, Section)}


def _name(key: object) -> str:
    """A table key as a message shows it: as written if it is plain, else quoted and escaped, so that a key
    with a line break (or only spaces) keeps the message one readable line."""
    return key if isinstance(key, str) and key and key.isprintable() and key.strip() == key else repr(key)


class _Bad(Exception):
    """A value's problem, as text after its key's name; Config's constructor adds the file."""


def _section(cls: type[Section], name: str, given: object, where: str) -> Section:
    if not isinstance(given, dict):
        raise ConfigError(f"{where}: [{name}] must be a table, not {type(given).__name__}")
    values: dict[str, object] = {}
    for key, value in given.items():
        if key in cls.MOVED:
            raise ConfigError(f"{where}: {name}.{key} moved to {cls.MOVED[key]}")
        if key in cls.REMOVED:
            raise ConfigError(f"{where}: {name}.{key} was removed: {cls.REMOVED[key]}; delete it from the file")
        if key not in cls.KEYS:
            raise ConfigError(f"{where}: unknown key {name}.{_name(key)}{_hint(key, cls.KEYS)}")
        tp, spec = cls.KEYS[key]
        unit = next((u for s, u in (("_s", " s"), ("_h", " h"), ("_days", " days")) if key.endswith(s)), "")
        try:
            values[key] = _typed(value, tp, f"{name}.{key}", unit, spec.check, spec.what)
        except _Bad as bad:
            raise ConfigError(f"{where}: {bad}") from None
    return cls(**values)


def _leads(given: object, where: str) -> dict[str, list[str]]:
    """[leads]: each account (not empty) -> a non-empty list of user names. Validated like a section's table."""
    if not isinstance(given, dict):
        raise ConfigError(f"{where}: [leads] must be a table, not {type(given).__name__}")
    what = "a non-empty list of user names"
    try:
        leads = cast(dict[str, list[str]], _typed(given, dict[str, list[str]], "leads", "", _not_empty, what))
    except _Bad as bad:
        raise ConfigError(f"{where}: {bad}") from None
    for account, users in leads.items():
        problem = _not_empty(account, "")
        if problem:
            raise ConfigError(f"{where}: an account name in [leads]{problem}")
        if not users:
            raise ConfigError(f"{where}: leads.{_name(account)} must be {what}, got []")
    return leads


def _typed(v: object, tp: object, name: str, unit: str, check: Check | None, what: str | None) -> object:
    """``v`` as type ``tp`` (ints become floats where a float is due), checked item by item in a list or a
    table (under ``name.key``); raise _Bad naming the key."""
    origin: object = getattr(tp, "__origin__", None)
    args: tuple[object, ...] = getattr(tp, "__args__", ())
    if origin is list and isinstance(v, list):
        return [_typed(x, args[0], name, unit, check, what) for x in v]
    if origin is dict and isinstance(v, dict):
        return {k: _typed(x, args[1], f"{name}.{_name(k)}", unit, check, what) for k, x in v.items()}
    if isinstance(tp, types.UnionType):
        for alternative in args:
            try:
                return _typed(v, alternative, name, unit, check, what)
            except _Bad:
                continue
    elif tp is float and isinstance(v, int | float) and not isinstance(v, bool):
        try:
            v = float(v)
        except OverflowError:  # an integer beyond the float range
            raise _Bad(f"{name} must be a finite number, got an integer of {int(v).bit_length()} bits") from None
        if not math.isfinite(v):
            raise _Bad(f"{name} must be a finite number, got {v}")
        return _checked(v, name, unit, check, what)
    elif (tp is str and isinstance(v, str)) or (tp is bool and isinstance(v, bool)) or (
            tp is int and isinstance(v, int) and not isinstance(v, bool)):
        return _checked(v, name, unit, check, what)
    kind = what or (tp.__name__ if isinstance(tp, type) else str(tp))
    raise _Bad(f"{name} must be {kind}, got {type(v).__name__} ({v!r})")


def _checked(v: object, name: str, unit: str, check: Check | None, what: str | None) -> object:
    problem = check(v, unit) if check else None
    if problem:
        raise _Bad(f"{name} must be {what}, got {v!r}" if what else f"{name}{problem}")
    return v


def _relations(c: Config) -> str | None:
    """Keys that are fine on their own but cannot work together; the first such problem, naming a key."""
    a, sv = c.agent, c.service
    if a.timeline_interval_s < a.interval_s:
        return (f"agent.timeline_interval_s = {_n(a.timeline_interval_s)} must be >= agent.interval_s "
                f"({_n(a.interval_s)}): a timeline point spans whole samples")
    if a.timeline_keep_h * 3600 < a.timeline_interval_s:
        return "agent.timeline_keep_h must keep at least one timeline point (agent.timeline_interval_s)"
    if c.collector.agent_stale_s < 2 * a.interval_s:
        return (f"collector.agent_stale_s = {_n(c.collector.agent_stale_s)} must be >= 2 x agent.interval_s "
                f"({_n(a.interval_s)}), or a live agent looks dead between two samples")
    if c.dcgm.connect_timeout_s >= c.collector.hook_timeout_s:
        return ("dcgm.connect_timeout_s must be < collector.hook_timeout_s: the hooks try the hostengine "
                "first and must have time left for the record")
    if c.dcgm.keep_age_s < c.dcgm.update_interval_s:
        return "dcgm.keep_age_s must be >= dcgm.update_interval_s, or DCGM keeps no sample"
    if c.sacct.enrich_window_days * DAY <= c.sacct.settle_s:
        return ("sacct.enrich_window_days must be longer than sacct.settle_s, or enrich never finds "
                "a settled job")
    if sv.cards_interval_s and c.reports.card_lookback_h * 3600 < sv.cards_interval_s:
        return ("reports.card_lookback_h must cover service.cards_interval_s, or jobs that end between "
                "two runs never get a card")
    if a.live_interval_s and a.live_interval_s < a.interval_s:
        return f"agent.live_interval_s must be 0 (off) or >= agent.interval_s ({_n(a.interval_s)})"
    if c.paths.spool_fallback_dir and c.paths.spool_fallback_dir.rstrip("/") == c.paths.spool_dir.rstrip("/"):
        return ("paths.spool_fallback_dir must be another directory than paths.spool_dir: it takes the records "
                "that the spool cannot")
    if sv.forward_max_backoff_s < sv.forward_interval_s:
        return "service.forward_max_backoff_s must be >= service.forward_interval_s"
    return None


def _hint(word: str, choices: Iterable[str]) -> str:
    import difflib  # only on the error path: keeps the hooks' start-up lean

    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def read(path: str) -> dict[str, object]:
    """The TOML table in ``path``; ConfigError naming the path for anything but a readable UTF-8 TOML file
    (FileNotFoundError passes through: whether that is an error is the caller's call). Opened with O_NONBLOCK
    and read only if a regular file: a plain open() of a FIFO waits for a writer, and a device can read
    forever; a hook must not hang on a misplaced config."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise
    except PermissionError:
        raise ConfigError(f"config file {path} is not readable by this user") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be opened: {exc.strerror}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = {"d": "a directory", "p": "a FIFO", "c": "a character device", "b": "a block device",
                    "s": "a socket"}.get(stat.filemode(mode)[0], "a special file")
            raise ConfigError(f"config file {path} is {kind}, not a regular file")
        with open(fd, "rb", closefd=False) as fh:
            raw = fh.read()
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read: {exc.strerror}") from None
    finally:
        os.close(fd)
    try:  # a byte-order mark (editors on Windows write one) is not TOML, but not the admin's mistake either
        return tomllib.loads(raw.decode("utf-8").removeprefix("\ufeff"))
    except UnicodeDecodeError as exc:
        raise ConfigError(f"config file {path} is not UTF-8 text (byte {exc.start})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    except ValueError:  # int()'s limit: an integer of more than 4300 digits
        raise ConfigError(f"{path}: not valid TOML: an integer has more than 4300 digits") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid TOML: arrays or tables nested too deeply") from None


def load(explicit: str | None = None) -> Config:
    """The validated config; ConfigError with a one-line explanation on any problem."""
    named = explicit or os.environ.get(ENV_VAR)
    path = named or DEFAULT_PATH
    try:
        data = read(path)
    except FileNotFoundError:
        if named:  # a path someone named must exist; the default one may be absent
            raise ConfigError(f"config file {path} does not exist") from None
        return Config(None, source="<defaults>")
    return Config(data, source=path)


def read_secret(path: str, key: str, holds: str) -> str:
    """The first line of the secret file that config key ``key`` names (its newline stripped), e.g. a
    password or a bearer token. A file every user may read is refused: the secret would be no more private
    than in the config, which users may read."""
    try:
        with open(path, "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            if mode & 0o004:
                raise GpueffError(f"{key} {path} is readable by every user (mode {mode & 0o7777:04o}): "
                                  f"chmod 600 {path} (or 640 with the service's group)")
            line = fh.readline(65536)
    except OSError as exc:
        raise GpueffError(f"cannot read {key} {path}: {exc.strerror or exc}") from None
    secret = line.rstrip(b"\r\n").decode("utf-8", "replace")
    if not secret:
        raise GpueffError(f"{key} {path}: the first line is empty (it holds {holds})")
    return secret
