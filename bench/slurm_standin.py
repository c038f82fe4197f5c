#!/usr/bin/env python3
"""Slurm's client commands for the site bench, as real programs: installed (:func:`install`) as ``sacct``,
``sacctmgr``, ``squeue``, ``scontrol`` and ``scancel`` in one folder that the service's ``[sacct] command``
names, so that the product's one Slurm runner finds and starts them as it would Slurm's (a clean environment,
the real argv: a list too long for one argument fails in ``exec`` with E2BIG, as it would for Slurm's own).

They answer from the simulated site's state, a JSON file the bench rewrites (atomically) as jobs start and
end: ``{"cluster": str, "jobs": {"ID": [user, account, partition, nodelist, gpus, start, end|null, array
job id|null, array task id|null]}}``.

* ``squeue -h -a -j IDS -O FIELDS`` (the idle-GPU pass): a fixed-width line per running job asked about, each
  field padded to the width asked, as Slurm pads them; ``squeue -h -j ID -o '%T|%u|%a'`` (seff-gpu);
* ``sacct --json ... -j IDS`` (enrichment): 24.11's data_parser v0.0.42 shape (a captured job from
  tests/data/sacct/24.11.5 as the template) for each finished job asked about; ``sacct -P ... -o
  JobIDRaw,JobID,AllocCPUS,TotalCPU,MaxRSS -j IDS``: the job's line and its batch step's;
* ``sacctmgr -P show user withcoord``: 24.11's captured output; ``scontrol show config``: 24.11's captured
  output; ``scancel`` and ``scontrol update``: refused (the bench runs the policy dry).

What they do not cover: a real slurmctld's and slurmdbd's speed at this size (not known here: they answer
as fast as Python reads the state file, so the bench's pass times hold the product's own work and the
stand-ins' parse, not the controller's), and every squeue/sacct option the product does not use.
"""

from __future__ import annotations

import copy
import json
import os
import sys

STATE = "@STATE@"
DATA = "@DATA@"
SQUEUE_WIDTHS = {"JobID": 40, "BatchFlag": 8, "Partition": 200, "QOS": 200, "State": 24, "RestartCnt": 12}


def _state() -> dict:
    with open(STATE) as fh:
        return json.load(fh)


def _ids(argv: list[str]) -> list[str] | None:
    return argv[argv.index("-j") + 1].split(",") if "-j" in argv else None


def squeue(argv: list[str]) -> int:
    jobs = _state()["jobs"]
    ids = _ids(argv) or [i for i, j in jobs.items() if j[6] is None]
    if "-O" in argv:
        fields = [(f.split(":")[0], int(f.split(":")[1]) if ":" in f else SQUEUE_WIDTHS.get(f.split(":")[0], 20))
                  for f in argv[argv.index("-O") + 1].split(",")]
        out = []
        for i in ids:
            j = jobs.get(i)
            if j is None or j[6] is not None:
                continue
            vals = {"JobID": i, "BatchFlag": "1", "Partition": j[2], "QOS": "normal", "State": "RUNNING",
                    "RestartCnt": "0"}
            out.append("".join(str(vals.get(f, "")).ljust(w) for f, w in fields).rstrip() + "\n")
        sys.stdout.write("".join(out))
        return 0
    out = []
    for i in ids:
        j = jobs.get(i.split("_")[0])
        if j is not None and j[6] is None:
            out.append(f"RUNNING|{j[0]}|{j[1]}\n")
    if not out:
        print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
        return 1
    sys.stdout.write("".join(out))
    return 0


def sacct(argv: list[str]) -> int:
    st = _state()
    jobs = st["jobs"]
    ids = [i for i in (_ids(argv) or []) if i in jobs and jobs[i][6] is not None]
    if "--json" in argv:
        with open(os.path.join(DATA, "sacct", "24.11.5", "sacct.v0.0.42.json")) as fh:
            tmpl = json.load(fh)
        proto = tmpl["jobs"][0]
        out = []
        for i in ids:
            user, account, partition, nodes, gpus, start, end, aid, tid = jobs[i]
            o = copy.deepcopy(proto)
            o.update(job_id=int(i), user=user, account=account, partition=partition, nodes=hostlist(nodes),
                     cluster=st["cluster"], name="job" + i)
            if aid is not None:
                o["array"]["job_id"] = aid
                o["array"]["task_id"] = {"set": True, "infinite": False, "number": tid}
            o["time"].update(start=int(start), end=int(end), submission=int(start) - 60, eligible=int(start) - 60,
                             elapsed=int(end - start))
            for t in o["tres"]["allocated"] + o["tres"]["requested"]:
                if t["type"] == "gres" and t["name"] == "gpu":
                    t["count"] = gpus
            out.append(o)
        tmpl["jobs"] = out
        json.dump(tmpl, sys.stdout)
        return 0
    if "-P" in argv:
        delim = next((a.split("=", 1)[1] for a in argv if a.startswith("--delimiter=")), "|")
        lines = []
        for i in ids:
            _u, _a, _p, _n, gpus, start, end = jobs[i][:7]
            cpu = int((end - start) * 4 * gpus)
            lines.append(delim.join((i, i, str(8 * gpus), f"{cpu // 3600:02d}:{cpu % 3600 // 60:02d}:00", "")))
            lines.append(delim.join((f"{i}.batch", f"{i}.batch", str(8 * gpus),
                                     f"{cpu // 3600:02d}:{cpu % 3600 // 60:02d}:00", f"{1000 + int(i) % 9000}M")))
        sys.stdout.write("".join(ln + "\n" for ln in lines))
        return 0
    return 0


def hostlist(nodes: str) -> str:
    """Slurm's compressed form of a comma list of names that differ in a numeric suffix of fixed width, as
    sacct prints a job's NodeList ("gpu[00007-00008]"); a name alone stays as it is."""
    names = nodes.split(",")
    if len(names) == 1:
        return names[0]
    stem = names[0].rstrip("0123456789")
    nums = [n[len(stem):] for n in names]
    if not all(n.startswith(stem) and x.isdigit() for n, x in zip(names, nums, strict=True)):
        return nodes
    parts, i = [], 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and int(nums[j + 1]) == int(nums[j]) + 1:
            j += 1
        parts.append(nums[i] if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return f"{stem}[{','.join(parts)}]"


def captured(name: str) -> int:
    with open(os.path.join(DATA, "slurmcmds", name)) as fh:
        sys.stdout.write(fh.read())
    return 0


def main() -> int:
    name, argv = os.path.basename(sys.argv[0]), sys.argv[1:]
    with open(os.path.join(os.path.dirname(STATE), "calls.log"), "a") as fh:  # one line a call
        fh.write(f"{name} {len(argv)} {max(map(len, argv), default=0)}\n")
    if name == "squeue":
        return squeue(argv)
    if name == "sacct":
        return sacct(argv)
    if name == "sacctmgr":
        return captured("sacctmgr-user-withcoord-24.11.5.psv")
    if name == "scontrol" and argv[:2] == ["show", "config"]:
        return captured("scontrol-show-config-clustername-24.11.5.txt")
    print(f"{name}: error: the site bench runs the policy dry; {' '.join(argv)[:80]} refused", file=sys.stderr)
    return 1


def install(folder: str, state: str) -> str:
    """The stand-ins in ``folder`` reading ``state``; returns the path of ``sacct`` (``[sacct] command``)."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.abspath(__file__)) as fh:
        src = fh.read()
    data = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "data")
    src = src.replace('"@STATE@"', repr(state), 1).replace('"@DATA@"', repr(data), 1)
    src = src.replace("#!/usr/bin/env python3", f"#!{sys.executable}", 1)
    for name in ("sacct", "sacctmgr", "squeue", "scontrol", "scancel"):
        path = os.path.join(folder, name)
        with open(path, "w") as fh:
            fh.write(src)
        os.chmod(path, 0o755)
    return os.path.join(folder, "sacct")


def write_state(path: str, cluster: str, jobs: dict[str, list]) -> None:
    """The site's state, replaced atomically (a stand-in reads either the old file or the new one)."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fh:
        json.dump({"cluster": cluster, "jobs": jobs}, fh, separators=(",", ":"))
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
