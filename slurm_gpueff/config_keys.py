"""The machinery of the config's sections: typed keys with defaults and checks, read-only sections.

Apart from :mod:`.config` (the sections, the file, the relations between keys) so that each stays small;
stdlib only, like config: the hooks load it on every job.
"""

from collections.abc import Callable
from typing import ClassVar, NamedTuple, NoReturn, TypeVar, cast, dataclass_transform

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


def _must(needles: tuple[str, ...], what: str, present: bool = True) -> Check:
    return lambda v, unit: None if not isinstance(v, str) or any(n in v for n in needles) is present else what


def _database(v: object, unit: str) -> str | None:
    scheme, sep, rest = str(v).partition("://")
    userinfo = rest.split("/", 1)[0].rpartition("@")[0]
    if sep and ":" in userinfo:  # users read this file: a password here is everyone's
        return (" must not hold a password (every user reads this file): put the password in a file "
                "named by paths.database_password_file, readable only by the service account")
    if sep and scheme == "sqlite" and rest.strip("/") in ("", ":memory:"):
        return f" = {v!r}: an in-memory database keeps nothing; name a file (sqlite:////PATH)"
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


