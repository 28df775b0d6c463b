"""pytest fixtures around the fake RunPod API; import `fake_runpod_fixture` into a test module or conftest.

The fixture is named `fake_runpod` (tests ask for that name); the function has another name so that importing it
does not shadow the tests' parameter.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.fakes.runpod_api import FakeRunPod, Faults

TEST_KEY = "rpa_TESTKEY_0123456789abcdef0123456789abcdef"
OTHER_KEY = "rpa_OTHERKEY_fedcba9876543210fedcba98765432"


@pytest.fixture(name="fake_runpod")
def fake_runpod_fixture(tmp_path, monkeypatch) -> Iterator[FakeRunPod]:
    """A started fake with two accounts ('main', 'spare'); RUNPOD_API_BASE_URL points at it."""
    fake = FakeRunPod({TEST_KEY: "main", OTHER_KEY: "spare"}, workdir=tmp_path, log_dir=tmp_path / "pods",
                      faults=Faults(seed=1))
    monkeypatch.setenv("RUNPOD_API_BASE_URL", fake.start())
    try:
        yield fake
    finally:
        fake.stop()
