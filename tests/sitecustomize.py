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
