"""`eps-screen serve`: the reports of result stores over HTTP, read-only, and the URL a screen run links to.

Browsers refuse `file://` links from a web page (the Prefect UI), and a `file://` path means nothing over an SSH
tunnel, so the screen run's report artifact links `<base>/stores/<id>/<screen>/report/clean_result.html?store=<its
store>`, where <base> is EPS_REPORT_URL when set (e.g. the address a tunnel or a reverse proxy gives this server),
else this server's default address, http://127.0.0.1:8765. The link names its store (eps_screen.report.stores), so
it works whatever store the run used: the server answers for the store it was started on and for every store a
screen run registered on this machine. `?store=` only words the 404 page of a store the server does not know (which
store, and the command that serves it); it never chooses what is served. A URL store (s3://...) is linked by its
object URL unless EPS_REPORT_URL is set. The store the server was started on keeps its short links,
`/<screen>/report/...`. Only GET and HEAD of `/`, `[/stores/<id>]/<screen>/` and files under `<screen>/report/`
are answered; nothing is written. Standard library only (eps_screen never imports Prefect).
"""

from __future__ import annotations

import html
import io
import os
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, quote, unquote, urlsplit
from urllib.request import Request, urlopen

from eps_screen.report import stores
from eps_screen.spec.config_urls import is_url

HOST = "127.0.0.1"
PORT = 8765
REPORT_URL_ENV = "EPS_REPORT_URL"
PAGE = "report/clean_result.html"


def default_base() -> str:
    return f"http://{HOST}:{PORT}"


def report_url(where: str, screen: str, base: str | None = None) -> str:
    """The URL of a screen's clean_result.html in the store at `where` (stores.location): under `base` (default:
    EPS_REPORT_URL, else this server's default address), or the object URL of a URL store when neither `base` nor
    EPS_REPORT_URL is set."""
    base = base or os.environ.get(REPORT_URL_ENV)
    if not base and is_url(where):
        return f"{where.rstrip('/')}/{screen}/{PAGE}"
    return (f"{(base or default_base()).rstrip('/')}/stores/{stores.store_id(where)}/{quote(screen)}/{PAGE}"
            f"?store={quote(where, safe='/:')}")


def shown_link(url: str | None, path: str | Path) -> str:
    """How a run names its report on the terminal: "URL (PATH)" where the URL works, else the path and the command
    that serves it. A URL under EPS_REPORT_URL (a tunnel's address may answer only on the user's side) or a URL
    store's object URL is taken as given; this server's own address only when something answers there."""
    if url and (os.environ.get(REPORT_URL_ENV) or not url.startswith(default_base()) or _answers(url)):
        return f"{url} ({path})"
    return f"{path} (`eps-screen serve` serves it over HTTP)"


def _answers(url: str) -> bool:
    try:
        with urlopen(Request(url, method="HEAD"), timeout=2) as response:
            return response.status == 200
    except (OSError, ValueError):  # refused, timed out, or an HTTP error status
        return False


def _screens(root: Path) -> list[str]:
    return sorted(p.parent.parent.name for p in root.glob(f"*/{PAGE}"))


class ReportHandler(SimpleHTTPRequestHandler):
    """Files under <store>/<screen>/report/ of the server's own store and of the registered ones, and an index of
    the screens with a report; nothing else."""

    server_version = "eps-screen-serve"

    def __init__(self, *args, directory: str, own_id: str, **kwargs):
        self.own_id = own_id
        super().__init__(*args, directory=directory, **kwargs)

    def _parts(self) -> list[str]:
        return [p for p in unquote(urlsplit(self.path).path).split("/") if p]

    def send_head(self):
        parts = self._parts()
        if any(p in {".", ".."} or p.startswith(".") or "\0" in p for p in parts):
            return self._refuse()
        if not parts:
            return self._listing()
        # `/stores/report/...` stays the short link of a screen named "stores"; an id is never "report".
        if parts[0] == "stores" and len(parts) > 1 and parts[1] != "report":
            sid, parts, prefix = parts[1], parts[2:], f"/stores/{parts[1]}"
            root = self._store_dir(sid)
            if root is None:
                return self._unknown_store(sid)
        else:
            root, prefix = Path(self.directory), ""
        if len(parts) == 1:  # /<screen>: its report
            self.send_response(302)
            self.send_header("Location", f"{prefix}/{quote(parts[0])}/{PAGE}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if len(parts) < 3 or parts[1] != "report" or (root / Path(*parts)).is_dir():  # no listing below the index
            return self._refuse()
        self.directory = str(root)  # this request's store; the handler lives for one request
        self.path = "/" + "/".join(quote(p) for p in parts)
        return super().send_head()

    def _refuse(self):
        self.send_error(404, "only the reports of a store are served")
        return None

    def _store_dir(self, sid: str) -> Path | None:
        if sid == self.own_id:
            return Path(self.directory)
        entry = stores.lookup(sid)  # read now: a store registered after the server started is served too
        return Path(entry["dir"]) if entry and Path(entry["dir"]).is_dir() else None

    def _unknown_store(self, sid: str):
        """404, saying which store the link wants (from the registry, or the link's own ?store= when it hashes to
        the id) and the command that serves it."""
        entry = stores.lookup(sid)
        named = parse_qs(urlsplit(self.path).query).get("store", [None])[0]
        where = entry["location"] if entry else named if named and stores.store_id(named) == sid else None
        if where:
            why = (f"its directory {entry['dir']} is gone" if entry else
                   "no screen run on this machine has registered it (a screen registers its store when it "
                   "aggregates)")
            text = (f"<p>This link wants the reports of the store <code>{html.escape(where)}</code>, which this "
                    f"server does not serve: {html.escape(why)}.</p><p>Serve it with <code>eps-screen serve "
                    f"--store {html.escape(where)}</code>, or re-aggregate it on this machine "
                    f"(<code>eps-screen report SCREEN --store {html.escape(where)}</code>), which registers it.</p>")
        else:
            text = (f"<p>This link wants the reports of the store with id <code>{html.escape(sid)}</code>, which "
                    f"this server does not know. The screen run's report artifact names the store; serve it with "
                    f"<code>eps-screen serve --store DIR</code>.</p>")
        return self._page(404, "store not served here", text)

    def _listing(self):
        own = Path(self.directory)
        sections = [(str(own), "", own)] + [(e["location"], f"/stores/{sid}", Path(e["dir"]))
                                            for sid, e in stores.registered().items() if sid != self.own_id]
        body = "".join(
            f"<h2>Reports in {html.escape(name)}</h2><ul>"
            + ("".join(f'<li><a href="{prefix}/{quote(s)}/{PAGE}">{html.escape(s)}</a></li>' for s in _screens(root))
               or "<li>no screen has a report yet</li>") + "</ul>"
            for name, prefix, root in sections)
        return self._page(200, "eps-screen reports", body)

    def _page(self, status: int, title: str, body: str):
        data = (f"<!doctype html><meta charset='utf-8'><title>{html.escape(title)}</title>"
                f"<h1>{html.escape(title)}</h1>{body}").encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        return io.BytesIO(data)

    def do_POST(self):  # read-only: no method writes
        self.send_error(405, "read-only")

    do_PUT = do_DELETE = do_PATCH = do_POST


def make_server(root: str | Path, host: str = HOST, port: int = PORT, where: str | None = None) -> ThreadingHTTPServer:
    """A server over the store directory `root` (a URL store: its local mirror, and `where` its URL) and every
    registered store (port 0: any free port; server.server_address has it)."""
    root = Path(root).resolve()
    handler = partial(ReportHandler, directory=str(root), own_id=stores.store_id(where or str(root)))
    return ThreadingHTTPServer((host, port), handler)
