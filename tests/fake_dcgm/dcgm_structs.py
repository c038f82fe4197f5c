"""FAKE of DCGM's ``dcgm_structs`` binding module, for tests only (DCGM cannot be installed here).

Written from DCGM's documented Python API (NVIDIA/DCGM testing/python3/dcgm_structs.py, v4.x): the same
names, status codes, exception classes (``DCGMError`` with ``.value``, one ``DCGMError_*`` subclass per
status) and ctypes structure layouts for the structures the dcgm backend touches (connect params v2,
device attributes v3, job info v3, field summary request v1, MIG hierarchy v2, version info v2). Bytes
fields read back as ``str``, as in the real ``_DcgmStructure``. ``_dcgmInit`` loads no library.
"""

from __future__ import annotations

import string
import sys
from ctypes import (
    Structure,
    Union,
    c_char,
    c_double,
    c_int32,
    c_int64,
    c_uint,
    c_uint32,
    c_uint64,
    c_ushort,
    sizeof,
)

DCGM_MAX_STR_LENGTH = 256
DCGM_MAX_NUM_DEVICES = 32
DCGM_MAX_PID_INFO_NUM = 16
DCGM_HEALTH_WATCH_COUNT_V1 = 10
DCGM_SUMMARY_SIZE = 7
DCGM_MAX_HIERARCHY_INFO = DCGM_MAX_NUM_DEVICES * 14

DCGM_ST_OK = 0
DCGM_ST_BADPARAM = -1
DCGM_ST_GENERIC_ERROR = -3
DCGM_ST_NOT_SUPPORTED = -6
DCGM_ST_INIT_ERROR = -7
DCGM_ST_NO_DATA = -14
DCGM_ST_NOT_WATCHED = -16
DCGM_ST_NO_PERMISSION = -17
DCGM_ST_CONNECTION_NOT_VALID = -21
DCGM_ST_LIBRARY_NOT_FOUND = -25
DCGM_ST_DUPLICATE_KEY = -26
DCGM_ST_REQUIRES_ROOT = -29
DCGM_ST_MODULE_NOT_LOADED = -33
DCGM_ST_PROFILING_NOT_SUPPORTED = -36
DCGM_ST_PROFILING_MULTI_PASS = -38

DCGM_GROUP_DEFAULT = 0
DCGM_GROUP_EMPTY = 1

DCGM_SUMMARY_MIN = 0x1
DCGM_SUMMARY_MAX = 0x2
DCGM_SUMMARY_AVG = 0x4
DCGM_SUMMARY_SUM = 0x8
DCGM_SUMMARY_COUNT = 0x10

_MESSAGES = {
    DCGM_ST_NO_DATA: "No data is available",
    DCGM_ST_CONNECTION_NOT_VALID: "The connection to the host engine is not valid any longer",
    DCGM_ST_DUPLICATE_KEY: "Duplicate key passed to function",
    DCGM_ST_REQUIRES_ROOT: "This operation is not supported when the host engine is running as non root",
    DCGM_ST_PROFILING_MULTI_PASS: "The requested profiling metrics cannot be collected in a single pass",
    DCGM_ST_PROFILING_NOT_SUPPORTED: "Profiling is not supported for this group of GPUs or GPU",
}


class DCGMError(Exception):
    """Same contract as the real class: ``DCGMError(code)`` yields the ``DCGMError_*`` subclass."""

    _valClassMapping: dict[int, type] = {}

    def __new__(cls, value: int):  # type: ignore[no-untyped-def]
        if cls is DCGMError:
            cls = DCGMError._valClassMapping.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        obj.info = None
        return obj

    def __init__(self, value: int | None = None) -> None:
        super().__init__(value)

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"DCGM Error with code {self.value}")


def _make_error_classes() -> None:
    mod = sys.modules[__name__]
    for name in [n for n in dir(mod) if n.startswith("DCGM_ST_")]:
        cls_name = "DCGMError_" + string.capwords(name.replace("DCGM_ST_", ""), "_").replace("_", "")
        val = getattr(mod, name)

        def gen_new(v: int):  # type: ignore[no-untyped-def]
            def new(typ, *_a):  # type: ignore[no-untyped-def]
                return DCGMError.__new__(typ, v)
            return new

        cls = type(cls_name, (DCGMError,), {"__new__": gen_new(val)})
        setattr(mod, cls_name, cls)
        DCGMError._valClassMapping[val] = cls


_make_error_classes()


def dcgmExceptionClass(code: int) -> type:  # noqa: N802 - the real name
    return DCGMError._valClassMapping.get(code)  # type: ignore[return-value]


def _dcgmCheckReturn(ret: int) -> int:  # noqa: N802
    if ret != DCGM_ST_OK:
        raise DCGMError(ret)
    return ret


def _dcgmInit(libDcgmPath: str | None = None) -> None:  # noqa: N802,N803 - no library to load in the fake
    return None


class _DcgmStructure(Structure):
    def __getattribute__(self, key: str):  # type: ignore[no-untyped-def]
        value = super().__getattribute__(key)
        return value.decode("utf-8") if isinstance(value, bytes) else value

    def __setattr__(self, key: str, value) -> None:  # type: ignore[no-untyped-def]
        if isinstance(value, str):
            value = value.encode("utf-8")
        super().__setattr__(key, value)


_PrintableStructure = _DcgmStructure


def make_dcgm_version(struct, ver):  # type: ignore[no-untyped-def]
    return sizeof(struct) | (ver << 24)


class c_dcgmConnectV2Params_v2(_DcgmStructure):  # noqa: N801
    _fields_ = [("version", c_uint), ("persistAfterDisconnect", c_uint), ("timeoutMs", c_uint),
                ("addressIsUnixSocket", c_uint)]


c_dcgmConnectV2Params_version2 = make_dcgm_version(c_dcgmConnectV2Params_v2, 2)
c_dcgmConnectV2Params_version = c_dcgmConnectV2Params_version2


class c_dcgmDeviceIdentifiers_v1(_DcgmStructure):  # noqa: N801
    _fields_ = [("version", c_uint), ("brandName", c_char * DCGM_MAX_STR_LENGTH),
                ("deviceName", c_char * DCGM_MAX_STR_LENGTH), ("pciBusId", c_char * DCGM_MAX_STR_LENGTH),
                ("serial", c_char * DCGM_MAX_STR_LENGTH), ("uuid", c_char * DCGM_MAX_STR_LENGTH),
                ("vbios", c_char * DCGM_MAX_STR_LENGTH), ("inforomImageVersion", c_char * DCGM_MAX_STR_LENGTH),
                ("pciDeviceId", c_uint32), ("pciSubSystemId", c_uint32),
                ("driverVersion", c_char * DCGM_MAX_STR_LENGTH), ("virtualizationMode", c_uint32)]


class c_dcgmDeviceMemoryUsage_v1(_DcgmStructure):  # noqa: N801
    _fields_ = [("version", c_uint), ("bar1Total", c_uint), ("fbTotal", c_uint), ("fbUsed", c_uint),
                ("fbFree", c_uint)]


class c_dcgmDeviceAttributes_v3(_DcgmStructure):  # noqa: N801
    """Only the members the backend reads (identifiers, memoryUsage); the real one has more before them."""

    _fields_ = [("version", c_uint), ("identifiers", c_dcgmDeviceIdentifiers_v1),
                ("memoryUsage", c_dcgmDeviceMemoryUsage_v1)]


dcgmDeviceAttributes_version3 = make_dcgm_version(c_dcgmDeviceAttributes_v3, 3)


class c_dcgmStatSummaryInt64_t(_DcgmStructure):  # noqa: N801
    _fields_ = [("minValue", c_int64), ("maxValue", c_int64), ("average", c_int64)]


class c_dcgmStatSummaryInt32_t(_DcgmStructure):  # noqa: N801
    _fields_ = [("minValue", c_int32), ("maxValue", c_int32), ("average", c_int32)]


class c_dcgmStatSummaryFp64_t(_DcgmStructure):  # noqa: N801
    _fields_ = [("minValue", c_double), ("maxValue", c_double), ("average", c_double)]


class c_dcgmProcessUtilInfo_t(_DcgmStructure):  # noqa: N801
    _fields_ = [("pid", c_uint), ("smUtil", c_double), ("memUtil", c_double)]


class c_dcgmHealthResponseInfo_t(_DcgmStructure):  # noqa: N801
    _fields_ = [("system", c_uint), ("health", c_uint)]


class c_dcgmGpuUsageInfo_t(_DcgmStructure):  # noqa: N801
    _fields_ = [
        ("gpuId", c_uint32), ("energyConsumed", c_int64), ("powerUsage", c_dcgmStatSummaryFp64_t),
        ("pcieRxBandwidth", c_dcgmStatSummaryInt64_t), ("pcieTxBandwidth", c_dcgmStatSummaryInt64_t),
        ("pcieReplays", c_int64), ("startTime", c_int64), ("endTime", c_int64),
        ("smUtilization", c_dcgmStatSummaryInt32_t), ("memoryUtilization", c_dcgmStatSummaryInt32_t),
        ("eccSingleBit", c_uint32), ("eccDoubleBit", c_uint32), ("memoryClock", c_dcgmStatSummaryInt32_t),
        ("smClock", c_dcgmStatSummaryInt32_t), ("numXidCriticalErrors", c_int32),
        ("xidCriticalErrorsTs", c_int64 * 10), ("numComputePids", c_int32),
        ("computePids", c_dcgmProcessUtilInfo_t * DCGM_MAX_PID_INFO_NUM), ("numGraphicsPids", c_int32),
        ("graphicsPids", c_dcgmProcessUtilInfo_t * DCGM_MAX_PID_INFO_NUM), ("maxGpuMemoryUsed", c_int64),
        ("powerViolationTime", c_int64), ("thermalViolationTime", c_int64),
        ("reliabilityViolationTime", c_int64), ("boardLimitViolationTime", c_int64),
        ("lowUtilizationTime", c_int64), ("syncBoostTime", c_int64), ("overallHealth", c_uint),
        ("incidentCount", c_uint), ("systems", c_dcgmHealthResponseInfo_t * DCGM_HEALTH_WATCH_COUNT_V1),
    ]


class c_dcgmJobInfo_v3(_DcgmStructure):  # noqa: N801
    _fields_ = [("version", c_uint32), ("numGpus", c_int32), ("summary", c_dcgmGpuUsageInfo_t),
                ("gpus", c_dcgmGpuUsageInfo_t * DCGM_MAX_NUM_DEVICES)]


dcgmJobInfo_version3 = make_dcgm_version(c_dcgmJobInfo_v3, 3)


class c_dcgmSummaryResponse_t(_DcgmStructure):  # noqa: N801
    class ResponseValue(Union):
        _fields_ = [("i64", c_int64), ("dbl", c_double)]

    _fields_ = [("fieldType", c_uint), ("summaryCount", c_uint), ("values", ResponseValue * DCGM_SUMMARY_SIZE)]


class c_dcgmFieldSummaryRequest_v1(_DcgmStructure):  # noqa: N801
    _fields_ = [("version", c_uint), ("fieldId", c_ushort), ("entityGroupType", c_uint32), ("entityId", c_uint),
                ("summaryTypeMask", c_uint32), ("startTime", c_uint64), ("endTime", c_uint64),
                ("response", c_dcgmSummaryResponse_t)]


dcgmFieldSummaryRequest_version1 = make_dcgm_version(c_dcgmFieldSummaryRequest_v1, 1)


class c_dcgmGroupEntityPair_t(_DcgmStructure):  # noqa: N801
    _fields_ = [("entityGroupId", c_uint32), ("entityId", c_uint32)]


class c_dcgmMigEntityInfo_t(_DcgmStructure):  # noqa: N801
    _fields_ = [("gpuUuid", c_char * 128), ("nvmlGpuIndex", c_uint), ("nvmlInstanceId", c_uint),
                ("nvmlComputeInstanceId", c_uint), ("nvmlMigProfileId", c_uint), ("nvmlProfileSlices", c_uint)]


class c_dcgmMigHierarchyInfo_v2(_DcgmStructure):  # noqa: N801
    _fields_ = [("entity", c_dcgmGroupEntityPair_t), ("parent", c_dcgmGroupEntityPair_t),
                ("info", c_dcgmMigEntityInfo_t)]


class c_dcgmMigHierarchy_v2(_DcgmStructure):  # noqa: N801
    _fields_ = [("version", c_uint), ("count", c_uint),
                ("entityList", c_dcgmMigHierarchyInfo_v2 * DCGM_MAX_HIERARCHY_INFO)]


c_dcgmMigHierarchy_version2 = make_dcgm_version(c_dcgmMigHierarchy_v2, 2)


class c_dcgmVersionInfo_v2(_DcgmStructure):  # noqa: N801
    _fields_ = [("version", c_uint32), ("rawBuildInfoString", c_char * (DCGM_MAX_STR_LENGTH * 2))]


dcgmVersionInfo_version2 = make_dcgm_version(c_dcgmVersionInfo_v2, 2)
