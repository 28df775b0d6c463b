"""`eps-screen doctor [CONFIG]`: preflight checks before anything is rented, one line each.

Checks, in order: the config is valid; its model's weights are here (a packaged model's file fetched) and where they
come from; the result store is writable (a URL store: an object written, read back
and deleted there) and reachable by the pool's cells (RunPod pods need a URL store); the Prefect API answers;
the pool exists with a worker online; the job deployment exists; the pool has the credentials it needs (RunPod:
each account's key is found and RunPod accepts it, by one read call, `myself`, at $RUNPOD_API_BASE_URL). Then,
for every config (in-process too), the path of a run started from the UI or with `run --submit`: the `cpu` pool
with a worker online, and the `screen`, `preset` and `aggregate` deployments on it. A check that cannot run
because an earlier one failed, or that needs a Prefect API when none is configured, is reported as skipped. Exit 1 if any check failed; no
traceback ever reaches the terminal (each check's exception becomes its line).
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from urllib.parse import urlparse

from eps_screen.spec.config import ConfigError, ScreenConfig, load_config
from eps_screen.store.result_store import ResultStore
from flows.cli.session import command_env, console
from flows.runtime.api import api_problem, api_url
from flows.runtime.names import AGGREGATE, JOB_DEPLOYMENTS, CPU_POOL, POOL_TYPES, PRESET, RUNPOD_POOL, SCREEN
from flows.runtime.workers import no_worker, online_workers

UI_POOL = CPU_POOL
# Deployments a run started from the UI (or with --submit) needs; deployments/prefect.yaml defines them.
UI_DEPLOYMENTS = tuple((d.name, d.full_name) for d in (SCREEN, PRESET, AGGREGATE))
LOCAL_HOSTS = {"127.0.0.1", "localhost", "0.0.0.0", "::1"}


class Skip(Exception):
    """A check that cannot run (an earlier check failed, or it does not apply)."""


@dataclass
class Check:
    name: str
    ok: bool | None  # None = skipped
    detail: str

    def line(self) -> str:
        mark = {True: "[green]ok  [/]", False: "[red]FAIL[/]", None: "[dim]skip[/]"}[self.ok]
        return f"{mark} {self.name}: {self.detail}"


class Doctor:
    def __init__(self, config_path: str):
        self.config_path = config_path
        self.config: ScreenConfig | None = None
        self.api_ok = False
        self.pool = None  # the WorkPool read from the API
        self.deployment = None
        self.ui_pool = None

    # each check returns its detail line, raises Skip, or raises anything else (= failure)
    def check_config(self) -> str:
        try:
            self.config = load_config(self.config_path)
        except ConfigError as err:
            n = len(err.problems) - 1
            more = f" (+{n} more: eps-screen validate {self.config_path})" if n else ""
            raise ValueError(f"{err.problems[0]}{more}") from None
        return f"{self.config_path} is valid (screen {self.config.name!r}, pool {self.config.execution.pool})"

    def check_weights(self) -> str:
        from eps_screen.models.packaged import weights_of, weights_problems

        cfg = self._need_config()
        if problems := weights_problems(cfg):
            raise FileNotFoundError("; ".join(problems))
        return weights_of(cfg)

    def check_store(self) -> str:
        cfg = self._need_config()
        store = ResultStore.for_config(cfg)
        if store.remote:
            try:
                store.probe_remote()
            except Exception as err:  # noqa: BLE001 - whatever the filesystem raises becomes one line with a fix
                raise ConnectionError(f"{store.location} is not writable: {remote_problem(err)}") from None
            return f"{store.location} is writable and readable (cache {store.dir})"
        # Probe the nearest directory that exists, so that a check creates nothing.
        probe_dir = next(p for p in (store.dir, *store.dir.parents) if p.exists())
        try:
            if not probe_dir.is_dir():
                raise NotADirectoryError(20, "a file is in the way", str(probe_dir))
            with tempfile.NamedTemporaryFile(dir=probe_dir, prefix=".eps-doctor-"):
                pass
        except OSError as err:
            raise OSError(f"{store.dir} is not writable ({err.strerror or type(err).__name__} at {probe_dir})") from None
        if cfg.execution.pool == RUNPOD_POOL:
            raise ValueError(f"{store.dir} is a local directory: RunPod pods write their cells to their own disk, "
                             "so this screen would never see them; set store to a URL both reach (s3://bucket/prefix)")
        return f"{store.dir} is writable"

    def check_api(self) -> str:
        cfg = self._need_config()
        needed = cfg.execution.pool != "inprocess"
        problem = api_problem(required=needed)
        if problem:
            raise ConnectionError(problem + ("" if needed else " (unset it to use a temporary server)"))
        self.api_ok = bool(api_url())
        return f"{api_url()} answers" if api_url() else "not set: `eps-screen run` starts a temporary server"

    def check_pool(self) -> str:
        from prefect.client.orchestration import get_client
        from prefect.exceptions import ObjectNotFound

        cfg = self._need_pool()
        with get_client(sync_client=True) as client:
            try:
                self.pool = client.read_work_pool(cfg.execution.pool)
            except ObjectNotFound:
                raise LookupError(f"work pool {cfg.execution.pool!r} does not exist: run `eps-screen deploy`") from None
        want = POOL_TYPES[cfg.execution.pool]
        if self.pool.type != want:
            raise ValueError(f"work pool {self.pool.name!r} has type {self.pool.type!r}, expected {want!r}")
        if self.pool.is_paused:
            raise ValueError(f"work pool {self.pool.name!r} is paused: prefect work-pool resume {self.pool.name}")
        return f"{self.pool.name!r} (type {self.pool.type}, concurrency limit {self.pool.concurrency_limit})"

    def check_workers(self) -> str:
        if self.pool is None:
            raise Skip("no pool")
        return _workers_line(self.pool.name)

    def check_deployment(self) -> str:
        from prefect.client.orchestration import get_client
        from prefect.exceptions import ObjectNotFound

        cfg = self._need_pool()
        name = JOB_DEPLOYMENTS[cfg.execution.pool]
        with get_client(sync_client=True) as client:
            try:
                self.deployment = client.read_deployment_by_name(name)
            except ObjectNotFound:
                raise LookupError(f"deployment {name!r} does not exist: run `eps-screen deploy`") from None
        if self.deployment.work_pool_name != cfg.execution.pool:
            raise ValueError(
                f"deployment {name!r} is on pool {self.deployment.work_pool_name!r}, not {cfg.execution.pool!r}")
        return f"{name} on pool {self.deployment.work_pool_name}"

    def check_credentials(self) -> str:
        cfg = self._need_config()
        if cfg.execution.pool != RUNPOD_POOL:
            return f"pool {cfg.execution.pool} needs none"
        if self.pool is None:
            raise Skip("no pool")
        values = job_values(self.pool, self.deployment)
        problems, usable, keys = [], [], {}
        for account in values.get("accounts") or []:
            label, why, keys[account.get("name", "?")] = account_key(account)
            (usable if why is None else problems).append(f"{label}{'' if why is None else ': ' + why}")
        if not usable:
            raise LookupError("no RunPod account with a key: " + ("; ".join(problems) or "accounts is empty"))
        if not values.get("image"):
            raise ValueError("no image set for the pods: set `image` in the runpod-gpu pool "
                             "(UI form or deployments/pools/runpod-gpu.yaml)")
        api = values.get("prefect_api_url") or api_url() or ""  # unset: the pods get the worker's own API URL
        if urlparse(api).hostname in LOCAL_HOSTS:
            raise ValueError(f"pods cannot reach the Prefect API at {api}: set `prefect_api_url` in the pool to an "
                             "address they can reach")
        for name in usable:  # last: a real read call with each key found
            verify_runpod_key(name, keys[name])
        return f"RunPod key for {', '.join(usable)} accepted by RunPod; image {values['image']}"

    # --- the UI path: a run started from the Prefect UI (or `run --submit`) runs on the `cpu` pool ---
    def check_ui_pool(self) -> str:
        from prefect.client.orchestration import get_client
        from prefect.exceptions import ObjectNotFound

        self._need_api()
        with get_client(sync_client=True) as client:
            try:
                self.ui_pool = client.read_work_pool(UI_POOL)
            except ObjectNotFound:
                raise LookupError(f"work pool {UI_POOL!r} (screen runs started from the UI or with --submit) does "
                                  "not exist: run `eps-screen deploy`") from None
        if self.ui_pool.type != "process":
            raise ValueError(f"work pool {UI_POOL!r} has type {self.ui_pool.type!r}, expected 'process'")
        if self.ui_pool.is_paused:
            raise ValueError(f"work pool {UI_POOL!r} is paused: prefect work-pool resume {UI_POOL}")
        return f"{UI_POOL!r} (type process) runs the screen and aggregate deployments"

    def check_ui_workers(self) -> str:
        self._need_api()
        if self.ui_pool is None:
            raise Skip(f"no {UI_POOL} pool")
        return _workers_line(UI_POOL)

    def check_ui_deployment(self, name: str) -> str:
        from prefect.client.orchestration import get_client
        from prefect.exceptions import ObjectNotFound

        self._need_api()
        with get_client(sync_client=True) as client:
            try:
                deployment = client.read_deployment_by_name(name)
            except ObjectNotFound:
                raise LookupError(f"deployment {name!r} does not exist: run `eps-screen deploy`") from None
        if deployment.work_pool_name != UI_POOL:
            raise ValueError(f"deployment {name!r} is on pool {deployment.work_pool_name!r}, not {UI_POOL!r}: "
                             "run `eps-screen deploy`")
        return f"{name} on pool {UI_POOL}"

    # --- helpers ---
    def _need_api(self) -> None:
        if not self.api_ok:
            raise Skip("no Prefect API configured (PREFECT_API_URL)" if not api_url() else "no Prefect API")

    def _need_config(self) -> ScreenConfig:
        if self.config is None:
            raise Skip("no valid config")
        return self.config

    def _need_pool(self) -> ScreenConfig:
        cfg = self._need_config()
        if cfg.execution.pool == "inprocess":
            raise Skip("cells run in-process (execution.pool = inprocess)")
        if not self.api_ok:
            raise Skip("no Prefect API")
        return cfg

    def checks(self) -> list[tuple[str, Callable[[], str]]]:
        return [("config", self.check_config), ("weights", self.check_weights), ("store", self.check_store),
                ("prefect api", self.check_api), ("work pool", self.check_pool), ("workers", self.check_workers),
                ("job deployment", self.check_deployment), ("credentials", self.check_credentials),
                ("cpu pool", self.check_ui_pool), ("cpu workers", self.check_ui_workers),
                *[(f"{kind} deployment", partial(self.check_ui_deployment, name)) for kind, name in UI_DEPLOYMENTS]]

    def run(self) -> list[Check]:
        results = []
        for name, fn in self.checks():
            try:
                results.append(Check(name, True, fn()))
            except Skip as skip:
                results.append(Check(name, None, str(skip)))
            except Exception as exc:  # noqa: BLE001 - every failure is one line, never a traceback
                detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                results.append(Check(name, False, detail))
        return results


def _workers_line(pool: str) -> str:
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        online = online_workers(client, pool)
    if not online:
        raise LookupError(no_worker(pool))
    return f"{len(online)} online: {', '.join(sorted(w.name for w in online))}"


def remote_problem(err: Exception) -> str:
    """What went wrong at a store URL and the likely fix, in one line (never a credential: only names)."""
    name = type(err).__name__
    first = (str(err).strip().splitlines() or [""])[0][:200]
    if name in {"NoCredentialsError", "PartialCredentialsError"}:
        return "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in this environment"
    if isinstance(err, FileNotFoundError):
        return f"the bucket does not exist ({first}): create it or fix the URL"
    if isinstance(err, PermissionError):
        return f"access denied ({first}): check the credentials in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and their permissions"
    if "Connect" in name or "Endpoint" in name or isinstance(err, ConnectionError | TimeoutError):
        return (f"the endpoint is not reachable ({first}): check store_options.endpoint_url or AWS_ENDPOINT_URL "
                "(R2, MinIO and RunPod volumes need one)")
    return f"{name}: {first}"


def job_values(pool, deployment) -> dict:
    """The job variables a cell run gets: the pool's defaults, then the deployment's job_variables."""
    props = pool.base_job_template.get("variables", {}).get("properties", {})
    values = {k: v["default"] for k, v in props.items() if "default" in v}
    values.update((deployment.job_variables or {}) if deployment is not None else {})
    return values


def account_key(account: dict) -> tuple[str, str | None, str | None]:
    """(label, None, key) when the account's key can be found from here, else (label, why not, None). The key is
    only passed on to RunPod, never printed."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound

    label = account.get("name", "?")
    if account.get("api_key_secret_block"):
        block = account["api_key_secret_block"]
        with get_client(sync_client=True) as client:
            try:
                doc = client.read_block_document_by_name(block, "secret")
            except ObjectNotFound:
                return label, f"Secret block {block!r} does not exist (prefect block create secret)", None
        value = (doc.data or {}).get("value")
        value = value.get_secret_value() if hasattr(value, "get_secret_value") else value
        return label, None, str(value or "").strip()
    env = account.get("api_key_env") or ""
    if os.environ.get(env):
        return label, None, os.environ[env].strip()
    return label, f"environment variable {env} is not set here (the worker's environment needs it)", None


def verify_runpod_key(account: str, key: str | None) -> None:
    """One read call (`myself`) with the account's key; raises with one line when RunPod refuses it or cannot be
    reached. A rejected key would otherwise show only when the screen's first job asks for a pod."""
    from pydantic import SecretStr

    from eps_screen_runpod.api import BadApiKey, RetryPolicy, RunPodApi, RunPodApiError

    api = RunPodApi(SecretStr(key or ""), account, RetryPolicy(attempts=2, base_delay_s=0.5, timeout_s=15))
    try:
        api.whoami()
    except BadApiKey as exc:
        raise PermissionError(f"{exc}: replace the key (RunPod console, Settings > API Keys) where the worker "
                              "reads it") from None
    except RunPodApiError as exc:
        raise ConnectionError(f"cannot verify the key of account {account!r}: {exc}") from None


def doctor(config_path: str, console) -> int:
    results = Doctor(config_path).run()
    for check in results:
        console.print(check.line(), highlight=False, soft_wrap=True)
    failed = [c for c in results if c.ok is False]
    console.print(f"{len(failed)} check(s) failed" if failed else "all checks passed", highlight=False)
    return 1 if failed else 0


def run(args) -> int:
    command_env()
    return doctor(args.config, console())
