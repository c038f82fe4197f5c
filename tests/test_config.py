"""Config loading and validation: every bad input gets a one-line error naming the file and key."""

from __future__ import annotations

import os

import pytest

from slurm_gpueff import config
from slurm_gpueff.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def write(tmp_path, text: str) -> str:
    p = tmp_path / "gpueff.toml"
    p.write_text(text)
    return str(p)


def test_example_in_etc_is_valid_and_equals_defaults():
    """etc/gpueff.toml documents every key with its default value; keep the two in step."""
    cfg = config.load(os.path.join(ROOT, "etc", "gpueff.toml"))
    assert cfg.as_dict() == config.Config().as_dict()
    with open(os.path.join(ROOT, "etc", "gpueff.toml")) as fh:
        text = fh.read()
    for section, keys in config.SCHEMA.items():
        assert f"[{section}]" in text
        for key in keys:
            assert f"\n{key} = " in text, f"{section}.{key} is not documented in etc/gpueff.toml"


def test_values_override_defaults(tmp_path):
    cfg = config.load(write(tmp_path, '[site]\ncluster = "hpc1"\n[agent]\ninterval_s = 2\n'))
    assert cfg.site.cluster == "hpc1"
    assert cfg.agent.interval_s == 2.0 and isinstance(cfg.agent.interval_s, float)
    assert cfg.paths.spool_dir == "/var/spool/slurm-gpueff"


@pytest.mark.parametrize(
    "text, message",
    [
        ("[site\ncluster = 1", "not valid TOML"),
        ("[sites]\ncluster = 'x'", "unknown section [sites] (did you mean 'site'?)"),
        ("[paths]\nspool = 'x'", "unknown key paths.spool"),
        ("[agent]\ninterval_s = 'fast'", "agent.interval_s must be float, got str"),
        ("[agent]\ninterval_s = 0.1", "agent.interval_s must be >= 1 s"),
        ("[collector]\nbackend = 'gpu'", "collector.backend = 'gpu'; expected one of"),
        ("[analysis]\nbusy_sm_pct = 130", "is not a percentage"),
        ("[simulated]\ngpus_per_node = true", "simulated.gpus_per_node must be int"),
        ("paths = 3", "[paths] must be a table"),
        ("[service]\ningest_workers = 65", "service.ingest_workers must be 0 (automatic) to 64"),
        ("[service]\ningest_workers = -1", "service.ingest_workers must be 0 (automatic) to 64"),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        config.load(path)
    assert message in str(err.value)
    assert path in str(err.value) or "not valid TOML" in str(err.value)


def test_named_missing_file_is_an_error_default_missing_is_not(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="does not exist"):
        config.load(str(tmp_path / "nope.toml"))
    monkeypatch.setenv("GPUEFF_CONFIG", str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match="does not exist"):
        config.load()
    monkeypatch.delenv("GPUEFF_CONFIG")
    monkeypatch.setattr(config, "DEFAULT_PATH", str(tmp_path / "absent.toml"))
    assert config.load().source == "<defaults>"


def test_env_var_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUEFF_CONFIG", write(tmp_path, '[site]\ncluster = "from-env"\n'))
    assert config.load().site.cluster == "from-env"
    assert config.load(write(tmp_path, '[site]\ncluster = "explicit"\n')).site.cluster == "explicit"
