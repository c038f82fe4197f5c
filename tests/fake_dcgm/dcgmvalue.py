"""FAKE of DCGM's ``dcgmvalue`` binding module (blank sentinels), written from DCGM's documented API
(testing/python3/dcgmvalue.py in NVIDIA/DCGM). Test double only: DCGM cannot be installed here."""

DCGM_INT32_BLANK = 0x7FFFFFF0
DCGM_INT64_BLANK = 0x7FFFFFFFFFFFFFF0
DCGM_FP64_BLANK = 140737488355328.0
DCGM_INT32_NOT_SUPPORTED = DCGM_INT32_BLANK + 2
DCGM_INT64_NOT_SUPPORTED = DCGM_INT64_BLANK + 2
DCGM_FP64_NOT_SUPPORTED = DCGM_FP64_BLANK + 2.0
