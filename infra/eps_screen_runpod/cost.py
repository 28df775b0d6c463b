"""What a pod cost (price x time), published as a table artifact on its flow run.

The screen's spend cap (kill criterion 5) reads these back with `read_pod_costs`, and its cost records
(eps_screen/plan/costs.py: GPU-seconds and USD per cell) with `read_pod_records`, so the table's columns are a small
contract: `pod_id`, `usd` (float), `seconds` (float) and `gpu_count` (int) must stay.

One record per pod: the artifact's key is the pod's (`cost_key`), so a write that lands twice is two versions of
one record, never a second record. It does land twice: Prefect's client re-sends a request whose answer it did
not get (a read timeout, a dropped connection), and a SQLite-backed server under load can hold a write for its
whole lock timeout (60 s, the client's timeout too) and commit it after the client gave up; the re-sent write
then inserts a second artifact. CI once counted 43 cost artifacts for 42 pods that way. Readers therefore count
each (flow run, pod) once, and the worker publishes once per pod.
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any
from collections.abc import Iterable
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
    return dt.datetime.fromtimestamp(ts, tz=dt.UTC).isoformat(timespec="seconds")


def cost_key(pod_id: str) -> str:
    """The artifact key of a pod's cost record (keys allow lowercase letters, digits and dashes only)."""
    return "runpod-cost-" + "".join(ch if ch.isascii() and ch.isalnum() else "-" for ch in pod_id.lower())


async def publish_pod_cost(client: PrefectClient, flow_run_id: UUID, cost: PodCost) -> None:
    """The pod's cost record: a table artifact keyed by the pod, attached to the flow run (its Artifacts tab)."""
    from prefect.client.schemas.actions import ArtifactCreate

    await client.create_artifact(
        ArtifactCreate(key=cost_key(cost.pod_id), type="table", data=json.dumps([asdict(cost)]),
                       description=ARTIFACT_DESCRIPTION, flow_run_id=flow_run_id)
    )


def pod_records(artifacts: Iterable[Any]) -> dict[tuple[UUID, str], dict]:
    """The cost record (a PodCost's fields) per (flow run, pod) from cost artifacts, each pod counted once however
    many times its record was written (the earliest write stands); artifacts that are not cost records are ignored."""
    records: dict[tuple[UUID, str], dict] = {}
    for art in sorted(artifacts, key=lambda a: (a.created is None, a.created or 0)):
        if art.description != ARTIFACT_DESCRIPTION or art.flow_run_id is None:
            continue
        rows = json.loads(art.data) if isinstance(art.data, str) else art.data
        for row in rows or []:
            records.setdefault((art.flow_run_id, str(row["pod_id"])), dict(row))
    return records


def pod_costs(artifacts: Iterable[Any]) -> dict[tuple[UUID, str], float]:
    """USD per (flow run, pod) from cost artifacts, each pod once (`pod_records`)."""
    return {key: float(row["usd"]) for key, row in pod_records(artifacts).items()}


async def read_pod_records(client: PrefectClient, flow_run_ids: Iterable[UUID]) -> dict[UUID, list[dict]]:
    """Each flow run's pod cost records, each pod once (runs without one are absent): what the screen splits
    among a job's cells (eps_screen/plan/costs.py)."""
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterType,
        FlowRunFilter,
        FlowRunFilterId,
    )

    ids = list(flow_run_ids)
    artifacts: list[Any] = []
    for start in range(0, len(ids), 100):
        chunk = ids[start : start + 100]
        for offset in range(0, 100_000, 200):
            page = await client.read_artifacts(
                artifact_filter=ArtifactFilter(type=ArtifactFilterType(any_=["table"])),
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=chunk)),
                limit=200, offset=offset,
            )
            artifacts.extend(page)
            if len(page) < 200:
                break
    by_run: dict[UUID, list[dict]] = {}
    for (run_id, _pod), row in pod_records(artifacts).items():
        by_run.setdefault(run_id, []).append(row)
    return by_run


async def read_pod_costs(client: PrefectClient, flow_run_ids: Iterable[UUID]) -> dict[UUID, float]:
    """USD per flow run, the sum over its pods of each pod's cost record, once (runs without one are absent)."""
    records = await read_pod_records(client, flow_run_ids)
    return {run_id: sum(float(row["usd"]) for row in rows) for run_id, rows in records.items()}
