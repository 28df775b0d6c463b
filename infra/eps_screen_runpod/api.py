"""A thin, per-account RunPod API client built on the runpod SDK's GraphQL text.

Why not call `runpod.create_pod` and friends directly:
- they read the module-global `runpod.api_key`, so two accounts in one worker (which serves many flow
  runs at once from threads) would race on it; here every call carries its own key;
- `runpod.api.graphql.run_graphql_query` calls `response.json()` whatever the HTTP status, so a 429 or
  an HTML 502 page surfaces as a JSON decode error or a KeyError; here the status decides: 401/403 =
  bad key, 429 and 5xx = transient (retried with backoff), GraphQL errors = the API's own answer.

The query text itself still comes from the SDK's generators (`runpod.api.mutations.pods`,
`runpod.api.queries.*`). Those build GraphQL with f-strings and no escaping, so every string value is
passed through `gql_escape` first: the SDK's surrounding quotes plus our escaping form an exact GraphQL
string literal, whatever quotes, backslashes, newlines or braces the value holds.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import time
from dataclasses import dataclass
from typing import Any

import requests
from pydantic import SecretStr
from runpod.api.mutations import pods as pod_mutations
from runpod.api.queries import gpus as gpu_queries
from runpod.api.queries import pods as pod_queries
from runpod.api.queries import user as user_queries
from runpod.user_agent import USER_AGENT

DEFAULT_BASE_URL = "https://api.runpod.io"

# What RunPod answers when no machine fits (podFindAndDeployOnDemand); matched loosely on purpose.
_NO_CAPACITY = re.compile(
    r"no longer any instances available|no instances? (currently )?available|not enough (free )?gpus|"
    r"insufficient capacity|could not find any pods with required specifications",
    re.IGNORECASE,
)


class RunPodApiError(Exception):
    """Any failure talking to RunPod. Messages never contain API keys or query text."""


class BadApiKey(RunPodApiError):
    """401/403: the account's key is wrong, revoked or lacks permission."""


class TransientApiError(RunPodApiError):
    """429, 5xx, a timeout or a broken connection: worth retrying later."""


class NoCapacity(RunPodApiError):
    """RunPod has no machine for this GPU type / cloud right now."""


class QueryRejected(RunPodApiError):
    """A GraphQL error that is neither capacity nor auth (bad input, unknown GPU type, ...)."""


def gql_escape(value: Any) -> str:
    """Escape `value` for the inside of a GraphQL string literal ("...").

    GraphQL string escapes are a subset of JSON's (\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX), so the body of a
    JSON string is a valid GraphQL string body with the same meaning. ensure_ascii keeps the query ASCII.
    """
    return json.dumps(str(value), ensure_ascii=True)[1:-1]


def _redact(text: str, secret: str) -> str:
    return text.replace(secret, "***") if secret else text


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 4
    base_delay_s: float = 1.0
    max_delay_s: float = 20.0
    timeout_s: float = 30.0


class RunPodApi:
    """One account's view of RunPod. Methods are blocking: call them from a worker thread."""

    def __init__(self, api_key: SecretStr, account: str = "default", retry: RetryPolicy | None = None):
        self._key = api_key
        self.account = account
        self.retry = retry or RetryPolicy()

    def __repr__(self) -> str:  # never show the key
        return f"RunPodApi(account={self.account!r})"

    # -- transport ---------------------------------------------------------------------------------
    def _post_once(self, query: str) -> dict[str, Any]:
        base = os.environ.get("RUNPOD_API_BASE_URL", DEFAULT_BASE_URL).rstrip("/")
        key = self._key.get_secret_value()
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT, "Authorization": f"Bearer {key}"}
        try:
            resp = requests.post(f"{base}/graphql", headers=headers, data=json.dumps({"query": query}),
                                 timeout=self.retry.timeout_s)
        except requests.RequestException as exc:
            raise TransientApiError(f"RunPod API unreachable ({type(exc).__name__})") from None
        if resp.status_code in (401, 403):
            raise BadApiKey(f"RunPod rejected the API key of account {self.account!r} (HTTP {resp.status_code})")
        if resp.status_code == 429 or resp.status_code >= 500:
            err = TransientApiError(f"RunPod API answered HTTP {resp.status_code}")
            err.retry_after = _retry_after(resp)  # type: ignore[attr-defined]
            raise err
        try:
            body = resp.json()
        except ValueError:
            raise TransientApiError(f"RunPod API answered HTTP {resp.status_code} with a non-JSON body") from None
        if not isinstance(body, dict):
            raise TransientApiError("RunPod API answered with an unexpected JSON shape")
        if body.get("errors"):
            message = _redact(str(body["errors"][0].get("message", "unknown error")), key)
            if _NO_CAPACITY.search(message):
                raise NoCapacity(message)
            if re.search(r"unauthori[sz]ed|api key", message, re.IGNORECASE):
                raise BadApiKey(f"account {self.account!r}: {message}")
            raise QueryRejected(message)
        if resp.status_code >= 400 or "data" not in body:
            raise QueryRejected(f"RunPod API answered HTTP {resp.status_code} without data")
        return body["data"]

    def query(self, query: str) -> dict[str, Any]:
        """POST one GraphQL document; retry transient failures with jittered exponential backoff."""
        delay = self.retry.base_delay_s
        for attempt in range(1, self.retry.attempts + 1):
            try:
                return self._post_once(query)
            except TransientApiError as exc:
                if attempt == self.retry.attempts:
                    raise
                wait = max(getattr(exc, "retry_after", 0.0) or 0.0, delay * (0.5 + random.random()))
                logging.getLogger(__name__).debug("transient RunPod error (%s); retry in %.1fs", exc, wait)
                time.sleep(min(wait, self.retry.max_delay_s))
                delay = min(delay * 2, self.retry.max_delay_s)
        raise AssertionError("unreachable")

    # -- operations the worker uses ----------------------------------------------------------------
    def gpu_type(self, gpu_type_id: str, gpu_count: int = 1) -> dict[str, Any] | None:
        data = self.query(gpu_queries.generate_gpu_query(gql_escape(gpu_type_id), int(gpu_count)))
        found = data.get("gpuTypes") or []
        return found[0] if found else None

    def whoami(self) -> str:
        """The account's user id: a read call that proves the key works (BadApiKey when RunPod refuses it)."""
        user = self.query(user_queries.QUERY_USER).get("myself") or {}
        return str(user.get("id") or "?")

    def network_volume_datacenter(self, network_volume_id: str) -> str | None:
        user = self.query(user_queries.QUERY_USER).get("myself") or {}
        for vol in user.get("networkVolumes") or []:
            if vol.get("id") == network_volume_id:
                return vol.get("dataCenterId")
        return None

    def create_pod(self, *, name: str, image: str, gpu_type_id: str, cloud_type: str, gpu_count: int,
                   container_disk_gb: int, volume_gb: int, volume_mount_path: str, docker_args: str,
                   env: dict[str, str], network_volume_id: str | None, data_center_id: str | None) -> dict[str, Any]:
        if cloud_type not in ("SECURE", "COMMUNITY", "ALL"):
            raise ValueError(f"cloud type {cloud_type!r} is not one of SECURE, COMMUNITY, ALL")
        for key in env:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
                raise ValueError(f"environment variable name {key!r} is not a valid name")
        mutation = pod_mutations.generate_pod_deployment_mutation(
            name=gql_escape(name),
            image_name=gql_escape(image),
            gpu_type_id=gql_escape(gpu_type_id),
            cloud_type=cloud_type,
            start_ssh=False,
            support_public_ip=False,
            data_center_id=gql_escape(data_center_id) if data_center_id else None,
            gpu_count=int(gpu_count),
            volume_in_gb=int(volume_gb),
            container_disk_in_gb=int(container_disk_gb),
            docker_args=gql_escape(docker_args),
            volume_mount_path=gql_escape(volume_mount_path),
            env={k: gql_escape(v) for k, v in env.items()},
            network_volume_id=gql_escape(network_volume_id) if network_volume_id else None,
        )
        pod = self.query(mutation).get("podFindAndDeployOnDemand")
        if not pod or not pod.get("id"):
            raise NoCapacity("RunPod returned no pod for the deployment request")
        return pod

    def get_pod(self, pod_id: str) -> dict[str, Any] | None:
        """The pod, or None when RunPod no longer knows it."""
        return self.query(pod_queries.generate_pod_query(gql_escape(pod_id))).get("pod")

    def list_pods(self) -> list[dict[str, Any]]:
        user = self.query(pod_queries.QUERY_POD).get("myself") or {}
        return list(user.get("pods") or [])

    def terminate_pod(self, pod_id: str) -> bool:
        """Terminate; False when RunPod says the pod does not exist (already gone counts as done)."""
        try:
            self.query(pod_mutations.generate_pod_terminate_mutation(gql_escape(pod_id)))
        except QueryRejected as exc:
            if re.search(r"not found|does not exist|no pod", str(exc), re.IGNORECASE):
                return False
            raise
        return True


def _retry_after(resp: requests.Response) -> float:
    try:
        return float(resp.headers.get("Retry-After", "0"))
    except ValueError:
        return 0.0
