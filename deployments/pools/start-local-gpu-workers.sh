#!/usr/bin/env bash
# Starts one `local-gpu` worker per GPU, each pinned to its GPU and taking one cell at a time.
#   deployments/pools/start-local-gpu-workers.sh            # every GPU nvidia-smi lists
#   deployments/pools/start-local-gpu-workers.sh 0 2 3      # only these GPUs
# Logs: worker-gpu-<i>.log in the current directory; stop them with the PIDs printed (kill PID).
set -euo pipefail
prefect_bin="${PREFECT_BIN:-prefect}"
if [ "$#" -gt 0 ]; then gpus=("$@"); else mapfile -t gpus < <(nvidia-smi --query-gpu=index --format=csv,noheader); fi
[ "${#gpus[@]}" -gt 0 ] || { echo "no GPU found (nvidia-smi)" >&2; exit 1; }
for i in "${gpus[@]}"; do
  CUDA_VISIBLE_DEVICES="$i" nohup $prefect_bin worker start --pool local-gpu --name "gpu-$i-$(hostname)" \
    --limit 1 > "worker-gpu-$i.log" 2>&1 &
  echo "worker for GPU $i: pid $! (log worker-gpu-$i.log)"
done
