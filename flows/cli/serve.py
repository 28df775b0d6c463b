"""`eps-screen serve`: the store's reports over HTTP, read-only (what a screen run's report link points to)."""

from __future__ import annotations

from eps_screen.report.serve import REPORT_URL_ENV, make_server
from eps_screen.store import ResultStore


def run(args) -> int:
    root = ResultStore(args.store, "-").root  # a URL store: its local mirror on this machine
    server = make_server(root, args.host, args.port)
    host, port = server.server_address[:2]
    print(f"serving the reports of {root} at http://{host}:{port}/ (read-only; Ctrl-C stops it); screen runs link "
          f"here unless {REPORT_URL_ENV} says otherwise", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
