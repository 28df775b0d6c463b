"""Is a worker online for a work pool, and the command that starts one: for `doctor`, the screen's first step
(a GPU pool without a worker) and `eps-screen run --submit` (a `cpu` pool without one).

Without this check a run sent to a pool with no worker sits Late with no message, for ever.
"""

from __future__ import annotations

from datetime import datetime, timedelta, UTC

from flows.runtime.names import CPU_POOL, LOCAL_GPU_POOL, RUNPOD_POOL

# The commands of docs/walkthroughs.md ("Workers") and deployments/pools/*.yaml.
START_COMMANDS = {
    CPU_POOL: f"prefect worker start --pool {CPU_POOL}",
    LOCAL_GPU_POOL: "deployments/pools/start-local-gpu-workers.sh",
    RUNPOD_POOL: f"prefect worker start --pool {RUNPOD_POOL} --type runpod --limit 8",
}


def start_command(pool: str) -> str:
    return START_COMMANDS.get(pool, f"prefect worker start --pool {pool}")


def online_workers(client, pool: str) -> list:
    """Workers of the pool the server calls ONLINE, or whose last heartbeat is within 3 of their intervals."""
    now = datetime.now(UTC)

    def recent(w) -> bool:
        interval = timedelta(seconds=3 * (w.heartbeat_interval_seconds or 30))
        return w.last_heartbeat_time is not None and now - w.last_heartbeat_time < interval

    return [w for w in client.read_workers_for_work_pool(pool) if w.status.value == "ONLINE" or recent(w)]


def no_worker(pool: str) -> str:
    return f"no worker online for pool {pool!r}: start one ({start_command(pool)}; docs/walkthroughs.md)"


def pool_problem(client, pool: str) -> str | None:
    """None when the pool exists, is not paused and has a worker online; else one line naming the pool and the fix."""
    from prefect.exceptions import ObjectNotFound

    try:
        found = client.read_work_pool(pool)
    except ObjectNotFound:
        return f"work pool {pool!r} does not exist: run `eps-screen deploy`"
    if found.is_paused:
        return f"work pool {pool!r} is paused: prefect work-pool resume {pool}"
    return None if online_workers(client, pool) else no_worker(pool)
