"""`eps-screen serve`: the reports of the store and of every store a screen run registered on this machine, over
HTTP, read-only (what a screen run's report link points to)."""

from __future__ import annotations

import sys

from eps_screen.report.serve import REPORT_URL_ENV, make_server
from eps_screen.report.stores import registry_dir
from eps_screen.store.result_store import ResultStore
from flows.cli.session import NoStore, existing_store


def run(args) -> int:
    store = ResultStore(args.store, "-")  # a URL store: its local mirror on this machine
    try:
        existing_store(args.store)
    except NoStore as err:  # still worth serving: the registered stores, and this one once a screen writes it
        print(f"note: {err}", file=sys.stderr, flush=True)
    server = make_server(store.root, args.host, args.port, store.url)
    host, port = server.server_address[:2]
    print(f"serving the reports of {store.root} at http://{host}:{port}/, and of every store registered in "
          f"{registry_dir()} (read-only; Ctrl-C stops it); screen runs link here unless {REPORT_URL_ENV} says "
          "otherwise", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0
