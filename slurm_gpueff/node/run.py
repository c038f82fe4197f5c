"""The node agent's process, wired in one place: ``gpueff agent``.

:mod:`.agent` keeps and publishes the GPUs' state; this module runs it and everything around it: signals,
the schedule, a hook's request for a reading (:mod:`slurm_gpueff.node.tickwire`, served in a socket
thread and taken by the main loop between its regular ticks), /metrics with the per-job series
(:mod:`.job_metrics`), the running jobs' live records every ``agent.live_interval_s``, and seff-gpu's socket
on this node (:mod:`.live_socket`). The last two are handed over by ``gpueff agent`` (cli/node_cmds.py): a
live record is measured as the Epilog measures (slurm_gpueff.live, above the backends) and a card is
seff-gpu's engine's (slurm_gpueff.seff), both above this layer, which the hooks' backends import.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socketserver
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from .. import statedir
from ..access import scrape
from ..config import read_secret
from ..errors import CollectorError, GpueffError
from . import tickwire
from .agent import Agent
from .live_socket import LiveServer
from .nvml_sampler import GPM_MIN_S, GPM_SKIP_S, GPM_STEP_S, NvmlSampler, Sampler

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

    from ..config import Config
    from .live_socket import Answerer

log = logging.getLogger("slurm_gpueff.agent")


# How often the agent's socket servers look for a shutdown request (their connections are answered at once):
# each look costs CPU all day, a slower one only delays the agent's stop by that much.
SERVER_POLL_S = 2.0


def serve_metrics(agent: Agent, address: str, port: int,
                  token: str | None = None) -> tuple[WSGIServer, threading.Thread]:
    """Start the /metrics HTTP server in a daemon thread, with the agent as its only collector; with ``token``,
    only a scrape that sends it is answered (:mod:`slurm_gpueff.access.scrape`)."""
    from prometheus_client.registry import CollectorRegistry

    reg = CollectorRegistry(auto_describe=False)
    reg.register(agent)
    return scrape.serve(reg, address, port, token, key="[agent] metrics_token_file")


def _metrics_token(config: Config) -> str | None:
    """The bearer token of ``[agent] metrics_token_file`` (None: none set); GpueffError when it is set but
    unusable: then no /metrics at all, never one open to every user."""
    path = config.agent.metrics_token_file
    return read_secret(path, "agent.metrics_token_file", "the bearer token Prometheus sends") if path else None


class LiveRecords(Protocol):
    """What writes the running jobs' live records (slurm_gpueff.live.publish); ``log`` takes each job's problem."""

    def __call__(self, cfg: Config, *, log: Callable[[str], None]) -> object: ...


def run_agent(config: Config, *, once: bool = False, sampler: Sampler | None = None,
              energy_interval_s: float | None = None, live_records: LiveRecords | None = None,
              live_card: Answerer | None = None) -> int:
    """The body of ``gpueff agent``: sample until SIGTERM/SIGINT (or one tick with ``once``). Returns 1
    (after logging why) when the GPUs cannot be read at all, e.g. no NVIDIA driver. With ``live_records``,
    the running jobs' live records are written right after a reading every ``agent.live_interval_s``; with
    ``live_card`` (seff/livecard.py's), seff-gpu on this node gets a running job's card up to the second
    through the live socket (not with ``once``)."""
    agent = Agent(config, sampler if sampler is not None else NvmlSampler(),
                  energy_interval_s=energy_interval_s)
    try:
        agent.open()
    except CollectorError as exc:
        log.error("gpueff agent cannot start: %s", exc)
        return 1
    server = None
    address, port = config.agent.metrics_address, config.agent.metrics_port
    if port:
        try:
            server, _thread = serve_metrics(agent, address, port, _metrics_token(config))
            log.info("live GPU gauges on http://%s:%d/metrics%s", address, port,
                     " (bearer token required)" if config.agent.metrics_token_file else "")
        except (OSError, GpueffError) as exc:  # port taken, token file unusable: sampling (what jobs' figures
            # need) goes on without it
            log.error("cannot serve /metrics on %s:%d: %s; sampling goes on without it", address, port, exc)
    stop = threading.Event()
    readings = Readings()
    old: dict[signal.Signals, Callable[[int, FrameType | None], object] | int | None] = {}
    if threading.current_thread() is threading.main_thread():
        def _handler(signum: int, _frame: FrameType | None) -> None:
            log.info("signal %d: finishing the current tick, then exiting", signum)
            stop.set()
            readings.wake.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            old[sig] = signal.signal(sig, _handler)
    readings_server = None if once else serve_readings(
        statedir.reading_socket(agent.state_dir), readings, float(config.collector.tick_wait_s) + 1.0, log.error)
    live_server = None if once or live_card is None else _serve_live(agent.state_dir, live_card)
    try:
        requested = False
        next_t = live_due = time.monotonic()
        while True:
            readings.begin()
            try:
                agent.tick(requested)
            except OSError as exc:  # a full or read-only state dir must not kill sampling
                log.warning("tick failed: %s", exc)
            readings.done({"updated": agent.updated, "ticks": agent.ticks})
            if live_records is not None:
                live_due = _live(config, live_records, live_due, float(config.agent.live_interval_s))
            if once or stop.is_set():
                break
            next_t = _next_regular(next_t, agent.interval_s, requested)
            requested = _wait(agent, readings, stop, next_t)
            if stop.is_set():
                break
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
        for srv in (readings_server, live_server):
            if srv is not None:
                srv.shutdown()
                srv.server_close()
        agent.close()
        for sig, h in old.items():
            signal.signal(sig, h)
    log.info("gpueff agent stopped after %d ticks", agent.ticks)
    return 0



def _serve_live(state_dir: str, answer: Answerer) -> LiveServer | None:
    """seff-gpu's socket on this node, in a daemon thread; None (logged) when it cannot be made."""
    path = statedir.live_socket(state_dir)
    try:
        server = LiveServer(path, answer)
    except OSError as exc:
        log.error("cannot listen on %s (%s): seff-gpu on this node reads the database instead", path, exc)
        return None
    threading.Thread(target=server.serve_forever, args=(SERVER_POLL_S,), name="gpueff-live", daemon=True).start()
    return server


def _live(config: Config, publish: LiveRecords, due: float, every_s: float) -> float:
    """Write the live records if they are due; the next time they are due. A failure is logged, and
    sampling goes on."""
    now = time.monotonic()
    if not every_s or now < due:
        return due
    try:
        publish(config, log=_live_problem)
    except Exception as exc:  # noqa: BLE001 - live records must never stop the sampling jobs' figures need
        log.warning("live records failed: %s: %s", type(exc).__name__, exc)
    return max(due + every_s, now)


def _live_problem(msg: str) -> None:
    logging.getLogger("slurm_gpueff.live").warning("%s", msg)


def _next_regular(next_t: float, interval: float, after_requested: bool) -> float:
    """The next scheduled tick: missed ones are skipped rather than bunched, and one due too soon after a
    requested reading for GPM (``GPM_MIN_S``) is skipped too."""
    now = time.monotonic()
    while next_t <= now or (after_requested and next_t - now < GPM_MIN_S):
        next_t += interval
    return next_t


def _wait(agent: Agent, readings: Readings, stop: threading.Event, next_t: float) -> bool:
    """Sleep until the next regular tick (False) or a hook's request (True), whichever comes first, taking
    GPM samples every GPM_STEP_S on the way; a request waits until GPM's minimum spacing since the last
    sample has passed."""
    while not stop.is_set():
        now = time.monotonic()
        last = agent.last_sample_mono or 0.0
        if readings.pending():
            wait = last + GPM_MIN_S - now
            if wait <= 0:
                return True
            readings.wake.clear()
            readings.wake.wait(wait)
            continue
        if now >= next_t:
            return False
        gpm_due = last + GPM_STEP_S
        if now >= gpm_due and next_t - now >= GPM_SKIP_S:
            try:
                agent.gpm_tick()
            except Exception as exc:  # noqa: BLE001 - a GPM hiccup must not stop the agent's readings
                log.warning("GPM sample failed: %s", exc)
                agent.last_sample_mono = now
            continue
        readings.wake.clear()
        if not readings.pending():  # a request between the check and the clear set wake again
            readings.wake.wait(min(next_t, gpm_due if next_t - gpm_due >= GPM_SKIP_S else next_t) - now)
    return False


class Readings:
    """Requests waiting for a reading, shared by the socket threads and the agent's main loop.

    A request is answered by the first reading that *starts* after it arrived, so that the reading covers
    everything up to the request (a reading under way when it came may have sampled before it)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.started = 0  # readings begun
        self.finished = 0  # readings completed
        self.waiting = 0
        self.wake = threading.Event()  # set on a request (and by the agent's stop)
        self.last: dict[str, Any] = {}

    def ask(self, timeout_s: float) -> dict[str, Any]:
        with self.cond:
            target = self.started + 1
            self.waiting += 1
            self.wake.set()
            try:
                if not self.cond.wait_for(lambda: self.finished >= target, timeout_s):
                    return {"error": f"no reading within {timeout_s:g} s"}
                return dict(self.last)
            finally:
                self.waiting -= 1

    def pending(self) -> bool:
        with self.cond:
            return self.waiting > 0

    def begin(self) -> None:
        with self.cond:
            self.started += 1

    def done(self, answer: dict[str, Any]) -> None:
        with self.cond:
            self.finished = self.started
            self.last = answer
            self.cond.notify_all()


class _Handler(socketserver.StreamRequestHandler):
    timeout = 5.0  # a client that connects and says nothing does not hold a thread

    def handle(self) -> None:
        try:
            line = self.rfile.readline(tickwire.MAX_LINE)
        except OSError:
            return
        server: ReadingServer = self.server  # type: ignore[assignment]
        ok = line == tickwire.REQUEST
        answer = server.readings.ask(server.answer_within_s) if ok else {"error": "unknown request"}
        with contextlib.suppress(OSError):  # the hook gave up waiting: its fallback already applies
            self.wfile.write(json.dumps(answer, separators=(",", ":")).encode() + b"\n")


class ReadingServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, readings: Readings, answer_within_s: float) -> None:
        self.readings = readings
        self.answer_within_s = answer_within_s
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a previous agent's socket
        old = os.umask(0o177)  # root's hooks only: the socket is created 0600
        try:
            super().__init__(path, _Handler)
        finally:
            os.umask(old)


def serve_readings(path: str, readings: Readings, answer_within_s: float,
          log: Callable[[str], None]) -> ReadingServer | None:
    """Start answering requests in a daemon thread; None (logged) when the socket cannot be made."""
    try:
        server = ReadingServer(path, readings, answer_within_s)
    except OSError as exc:
        log(f"cannot listen on {path} ({exc}): jobs' windows fall back to the last reading")
        return None
    threading.Thread(target=server.serve_forever, args=(SERVER_POLL_S,), name="gpueff-readings",
                     daemon=True).start()
    return server
