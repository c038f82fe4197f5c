"""Everything that speaks to or about Slurm: the hooks' environment (:mod:`.hookenv`), the job ids users
type (:mod:`.jobid`), sacct's output of every generation (:mod:`.sacct`, :mod:`.sacct_json`,
:mod:`.sacct_rows`, :mod:`.sacct_steps`), the small questions to sacctmgr, squeue and scontrol and the
idle-GPU policy's actions (:mod:`.commands`), all run through the one bounded runner (:mod:`.runner`).

Stdlib only (the hooks load :mod:`.hookenv` on every job); nothing is imported here, so a hook pays only for
what it uses.
"""
