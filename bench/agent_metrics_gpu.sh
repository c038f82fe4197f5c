#!/bin/bash
# On a GPU: run the real agent with [agent] metrics_port = 9818 while a one-block spin kernel runs on GPU 0,
# scrape /metrics once and print GPU 0's series (expect kernel-active ~1, SM-active ~0.0076 on an H100),
# then stop the agent with SIGTERM. Needs CuPy and prometheus_client. Log: docs/gpu-validation/h100-agent-metrics.log
set -e
D=$(mktemp -d)
cat > $D/cfg.toml <<EOT
[paths]
state_dir = "$D/state"
spool_dir = "$D/spool"
[collector]
backend = "nvml"
[agent]
interval_s = 2.0
metrics_port = 9818
EOT
python3 -m slurm_gpueff.cli.gpueff agent --config $D/cfg.toml > $D/agent.log 2>&1 &
AG=$!
python3 - <<'PY' &
import sys, time
sys.path.insert(0, "bench")
import cupy as cp
from gpu_kernels import SPIN_SRC, clock_khz
k = cp.RawKernel(SPIN_SRC, "spin")
k((1,), (1,), (cp.int64(int(clock_khz(cp) * 1000 * 14.0)),))
cp.cuda.Device(0).synchronize()
PY
SP=$!
sleep 11
python3 - <<'PY'
import urllib.request
from prometheus_client.parser import text_string_to_metric_families
body = urllib.request.urlopen("http://127.0.0.1:9818/metrics", timeout=10).read().decode()
for fam in text_string_to_metric_families(body):
    for s in fam.samples:
        if s.labels.get("minor") in (None, "0") or not s.labels:
            print(s.name, s.labels.get("model", ""), round(s.value, 5))
PY
wait $SP
kill -TERM $AG; wait $AG; echo agent rc=$?
tail -3 $D/agent.log
