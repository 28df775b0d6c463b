"""`eps-screen serve`: the reports of a store over HTTP, read-only, and the URL a screen run links to.

Browsers refuse `file://` links from a web page (the Prefect UI), and a `file://` path means nothing over an SSH
tunnel, so the screen run's report artifact links `<base>/<screen>/report/clean_result.html`, where <base> is
EPS_REPORT_URL when set (e.g. the address a tunnel or a reverse proxy gives this server), else this server's
default address, http://127.0.0.1:8765. A URL store (s3://...) is linked by its object URL unless EPS_REPORT_URL
is set. Only GET and HEAD of `/`, `/<screen>/` and files under `<screen>/report/` are answered; nothing is written.
Standard library only (eps_screen never imports Prefect).
"""

from __future__ import annotations

import html
import os
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

HOST = "127.0.0.1"
PORT = 8765
REPORT_URL_ENV = "EPS_REPORT_URL"


def default_base() -> str:
    return f"http://{HOST}:{PORT}"


def report_url(store_url: str | None, screen: str, base: str | None = None) -> str:
    """The URL of a screen's clean_result.html: under `base` (default: EPS_REPORT_URL, else this server's default
    address), or the object URL of a URL store when neither `base` nor EPS_REPORT_URL is set."""
    base = base or os.environ.get(REPORT_URL_ENV)
    if not base and store_url:
        return f"{store_url.rstrip('/')}/{screen}/report/clean_result.html"
    return f"{(base or default_base()).rstrip('/')}/{quote(screen)}/report/clean_result.html"


def _screens(root: Path) -> list[str]:
    return sorted(p.parent.parent.name for p in root.glob("*/report/clean_result.html"))


class ReportHandler(SimpleHTTPRequestHandler):
    """Files under <store>/<screen>/report/ and an index of the screens with a report; nothing else."""

    server_version = "eps-screen-serve"

    def _parts(self) -> list[str]:
        return [p for p in unquote(urlsplit(self.path).path).split("/") if p]

    def _allowed(self) -> bool:
        parts = self._parts()
        if any(p in {".", ".."} or p.startswith(".") for p in parts):
            return False
        return len(parts) <= 1 or parts[1] == "report"

    def send_head(self):
        if not self._allowed():
            self.send_error(404, "only the reports of the store are served")
            return None
        parts = self._parts()
        if not parts:
            return self._listing()
        if len(parts) == 1:  # /<screen>: its report
            self.send_response(302)
            self.send_header("Location", f"/{quote(parts[0])}/report/clean_result.html")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if Path(self.translate_path(self.path)).is_dir():  # no directory listings below the index
            self.send_error(404, "no listing here")
            return None
        return super().send_head()

    def _listing(self):
        import io

        root = Path(self.directory)
        items = "".join(f'<li><a href="/{quote(s)}/report/clean_result.html">{html.escape(s)}</a></li>'
                        for s in _screens(root)) or "<li>no screen has a report yet</li>"
        body = (f"<!doctype html><meta charset='utf-8'><title>eps-screen reports</title>"
                f"<h1>Reports in {html.escape(str(root))}</h1><ul>{items}</ul>").encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return io.BytesIO(body)

    def do_POST(self):  # read-only: no method writes
        self.send_error(405, "read-only")

    do_PUT = do_DELETE = do_PATCH = do_POST


def make_server(root: str | Path, host: str = HOST, port: int = PORT) -> ThreadingHTTPServer:
    """A server over the store directory `root` (port 0: any free port; server.server_address has it)."""
    handler = partial(ReportHandler, directory=str(Path(root).resolve()))
    return ThreadingHTTPServer((host, port), handler)
