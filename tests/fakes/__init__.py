"""Fakes of external services, run on 127.0.0.1 by the tests (never a real endpoint)."""
