"""A pod's cost is one record and is summed once (issue 11, item 3: CI counted 43 cost artifacts for 42 pods).

The double count came from a write that landed twice: Prefect's client re-sends a request whose answer it did
not get, and a SQLite server under load can commit a write after the client's 60 s timeout. These tests make
exactly that happen (the first answer of the cost write is lost after the server stored it), and have the
worker try to cost one pod twice (the reaper re-adopting a pod the worker let go of).
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from uuid import uuid4

import anyio
import httpx
import pytest
from eps_screen_runpod import RunPodWorker
from eps_screen_runpod.cost import ARTIFACT_DESCRIPTION, PodCost, cost_key, pod_costs, publish_pod_cost, read_pod_costs
from eps_screen_runpod.provision import ProvisionedPod
from eps_screen_runpod.worker import Outcome
from prefect import flow
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId
from prefect.states import Pending

pytestmark = [pytest.mark.usefixtures("prefect_harness"), pytest.mark.timeout(120)]  # the session's server
POOL = "runpod-cost"


@flow(name="runpod-cost-flow")
def cost_flow() -> None:
    pass


def a_cost(pod_id: str, usd_per_hour: float = 3.6) -> PodCost:
    return PodCost.measure(pod_id=pod_id, account="main", gpu_type="H100", cloud="SECURE", gpu_count=1,
                           usd_per_hour=usd_per_hour, started=0.0, ended=100.0, outcome="flow run ended Completed")


async def records(client, flow_run_id) -> list:
    found = await client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(
        any_=[flow_run_id])))
    return [a for a in found if a.description == ARTIFACT_DESCRIPTION]


def test_a_cost_write_whose_answer_was_lost_is_one_record_summed_once(monkeypatch):
    """The server stores the write, the answer is lost (ReadTimeout), Prefect's client sends it again."""
    send = httpx.AsyncClient.send
    lost: list[str] = []

    async def lose_first_artifact_answer(self, request, *args, **kwargs):
        response = await send(self, request, *args, **kwargs)
        if request.method == "POST" and request.url.path.endswith("/artifacts/") and not lost:
            lost.append(str(request.url))
            raise httpx.ReadTimeout("answer lost after the server stored the artifact", request=request)
        return response

    async def main():
        async with get_client() as client:
            run = await client.create_flow_run(cost_flow, state=Pending())
            other = await client.create_flow_run(cost_flow, state=Pending())
            monkeypatch.setattr(httpx.AsyncClient, "send", lose_first_artifact_answer)
            await publish_pod_cost(client, run.id, a_cost("pod1abc"))
            monkeypatch.setattr(httpx.AsyncClient, "send", send)
            await publish_pod_cost(client, run.id, a_cost("pod2abc", usd_per_hour=7.2))  # a second pod, same run
            await publish_pod_cost(client, other.id, a_cost("pod3abc"))
            return run.id, other.id, await records(client, run.id), await read_pod_costs(client, [run.id, other.id])

    run_id, other_id, stored, totals = anyio.run(main)
    assert lost, "the fault was not injected"
    assert totals == {run_id: pytest.approx(0.1 + 0.2), other_id: pytest.approx(0.1)}  # pod1 once, plus pod2
    by_key: dict[str, int] = {}
    for art in stored:
        by_key[art.key] = by_key.get(art.key, 0) + 1
    # two writes of pod1's record reached the server; they are versions of one record, not two records
    assert by_key == {cost_key("pod1abc"): 2, cost_key("pod2abc"): 1}


def test_the_worker_costs_a_pod_once_when_it_lets_go_of_it_twice():
    """A pod terminated twice by one worker (the reaper adopting a pod whose run did not end) is costed once."""

    class Api:
        account = "main"
        terminated = 0

        def terminate_pod(self, pod_id: str) -> bool:
            self.terminated += 1
            return self.terminated == 1

    async def main():
        async with get_client() as client:
            run = await client.create_flow_run(cost_flow, state=Pending())
            worker = RunPodWorker(work_pool_name=POOL)
            worker._client = client
            api = Api()
            pod = ProvisionedPod("podtwice", api, "H100", "SECURE", 1, 3.6, created_at=time.time() - 100)
            log = SimpleNamespace(info=lambda *a: None, error=lambda *a: None, warning=lambda *a: None)
            for message in ("pod vanished", "adopted, then vanished"):
                await worker._terminate(pod, log, Outcome("crash", message), run.id)
            return api.terminated, await records(client, run.id), await read_pod_costs(client, [run.id])

    terminated, stored, totals = anyio.run(main)
    assert terminated == 2 and len(stored) == 1 and stored[0].key == cost_key("podtwice")
    assert list(totals.values()) == [pytest.approx(0.1, rel=0.05)]


def test_pod_costs_count_each_pod_of_each_run_once():
    def art(run, pod, usd, created, description=ARTIFACT_DESCRIPTION):
        return SimpleNamespace(description=description, flow_run_id=run, created=created,
                               data=[{"pod_id": pod, "usd": usd}])

    a, b = uuid4(), uuid4()
    costs = pod_costs([art(a, "p1", 1.5, 2), art(a, "p1", 1.0, 1), art(a, "p2", 2.0, 3), art(b, "p1", 4.0, 1),
                       art(b, "p9", 9.0, 1, description="a cell's table"), art(None, "p8", 8.0, 1)])
    assert costs == {(a, "p1"): 1.0, (a, "p2"): 2.0, (b, "p1"): 4.0}  # the earliest write of a record stands
    assert cost_key("AbC_12") == "runpod-cost-abc-12"
