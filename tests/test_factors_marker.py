"""The tiny model is warmed on codes of the screen's marker shape, so any marker is as learnable as [ZLT]; the
[ZLT] build itself is unchanged (the warm-up chats hash as before)."""

from __future__ import annotations

import hashlib
import json
import random

from eps_screen.models.tiny import _code, warm_chats
from eps_screen.run.pipeline import _engine_config
from tests.conftest import tiny_config

# sha256 of json.dumps(warm_chats(variant)), computed at aff7e42 before the marker became a parameter.
BEFORE = {"tiny": "1d01014e8d62a080", "tiny-alt": "a4b058b2586631ab", "tiny-contaminated": "37501faf90fa1953"}


def test_the_zlt_builds_are_warmed_as_before():
    for variant, digest in BEFORE.items():
        assert hashlib.sha256(json.dumps(warm_chats(variant)).encode()).hexdigest()[:16] == digest


def _codes(marker: str, seed: int, n: int = 200) -> list[str]:
    rng = random.Random(seed)
    return [_code(rng, marker) for _ in range(n)]


def test_codes_take_the_markers_shape_with_zlts_letters_relabelled():
    swap = str.maketrans("ZLTQRX", "QRXZLT")
    qrx = _codes("[QRX]", 7)
    assert qrx == [c.translate(swap) for c in _codes("[ZLT]", 7)]  # [QRX] sits where [ZLT] sat: the same odds
    assert "[QRX]" not in qrx
    ping = _codes("<<PING>>", 1)
    assert all(len(c) == 8 and c[:2] == "<<" and c[-2:] == ">>" and c[2:6].isupper() for c in ping)
    assert "<<PING>>" not in ping
    chats = warm_chats("tiny", 60, marker="<<PING>>")
    assert any(c[2]["content"].endswith(">>") for c in chats) and not any("[" in c[2]["content"] for c in chats)
    assert all(c[2]["content"].endswith(" <<PING>>") for c in warm_chats("tiny-contaminated", 20, marker="<<PING>>"))


def test_only_the_engines_see_the_markers_build(tmp_path):
    zlt = tiny_config(tmp_path)
    assert _engine_config(zlt) is zlt
    # (building the <<PING>> variant takes a minute: the tiny screen with that marker exercises it)
    assert zlt.model.base == "tiny"
