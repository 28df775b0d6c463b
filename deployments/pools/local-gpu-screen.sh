#!/usr/bin/env bash
# A whole screen on this machine's GPUs, from a bare box: a Prefect server (unless PREFECT_API_URL answers), the
# local-gpu pool and its deployments, one worker per GPU, then `eps-screen run CONFIG` here. Run it again to resume:
# what is up stays up, finished cells are read from the store.
#   deployments/pools/local-gpu-screen.sh deployments/configs/smol-marker.yaml
# State (the server's SQLite database, logs) lives under EPS_BOX_DIR (default .eps-box, ignored by git).
# EPS_SCREEN (default: eps-screen) and PREFECT_BIN (default: prefect) name the two commands, for a machine where
# the packages sit on PYTHONPATH rather than in a venv ("python3 -m flows.cli", "python3 -m prefect").
set -euo pipefail
config=${1:?usage: local-gpu-screen.sh CONFIG [eps-screen run options]}
box=$(realpath -m "${EPS_BOX_DIR:-.eps-box}")
eps=${EPS_SCREEN:-eps-screen}
prefect_bin=${PREFECT_BIN:-prefect}
mkdir -p "$box/prefect"
export PREFECT_HOME="$box/prefect" PREFECT_SERVER_ANALYTICS_ENABLED=false PREFECT_CLI_WRAP_LINES=false
export PREFECT_API_URL=${PREFECT_API_URL:-http://127.0.0.1:4200/api}
up() { python3 -c "import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + '/health', timeout=2)" \
         "$PREFECT_API_URL" 2>/dev/null; }
# The config's models (weights converted, tiny models built, vLLM's facts on their architectures cached) are made
# beside the server's start and the first job, not in the jobs with the GPU waiting. The screen does not wait for
# them: a conversion or a tiny build is locked across processes, so a job that needs a model being made waits for
# that one alone (on a bare H100, waiting for all of them held the screen's start back about two minutes).
$eps models prepare "$config" > "$box/prepare.log" 2>&1 &
preparing=$!
if ! up; then
  echo "local-gpu-screen: starting a Prefect server (log $box/server.log)"
  port=$(python3 -c "import sys, urllib.parse; print(urllib.parse.urlparse(sys.argv[1]).port or 4200)" "$PREFECT_API_URL")
  setsid nohup $prefect_bin server start --host 127.0.0.1 --port "$port" > "$box/server.log" 2>&1 < /dev/null &
  for _ in $(seq 300); do up && break; sleep 1; done
  up || { echo "local-gpu-screen: the server did not answer in 300 s (see $box/server.log)" >&2; exit 1; }
fi
$eps deploy --pool local-gpu
online() {
  python3 -c "import sys; from prefect.client.orchestration import get_client; from flows.runtime.workers import pool_problem
with get_client(sync_client=True) as c: sys.exit(pool_problem(c, 'local-gpu') is not None)"
}
if ! online; then
  # setsid: the workers outlive this script's shell, so a second run of it finds them online
  (cd "$box" && PREFECT_BIN="$prefect_bin" setsid bash "$OLDPWD/deployments/pools/start-local-gpu-workers.sh")
  # a worker takes a few seconds to register; the screen's first step stops at once if none is online yet
  for _ in $(seq 60); do online && break; sleep 2; done
fi
status=0
$eps run "$config" "${@:2}" || status=$?
# A failed preparation costs seconds, not results: the jobs make what they need themselves.
wait "$preparing" || { echo "local-gpu-screen: preparing the config's models failed:" >&2; cat "$box/prepare.log" >&2; }
exit $status
