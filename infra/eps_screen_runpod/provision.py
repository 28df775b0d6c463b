"""Renting a pod: walk the allowed (account, GPU type, cloud) offers in order until one deploys.

Order of preference: accounts outermost (who pays), then GPU types (what runs), then clouds (where). Every
offer that is skipped is logged with its reason; if none deploys, `ProvisioningFailed` lists them all, and
the worker reports the run as Crashed with that list (the screen resubmits it after a backoff).
"""

from __future__ import annotations

import base64
import functools
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import anyio

from eps_screen_runpod.api import BadApiKey, NoCapacity, QueryRejected, RunPodApi, RunPodApiError, TransientApiError
from eps_screen_runpod.job import RunPodJobConfiguration

SCRIPT_PATH = "/tmp/prefect-flow-run.sh"


class ProvisioningFailed(RuntimeError):
    """No offer deployed. `permanent` when every offer failed for a reason that waiting cannot fix (a missing or
    rejected key, an unknown GPU type, a request RunPod refuses, e.g. the image): retrying such a job only repeats
    the failure, so the worker fails the run at once and dispatch stops the screen (flows/runtime/dispatch.py)."""

    def __init__(self, skips: list[str], permanent: list[str] | None = None):
        self.skips = skips
        self.permanent_skips = list(permanent or [])
        super().__init__("no RunPod offer could be deployed: " + "; ".join(skips) if skips else "no offers allowed")

    @property
    def permanent(self) -> bool:
        return bool(self.skips) and len(self.permanent_skips) == len(self.skips)

    def line(self) -> str:
        """One line for the run's state and the screen's: the distinct causes, no traceback."""
        causes = list(dict.fromkeys(self.permanent_skips or self.skips))
        return ("RunPod refused the job for good (not retried): " + "; ".join(causes[:4])
                + (f"; and {len(causes) - 4} more" if len(causes) > 4 else ""))


@dataclass
class ProvisionedPod:
    pod_id: str
    api: RunPodApi
    gpu_type: str
    cloud: str
    gpu_count: int
    usd_per_hour: float
    created_at: float = field(default_factory=time.time)
    skips: list[str] = field(default_factory=list)
    name: str = ""

    @property
    def account(self) -> str:
        return self.api.account

    @property
    def infrastructure_pid(self) -> str:
        return f"{self.account}:{self.pod_id}"


def docker_args_for(command: str) -> str:
    """The container start command: the flow-run command travels base64-encoded and is decoded in the pod.

    The result holds only letters, digits, '+/=', spaces, quotes and a few shell symbols, so neither the GraphQL
    layer nor RunPod's own splitting of dockerArgs can change the command, whatever the command contains.
    """
    encoded = base64.b64encode(command.encode("utf-8")).decode("ascii")
    return f"bash -c 'echo {encoded} | base64 -d > {SCRIPT_PATH} && exec bash {SCRIPT_PATH}'"


def offer_price(gpu: dict[str, Any], cloud: str, gpu_count: int) -> float | None:
    """USD/hour for the whole pod, or None when the cloud does not offer this GPU type."""
    offered = gpu.get("secureCloud" if cloud == "SECURE" else "communityCloud")
    price = gpu.get("securePrice" if cloud == "SECURE" else "communityPrice")
    if offered is False or not price:
        return None
    return float(price) * gpu_count


async def provision(
    cfg: RunPodJobConfiguration,
    apis: list[RunPodApi | tuple[str, str]],
    logger: logging.Logger | logging.LoggerAdapter,
) -> ProvisionedPod:
    """Deploy one pod. `apis` holds, per allowed account in order, a client or (account, why it is unusable)."""
    skips: list[str] = []
    permanent: list[str] = []

    def skip(what: str, reason: str, for_good: bool = False) -> None:
        skips.append(f"{what}: {reason}")
        if for_good:
            permanent.append(skips[-1])
        logger.warning("Skipping %s: %s", what, reason)

    docker_args = docker_args_for(cfg.command or "prefect flow-run execute")
    for api in apis:
        if isinstance(api, tuple):
            skip(f"account {api[0]}", api[1], True)
            continue
        data_center = None
        if cfg.network_volume_id:
            try:
                data_center = await anyio.to_thread.run_sync(api.network_volume_datacenter, cfg.network_volume_id)
            except BadApiKey as exc:
                skip(f"account {api.account}", str(exc), True)
                continue
            except RunPodApiError as exc:
                skip(f"account {api.account}", f"network volume lookup failed: {exc}")
                continue
            if data_center is None:
                skip(f"account {api.account}", f"network volume {cfg.network_volume_id!r} not found")
                continue
        account_dead = False
        for gpu_type in cfg.gpu_types:
            try:
                gpu = await anyio.to_thread.run_sync(api.gpu_type, gpu_type, cfg.gpu_count)
            except BadApiKey as exc:
                skip(f"account {api.account}", str(exc), True)
                account_dead = True
                break
            except RunPodApiError as exc:
                skip(f"{gpu_type} on account {api.account}", f"GPU type lookup failed: {exc}",
                     isinstance(exc, QueryRejected))
                continue
            if gpu is None:
                skip(f"{gpu_type} on account {api.account}", "RunPod does not know this GPU type", True)
                continue
            for cloud in cfg.cloud_types:
                what = f"{gpu_type} x{cfg.gpu_count} / {cloud} / account {api.account}"
                price = offer_price(gpu, cloud, cfg.gpu_count)
                if price is None:
                    skip(what, "not offered in this cloud")
                    continue
                if cfg.max_hourly_price is not None and price > cfg.max_hourly_price:
                    skip(what, f"price ${price:.2f}/h is above max_hourly_price ${cfg.max_hourly_price:.2f}/h")
                    continue
                deploy = functools.partial(
                    api.create_pod,
                    name=cfg.name or cfg.name_prefix,
                    image=cfg.image or "",
                    gpu_type_id=gpu_type,
                    cloud_type=cloud,
                    gpu_count=cfg.gpu_count,
                    container_disk_gb=cfg.container_disk_gb,
                    volume_gb=cfg.volume_gb,
                    volume_mount_path=cfg.volume_mount_path,
                    docker_args=docker_args,
                    env=cfg.pod_env(),
                    network_volume_id=cfg.network_volume_id,
                    data_center_id=data_center,
                )
                try:
                    pod = await anyio.to_thread.run_sync(deploy)
                except NoCapacity as exc:
                    skip(what, f"no capacity ({exc})")
                    continue
                except BadApiKey as exc:
                    skip(f"account {api.account}", str(exc), True)
                    account_dead = True
                    break
                except (TransientApiError, QueryRejected) as exc:  # QueryRejected: RunPod refused the request
                    skip(what, f"deploy failed: {exc}", isinstance(exc, QueryRejected))
                    continue
                cost = pod.get("costPerHr")
                usd = float(cost) if cost else price
                logger.info("Deployed pod %s: %s at $%.2f/h", pod["id"], what, usd)
                return ProvisionedPod(str(pod["id"]), api, gpu_type, cloud, cfg.gpu_count, usd, skips=skips,
                                      name=cfg.name or "")
            if account_dead:
                break
    raise ProvisioningFailed(skips, permanent)
