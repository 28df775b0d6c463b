"""The RunPod work pool's job configuration and the variables shown in the pool's form.

Every field carries a description: Prefect renders them in the UI when a work pool of type `runpod`
is created or edited, and deployments override them through `job_variables`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Literal

from prefect.settings import get_current_settings
from prefect.workers.base import BaseJobConfiguration, BaseVariables
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, field_validator, model_validator

if TYPE_CHECKING:
    from uuid import UUID

    from prefect.client.schemas.objects import Flow as APIFlow
    from prefect.client.schemas.objects import FlowRun, WorkPool
    from prefect.client.schemas.responses import DeploymentResponse

CloudType = Literal["SECURE", "COMMUNITY"]
_SLUG = r"^[a-z0-9][a-z0-9-]{0,30}$"


class RunPodAccount(BaseModel):
    """One RunPod account; its API key comes from a Prefect Secret block or the worker's environment."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="A short label for logs and cost reports (never the key).", pattern=_SLUG)
    api_key_secret_block: str | None = Field(
        default=None, description="Name of a Prefect Secret block that holds this account's RunPod API key."
    )
    api_key_env: str | None = Field(
        default=None,
        description="Name of an environment variable, on the worker's machine, that holds the API key.",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
    )

    @model_validator(mode="after")
    def _one_source(self) -> RunPodAccount:
        if bool(self.api_key_secret_block) == bool(self.api_key_env):
            raise ValueError(f"account {self.name!r}: give exactly one of api_key_secret_block or api_key_env")
        return self


async def resolve_api_key(account: RunPodAccount) -> SecretStr:
    """The account's key, or ValueError with a reason that names the source but never the value."""
    if account.api_key_secret_block:
        from prefect.blocks.system import Secret

        try:
            block = await Secret.aload(account.api_key_secret_block)
        except Exception as exc:  # ValueError when missing; anything else is also "not usable"
            raise ValueError(
                f"Secret block {account.api_key_secret_block!r} could not be loaded ({type(exc).__name__})"
            ) from None
        value = str(block.get())
    else:
        value = os.environ.get(account.api_key_env or "", "")
        if not value:
            raise ValueError(f"environment variable {account.api_key_env} is not set on the worker")
    return SecretStr(value.strip())


class RunPodFields(BaseModel):
    """The fields shared by the job configuration and the pool's variables."""

    image: str | None = Field(
        default=None,
        description="Image with the project installed (infra/README.md), e.g. ghcr.io/org/eps-screen:0.1.0.",
    )
    gpu_types: list[str] = Field(
        default=["NVIDIA H100 80GB HBM3", "NVIDIA A100 80GB PCIe", "NVIDIA A100-SXM4-80GB"],
        description="RunPod GPU type ids allowed, in order of preference; the next one is tried on no capacity.",
        min_length=1,
    )
    gpu_count: int = Field(default=1, ge=1, le=8, description="GPUs per pod.")
    cloud_types: list[CloudType] = Field(
        default=["SECURE", "COMMUNITY"],
        description="Clouds allowed, in order of preference (leave one out to forbid it).",
        min_length=1,
    )
    accounts: list[RunPodAccount] = Field(
        default=[{"name": "default", "api_key_env": "RUNPOD_API_KEY"}],
        validate_default=True,
        description="RunPod accounts allowed, in order of preference; each names where its API key comes from.",
        min_length=1,
    )
    container_disk_gb: int = Field(default=50, ge=5, le=2000, description="Container disk (GB).")
    volume_gb: int = Field(default=0, ge=0, le=10000, description="Pod volume (GB), 0 for none.")
    volume_mount_path: str = Field(default="/workspace", description="Where the pod or network volume is mounted.")
    network_volume_id: str | None = Field(
        default=None, description="A RunPod network volume to attach (pins the pod to the volume's data center)."
    )
    max_wall_hours: float = Field(
        default=24.0, gt=0,
        description="A pod older than this is terminated and its run ends Crashed (kill criterion 5).",
    )
    max_hourly_price: float | None = Field(
        default=None, gt=0,
        description="Skip GPU type / cloud offers whose pod price (USD/hour, all GPUs) is above this.",
    )
    poll_interval_s: float = Field(
        default=10.0, ge=0.2, le=15.0, description="Seconds between pod checks (at most 15)."
    )
    bootstrap_timeout_s: float = Field(
        default=300.0,
        gt=0,
        description=(
            "Kill criterion 6: after the pod is RUNNING, the flow run must itself reach Running (the engine inside the"
            " pod started the flow) within this many seconds, or the pod is terminated and the run ends Crashed."
        ),
    )
    start_timeout_s: float = Field(
        default=900.0, gt=0, description="A pod that has not reached RUNNING this long after creation is given up on."
    )
    exit_grace_s: float = Field(
        default=30.0, ge=0, description="After the container exits, how long the flow run has to report a final state."
    )
    prefect_api_url: str | None = Field(
        default=None,
        description="PREFECT_API_URL as the pod must see it (default: the worker's own). Pods cannot reach 127.0.0.1.",
    )
    name_prefix: str = Field(
        default="prefect-eps",
        pattern=_SLUG,
        description="Pods are named <prefix>-<flow run id>; the reaper only touches pods with this prefix.",
    )
    reap_interval_s: float = Field(
        default=120.0, ge=1, description="Pool default only: how often the worker looks for orphaned pods to terminate."
    )

    @field_validator("gpu_types")
    @classmethod
    def _distinct_gpus(cls, v: list[str]) -> list[str]:
        if len(set(v)) != len(v):
            raise ValueError("gpu_types lists a GPU type twice")
        return v


class RunPodVariables(BaseVariables, RunPodFields):
    """What the UI form and `job_variables` can set."""


class RunPodJobConfiguration(BaseJobConfiguration, RunPodFields):
    """One flow run's resolved configuration.

    `env` ends up holding only what the flow run needs: PREFECT_API_URL, PREFECT__FLOW_RUN_ID and the job's own
    env. The worker's other Prefect settings (profiles, server settings, its logging) never reach the pod, and
    PREFECT_API_KEY is kept out of `env` altogether (in a private SecretStr) so no repr or dump can show it.
    """

    _prefect_api_key: SecretStr | None = PrivateAttr(default=None)

    def prepare_for_flow_run(
        self,
        flow_run: FlowRun,
        deployment: DeploymentResponse | None = None,
        flow: APIFlow | None = None,
        work_pool: WorkPool | None = None,
        worker_name: str | None = None,
        worker_id: UUID | None = None,
    ) -> None:
        job_env = {k: v for k, v in (self.env or {}).items() if v is not None}
        super().prepare_for_flow_run(flow_run, deployment, flow, work_pool, worker_name, worker_id)
        settings = get_current_settings()
        api_url = self.prefect_api_url or (str(settings.api.url) if settings.api.url else None)
        # A PREFECT_API_KEY in the job's own env (a key meant for pods) wins over the worker's.
        key = job_env.pop("PREFECT_API_KEY", None) or (
            settings.api.key.get_secret_value() if settings.api.key is not None else None
        )
        self._prefect_api_key = SecretStr(key) if key else None
        env: dict[str, str | None] = {}
        if api_url:
            env["PREFECT_API_URL"] = api_url
        env["PREFECT__FLOW_RUN_ID"] = str(flow_run.id)
        env.update(job_env)
        self.env = env
        self.name = f"{self.name_prefix}-{flow_run.id}"

    def pod_env(self) -> dict[str, str]:
        """The env sent to RunPod, the Prefect API key included. Never log the result."""
        env = {k: v for k, v in self.env.items() if v is not None}
        if self._prefect_api_key is not None:
            env["PREFECT_API_KEY"] = self._prefect_api_key.get_secret_value()
        return env

    def __repr_args__(self) -> Any:  # keep env values out of any repr
        for name, value in super().__repr_args__():
            yield (name, {k: "***" for k in value} if name == "env" and isinstance(value, dict) else value)
