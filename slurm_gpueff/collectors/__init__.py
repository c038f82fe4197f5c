"""The GPU backends: measure what a job's GPUs did between its Prolog and Epilog (nvml from the node agent's
readings, dcgm, simulated, none), and the job's window on the nvml backend.

On the hook path: stdlib only at import time (pynvml and DCGM are imported lazily, annotation-only imports
sit under ``if TYPE_CHECKING:``); see docs/DESIGN.md "Layers".
"""
