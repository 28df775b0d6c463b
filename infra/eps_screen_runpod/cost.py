"""What a pod cost (price x time), published as a table artifact on its flow run.

The screen's spend cap (kill criterion 5) reads these back with `read_pod_costs`, so the table's columns are
a small contract: `usd` (float) and `pod_id` must stay.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Iterable
from uuid import UUID

if TYPE_CHECKING:
    from prefect.client.orchestration import PrefectClient

ARTIFACT_DESCRIPTION = "RunPod pod cost (price x time) for this flow run"


@dataclass
class PodCost:
    pod_id: str
    account: str
    gpu_type: str
    cloud: str
    gpu_count: int
    usd_per_hour: float
    started_utc: str
    ended_utc: str
    seconds: float
    usd: float
    outcome: str

    @classmethod
    def measure(cls, *, pod_id: str, account: str, gpu_type: str, cloud: str, gpu_count: int,
                usd_per_hour: float, started: float, ended: float, outcome: str) -> PodCost:
        seconds = max(0.0, ended - started)
        return cls(
            pod_id=pod_id, account=account, gpu_type=gpu_type, cloud=cloud, gpu_count=gpu_count,
            usd_per_hour=round(usd_per_hour, 4), started_utc=_iso(started), ended_utc=_iso(ended),
            seconds=round(seconds, 1), usd=round(usd_per_hour * seconds / 3600.0, 6), outcome=outcome,
        )


def _iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, tz=dt.timezone.utc).isoformat(timespec="seconds")


async def publish_pod_cost(client: PrefectClient, flow_run_id: UUID, cost: PodCost) -> None:
    """A keyless table artifact attached to the flow run (shown on its Artifacts tab)."""
    from prefect.client.schemas.actions import ArtifactCreate

    await client.create_artifact(
        ArtifactCreate(type="table", data=json.dumps([asdict(cost)]), description=ARTIFACT_DESCRIPTION,
                       flow_run_id=flow_run_id)
    )


async def read_pod_costs(client: PrefectClient, flow_run_ids: Iterable[UUID]) -> dict[UUID, float]:
    """USD per flow run, summed over the cost artifacts the worker published (runs without one are absent)."""
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterType,
        FlowRunFilter,
        FlowRunFilterId,
    )

    ids = list(flow_run_ids)
    totals: dict[UUID, float] = {}
    for start in range(0, len(ids), 100):
        chunk = ids[start : start + 100]
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(type=ArtifactFilterType(any_=["table"])),
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=chunk)),
            limit=200,
        )
        for art in artifacts:
            if art.description != ARTIFACT_DESCRIPTION or art.flow_run_id is None:
                continue
            rows = json.loads(art.data) if isinstance(art.data, str) else art.data
            totals[art.flow_run_id] = totals.get(art.flow_run_id, 0.0) + sum(float(r["usd"]) for r in rows or [])
    return totals
