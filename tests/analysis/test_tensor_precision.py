"""Tensor activity by precision: the figure explains itself, and bf16 advice never reaches FP64 or int8 jobs."""

from __future__ import annotations

import json

from conftest import build

from slurm_gpueff.analysis import assess
from slurm_gpueff.analysis.precision import dominant, split
from slurm_gpueff.readmodel import JobRow
from slurm_gpueff.render.json import job_document
from slurm_gpueff.render.text import render_card

FP32_MATH = dict(sm_active=0.79, tensor_active=0.0, fp32_active=0.63, fp64_active=0.0, hmma_active=0.0,
                 imma_active=0.0, dfma_active=0.0)
DGEMM = dict(sm_active=0.92, tensor_active=0.86, dfma_active=0.86, hmma_active=0.0, imma_active=0.0,
             fp64_active=0.0004, fp32_active=0.02)


def _names(fig):
    return [v.name for v in assess(fig).verdicts]


def test_fp32_math_with_idle_tensor_cores_is_told_about_bf16():
    diag = assess(build(FP32_MATH))
    assert diag.verdicts[0].name == "tensor_idle" and "bf16" in " ".join(diag.verdicts[0].advice)


def test_fp64_math_on_the_fp64_pipe_is_not_told_to_switch_to_bf16():
    fig = build(dict(FP32_MATH, fp64_active=0.70, fp32_active=0.15))  # FP64 code: the FP64 pipe dominates
    assert "tensor_idle" not in _names(fig)


def test_int8_work_below_the_tensor_threshold_is_not_told_to_switch_to_bf16():
    fig = build(dict(FP32_MATH, tensor_active=0.015, imma_active=0.015, fp32_active=0.2))
    assert dominant(fig.means) == "imma_active" and "tensor_idle" not in _names(fig)


def test_an_fp64_dgemm_explains_its_tensor_figure_on_the_card_the_verdict_and_json():
    fig = build(DGEMM)
    assert split(fig.means) == "FP64 DFMA 86.0%" and dominant(fig.means) == "dfma_active"
    diag = assess(fig)
    assert diag.verdicts[0].name == "healthy" and "tensor cores 86.0% (FP64 DFMA 86.0%)" in diag.verdicts[0].why
    job = JobRow(cluster="c", job_id=1, gpu_count=1)
    assert "Tensor-active: 86.0%  (FP64 DFMA 86.0%)" in render_card(job, fig, diag)
    doc = json.loads(json.dumps(job_document(job, fig, diag)))
    assert doc["gpus"][0]["dfma_active"] == 0.86 and doc["figures"]["dfma_active"]["value"] == 0.86


def test_int8_gemm_reads_as_integer_tensor_work():
    fig = build(dict(sm_active=0.90, tensor_active=0.12, imma_active=0.12, hmma_active=0.0, dfma_active=0.0))
    assert split(fig.means) == "INT8 IMMA 12.0%"
    assert "Tensor-active: 12.0%  (INT8 IMMA 12.0%)" in render_card(JobRow(cluster="c", job_id=1), fig, assess(fig))


def test_unmeasured_precisions_add_nothing_and_stay_unknown():
    fig = build(dict(hmma_active=None, imma_active=None, dfma_active=None,
                     missing={"hmma_active": "DCGM had no such field"}))
    assert split(fig.means) is None and fig.mean("hmma_active") is None
    assert fig.missing["hmma_active"] == "DCGM had no such field"
    assert "Tensor-active: 78.0%\n" in render_card(JobRow(cluster="c", job_id=1), fig, assess(fig)) + "\n"
