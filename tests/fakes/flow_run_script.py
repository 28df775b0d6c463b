"""What a fake pod runs in the worker's unit tests: plays a flow run's engine against the Prefect API.

    python tests/fakes/flow_run_script.py MODE [SECONDS]

complete: Running, sleep, Completed | fail: Running, Failed | hang: Running, sleep forever |
exit: exit 3 without touching the state | env: write the environment to $ENV_DUMP, then complete.
"""

import os
import sys
import time
from uuid import UUID

from prefect.client.orchestration import get_client
from prefect.states import Completed, Failed, Running

mode = sys.argv[1]
seconds = float(sys.argv[2]) if len(sys.argv) > 2 else 0.5
flow_run_id = UUID(os.environ["PREFECT__FLOW_RUN_ID"])

if mode == "exit":
    sys.exit(3)
if mode == "env":
    with open(os.environ["ENV_DUMP"], "w") as fh:
        fh.write("\n".join(f"{k}={v}" for k, v in sorted(os.environ.items())))
with get_client(sync_client=True) as client:
    client.set_flow_run_state(flow_run_id, Running())
    print(f"flow run {flow_run_id} running ({mode})", flush=True)
    if mode == "hang":
        time.sleep(3600)
    time.sleep(seconds)
    client.set_flow_run_state(flow_run_id, Failed(message="boom") if mode == "fail" else Completed())
