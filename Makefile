# The two commands of a fresh machine (README): `make screen` and `make test`. Each sets itself up first.
.PHONY: setup screen lint test test-rest test-all test-gpu
setup:
	@bash scripts/setup

screen: setup
	.venv/bin/eps-screen run deployments/configs/tiny.yaml

# ruff over the whole tree, with the rules in pyproject.toml.
lint: setup
	.venv/bin/ruff check .

# Two pytest workers, one test file each at a time (a file's module fixtures, e.g. a tiny screen, run once).
# The tiers (docs/contributing.md): `make test` is the fast one, unit tests and flows on the simulated backend;
# `slow` marks tests that train or run real screens and models, `integration` those that start servers, Postgres
# or a browser (tests/marker_policy.py fails a test that does so unmarked). `test-all` is every non-GPU test;
# `test-rest` what test-all adds to test, so CI (.ci/run) runs each test once.
PYTEST = .venv/bin/python -m pytest -q -ra -n 2 --dist loadfile
test: setup
	$(PYTEST) -m "not slow and not integration and not gpu"

test-rest: setup
	$(PYTEST) -m "(slow or integration) and not gpu"

test-all: setup
	$(PYTEST) -m "not gpu"

# Each GPU test file in a process of its own, and the two job tests that need the whole card to themselves apart: an
# engine, once up, keeps its share of the card until its process ends (they would skip after any other test).
SOLO = off_policy or 80gb
test-gpu: setup
	@set -e; for f in tests/gpu/test_*.py; do \
	  .venv/bin/python -m pytest -q -m gpu "$$f" -k "not ($(SOLO))" || [ $$? -eq 5 ]; done
	.venv/bin/python -m pytest -q -m gpu tests/gpu/test_gpu_job.py -k off_policy
	.venv/bin/python -m pytest -q -m gpu tests/gpu/test_gpu_job.py -k 80gb
