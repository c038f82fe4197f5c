"""The real NvmlSampler's GPM steps: samples every step, figures at readings, one NVML call when it may.

The GPU mock is a stand-in ``pynvml`` for one H100 without MIG (only the calls NvmlSampler makes, with
nvidia-ml-py's names): its GPM samples hold cumulative busy and elapsed *cycles*, so a figure between two
samples is cycle-weighted as the real GPM's is, and the SM clock is what the test sets. Over a span where the
clock stayed put one metrics call is exact; across a clock change (the GPU clocked down while idle) only
per-step figures weighted by time are, which is what the sampler must then give.
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from slurm_gpueff.node import nvml_sampler
from slurm_gpueff.node.nvml_sampler import GPM_MAX_STEPS, NvmlSampler

UUID = "GPU-11111111-2222-3333-4444-555555555555"


class Gpu:
    def __init__(self) -> None:
        self.t = 1000.0
        self.clock = 1980.0
        self.busy = 0.0  # fraction of cycles busy from now on
        self.cycles = 0.0
        self.busy_cycles = 0.0
        self.metric_calls = 0

    def run(self, seconds: float) -> None:
        c = self.clock * 1e6 * seconds
        self.cycles += c
        self.busy_cycles += c * self.busy
        self.t += seconds


class NVMLError(Exception):
    pass


def fake_pynvml(gpu: Gpu) -> types.ModuleType:
    nv = types.ModuleType("pynvml")
    nv.NVMLError = NVMLError
    nv.NVMLError_NotFound = nv.NVMLError_NotSupported = type("NVMLError_NotFound", (NVMLError,), {})
    nv.NVML_SUCCESS, nv.NVML_GPM_METRICS_GET_VERSION, nv.NVML_CLOCK_SM = 0, 1, 1
    nv.NVML_GPU_UTILIZATION_SAMPLES, nv.NVML_VALUE_TYPE_DOUBLE = 1, 0
    for i, name in enumerate(("GRAPHICS_UTIL", "SM_UTIL", "ANY_TENSOR_UTIL")):
        setattr(nv, f"NVML_GPM_METRIC_{name}", i + 1)
    nv.nvmlInit = nv.nvmlShutdown = lambda: None
    nv.nvmlDeviceGetCount = lambda: 1
    nv.nvmlDeviceGetHandleByIndex = lambda i: "h0"
    nv.nvmlDeviceGetUUID = lambda h: UUID
    nv.nvmlDeviceGetMinorNumber = lambda h: 0
    nv.nvmlDeviceGetPciInfo = lambda h: types.SimpleNamespace(busId="00000000:18:00.0")
    nv.nvmlDeviceGetName = lambda h: "NVIDIA H100 80GB HBM3"
    nv.nvmlDeviceGetMemoryInfo = lambda h, version=None: types.SimpleNamespace(total=80 << 30, used=1 << 30)

    def unsupported(*_a: Any) -> Any:
        raise nv.NVMLError_NotSupported("Not Supported")

    nv.nvmlDeviceGetMigMode = nv.nvmlDeviceGetSamples = nv.nvmlDeviceGetUtilizationRates = unsupported
    nv.nvmlGpmQueryDeviceSupport = lambda h: types.SimpleNamespace(isSupportedDevice=1)
    nv.nvmlGpmSampleAlloc = lambda: {}
    nv.nvmlGpmSampleFree = lambda smp: None

    def sample_get(h: Any, smp: dict) -> None:
        smp.update(cycles=gpu.cycles, busy=gpu.busy_cycles)

    nv.nvmlGpmSampleGet = sample_get
    nv.nvmlDeviceGetClockInfo = lambda h, kind: gpu.clock
    nv.nvmlDeviceGetPowerUsage = lambda h: 300_000
    nv.nvmlDeviceGetTotalEnergyConsumption = lambda h: 1_000_000

    class Metric:
        def __init__(self) -> None:
            self.metricId, self.nvmlReturn, self.value = 0, 0, 0.0

    class MetricsGet:
        def __init__(self) -> None:
            self.metrics = [Metric() for _ in range(16)]

    def metrics_get(mg: Any) -> None:
        gpu.metric_calls += 1
        d = mg.sample2["cycles"] - mg.sample1["cycles"]
        for m in mg.metrics[: mg.numMetrics]:
            m.value = 100.0 * (mg.sample2["busy"] - mg.sample1["busy"]) / d if d else float("nan")

    nv.c_nvmlGpmMetricsGet_t = MetricsGet
    nv.nvmlGpmMetricsGet = metrics_get
    return nv


@pytest.fixture
def gpu(monkeypatch):
    g = Gpu()
    monkeypatch.setitem(__import__("sys").modules, "pynvml", fake_pynvml(g))
    monkeypatch.setattr(nvml_sampler, "time", types.SimpleNamespace(monotonic=lambda: g.t, time=lambda: g.t))
    return g


def steps(gpu: Gpu, sampler: NvmlSampler, parts: list[tuple[float, float, float]]) -> Any:
    """Run (seconds, busy fraction, SM clock) parts with a GPM step a second, then a reading."""
    for seconds, busy, clock in parts:
        gpu.busy, gpu.clock = busy, clock
        for _ in range(int(seconds)):
            gpu.run(1.0)
            sampler.sample_gpm()
    gpu.metric_calls = 0
    (s,) = sampler.sample(False)
    return s


def weighted(s: Any, metric: str) -> float:
    return sum(v[metric] * dt for v, dt in s.gpm_steps) / sum(dt for _v, dt in s.gpm_steps)


def test_a_steady_clock_takes_one_metrics_call_for_the_whole_interval(gpu):
    smp = NvmlSampler()
    smp.open()
    s = steps(gpu, smp, [(5, 0.8, 1980.0)])
    assert gpu.metric_calls == 1 and len(s.gpm_steps) == 1
    assert s.gpm_steps[0][1] == pytest.approx(5.0) and s.gpm["sm_active"] == pytest.approx(80.0)
    assert s.kernel_pct is None and s.gpm["kernel_active"] == pytest.approx(80.0)  # GRAPHICS_UTIL, no ring buffer


def test_a_gpu_that_clocked_down_gets_per_step_figures_weighted_by_time(gpu):
    smp = NvmlSampler()
    smp.open()
    s = steps(gpu, smp, [(2, 0.0, 345.0), (2, 1.0, 1980.0)])
    assert gpu.metric_calls == 4 and len(s.gpm_steps) == 4
    assert weighted(s, "sm_active") == pytest.approx(50.0)  # one call over the span would read 85 %
    later = steps(gpu, smp, [(5, 1.0, 1980.0)])  # the anchor moved on: the next span starts where this ended
    assert gpu.metric_calls == 1 and later.gpm["sm_active"] == pytest.approx(100.0)


def test_busy_and_idle_stretches_take_one_call_each_and_their_edges_one_step_each(gpu):
    """Jobs that take turns on a GPU (a shared GPU's usual reading): a call per steady stretch, not per step."""
    smp = NvmlSampler()
    smp.open()
    s = steps(gpu, smp, [(5, 1.0, 1980.0), (5, 0.0, 345.0), (5, 1.0, 1980.0)])
    assert gpu.metric_calls == 5 and [round(dt) for _v, dt in s.gpm_steps] == [5, 1, 4, 1, 4]
    assert weighted(s, "sm_active") == pytest.approx(100.0 * 10 / 15)  # one call over the span: 91.7 %


@pytest.mark.parametrize(("clocks", "runs"), [
    ([1980.0, 1980.0], [(0, 1)]),
    ([1980.0, 1900.0, 1800.0, 1980.0], [(0, 3)]),  # within 10 % of each other throughout
    ([1980.0, 1790.0, 1980.0], [(0, 1), (1, 2)]),  # 1980 > 1.1 x 1790
    ([None, 1980.0, 1980.0, None, 1980.0], [(0, 1), (1, 2), (2, 3), (3, 4)]),  # an unread clock: step by step
    ([345.0, 345.0, 1980.0, 1980.0, 1980.0], [(0, 1), (1, 2), (2, 4)]),
    ([0.0, 1980.0], [(0, 1)]),
    ([1980.0], []),
])
def test_steady_runs_cover_every_step_once(clocks, runs):
    assert nvml_sampler.steady_runs(clocks) == runs


def test_a_long_interval_turns_samples_into_figures_before_they_pile_up(gpu):
    smp = NvmlSampler()
    smp.open()
    s = steps(gpu, smp, [(GPM_MAX_STEPS + 3, 0.5, 1980.0)])
    assert sum(dt for _v, dt in s.gpm_steps) == pytest.approx(GPM_MAX_STEPS + 3)
    assert not smp._devs[0].steps and len(smp._devs[0].pool) <= nvml_sampler.GPM_POOL


def test_a_reading_without_figures_keeps_the_samples_for_the_next_one(gpu):
    """The agent asks for GPM figures at the energy counter's pace: a reading in between takes a sample only,
    and the next reading that asks gets the whole span, time-weighted."""
    smp = NvmlSampler()
    smp.open()
    for busy, clock in ((0.0, 345.0), (1.0, 1980.0)):
        gpu.busy, gpu.clock = busy, clock
        for _ in range(3):
            gpu.run(1.0)
            smp.sample_gpm()
        gpu.run(1.0)
        (between,) = smp.sample(False, set())
        assert between.gpm is None and between.gpm_steps is None
    (s,) = smp.sample(False, None)
    assert sum(dt for _v, dt in s.gpm_steps) == pytest.approx(8.0) and weighted(s, "sm_active") == pytest.approx(50.0)


def test_the_agents_gauges_keep_the_last_gpm_figures_between_readings_that_compute_them(gpu, tmp_path):
    """Between the readings that turn GPM samples into figures, /metrics keeps the last figures (a gauge that
    vanished four ticks in five would break every dashboard); the counters get the whole span when it comes."""
    from slurm_gpueff.config import Config
    from slurm_gpueff.node.agent import Agent

    ag = Agent(Config({"paths": {"state_dir": str(tmp_path)}}), NvmlSampler(), wall_clock=lambda: gpu.t)
    ag.open()
    gpu.busy = 0.6
    seen = []
    for _ in range(8):  # 5-s readings, GPM steps each second; figures at the first and then every 30 s
        for _ in range(5):
            gpu.run(1.0)
            ag.gpm_tick()
        ag.tick()
        g = next(iter(ag.gpus.values()))
        seen.append(g.last.get("sm_active"))
    assert all(v == pytest.approx(0.6) for v in seen[1:]), seen
    assert g.counters["covered_s"]["sm_active"] < 40.0  # the last readings' span waits for the next figures
    ag.tick(requested=True)  # a hook's reading: everything up to now
    assert g.counters["covered_s"]["sm_active"] == pytest.approx(40.0)
