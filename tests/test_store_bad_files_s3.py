"""The bad-file tests of tests/test_store_bad_files.py on a store at an s3:// URL (moto's S3 server): the files are
spoiled at the URL, where every machine looks, and the next run is another machine's (an empty cache)."""

from __future__ import annotations

import pytest

from eps_screen.store.files import BAD
from eps_screen.store.remote import Remote
from tests.test_remote_store import s3_endpoint  # noqa: F401 (the fixture)
from tests.test_store_bad_files import CUT_PARQUET, DAMAGED, EMPTY_JSON, EMPTY_PARQUET, SPOILED_JSON, small_screen, spoil

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_harness")]  # moto's S3 server


@pytest.fixture
def url(s3_endpoint) -> str:  # noqa: F811
    """A fresh bucket per test. fsspec keeps one filesystem per set of arguments: one made for another module's
    moto server would still point at it."""
    import uuid

    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    bucket = f"eps-{uuid.uuid4().hex[:12]}"
    Remote(f"s3://{bucket}").fs.mkdir(bucket)
    return f"s3://{bucket}/results"


def metrics_at(remote: Remote, screen: str) -> dict[str, bytes]:
    return {rel.split("/")[2]: remote.read(rel) for rel in remote.glob(f"{screen}/cells/*/*/metrics.json")}


def cell_prefixes(remote: Remote, screen: str) -> dict[str, str]:
    return {rel.split("/")[2]: rel.rsplit("/", 1)[0] for rel in remote.glob(f"{screen}/cells/*/*/metrics.json")}


def test_bad_files_at_the_url_are_kept_aside_there_and_only_their_cells_computed_again(url, tmp_path):
    from flows.cli import main
    from flows.screen import screen

    first = small_screen(url, "spoiled", store_cache=str(tmp_path / "first"))
    assert screen(first, return_state=True).is_completed()
    remote = Remote(url)
    cells = cell_prefixes(remote, "spoiled")
    cut = f"{cells[CUT_PARQUET]}/answers.parquet"
    remote.write(cut, remote.read(cut)[:100])
    spoil(cells, remote.write, remote.delete)
    before = metrics_at(remote, "spoiled")

    assert main(["verify", "--store", url]) == 1
    assert main(["verify", "--store", url, "--screen", "other"]) == 0  # nothing of that screen

    second = small_screen(url, "spoiled", store_cache=str(tmp_path / "second"))  # another machine
    state = screen(second, return_state=True)
    assert state.is_completed(), state.message
    after = metrics_at(remote, "spoiled")
    assert {c for c in after if before.get(c) != after[c]} == DAMAGED  # no other cell computed again
    aside = sorted(rel.split("/")[2] for rel in remote.find("spoiled") if BAD in rel)
    assert aside == sorted([SPOILED_JSON, CUT_PARQUET, EMPTY_JSON, EMPTY_PARQUET])
    assert main(["verify", "--store", url]) == 0


def test_verify_repairs_at_the_url(url, tmp_path, capsys):
    from flows.cli import main
    from flows.screen import screen

    assert screen(small_screen(url, "checked", store_cache=str(tmp_path / "c")), return_state=True).is_completed()
    remote = Remote(url)
    cells = cell_prefixes(remote, "checked")
    spoil(cells, remote.write, remote.delete)
    capsys.readouterr()
    assert main(["verify", "--store", url]) == 1
    out = capsys.readouterr().out
    assert sorted(line.split("/cells/")[1].split("/")[0] for line in out.splitlines() if line.startswith("unreadable")) \
        == sorted([SPOILED_JSON, EMPTY_JSON, EMPTY_PARQUET])
    assert main(["verify", "--store", url, "--repair"]) == 0
    assert len([rel for rel in remote.find("checked") if BAD in rel]) == 3
    assert main(["verify", "--store", url]) == 0


def test_leases_and_claims_on_the_url(url, tmp_path):
    from eps_screen.store.result_store import ResultStore
    from tests.test_store_claims import check_leases_and_claims

    config = small_screen(url, "claims", store_cache=str(tmp_path / "c"))
    store = ResultStore.for_config(config)
    check_leases_and_claims(config, store)
    assert not store.remote.find("claims/claims") and not store.remote.find("claims/runs")  # nothing left at the URL
