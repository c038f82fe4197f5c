"""What runs on a GPU node beside the Slurm hooks: the node agent (:mod:`.agent`, its process and servers in
:mod:`.run`, restarts in :mod:`.resume`), the running jobs' live records (:mod:`.live`), seff-gpu's socket on
the job's own node (:mod:`.live_socket`, answered by seff/livecard.py), the per-job Prometheus series
(:mod:`.job_metrics`) and ``gpueff hook install`` (:mod:`.hook_install`).

The hooks themselves (slurm_gpueff.hook) and what they read (slurm_gpueff.collectors) stay below this layer:
they must start in milliseconds and import nothing heavy.
"""
