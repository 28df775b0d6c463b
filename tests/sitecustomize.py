"""Python runs this at start-up in the processes a test launches (tests/marker_policy.py puts tests/ on their
PYTHONPATH): a test without `integration` may not start a server there either."""

import os

if os.environ.get("EPS_TEST_FORBID"):
    try:
        import marker_policy
    except ImportError:  # a Python without pytest (a fresh venv a test builds): nothing to enforce with
        pass
    else:
        marker_policy.guard_child(os.environ["EPS_TEST_FORBID"])

# Python runs the first sitecustomize on the path, and tests/ comes first here: a test that puts a sitecustomize of
# its own on its child's PYTHONPATH (a hook recording each run) would lose it. Run the next one too, as Python would
# have without this one.
from pathlib import Path as _Path  # noqa: E402
import importlib.util as _util  # noqa: E402
import sys as _sys  # noqa: E402

_here = _Path(__file__).resolve().parent
for _entry in _sys.path:
    _next = _Path(_entry or ".").resolve() / "sitecustomize.py"
    if _next.parent != _here and _next.is_file():
        _spec = _util.spec_from_file_location("_next_sitecustomize", _next)
        _spec.loader.exec_module(_util.module_from_spec(_spec))
        break
