"""A fake RunPod GraphQL API on 127.0.0.1 whose "pods" are local processes.

The runpod SDK (and our client) POST GraphQL documents to $RUNPOD_API_BASE_URL/graphql. This server parses
and validates them with graphql-core against a schema covering the operations the worker uses, so a query
that a quote or newline broke is answered with a GraphQL error, as the real API would.

A pod goes CREATED -> (start delay) -> RUNNING, at which point its dockerArgs are run as a local process
(shlex-split, like a container command) with a clean environment: a few base variables, `image_env` (what
the image would bake in) and exactly the env the deployment request carried. When the process exits the pod
shows EXITED. Faults, chosen per pod by a seeded RNG or forced by creation index:

- vanish:  some seconds after RUNNING the process group is killed and the pod leaves the inventory;
- silent:  the pod reaches RUNNING but the command never starts (a bootstrap that never reports);
- exit0:   the pod reaches RUNNING and its container exits 0 at once, without running its command (work not done);
- late:    the pod reaches RUNNING and its command starts only `late_start_s` later (an engine start that runs up to
           the bootstrap-silence limit); podTerminate stops it as `docker stop` does, SIGTERM first and SIGKILL
           `stop_grace_s` later, so a flow that has just started can write its own last state as it dies;
- slow start: a long CREATED phase;
- no capacity: for chosen (account, GPU type, cloud) patterns, or a share of all deploy requests;
- HTTP errors: the next N requests answered 429 / 5xx; or every Nth request (`status_every`); or the first
  podTerminate of each pod (`first_terminate_status`);
- slow answers: every answer delayed `delay_s`;
- bad API key: any key not in `accounts` gets HTTP 401.

Inspection for tests: GET /_fake/pods (live pods), GET /_fake/events (history). Run standalone with
`python -m tests.fakes.runpod_api --port 8911 --key KEY` for manual trials.
"""

from __future__ import annotations

import json
import os
import random
import re
import shlex
import signal
import string
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field, fields
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from graphql import GraphQLError, build_schema, graphql_sync

NO_CAPACITY_MESSAGE = (
    "There are no longer any instances available with the requested specifications. Please refresh and try again."
)

SDL = """
enum CloudTypeEnum { ALL SECURE COMMUNITY }
enum PodStatus { CREATED RUNNING RESTARTING EXITED PAUSED DEAD TERMINATED }

input EnvironmentVariableInput { key: String!, value: String! }
input PodFilter { podId: String! }
input PodTerminateInput { podId: String! }
input PodStopInput { podId: String! }
input GpuTypeFilter { id: String, ids: [String] }
input GpuLowestPriceInput { gpuCount: Int }
input PodFindAndDeployOnDemandInput {
  name: String, imageName: String!, cloudType: CloudTypeEnum, startSsh: Boolean, gpuTypeId: String,
  supportPublicIp: Boolean, gpuCount: Int, volumeInGb: Int, minVcpuCount: Int, minMemoryInGb: Int,
  allowedCudaVersions: [String], dataCenterId: String, dockerArgs: String, countryCode: String,
  containerDiskInGb: Int, ports: String, volumeMountPath: String, env: [EnvironmentVariableInput],
  templateId: String, networkVolumeId: String, minDownload: Int, minUpload: Int
}

type LowestPrice { minimumBidPrice: Float, uninterruptablePrice: Float }
type GpuType {
  id: String, displayName: String, manufacturer: String, memoryInGb: Int, cudaCores: Int, maxGpuCount: Int,
  secureCloud: Boolean, communityCloud: Boolean, securePrice: Float, communityPrice: Float,
  oneMonthPrice: Float, threeMonthPrice: Float, oneWeekPrice: Float, communitySpotPrice: Float,
  secureSpotPrice: Float, lowestPrice(input: GpuLowestPriceInput): LowestPrice
}
type PortMapping { ip: String, isIpPublic: Boolean, privatePort: Int, publicPort: Int, type: String }
type PodRuntime { uptimeInSeconds: Int, ports: [PortMapping] }
type PodMachine { podHostId: String, gpuDisplayName: String }
type Pod {
  id: String!, name: String, imageName: String, env: [String], machineId: String, machine: PodMachine,
  desiredStatus: PodStatus, costPerHr: Float, containerDiskInGb: Int, dockerArgs: String, dockerId: String,
  gpuCount: Int, lastStatusChange: String, memoryInGb: Float, podType: String, port: Int, ports: String,
  uptimeSeconds: Int, vcpuCount: Float, volumeInGb: Float, volumeMountPath: String, runtime: PodRuntime
}
type NetworkVolume { id: String, name: String, size: Int, dataCenterId: String }
type User { id: String, pubKey: String, networkVolumes: [NetworkVolume], pods: [Pod] }
type Query { myself: User, pod(input: PodFilter!): Pod, gpuTypes(input: GpuTypeFilter): [GpuType] }
type Mutation {
  podFindAndDeployOnDemand(input: PodFindAndDeployOnDemandInput!): Pod
  podTerminate(input: PodTerminateInput!): Boolean
  podStop(input: PodStopInput!): Pod
}
"""

SCHEMA = build_schema(SDL)

DEFAULT_GPUS: list[dict[str, Any]] = [
    {"id": "NVIDIA H100 80GB HBM3", "securePrice": 2.99, "communityPrice": 2.69, "memoryInGb": 80},
    {"id": "NVIDIA A100 80GB PCIe", "securePrice": 1.64, "communityPrice": 1.19, "memoryInGb": 80},
    {"id": "NVIDIA A100-SXM4-80GB", "securePrice": 1.89, "communityPrice": 1.39, "memoryInGb": 80},
    {"id": "NVIDIA GeForce RTX 4090", "securePrice": 0.69, "communityPrice": 0.34, "memoryInGb": 24},
]


@dataclass
class Faults:
    """What goes wrong. Patterns are (account, gpu type, cloud) with None as a wildcard."""

    seed: int = 0
    no_capacity: list[tuple[str | None, str | None, str | None]] = field(default_factory=list)
    no_capacity_rate: float = 0.0
    vanish_rate: float = 0.0
    vanish_after_s: tuple[float, float] = (2.0, 5.0)
    silent_rate: float = 0.0
    start_delay_s: tuple[float, float] = (0.1, 0.3)
    vanish_pods: set[int] = field(default_factory=set)  # creation indices (0-based) forced to vanish
    silent_pods: set[int] = field(default_factory=set)
    exit_zero_pods: set[int] = field(default_factory=set)  # creation indices whose container exits 0 without work
    late_pods: set[int] = field(default_factory=set)  # creation indices whose command starts late_start_s after RUNNING
    late_start_s: float = 0.0
    stop_grace_s: float = 10.0  # a late pod's SIGTERM -> SIGKILL on podTerminate (docker stop's default)
    fail_next: list[int] = field(default_factory=list)  # HTTP statuses for the next requests, in order
    status_every: tuple[int, int] | None = None  # (N, status): every Nth request is answered with that status
    first_terminate_status: int | None = None  # the first podTerminate of each pod is answered with this status
    delay_s: float = 0.0  # every answer waits this long


@dataclass
class FakePod:
    id: str
    index: int
    account: str
    name: str
    image: str
    gpu_type: str
    cloud: str
    gpu_count: int
    docker_args: str
    env: dict[str, str]
    cost_per_hr: float
    fate: str  # normal | vanish | silent | exit0 | late
    start_delay_s: float
    vanish_after_s: float
    created_at: float = field(default_factory=time.time)
    status: str = "CREATED"
    running_at: float | None = None
    exit_code: int | None = None
    pid: int | None = None
    log_path: str | None = None
    process: subprocess.Popen | None = field(default=None, repr=False)

    def public(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in ("process", "env", "docker_args")}
        d["env_keys"] = sorted(self.env)
        return d


class FakeRunPod:
    def __init__(self, accounts: dict[str, str], *, workdir: str | Path | None = None,
                 image_env: dict[str, str] | None = None, log_dir: str | Path | None = None,
                 gpus: list[dict[str, Any]] | None = None, faults: Faults | None = None,
                 network_volumes: dict[str, list[dict[str, Any]]] | None = None):
        self.accounts = dict(accounts)  # api key -> account name
        self.workdir = str(workdir or os.getcwd())
        self.image_env = dict(image_env or {})
        self.log_dir = Path(log_dir or tempfile.mkdtemp(prefix="fake-runpod-"))
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.gpus = {g["id"]: g for g in (gpus or DEFAULT_GPUS)}
        self.faults = faults or Faults()
        self.network_volumes = network_volumes or {}
        self.pods: dict[str, FakePod] = {}
        self.events: list[dict[str, Any]] = []
        self.documents: list[str] = []  # every GraphQL document received, for tests of escaping
        self.refused_bodies: list[str] = []  # the body of each request answered 401 (bad key), to tell them apart
        self.stats = {"requests": 0, "http_errors": 0, "unauthorized": 0, "no_capacity": 0, "deployed": 0}
        self._rng = random.Random(self.faults.seed)
        self._lock = threading.RLock()
        self._created = 0
        self._stop = threading.Event()
        self._terminate_failed: set[bytes] = set()  # pods whose first podTerminate got first_terminate_status
        self._stopping: dict[str, tuple[FakePod, float]] = {}  # terminated late pods still dying: (pod, SIGKILL at)
        self._server: ThreadingHTTPServer | None = None
        self._threads: list[threading.Thread] = []

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, port: int = 0) -> str:
        handler = type("Handler", (_Handler,), {"fake": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", port), handler)
        self._server.daemon_threads = True
        for target in (self._server.serve_forever, self._tick_loop):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self._threads.append(t)
        return self.url

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._stop.set()
        with self._lock:
            for pod in [*self.pods.values(), *(p for p, _ in self._stopping.values())]:
                self._kill(pod)
            self.pods.clear()
            self._stopping.clear()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for t in self._threads:
            t.join(timeout=5)

    def __enter__(self) -> FakeRunPod:
        self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- inspection --------------------------------------------------------------------------------
    def live_pods(self) -> list[dict[str, Any]]:
        with self._lock:
            return [p.public() for p in self.pods.values()]

    def running_processes(self) -> list[int]:
        """Live pod processes, including those of terminated pods still within their stop grace."""
        with self._lock:
            pods = [*self.pods.values(), *(p for p, _ in self._stopping.values())]
            return [p.pid for p in pods if p.process is not None and p.process.poll() is None]

    def events_of(self, kind: str) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.events if e["event"] == kind]

    def _event(self, pod: FakePod, kind: str, **extra: Any) -> None:
        self.events.append({"event": kind, "pod_id": pod.id, "name": pod.name, "account": pod.account,
                            "t": time.time(), "index": pod.index, **extra})

    # -- the pod state machine ---------------------------------------------------------------------
    def _tick_loop(self) -> None:
        while not self._stop.wait(0.1):
            now = time.time()
            with self._lock:
                for pod in list(self.pods.values()):
                    self._tick(pod, now)
                for pod_id, (pod, kill_at) in list(self._stopping.items()):
                    if pod.process is None or pod.process.poll() is not None or now >= kill_at:
                        self._kill(pod)
                        del self._stopping[pod_id]

    def _tick(self, pod: FakePod, now: float) -> None:
        if pod.status == "CREATED" and now >= pod.created_at + pod.start_delay_s:
            pod.status, pod.running_at = "RUNNING", now
            self._event(pod, "running", fate=pod.fate)
            if pod.fate not in ("silent", "late"):
                self._spawn(pod)
        elif (pod.status == "RUNNING" and pod.fate == "late" and pod.process is None
              and now >= pod.running_at + self.faults.late_start_s):
            self._spawn(pod)
            self._event(pod, "command_started")
        elif pod.status == "RUNNING" and pod.process is not None and pod.process.poll() is not None:
            pod.status, pod.exit_code = "EXITED", pod.process.returncode
            self._event(pod, "exited", exit_code=pod.exit_code)
        if pod.fate == "vanish" and pod.running_at is not None and now >= pod.running_at + pod.vanish_after_s:
            self._kill(pod)
            del self.pods[pod.id]
            self._event(pod, "vanished", was=pod.status)

    def _spawn(self, pod: FakePod) -> None:
        home = self.log_dir / f"home-{pod.id}"
        home.mkdir(exist_ok=True)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
               "RUNPOD_POD_ID": pod.id, "TMPDIR": str(home)}
        env.update(self.image_env)
        env.update(pod.env)
        pod.log_path = str(self.log_dir / f"pod-{pod.id}.log")
        args = shlex.split(pod.docker_args) if pod.docker_args and pod.fate != "exit0" else ["true"]
        # The real command writes its script to /tmp; give each fake pod its own /tmp-like path instead.
        args = [a.replace("/tmp/", f"{home}/") for a in args]
        with open(pod.log_path, "ab") as log:
            pod.process = subprocess.Popen(args, cwd=self.workdir, env=env, stdout=log, stderr=subprocess.STDOUT,
                                           stdin=subprocess.DEVNULL, start_new_session=True)
        pod.pid = pod.process.pid

    def _kill(self, pod: FakePod) -> None:
        proc = pod.process
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    # -- GraphQL resolvers (called with the request's account) -------------------------------------
    def deploy(self, account: str, inp: dict[str, Any]) -> dict[str, Any]:
        gpu_type, cloud = inp.get("gpuTypeId"), inp.get("cloudType") or "ALL"
        if gpu_type not in self.gpus:
            raise GraphQLError(f"GPU type {gpu_type!r} does not exist")
        with self._lock:
            f = self.faults
            blocked = any((a in (None, account)) and (g in (None, gpu_type)) and (c in (None, cloud))
                          for a, g, c in f.no_capacity)
            if blocked or self._rng.random() < f.no_capacity_rate:
                self.stats["no_capacity"] += 1
                raise GraphQLError(NO_CAPACITY_MESSAGE)
            index = self._created
            self._created += 1
            roll = self._rng.random()
            fate = ("vanish" if index in f.vanish_pods or (roll < f.vanish_rate and index not in f.silent_pods)
                    else "silent" if index in f.silent_pods or roll < f.vanish_rate + f.silent_rate
                    else "exit0" if index in f.exit_zero_pods else "late" if index in f.late_pods else "normal")
            gpu = self.gpus[gpu_type]
            price = gpu["securePrice" if cloud != "COMMUNITY" else "communityPrice"] * (inp.get("gpuCount") or 1)
            pod = FakePod(
                id="".join(self._rng.choices(string.ascii_lowercase + string.digits, k=14)), index=index,
                account=account, name=inp.get("name") or "", image=inp["imageName"], gpu_type=gpu_type,
                cloud=cloud, gpu_count=inp.get("gpuCount") or 1, docker_args=inp.get("dockerArgs") or "",
                env={e["key"]: e["value"] for e in inp.get("env") or []}, cost_per_hr=price, fate=fate,
                start_delay_s=self._rng.uniform(*f.start_delay_s), vanish_after_s=self._rng.uniform(*f.vanish_after_s),
            )
            self.pods[pod.id] = pod
            self.stats["deployed"] += 1
            self._event(pod, "created", fate=fate, gpu_type=gpu_type, cloud=cloud, env_keys=sorted(pod.env),
                        cost_per_hr=price)  # the price the worker must record (a terminated pod leaves self.pods)
            return self._pod_view(pod)

    def terminate(self, account: str, pod_id: str) -> None:
        with self._lock:
            pod = self.pods.get(pod_id)
            if pod is None or pod.account != account:
                # A client that terminates a pod already gone has noticed that it is gone: the tests time it.
                self.events.append({"event": "terminate_missing", "pod_id": pod_id, "account": account,
                                    "t": time.time()})
                raise GraphQLError(f"Pod {pod_id} not found")
            if pod.fate == "late" and pod.process is not None and pod.process.poll() is None:
                try:  # the tick loop sends SIGKILL after the grace, if the process is still there
                    os.killpg(pod.process.pid, signal.SIGTERM)
                    self._stopping[pod_id] = (pod, time.time() + self.faults.stop_grace_s)
                except ProcessLookupError:
                    pass
            else:
                self._kill(pod)
            del self.pods[pod_id]
            self._event(pod, "terminated", was=pod.status, started=pod.process is not None)

    def pod(self, account: str, pod_id: str) -> dict[str, Any] | None:
        with self._lock:
            pod = self.pods.get(pod_id)
            return self._pod_view(pod) if pod is not None and pod.account == account else None

    def myself(self, account: str) -> dict[str, Any]:
        with self._lock:
            pods = [self._pod_view(p) for p in self.pods.values() if p.account == account]
        return {"id": f"user-{account}", "pubKey": "", "networkVolumes": self.network_volumes.get(account, []),
                "pods": pods}

    def gpu_types(self, ids: list[str] | None) -> list[dict[str, Any]]:
        out = []
        for gpu in self.gpus.values():
            if ids and gpu["id"] not in ids:
                continue
            view = {"displayName": gpu["id"].replace("NVIDIA ", ""), "manufacturer": "Nvidia", "maxGpuCount": 8,
                    "secureCloud": gpu.get("secureCloud", True), "communityCloud": gpu.get("communityCloud", True),
                    **gpu}
            view["lowestPrice"] = lambda info, input=None, g=gpu: {
                "minimumBidPrice": g["communityPrice"] / 2,
                "uninterruptablePrice": g["communityPrice"] * ((input or {}).get("gpuCount") or 1)}
            out.append(view)
        return out

    def _pod_view(self, pod: FakePod) -> dict[str, Any]:
        running = pod.status == "RUNNING"
        uptime = int(time.time() - pod.running_at) if pod.running_at else 0
        return {
            "id": pod.id, "name": pod.name, "imageName": pod.image, "env": [f"{k}={v}" for k, v in pod.env.items()],
            "machineId": f"m-{pod.id[:6]}", "machine": {"podHostId": f"{pod.id}-host", "gpuDisplayName": pod.gpu_type},
            "desiredStatus": pod.status, "costPerHr": pod.cost_per_hr, "containerDiskInGb": 50,
            "dockerArgs": pod.docker_args, "dockerId": None, "gpuCount": pod.gpu_count,
            "lastStatusChange": str(pod.running_at or pod.created_at), "memoryInGb": 64.0, "podType": "RESERVED",
            "port": None, "ports": None, "uptimeSeconds": uptime if running else 0, "vcpuCount": 8.0,
            "volumeInGb": 0.0, "volumeMountPath": "/workspace",
            "runtime": {"uptimeInSeconds": uptime, "ports": []} if running else None,
        }


class _Root:
    """Root value: graphql-core's default resolver calls these methods for top-level fields."""

    def __init__(self, fake: FakeRunPod, account: str):
        self.fake, self.account = fake, account

    def myself(self, info: Any) -> dict[str, Any]:
        return self.fake.myself(self.account)

    def pod(self, info: Any, input: dict[str, Any]) -> dict[str, Any] | None:
        return self.fake.pod(self.account, input["podId"])

    def gpuTypes(self, info: Any, input: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        ids = None
        if input:
            ids = [input["id"]] if input.get("id") else input.get("ids")
        return self.fake.gpu_types(ids)

    def podFindAndDeployOnDemand(self, info: Any, input: dict[str, Any]) -> dict[str, Any]:
        return self.fake.deploy(self.account, input)

    def podTerminate(self, info: Any, input: dict[str, Any]) -> None:
        self.fake.terminate(self.account, input["podId"])

    def podStop(self, info: Any, input: dict[str, Any]) -> None:
        raise GraphQLError("podStop is not supported by the fake")


class _Handler(BaseHTTPRequestHandler):
    fake: FakeRunPod

    def log_message(self, format: str, *args: Any) -> None:  # silence the default stderr access log
        pass

    def _send(self, status: int, body: Any, content_type: str = "application/json", headers: dict | None = None):
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(raw)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(raw)

    def do_GET(self) -> None:
        if self.path == "/_fake/pods":
            return self._send(200, self.fake.live_pods())
        if self.path == "/_fake/events":
            with self.fake._lock:
                return self._send(200, list(self.fake.events))
        self._send(404, {"error": "not found"})

    def do_POST(self) -> None:
        fake = self.fake
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length)
        if self.path != "/graphql":
            return self._send(404, {"error": "not found"})
        if fake.faults.delay_s:
            time.sleep(fake.faults.delay_s)
        with fake._lock:
            fake.stats["requests"] += 1
            status = fake.faults.fail_next.pop(0) if fake.faults.fail_next else None
            every = fake.faults.status_every
            if status is None and every and fake.stats["requests"] % every[0] == 0:
                status = every[1]
            terminate = re.search(rb'podTerminate\s*\(\s*input\s*:\s*\{\s*podId\s*:\s*\\?"([^"\\]+)', raw)
            if (status is None and terminate and fake.faults.first_terminate_status
                    and terminate.group(1) not in fake._terminate_failed):
                fake._terminate_failed.add(terminate.group(1))
                status = fake.faults.first_terminate_status
        if status is not None:
            fake.stats["http_errors"] += 1
            if status == 429:
                return self._send(429, b"Too Many Requests", "text/plain", {"Retry-After": "0"})
            return self._send(status, b"<html><body>upstream error</body></html>", "text/html")
        auth = self.headers.get("Authorization", "")
        account = fake.accounts.get(auth.removeprefix("Bearer ").strip())
        if account is None:
            fake.stats["unauthorized"] += 1
            fake.refused_bodies.append(raw.decode(errors="replace"))
            return self._send(401, {"errors": [{"message": "Unauthorized"}]})
        try:
            payload = json.loads(raw)
            query = payload["query"]
        except (ValueError, KeyError, TypeError):
            return self._send(400, {"errors": [{"message": "POST body must be JSON with a 'query'"}]})
        with fake._lock:
            fake.documents.append(query)
        result = graphql_sync(SCHEMA, query, root_value=_Root(fake, account),
                              variable_values=payload.get("variables"))
        body: dict[str, Any] = {"data": result.data}
        if result.errors:
            body["errors"] = [e.formatted for e in result.errors]
        self._send(400 if result.data is None and result.errors else 200, body)


def main() -> None:  # pragma: no cover - manual use
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8911)
    parser.add_argument("--key", action="append", default=[], help="an accepted API key (repeatable)")
    parser.add_argument("--vanish-rate", type=float, default=0.0)
    parser.add_argument("--no-capacity-rate", type=float, default=0.0)
    args = parser.parse_args()
    fake = FakeRunPod({k: f"acct{i}" for i, k in enumerate(args.key or ["test-key"])},
                      faults=Faults(vanish_rate=args.vanish_rate, no_capacity_rate=args.no_capacity_rate))
    print(f"fake RunPod API on {fake.start(args.port)}/graphql", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        fake.stop()


if __name__ == "__main__":  # pragma: no cover
    main()
