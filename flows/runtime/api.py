"""The Prefect API this process talks to: is it set and answering, and a flow run's address in the UI.

Prefect is imported inside the functions: the CLI's read-only commands import this module and must answer in a
second, without Prefect's import.
"""

from __future__ import annotations

from typing import Any


def api_url() -> str | None:
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def api_problem(required: bool) -> str | None:
    """None when the API answers (or is not needed); else one line saying what is wrong."""
    import httpx
    from prefect.settings import PREFECT_API_KEY

    url = api_url()
    if not url:
        return "PREFECT_API_URL is not set: start a server (prefect server start) and export it" if required else None
    key = PREFECT_API_KEY.value()
    headers = {"Authorization": f"Bearer {key.get_secret_value()}"} if key else {}
    try:
        response = httpx.get(f"{url.rstrip('/')}/health", headers=headers, timeout=5)
    except httpx.HTTPError as exc:
        return f"Prefect API {url} is not reachable ({type(exc).__name__})"
    if response.status_code != 200:
        return f"Prefect API {url} answered HTTP {response.status_code} on /health"
    return None


def ui_url(flow_run_id: Any) -> str | None:
    from prefect.settings import PREFECT_UI_URL

    base = PREFECT_UI_URL.value()
    return f"{base}/runs/flow-run/{flow_run_id}" if base else None
