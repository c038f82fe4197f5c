"""Config loading and validation: every bad input gets a one-line error naming the file and key."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading

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
    for section, cls in config.SECTIONS.items():
        assert f"[{section}]" in text
        for key in cls().as_dict():
            assert f"\n{key} = " in text, f"{section}.{key} is not documented in etc/gpueff.toml"
    assert "\n[leads]\n" in text and cfg.leads == {}


def test_values_override_defaults(tmp_path):
    cfg = config.load(write(tmp_path, '[site]\ncluster = "hpc1"\n[agent]\ninterval_s = 2\n'))
    assert cfg.site.cluster == "hpc1"
    assert cfg.agent.interval_s == 2.0 and isinstance(cfg.agent.interval_s, float)
    assert cfg.paths.spool_dir == "/var/spool/slurm-gpueff"


def test_config_is_frozen_and_typed():
    cfg = config.Config({"reports": {"price_per_gpu_hour": {"default": 2}}})
    with pytest.raises(config.FrozenError):
        cfg.paths.spool_dir = "/elsewhere"  # type: ignore[misc]
    with pytest.raises(config.FrozenError):
        cfg.paths = cfg.paths  # type: ignore[misc]
    assert cfg.reports.price_per_gpu_hour == {"default": 2.0}
    assert isinstance(cfg.reports.price_per_gpu_hour["default"], float)
    assert config.Config().paths == config.Config().paths != cfg.paths.__class__(spool_dir="/x")
    assert config.Config().service.push_users is not config.Config().service.push_users  # no shared defaults


@pytest.mark.parametrize(
    "text, message",
    [
        ("[site\ncluster = 1", "not valid TOML"),
        ("[sites]\ncluster = 'x'", "unknown section [sites] (did you mean 'site'?)"),
        ("[paths]\nspool = 'x'", "unknown key paths.spool"),
        ("[paths]\nspool_dri = 'x'", "unknown key paths.spool_dri (did you mean 'spool_dir'?)"),
        ("[agent]\ninterval_s = 'fast'", "agent.interval_s must be float, got str"),
        ("[agent]\ninterval_s = 0.1", "agent.interval_s must be >= 1 s"),
        ("[collector]\nbackend = 'gpu'", "collector.backend = 'gpu'; expected one of"),
        ("[analysis]\nbusy_sm_pct = 130", "is not a percentage"),
        ("paths = 3", "[paths] must be a table"),
        # NaN and infinities, in any float (TOML spells them nan, inf, -inf)
        ("[agent]\ntimeline_interval_s = nan", "agent.timeline_interval_s must be a finite number, got nan"),
        ("[collector]\nhook_timeout_s = inf", "collector.hook_timeout_s must be a finite number, got inf"),
        ("[sacct]\nsettle_s = -inf", "sacct.settle_s must be a finite number, got -inf"),
        ("[analysis]\nmin_gpu_hours = nan", "analysis.min_gpu_hours must be a finite number, got nan"),
        ("[reports]\nprice_per_gpu_hour = { default = inf }",
         "reports.price_per_gpu_hour.default must be a finite number, got inf"),
        # negative
        ("[collector]\nhook_timeout_s = -1", "collector.hook_timeout_s must be > 0 s and <= 300 s, got -1.0"),
        ("[mail]\nbackoff_s = -2", "mail.backoff_s must be >= 0 s and <= 600 s, got -2.0"),
        ("[reports]\ncard_min_gpu_hours = -1", "reports.card_min_gpu_hours must be >= 0, got -1.0"),
        ("[reports]\nprice_per_gpu_hour = { default = -1 }",
         "reports.price_per_gpu_hour.default must be a number >= 0"),
        # absurd
        ("[collector]\nhook_timeout_s = 3600", "collector.hook_timeout_s must be > 0 s and <= 300 s, got 3600.0"),
        ("[collector]\nhook_timeout_s = 0", "collector.hook_timeout_s must be > 0 s"),
        ("[sacct]\nbatch_size = 10000000", "sacct.batch_size must be >= 1 and <= 10000, got 10000000"),
        ("[mail]\nretries = 1000", "mail.retries must be >= 1 and <= 10, got 1000"),
        ("[dcgm]\nkeep_age_s = 1e12",
         "dcgm.keep_age_s must be > 0 s and <= 31622400 s (366 days), got 1000000000000.0"),
        ("[agent]\nmetrics_port = 70000", "agent.metrics_port = 70000 is not a TCP port (0 = off)"),
        # intervals that could never fire
        ("[service]\ningest_interval_s = 1e12", "service.ingest_interval_s must be 0 (off) or >= 1 s and <= "),
        ("[service]\ncards_interval_s = 0.001", "service.cards_interval_s must be 0 (off) or >= 1 s"),
        ("[service]\nenrich_interval_s = -60", "service.enrich_interval_s must be 0 (off) or >= 1 s"),
        ("[agent]\ninterval_s = 120", "agent.timeline_interval_s = 60 must be >= agent.interval_s (120)"),
        ("[agent]\ntimeline_keep_h = 0.001", "agent.timeline_keep_h must keep at least one timeline point"),
        ("[collector]\nagent_stale_s = 5", "collector.agent_stale_s = 5 must be >= 2 x agent.interval_s (5)"),
        ("[dcgm]\nconnect_timeout_s = 20", "dcgm.connect_timeout_s must be < collector.hook_timeout_s"),
        ("[dcgm]\nkeep_age_s = 1", "dcgm.keep_age_s must be >= dcgm.update_interval_s"),
        ("[sacct]\nenrich_window_days = 0.001", "sacct.enrich_window_days must be longer than sacct.settle_s"),
        ("[reports]\ncard_lookback_h = 0.01", "reports.card_lookback_h must cover service.cards_interval_s"),
        ("[service]\nforward_max_backoff_s = 1", "service.forward_max_backoff_s must be >= service.forward_interval_s"),
        # the pushes the service stores at once, and how long one waits for a slot
        ("[service]\npush_slots = 0", "service.push_slots must be >= 1 and <= 64, got 0"),
        ("[service]\npush_slots = 65", "service.push_slots must be >= 1 and <= 64, got 65"),
        ("[service]\npush_slots = 2.5", "service.push_slots must be int, got float (2.5)"),
        ("[service]\npush_slots = '2'", "service.push_slots must be int, got str ('2')"),
        ("[service]\npush_slot = 2", "unknown key service.push_slot (did you mean 'push_slots'?)"),
        ("[service]\npush_wait_s = 0", "service.push_wait_s must be > 0 s and <= 300 s, got 0.0"),
        ("[service]\npush_wait_s = -4", "service.push_wait_s must be > 0 s and <= 300 s, got -4.0"),
        ("[service]\npush_wait_s = 301", "service.push_wait_s must be > 0 s and <= 300 s, got 301.0"),
        ("[service]\npush_wait_s = nan", "service.push_wait_s must be a finite number, got nan"),
        ("[service]\npush_wait = 4", "unknown key service.push_wait (did you mean 'push_wait_s'?)"),
        # database URLs of dialects that storage cannot open
        ("[paths]\ndatabase = 'mysql://u@h/db'", "paths.database = 'mysql://u@h/db': unsupported database 'mysql'"),
        ("[paths]\ndatabase = 'postgresql+psycopg2://u@h/db'", "unsupported database 'postgresql+psycopg2'"),
        # a password in the config every user reads: refused, and not echoed
        ("[paths]\ndatabase = 'postgresql+psycopg://u:pw9@h/db'", "paths.database must not hold a password"),
        ("[service]\napi_listen = 'localhost'", "service.api_listen = 'localhost': expected HOST:PORT"),
        ("[service]\napi_url = 'ftp://h'", "service.api_url = 'ftp://h': expected http://HOST:PORT"),
        ("[paths]\ndatabase = 'sqlite:///relative.db'", "a relative path (relative to whichever directory"),
        ("[paths]\ndatabase = 'jobs.db'", "'jobs.db': a relative path"),
        ("[mail]\nfrom_address = \"a@b\\r\\nBcc: c@d\"", "mail.from_address must be one line"),
        ("[mail]\nreply_to = \"a@b\\nX: y\"", "mail.reply_to must be one line"),
        ("[reports]\naddress_pattern = \"{user}@x\\n\"", "reports.address_pattern must be one line"),
        # [leads]: account -> a non-empty list of user names
        ("[leads]\nphysics = 'bob'", "leads.physics must be a non-empty list of user names, got str ('bob')"),
        ("[leads]\nphysics = []", "leads.physics must be a non-empty list of user names, got []"),
        ("[leads]\nphysics = ['bob', '']", "leads.physics must be a non-empty list of user names, got ''"),
        ("[leads]\nphysics = [1]", "leads.physics must be a non-empty list of user names, got int (1)"),
        ("[leads]\n'' = ['bob']", "an account name in [leads] must not be empty"),
        ("leads = ['bob']", "[leads] must be a table, not list"),
        ("[lead]\nphysics = ['bob']", "unknown section [lead] (did you mean 'leads'?)"),
        ("[spool]\nmax_file_mb = 0", "spool.max_file_mb must be > 0"),
        ("[paths]\ndatabase = 'sqlite:///:memory:'", "an in-memory database keeps nothing"),
        # empty paths
        ("[paths]\nspool_dir = ''", "paths.spool_dir must not be empty"),
        ("[paths]\nstate_dir = ''", "paths.state_dir must not be empty"),
        ("[paths]\ndatabase = ''", "paths.database must not be empty"),
        ("[reports]\ndir = ''", "reports.dir must not be empty"),
        ("[dcgm]\nexporter_mapping_dir = ''", "dcgm.exporter_mapping_dir must not be empty"),
        ("[sacct]\ncommand = ''", "sacct.command must not be empty"),
        # lists and tables, item by item
        ("[privacy]\nadmins = ['alice', '']", "privacy.admins must be a list of user names"),
        ("[privacy]\nadmins = 'alice'", "privacy.admins must be a list of user names, got str"),
        ("[reports]\nadmins = [1]", "reports.admins must be a list of addresses"),
        ('[reports]\naddresses = { bob = "b@x\\nBcc: y" }', "reports.addresses.bob must be one address (a string)"),
    ],
)
def test_bad_config_is_a_clear_error(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        config.load(path)
    assert message in str(err.value)
    assert path in str(err.value) or "not valid TOML" in str(err.value)


@pytest.mark.parametrize(
    "data",
    [
        {"paths": {"database": "/var/lib/gpueff.db"}},  # a plain path is a SQLite file
        {"paths": {"database": "postgresql://gpueff@db/gpueff"}},
        {"paths": {"database": "postgresql+psycopg://gpueff@db:5432/gpueff", "database_password_file": "/etc/pw"}},
        {"service": {"api_listen": "unix:/run/slurm-gpueff/api.sock", "api_url": "http://svc:9818"}},
        {"service": {"api_listen": "0.0.0.0:9818"}, "privacy": {"admins": ["root_alt"]}},
        {"mail": {"password_file": ""}, "reports": {"optout_file": ""}, "dcgm": {"bindings_path": ""}},
        {"service": {"ingest_interval_s": 0, "enrich_interval_s": 0, "cards_interval_s": 0}},  # 0 = off
        {"service": {"cards_interval_s": 0}, "reports": {"card_lookback_h": 0.01}},  # no cards task, no limit
        {"collector": {"hook_timeout_s": 300}, "agent": {"interval_s": 1, "timeline_interval_s": 1}},
        {"reports": {"addresses": {"pi_smith": "a@x"}, "price_per_gpu_hour": {"default": 0}}},
        {"service": {"forward_interval_s": 0.2, "forward_max_backoff_s": 0.5}},
        {"service": {"push_slots": 1, "push_wait_s": 0.1}},
        {"service": {"push_slots": 64, "push_wait_s": 300}},  # more than half api_timeout_s: capped, not refused
    ],
)
def test_good_values_are_accepted(data):
    cfg = config.Config(data, source="<test>")
    for section, keys in data.items():
        for key, value in keys.items():
            assert getattr(getattr(cfg, section), key) == value


def test_the_push_slots_and_their_wait_default_to_two_and_four_seconds(tmp_path):
    """Two pushes stored at once, a push waiting up to 4 s for a slot (what the service did before these were
    keys); an integer wait is a number of seconds like any other."""
    service = config.Config().service
    assert (service.push_slots, service.push_wait_s) == (2, 4.0)
    assert type(service.push_slots) is int and type(service.push_wait_s) is float
    cfg = config.load(write(tmp_path, "[service]\npush_slots = 4\npush_wait_s = 2\n"))
    assert (cfg.service.push_slots, cfg.service.push_wait_s) == (4, 2.0)
    assert isinstance(cfg.service.push_wait_s, float)


def test_leads_is_one_table_of_user_names_per_account(tmp_path):
    cfg = config.load(write(tmp_path, '[leads]\nphysics = ["pi_smith", "lab_manager"]\n"ml-lab" = ["pi_jones"]\n'))
    assert cfg.leads == {"physics": ["pi_smith", "lab_manager"], "ml-lab": ["pi_jones"]}
    assert cfg.as_dict()["leads"] == cfg.leads
    assert config.Config(cfg.as_dict()) == cfg != config.Config()  # what `config check --json` shows loads back


@pytest.mark.parametrize("section", ["reports", "privacy"])
def test_the_old_leads_maps_say_where_they_went(tmp_path, section):
    """[reports] leads (addresses) and [privacy] leads (user names) became the one [leads] map: a config that
    still has either is refused with a message saying how to write it now, not "unknown key"."""
    path = write(tmp_path, f'[{section}]\nleads = {{ physics = ["pi_smith"] }}\n')
    with pytest.raises(ConfigError) as err:
        config.load(path)
    assert str(err.value) == (
        f"{path}: {section}.leads moved to [leads] (account = [user names]), who see the account's jobs and get "
        "its monthly summary; their mail addresses come from reports.addresses / reports.address_pattern")


@pytest.mark.parametrize("section, key, why", [
    ("simulated", "gpus_per_node", "it did nothing (a simulated job has the GPUs Slurm gave it)"),
    ("service", "ingest_workers", "it did nothing (ingest runs in one process)"),
    ("service", "plugins",
     "gpueff serve runs its own tasks only (a site's own job belongs in cron or a systemd timer)"),
])
def test_a_removed_key_is_refused_saying_so(tmp_path, section, key, why):
    """A key that is gone is refused whatever its value, saying it was removed and why, not "unknown key"."""
    path = write(tmp_path, f'[{section}]\n{key} = 4\n')
    with pytest.raises(ConfigError) as err:
        config.load(path)
    assert str(err.value) == f"{path}: {section}.{key} was removed: {why}; delete it from the file"
    assert key not in getattr(config.Config(), section).as_dict()


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


def test_directory_and_device_are_refused(tmp_path):
    with pytest.raises(ConfigError) as err:
        config.load(str(tmp_path))
    assert str(err.value) == f"config file {tmp_path} is a directory, not a regular file"
    with pytest.raises(ConfigError) as err:
        config.load("/dev/null")
    assert str(err.value) == "config file /dev/null is a character device, not a regular file"


def test_not_utf8_is_refused(tmp_path):
    p = tmp_path / "gpueff.toml"
    p.write_bytes(b'[site]\ncluster = "caf\xe9"\n')
    with pytest.raises(ConfigError) as err:
        config.load(str(p))
    assert str(err.value) == f"config file {p} is not UTF-8 text (byte 21)"


def test_fifo_is_refused_without_blocking(tmp_path, monkeypatch):
    """open() of a FIFO waits for a writer: load() must check the file type without waiting."""
    fifo = tmp_path / "gpueff.toml"
    os.mkfifo(fifo)
    link = tmp_path / "link.toml"
    link.symlink_to(fifo)
    monkeypatch.setenv("GPUEFF_CONFIG", str(link))
    errors: list[str] = []

    def attempt() -> None:
        for path in (str(fifo), None):  # named, and through $GPUEFF_CONFIG and a symlink
            try:
                config.load(path)
            except ConfigError as exc:
                errors.append(str(exc))

    t = threading.Thread(target=attempt, daemon=True)
    t.start()
    t.join(10)
    if t.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # lets the blocked open() return
        pytest.fail("config.load() blocked on a FIFO")
    assert errors == [f"config file {fifo} is a FIFO, not a regular file",
                      f"config file {link} is a FIFO, not a regular file"]


def _load_as_nobody(path: str) -> str:
    """config.load(path) in a child process that dropped root for nobody; what it raised (or 'loaded')."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.close(r)
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            try:
                config.load(path)
                out = "loaded"
            except BaseException as exc:  # noqa: BLE001
                out = f"{type(exc).__name__}: {exc}"
            os.write(w, out.encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as fh:
        out = fh.read()
    os.waitpid(pid, 0)
    return out


def test_unreadable_file_is_refused():
    """Root reads any file, so as root the check runs as nobody (after proving nobody can read it at 0644)."""
    d = tempfile.mkdtemp(prefix="gpueff-config-")
    try:
        os.chmod(d, 0o755)
        p = os.path.join(d, "gpueff.toml")
        with open(p, "w") as fh:
            fh.write('[site]\ncluster = "c"\n')
        expected = f"config file {p} is not readable by this user"
        if os.geteuid() == 0:
            os.chmod(p, 0o644)
            assert _load_as_nobody(p) == "loaded"
            os.chmod(p, 0)
            assert _load_as_nobody(p) == f"ConfigError: {expected}"
        else:
            os.chmod(p, 0)
            with pytest.raises(ConfigError) as err:
                config.load(p)
            assert str(err.value) == expected
    finally:
        shutil.rmtree(d)


def test_a_database_password_in_the_config_is_refused_without_echoing_it(tmp_path):
    path = write(tmp_path, "[paths]\ndatabase = 'postgresql+psycopg://gpueff:Hunter2-xyz@db/gpueff'")
    with pytest.raises(ConfigError) as err:
        config.load(path)
    assert "database_password_file" in str(err.value) and "Hunter2-xyz" not in str(err.value)


def test_a_byte_order_mark_is_read_past(tmp_path):
    """Editors on Windows start UTF-8 files with a BOM; tomllib calls it an invalid statement at 1:1."""
    from slurm_gpueff.config import load

    path = tmp_path / "gpueff.toml"
    path.write_bytes(b'\xef\xbb\xbf[site]\ncluster = "bom"\n')
    assert load(str(path)).site.cluster == "bom"
