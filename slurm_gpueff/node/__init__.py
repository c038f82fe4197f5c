"""What runs on a GPU node beside the Slurm hooks: the node agent and the forwarder.

The agent: its process and servers (:mod:`.run`), what it keeps and publishes (:mod:`.agent`), NVML sampling
(:mod:`.nvml_sampler`), restarts (:mod:`.resume`), a GPU shared by several jobs (:mod:`.attribution`,
:mod:`.proc_jobs`), the per-job Prometheus series (:mod:`.job_metrics`) and seff-gpu's socket on the job's
own node (:mod:`.live_socket`). What the hooks read of it: its files (:mod:`.agent_files`), the integrals'
arithmetic (:mod:`.integrals`), GPU and MIG identity (:mod:`.gpu_ids`) and the request for a reading now
(:mod:`.tickwire`). ``gpueff forward``: :mod:`.push`.

The lowest layer but the base: the hooks' backends (slurm_gpueff.collectors) import it, so what the hooks
reach of it is stdlib only at import time, and nothing here imports the backends, the hooks or the database.
"""
