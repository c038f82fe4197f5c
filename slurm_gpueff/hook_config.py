"""The hooks' config loading: a broken config must never lose a job's record.

Unlike the service commands, which refuse a bad config, the hooks keep every setting that is valid on
its own (the spool and state paths above all), use the defaults for the rest, and put the problem in
the record's reason. Stdlib only (hook path).
"""

from __future__ import annotations

import os

from . import config as cfgmod

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from typing import Any

    from .config import Config


def load_config(config_path: str | None, env: Mapping[str, str],
                log: Callable[[str, str], None]) -> tuple[Config, str | None]:
    """The config (explicit path > $GPUEFF_CONFIG in ``env`` > default file > built-in defaults) and
    the problem that made it fall back to defaults, if any."""
    path = config_path or env.get(cfgmod.ENV_VAR) or None
    try:
        if path:
            return cfgmod.load(path), None
        if os.path.exists(cfgmod.DEFAULT_PATH):
            return cfgmod.load(cfgmod.DEFAULT_PATH), None
        return cfgmod.Config(), None
    except Exception as exc:  # noqa: BLE001 - ConfigError, or anything odd while reading
        where = "" if path is None or path in str(exc) else f"{path}: "
        problem = f"config problem ({where}{exc}); using defaults for the unusable settings"
        log("error", problem)
        return salvage(path or cfgmod.DEFAULT_PATH), problem


def salvage(path: str) -> Config:
    """Every setting of a broken config file that is valid on its own (paths above all)."""
    try:  # read() never waits on a FIFO
        data = cfgmod.read(path)
    except Exception:  # noqa: BLE001
        data = {}
    good: dict[str, dict[str, Any]] = {}
    for section, keys in cfgmod.Config().as_dict().items():
        given = data.get(section)
        if not isinstance(given, dict):
            continue
        for key, value in given.items():
            if key in keys:
                try:
                    cfgmod.Config({section: {key: value}})
                except Exception:  # noqa: BLE001
                    continue
                good.setdefault(section, {})[key] = value
    paths_only: dict[str, Any] = {s: good[s] for s in ("paths", "site") if s in good}
    for keep in (good, paths_only, {}):
        try:
            return cfgmod.Config(keep, source=f"{path} (salvaged)")
        except Exception:  # noqa: BLE001
            continue
    return cfgmod.Config()

