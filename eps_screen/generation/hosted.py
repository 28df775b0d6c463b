"""Answers from a hosted model: Anthropic's Messages API or an OpenAI-compatible chat-completions endpoint.

Plain HTTP through httpx (no vendor SDK: their own retries would stack on these, and they are not dependencies).

- The key is read from the environment variable `off_policy.api_key_env` names, per request, into that request's
  headers only: no attribute, repr, log line, exception message or stored file holds it (a server's error text is
  redacted before it is raised).
- At most `max_concurrent` requests are in flight and at most `requests_per_minute` start per minute (spaced
  evenly, retries included). A 408, 429, 5xx (Anthropic's 529 too) or a transport failure is retried up to
  `max_retries` times, `retry_backoff_s` doubling with jitter, or after the server's Retry-After when it sends one.
  Any other error stops the batch: no new request starts, those in flight finish and are delivered, then the first
  error is raised.
- `complete` hands each answer to `on_answer` as it arrives, so the caller can store it at once: an interrupted
  batch loses only what was in flight (eps_screen/run/offpolicy.py keeps them in the result store).
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass

import httpx

from eps_screen.generation import GenerationParams, Prompt
from eps_screen.spec.config import OffPolicyConfig

log = logging.getLogger(__name__)

ANTHROPIC_VERSION = "2023-06-01"


class HostedError(RuntimeError):
    """A request that failed for good; the message names the endpoint and status, never the key."""


@dataclass(frozen=True)
class Answer:
    text: str
    stop_reason: str | None
    usage: dict


class RateLimiter:
    """Request starts spaced 60/per_minute seconds apart, shared by every thread (None: no spacing)."""

    def __init__(self, per_minute: float | None):
        self.interval = 60.0 / per_minute if per_minute else 0.0
        self._next = 0.0
        self._lock = threading.Lock()

    def wait(self) -> None:
        if not self.interval:
            return
        with self._lock:
            now = time.monotonic()
            start = max(now, self._next)
            self._next = start + self.interval
        if start > now:
            time.sleep(start - now)


def _retryable(status: int) -> bool:
    return status in (408, 429) or status >= 500  # 5xx includes Anthropic's 529 "overloaded"


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers.get("retry-after", "")))
    except ValueError:
        return None  # absent, or an HTTP date: fall back to the backoff


class HostedClient:
    """One hosted model behind `complete(prompts, params, on_answer)`."""

    def __init__(self, off_policy: OffPolicyConfig):
        if not off_policy.hosted:
            raise ValueError(f"off_policy.kind {off_policy.kind!r} is not a hosted API")
        self.kind = off_policy.kind
        self.model = off_policy.model
        self.root = off_policy.api_root
        self.key_env = off_policy.key_env
        self.limits = off_policy
        self._limiter = RateLimiter(off_policy.requests_per_minute)
        self._client = httpx.Client(timeout=off_policy.timeout_s)

    def __repr__(self) -> str:
        return f"HostedClient({self.kind}:{self.model} at {self.root}, key from ${self.key_env})"

    @property
    def source(self) -> str:
        """What the regime meta records as `answers_from`."""
        return f"{self.kind}:{self.model}@{self.root}"

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> HostedClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # --- one request -------------------------------------------------------------------------------------
    def _key(self) -> str:
        key = os.environ.get(self.key_env, "").strip()
        if not key:
            raise HostedError(
                f"{self.kind}: the environment variable {self.key_env} (off_policy.api_key_env) is not set; the API key"
                " comes from the environment, never from the config"
            )
        return key

    def _request(self, prompt: Prompt, params: GenerationParams, key: str) -> tuple[str, dict, dict]:
        if self.kind == "anthropic":
            body: dict = {"model": self.model, "max_tokens": params.max_new_tokens,
                          "messages": [{"role": "user", "content": prompt.user}], "temperature": params.temperature}
            if prompt.system:
                body["system"] = prompt.system
            if params.top_p < 1.0:  # some models refuse temperature and top_p together
                body["top_p"] = params.top_p
            headers = {"x-api-key": key, "anthropic-version": ANTHROPIC_VERSION}
            return f"{self.root}/v1/messages", headers, body
        messages = ([{"role": "system", "content": prompt.system}] if prompt.system else []) + [
            {"role": "user", "content": prompt.user}]
        body = {"model": self.model, "messages": messages, "max_tokens": params.max_new_tokens,
                "temperature": params.temperature, "top_p": params.top_p, "n": 1}
        return f"{self.root}/chat/completions", {"authorization": f"Bearer {key}"}, body

    def _parse(self, data: dict) -> Answer:
        if self.kind == "anthropic":
            text = "".join(b.get("text", "") for b in data.get("content", []) if b.get("type") == "text")
            return Answer(text, data.get("stop_reason"), data.get("usage") or {})
        choice = data["choices"][0]
        return Answer(choice["message"].get("content") or "", choice.get("finish_reason"), data.get("usage") or {})

    def _error(self, what: str, response: httpx.Response | None, key: str) -> HostedError:
        detail = ""
        if response is not None:
            try:
                err = response.json().get("error", {})
                detail = err.get("message", "") if isinstance(err, dict) else str(err)
            except ValueError:
                detail = response.text
            detail = ": " + detail.replace(key, "[key]")[:300] if detail else ""
        return HostedError(f"{self.kind}:{self.model} at {self.root}: {what}{detail}")

    def _one(self, prompt: Prompt, params: GenerationParams, stop: threading.Event) -> Answer | None:
        """One answer, retried; None when the batch was stopped before this request started. A failure stops the
        batch here, in the worker, so that no queued request starts after it."""
        try:
            return self._attempts(prompt, params, stop)
        except BaseException:
            stop.set()
            raise

    def _attempts(self, prompt: Prompt, params: GenerationParams, stop: threading.Event) -> Answer | None:
        key = self._key()
        url, headers, body = self._request(prompt, params, key)
        limits = self.limits
        for attempt in range(limits.max_retries + 1):
            if stop.is_set():
                return None
            self._limiter.wait()
            last = attempt == limits.max_retries
            try:
                response = self._client.post(url, headers=headers, json=body)
            except httpx.TransportError as err:
                if last:
                    raise self._error(f"no answer after {attempt + 1} attempts ({type(err).__name__})", None, key) from None
                delay, why = None, type(err).__name__
            else:
                if response.status_code == 200:
                    try:
                        return self._parse(response.json())
                    except (ValueError, KeyError, IndexError, TypeError):
                        raise self._error("HTTP 200 with a body that is not an answer", None, key) from None
                if not _retryable(response.status_code):
                    raise self._error(f"HTTP {response.status_code}", response, key)
                if last:
                    raise self._error(f"HTTP {response.status_code} after {attempt + 1} attempts", response, key)
                delay, why = _retry_after(response), f"HTTP {response.status_code}"
            if delay is None:
                delay = limits.retry_backoff_s * 2**attempt * (0.5 + random.random() / 2)
            log.warning("%s: %s, retry %d of %d in %.1f s", self.source, why, attempt + 1, limits.max_retries, delay)
            time.sleep(delay)
        raise AssertionError("unreachable")

    # --- a batch -----------------------------------------------------------------------------------------
    def complete(self, prompts: Sequence[Prompt], params: GenerationParams,
                 on_answer: Callable[[int, Answer], None]) -> None:
        """Request every prompt; `on_answer(index, answer)` runs in this thread as each arrives."""
        if not prompts:
            return
        self._key()  # a missing key fails before any request
        stop = threading.Event()
        first_error: BaseException | None = None
        with ThreadPoolExecutor(max_workers=min(self.limits.max_concurrent, len(prompts))) as pool:
            futures = {pool.submit(self._one, p, params, stop): i for i, p in enumerate(prompts)}
            try:
                for future in as_completed(futures):
                    try:
                        answer = future.result()
                    except Exception as err:  # noqa: BLE001 - the first is re-raised below
                        first_error = first_error or err
                        continue
                    if answer is not None:
                        on_answer(futures[future], answer)
            except BaseException:
                stop.set()  # Ctrl-C: start nothing new; what is in flight still finishes before the pool closes
                raise
        if first_error is not None:
            raise first_error
