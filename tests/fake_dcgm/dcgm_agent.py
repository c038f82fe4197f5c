"""FAKE of DCGM's ``dcgm_agent`` binding module plus an in-process stand-in for nv-hostengine.

Test double only: DCGM cannot be installed on these machines. Written from DCGM's documented Python API
(NVIDIA/DCGM testing/python3/dcgm_agent.py, v4.x): same function names, argument order and return types
(handles and group ids as ``c_void_p``, ``dcgmJobGetStats`` -> ``c_dcgmJobInfo_v3``,
``dcgmGetFieldSummary`` -> the filled ``c_dcgmFieldSummaryRequest_v1``), errors raised as
``dcgm_structs.DCGMError`` subclasses carrying the DCGM status code. The hostengine's state (groups,
field groups, watches, jobs) lives in :data:`ENGINE` for the life of the test process, so a Prolog and
an Epilog run in the same test see the same "hostengine", as they would through a real one.

Tests drive it through :data:`ENGINE`: the GPUs and MIG instances DCGM lists, job-statistics values
per GPU (blank sentinels included), profiling averages per (entity group, entity, field), and failures
to inject (``ENGINE.fail["dcgmJobStartStats"] = -29``).
"""

from __future__ import annotations

from ctypes import c_void_p
from typing import Any

import dcgm_structs as S

JOBSTATS_DEFAULT = {"energyConsumed": 1_800_000, "powerUsage.average": 300.0, "smUtilization.average": 90,
                    "maxGpuMemoryUsed": 8 * 2**30, "numXidCriticalErrors": 0, "powerViolationTime": 2_500_000,
                    "thermalViolationTime": 0, "reliabilityViolationTime": 0, "boardLimitViolationTime": 0,
                    "lowUtilizationTime": 0, "syncBoostTime": 0, "pids": [4242]}


class Engine:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.gpus: list[dict[str, Any]] = []
        self.gpu_instances: list[dict[str, Any]] = []  # {entity_id, gpu_id, gi_id, ci_id}
        self.stats: dict[int, dict[str, Any]] = {}
        self.prof: dict[tuple[int, int, int], float] = {}
        self.multi_pass_max: int | None = None
        self.fail: dict[str, int] = {}
        self.groups: dict[int, dict[str, Any]] = {}
        self.field_groups: dict[int, dict[str, Any]] = {}
        self.watches: set[tuple[int, int]] = set()
        self.job_watches: dict[int, tuple[int, float]] = {}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.next_id = 2
        self.connect_params: list[dict[str, int]] = []
        self.calls: list[str] = []
        self.version = "4.2.3"

    def add_gpu(self, gpu_id: int, uuid: str, bus: str, name: str = "NVIDIA H100 80GB HBM3",
                fb_mb: int = 81559) -> None:
        self.gpus.append({"gpu_id": gpu_id, "uuid": uuid, "bus": bus, "name": name, "fb_mb": fb_mb})

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id


ENGINE = Engine()


def _call(name: str) -> None:
    ENGINE.calls.append(name)
    code = ENGINE.fail.get(name)
    if code is not None:
        raise S.DCGMError(code)


def _id(x: Any) -> int:
    return int(getattr(x, "value", x) or 0)


def dcgmInit() -> int:  # noqa: N802
    _call("dcgmInit")
    return 0


def dcgmShutdown() -> int:  # noqa: N802
    return 0


def dcgmConnect_v2(ip_address: Any, connectParams: Any, version: int = S.c_dcgmConnectV2Params_version) -> Any:  # noqa: N802,N803
    _call("dcgmConnect_v2")
    connectParams.version = version
    ENGINE.connect_params.append({"persist": int(connectParams.persistAfterDisconnect),
                                  "timeoutMs": int(connectParams.timeoutMs),
                                  "unix": int(connectParams.addressIsUnixSocket)})
    return c_void_p(1)


def dcgmDisconnect(dcgm_handle: Any) -> int:  # noqa: N802
    _call("dcgmDisconnect")
    return 0


def dcgmGetAllSupportedDevices(dcgm_handle: Any) -> list[int]:  # noqa: N802
    _call("dcgmGetAllSupportedDevices")
    return [g["gpu_id"] for g in ENGINE.gpus]


def dcgmGetDeviceAttributes(dcgm_handle: Any, gpuId: int, version: int = S.dcgmDeviceAttributes_version3) -> Any:  # noqa: N802,N803
    _call("dcgmGetDeviceAttributes")
    g = next((g for g in ENGINE.gpus if g["gpu_id"] == gpuId), None)
    if g is None:
        raise S.DCGMError(S.DCGM_ST_BADPARAM)
    a = S.c_dcgmDeviceAttributes_v3()
    a.version = version
    a.identifiers.uuid = g["uuid"].encode()
    a.identifiers.pciBusId = g["bus"].encode()
    a.identifiers.deviceName = g["name"].encode()
    a.memoryUsage.fbTotal = g["fb_mb"]
    return a


def dcgmGetGpuInstanceHierarchy(dcgm_handle: Any) -> Any:  # noqa: N802
    _call("dcgmGetGpuInstanceHierarchy")
    h = S.c_dcgmMigHierarchy_v2()
    h.version = S.c_dcgmMigHierarchy_version2
    h.count = len(ENGINE.gpu_instances)
    for i, gi in enumerate(ENGINE.gpu_instances):
        e = h.entityList[i]
        e.entity.entityGroupId = 4
        e.entity.entityId = gi["entity_id"]
        e.parent.entityGroupId = 1
        e.parent.entityId = gi["gpu_id"]
        parent = next(g for g in ENGINE.gpus if g["gpu_id"] == gi["gpu_id"])
        e.info.gpuUuid = parent["uuid"].encode()
        e.info.nvmlInstanceId = gi["gi_id"]
        e.info.nvmlComputeInstanceId = gi.get("ci_id", 0)
    return h


def dcgmGroupCreate(dcgm_handle: Any, type: int, groupName: Any) -> Any:  # noqa: N802,N803,A002
    _call("dcgmGroupCreate")
    gid = ENGINE._new_id()
    ENGINE.groups[gid] = {"name": groupName, "entities": []}
    return c_void_p(gid)


def _group(group_id: Any) -> dict[str, Any]:
    g = ENGINE.groups.get(_id(group_id))
    if g is None:
        raise S.DCGMError(S.DCGM_ST_BADPARAM)
    return g


def dcgmGroupAddDevice(dcgm_handle: Any, group_id: Any, gpu_id: int) -> int:  # noqa: N802
    _call("dcgmGroupAddDevice")
    _group(group_id)["entities"].append((1, int(gpu_id)))
    return 0


def dcgmGroupAddEntity(dcgm_handle: Any, group_id: Any, entityGroupId: int, entityId: int) -> int:  # noqa: N802,N803
    _call("dcgmGroupAddEntity")
    _group(group_id)["entities"].append((int(entityGroupId), int(entityId)))
    return 0


def dcgmGroupDestroy(dcgm_handle: Any, group_id: Any) -> int:  # noqa: N802
    _call("dcgmGroupDestroy")
    _group(group_id)
    del ENGINE.groups[_id(group_id)]
    ENGINE.job_watches.pop(_id(group_id), None)
    ENGINE.watches = {w for w in ENGINE.watches if w[0] != _id(group_id)}
    return 0


def dcgmFieldGroupCreate(dcgm_handle: Any, fieldIds: list[int], fieldGroupName: Any) -> Any:  # noqa: N802,N803
    _call("dcgmFieldGroupCreate")
    if any(fg["name"] == fieldGroupName for fg in ENGINE.field_groups.values()):
        raise S.DCGMError(S.DCGM_ST_DUPLICATE_KEY)
    fid = ENGINE._new_id()
    ENGINE.field_groups[fid] = {"name": fieldGroupName, "ids": list(fieldIds)}
    return c_void_p(fid)


def dcgmFieldGroupDestroy(dcgm_handle: Any, fieldGroupId: Any) -> int:  # noqa: N802,N803
    _call("dcgmFieldGroupDestroy")
    if ENGINE.field_groups.pop(_id(fieldGroupId), None) is None:
        raise S.DCGMError(S.DCGM_ST_BADPARAM)
    return 0


def dcgmWatchFields(dcgm_handle: Any, groupId: Any, fieldGroupId: Any, updateFreq: int, maxKeepAge: float,  # noqa: N802,N803
                    maxKeepSamples: int) -> int:
    _call("dcgmWatchFields")
    _group(groupId)
    ids = ENGINE.field_groups[_id(fieldGroupId)]["ids"]
    prof = [f for f in ids if 1001 <= f <= 1015]
    if ENGINE.multi_pass_max is not None and len(prof) > ENGINE.multi_pass_max:
        raise S.DCGMError(S.DCGM_ST_PROFILING_MULTI_PASS)
    ENGINE.watches.add((_id(groupId), _id(fieldGroupId)))
    return 0


def dcgmUnwatchFields(dcgm_handle: Any, groupId: Any, fieldGroupId: Any) -> int:  # noqa: N802,N803
    _call("dcgmUnwatchFields")
    ENGINE.watches.discard((_id(groupId), _id(fieldGroupId)))
    return 0


def dcgmWatchJobFields(dcgm_handle: Any, groupId: Any, updateFreq: int, maxKeepAge: float,  # noqa: N802,N803
                       maxKeepSamples: int) -> int:
    _call("dcgmWatchJobFields")
    _group(groupId)
    ENGINE.job_watches[_id(groupId)] = (int(updateFreq), float(maxKeepAge))
    return 0


def dcgmJobStartStats(dcgm_handle: Any, groupId: Any, jobid: Any) -> int:  # noqa: N802,N803
    _call("dcgmJobStartStats")
    _group(groupId)
    if jobid in ENGINE.jobs:
        raise S.DCGMError(S.DCGM_ST_DUPLICATE_KEY)
    ENGINE.jobs[jobid] = {"gid": _id(groupId), "running": True}
    return 0


def dcgmJobStopStats(dcgm_handle: Any, jobid: Any) -> int:  # noqa: N802
    _call("dcgmJobStopStats")
    job = ENGINE.jobs.get(jobid)
    if job is None:
        raise S.DCGMError(S.DCGM_ST_NO_DATA)
    job["running"] = False
    return 0


def _set(obj: Any, dotted: str, value: Any) -> None:
    *path, last = dotted.split(".")
    for p in path:
        obj = getattr(obj, p)
    setattr(obj, last, value)


def dcgmJobGetStats(dcgm_handle: Any, jobid: Any) -> Any:  # noqa: N802
    _call("dcgmJobGetStats")
    job = ENGINE.jobs.get(jobid)
    if job is None:
        raise S.DCGMError(S.DCGM_ST_NO_DATA)
    info = S.c_dcgmJobInfo_v3()
    info.version = S.dcgmJobInfo_version3
    gpus = [eid for eg, eid in ENGINE.groups[job["gid"]]["entities"] if eg == 1]
    info.numGpus = len(gpus)
    for i, gpu_id in enumerate(gpus):
        g = info.gpus[i]
        g.gpuId = gpu_id
        values = dict(JOBSTATS_DEFAULT)
        values.update(ENGINE.stats.get(gpu_id, {}))
        pids = values.pop("pids")
        for k, v in values.items():
            _set(g, k, v)
        g.numComputePids = len(pids)
        for j, pid in enumerate(pids):
            g.computePids[j].pid = pid
    return info


def dcgmJobRemove(dcgm_handle: Any, jobid: Any) -> int:  # noqa: N802
    _call("dcgmJobRemove")
    if ENGINE.jobs.pop(jobid, None) is None:
        raise S.DCGMError(S.DCGM_ST_NO_DATA)
    return 0


def dcgmGetFieldSummary(dcgmHandle: Any, fieldId: int, entityGroupType: int, entityId: int,  # noqa: N802,N803
                        summaryMask: int, startTime: int, endTime: int) -> Any:
    _call("dcgmGetFieldSummary")
    watched = any(fieldId in ENGINE.field_groups[fg]["ids"] and (entityGroupType, entityId) in
                  ENGINE.groups.get(gid, {}).get("entities", []) for gid, fg in ENGINE.watches)
    if not watched:
        raise S.DCGMError(S.DCGM_ST_NOT_WATCHED)
    value = ENGINE.prof.get((entityGroupType, entityId, fieldId))
    if value is None or endTime <= startTime:
        raise S.DCGMError(S.DCGM_ST_NO_DATA)
    req = S.c_dcgmFieldSummaryRequest_v1()
    req.version = S.dcgmFieldSummaryRequest_version1
    req.fieldId = fieldId
    req.entityGroupType = entityGroupType
    req.entityId = entityId
    req.summaryTypeMask = summaryMask
    req.startTime = startTime
    req.endTime = endTime
    req.response.summaryCount = 1
    if summaryMask == S.DCGM_SUMMARY_COUNT:
        req.response.values[0].i64 = max(1, (endTime - startTime) // 1_000_000)
    else:
        req.response.values[0].dbl = value
    return req


def dcgmVersionInfo() -> Any:  # noqa: N802
    _call("dcgmVersionInfo")
    msg = S.c_dcgmVersionInfo_v2()
    msg.version = S.dcgmVersionInfo_version2
    msg.rawBuildInfoString = f"version:{ENGINE.version};arch:x86_64;buildtype:Release".encode()
    return msg
