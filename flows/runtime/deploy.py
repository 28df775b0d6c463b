"""`eps-screen deploy`: the work pools of deployments/pools/ and the deployments of deployments/prefect.yaml.

Idempotent. A pool that exists is updated in place: its base job template is rebuilt from the worker type's
own template plus the defaults in deployments/pools/<pool>.yaml, but a default someone changed in the UI (a
RunPod image, say) is kept unless the pool file sets that variable. The deployments are applied by
`prefect --no-prompt deploy` itself, run from the repository root, so the command a researcher can type and
the one this runs are the same.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from flows.runtime import names
from flows.runtime.api import api_problem

REPO = Path(__file__).resolve().parents[2]
POOLS_DIR = REPO / "deployments" / "pools"
PREFECT_FILE = REPO / "deployments" / "prefect.yaml"


@dataclass
class PoolSpec:
    name: str
    type: str
    description: str = ""
    concurrency_limit: int | str | None = None
    defaults: dict = field(default_factory=dict)


def pool_specs() -> dict[str, PoolSpec]:
    specs = {}
    for path in sorted(POOLS_DIR.glob("*.yaml")):
        data = yaml.safe_load(path.read_text()) or {}
        specs[path.stem] = PoolSpec(name=path.stem, **data)
    return specs


def pools_of_deployments() -> dict[str, str]:
    """Deployment name -> work pool name, as deployments/prefect.yaml declares them."""
    data = yaml.safe_load(PREFECT_FILE.read_text())
    return {d["name"]: d["work_pool"]["name"] for d in data["deployments"]}


def worker_class(type_: str):
    """The worker class registered for a pool type, or None (e.g. `runpod` when infra/ is not installed)."""
    from prefect.plugins import load_prefect_collections
    from prefect.workers.base import BaseWorker

    load_prefect_collections()
    return BaseWorker.get_worker_class_from_type(type_)


def gpu_count() -> int:
    """GPUs on this machine, as nvidia-smi lists them (1 when there is no nvidia-smi: a pool needs a limit >= 1)."""
    if shutil.which("nvidia-smi") is None:
        return 1
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 1
    return max(1, sum(1 for line in out.splitlines() if line.startswith("GPU ")))


def base_job_template(spec: PoolSpec) -> dict:
    """The worker type's default template with the pool file's variable defaults applied."""
    cls = worker_class(spec.type)
    if cls is None:
        raise LookupError(f"worker type {spec.type!r} is not installed")
    template = copy.deepcopy(cls.get_default_base_job_template())
    props = template["variables"]["properties"]
    unknown = sorted(set(spec.defaults) - set(props))
    if unknown:
        raise ValueError(f"deployments/pools/{spec.name}.yaml: unknown variables {unknown}; known: {sorted(props)}")
    for key, value in spec.defaults.items():
        # {python}: this interpreter, the one a local pool's workers run (eps-screen deploy runs on their machine)
        props[key]["default"] = value.replace("{python}", sys.executable) if isinstance(value, str) else value
    return template


def keep_ui_edits(new: dict, existing: dict, type_default: dict, spec: PoolSpec) -> dict:
    """Keep defaults set on the live pool (in the UI) that differ from the type's and that the pool file leaves alone."""
    merged = copy.deepcopy(new)
    live = existing.get("variables", {}).get("properties", {})
    stock = type_default.get("variables", {}).get("properties", {})
    for key, prop in merged["variables"]["properties"].items():
        if key in spec.defaults or "default" not in live.get(key, {}):
            continue
        if live[key]["default"] != stock.get(key, {}).get("default"):
            prop["default"] = live[key]["default"]
    return merged


def concurrency(spec: PoolSpec, gpus: int | None) -> int | None:
    if spec.concurrency_limit == "gpus":
        return gpus or gpu_count()
    return spec.concurrency_limit  # type: ignore[return-value]


def apply_pool(client, spec: PoolSpec, gpus: int | None) -> str:
    """Create or update one pool; returns what was done, in a few words."""
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate
    from prefect.exceptions import ObjectNotFound

    template = base_job_template(spec)
    limit = concurrency(spec, gpus)
    try:
        pool = client.read_work_pool(spec.name)
    except ObjectNotFound:
        client.create_work_pool(WorkPoolCreate(name=spec.name, type=spec.type, description=spec.description,
                                               base_job_template=template, concurrency_limit=limit))
        return f"created (type {spec.type}, concurrency limit {limit})"
    if pool.type != spec.type:
        raise ValueError(f"pool {spec.name!r} exists with type {pool.type!r}, not {spec.type!r}: delete it first "
                         f"(prefect work-pool delete {spec.name})")
    stock = worker_class(spec.type).get_default_base_job_template()
    template = keep_ui_edits(template, pool.base_job_template, stock, spec)
    client.update_work_pool(spec.name, WorkPoolUpdate(description=spec.description, base_job_template=template,
                                                       concurrency_limit=limit))
    return f"updated (type {spec.type}, concurrency limit {limit})"


def prefect_deploy(names: list[str]) -> subprocess.CompletedProcess:
    """`prefect --no-prompt deploy` from the repository root for these deployment names."""
    # `python -m prefect`, not the console script beside the interpreter: where the packages sit on PYTHONPATH
    # (a GPU image's own Python) there is no such script
    cmd = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--prefect-file", str(PREFECT_FILE.relative_to(REPO))]
    for name in names:
        cmd += ["--name", name]
    from prefect.settings import PREFECT_API_KEY, PREFECT_API_URL

    env = {**os.environ, "PREFECT_CLI_WRAP_LINES": "false", "COLUMNS": "200", "PREFECT_API_URL": PREFECT_API_URL.value()}
    if PREFECT_API_KEY.value():  # the API this process talks to, whether it came from the env or a profile
        env["PREFECT_API_KEY"] = PREFECT_API_KEY.value().get_secret_value()
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def set_aggregate(client, cron: str | None, store: str | None) -> list[str]:
    """Replace the aggregate deployment's store parameter and/or schedule (flags of `eps-screen deploy`).

    The store first: the server's scheduler copies the deployment's parameters into each run it creates, and a
    parameter update deletes only the runs still in the future. With the schedule first, a run the scheduler made
    in between and that fell due before the update kept the old store (a CI run aggregated an empty `results`)."""
    from prefect.client.schemas.actions import DeploymentUpdate
    from prefect.client.schemas.schedules import CronSchedule

    done = []
    dep = client.read_deployment_by_name(names.AGGREGATE.full_name)
    if store:
        client.update_deployment(dep.id, DeploymentUpdate(parameters={**dep.parameters, "store": store}))
        done.append(f"store {store!r}")
    if cron:
        for s in client.read_deployment_schedules(dep.id):
            client.delete_deployment_schedule(dep.id, s.id)
        client.create_deployment_schedules(dep.id, [(CronSchedule(cron=cron, timezone="UTC"), True)])
        done.append(f"schedule cron {cron!r} (UTC)")
    return done


def deploy(console, *, pools: list[str] | None = None, gpus: int | None = None, aggregate_cron: str | None = None,
           aggregate_store: str | None = None) -> int:
    """Create/update the pools, then apply the deployments whose pools exist. Returns an exit code."""
    from prefect.client.orchestration import get_client
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    problem = api_problem(required=True)
    if problem:
        console.print(f"[red]error[/]: {problem}")
        return 2
    specs = pool_specs()
    wanted = pools or list(specs)
    unknown = sorted(set(wanted) - set(specs))
    if unknown:
        console.print(f"[red]error[/]: unknown pools {unknown}; known: {sorted(specs)}")
        return 2
    ready: set[str] = set()
    code = 0
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with get_client(sync_client=True) as client, Progress(*columns, console=console, transient=True) as bar:
        for name in wanted:
            spec = specs[name]
            step = bar.add_task(f"work pool {name}")
            if worker_class(spec.type) is None:
                console.print(f"[yellow]skip[/] work pool {name}: worker type {spec.type!r} is not installed "
                              f"(pip install -e ./infra registers `runpod`)")
            else:
                try:
                    console.print(f"[green]ok[/]   work pool {name}: {apply_pool(client, spec, gpus)}")
                    ready.add(name)
                except Exception as exc:  # one line per failure, no traceback
                    console.print(f"[red]FAIL[/] work pool {name}: {type(exc).__name__}: {exc}")
                    code = 1
            bar.remove_task(step)
        existing = {p.name for p in client.read_work_pools()}
        targets = {d: p for d, p in pools_of_deployments().items() if p in ready}
        skipped = sorted(set(pools_of_deployments()) - set(targets))
        if targets:
            step = bar.add_task(f"prefect deploy {', '.join(targets)}")
            out = prefect_deploy(list(targets))
            bar.remove_task(step)
            if out.returncode != 0:
                tail = (out.stdout + out.stderr).strip().splitlines()[-8:]
                console.print(f"[red]FAIL[/] prefect deploy exited {out.returncode}:\n  " + "\n  ".join(tail))
                return 1
            for dep, pool in targets.items():
                console.print(f"[green]ok[/]   deployment {dep} -> pool {pool}")
        for dep in skipped:
            pool = pools_of_deployments()[dep]
            why = ("does not exist" if pool not in existing else
                   "was not selected (--pool)" if pool not in wanted else "was skipped above")
            console.print(f"[yellow]skip[/] deployment {dep}: its pool {pool} {why}")
        if (aggregate_cron or aggregate_store) and names.AGGREGATE.name in targets:
            changed = set_aggregate(client, aggregate_cron, aggregate_store)
            console.print(f"[green]ok[/]   {names.AGGREGATE.full_name}: {', '.join(changed)}")
    return code


def template_json(name: str) -> str:
    """The base job template `eps-screen deploy` gives a pool, for `prefect work-pool create --base-job-template`."""
    return json.dumps(base_job_template(pool_specs()[name]), indent=2)
