"""The report link a run prints (issue 43): this server's address only while something serves the report there;
else the report's path and the command that serves it. An address the user chose (EPS_REPORT_URL) or a URL store's
object URL is printed as given."""

from __future__ import annotations

import threading

import pytest

from eps_screen.report import serve
from eps_screen.report.serve import REPORT_URL_ENV, make_server, report_url, shown_link


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("EPS_SCREEN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(REPORT_URL_ENV, raising=False)
    page = tmp_path / "store" / "mine" / "report" / "clean_result.html"
    page.parent.mkdir(parents=True)
    page.write_text("<html>report</html>")
    return tmp_path / "store", page


@pytest.mark.integration  # a report server on 127.0.0.1
def test_the_link_is_printed_only_while_something_serves_it(store, monkeypatch):
    root, page = store
    server = make_server(root, port=0)
    monkeypatch.setattr(serve, "PORT", server.server_address[1])  # the run's default address is this server's
    url = report_url(str(root), "mine")
    assert shown_link(url, page) == f"{page} (`eps-screen serve` serves it over HTTP)"  # bound, not yet serving

    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert shown_link(url, page) == f"{url} ({page})"
    finally:
        server.shutdown()
        server.server_close()
    assert shown_link(url, page).startswith(f"{page} (")


def test_an_address_the_user_chose_and_an_object_url_are_printed_as_given(store, monkeypatch):
    root, page = store
    monkeypatch.setenv(REPORT_URL_ENV, "http://127.0.0.1:9/tunnel")  # answers only at the user's end of a tunnel
    url = report_url(str(root), "mine")
    assert url.startswith("http://127.0.0.1:9/tunnel/") and shown_link(url, page) == f"{url} ({page})"
    monkeypatch.delenv(REPORT_URL_ENV)
    url = report_url("s3://bucket/prefix", "mine")
    assert shown_link(url, page) == f"{url} ({page})"
    assert shown_link(None, page).startswith(f"{page} (")


def test_serving_a_store_that_is_not_there_says_so_and_serves_the_rest(tmp_path, monkeypatch, capsys):
    """`eps-screen serve --store TYPO`: one line naming the missing directory, then the server still starts (the
    registered stores are served, and this one once a screen writes it)."""
    from types import SimpleNamespace

    from flows.cli import serve as serve_cli

    started = []

    class Server:
        server_address = ("127.0.0.1", 1)

        def serve_forever(self):
            started.append(True)
            raise KeyboardInterrupt

        def server_close(self):
            pass

    monkeypatch.setattr(serve_cli, "make_server", lambda *args: Server())
    missing = tmp_path / "no-such-store"
    assert serve_cli.run(SimpleNamespace(store=str(missing), host="127.0.0.1", port=0)) == 0
    err = capsys.readouterr().err
    assert f"no store at {missing}" in err and started
    missing.mkdir()
    assert serve_cli.run(SimpleNamespace(store=str(missing), host="127.0.0.1", port=0)) == 0
    assert "no store" not in capsys.readouterr().err
