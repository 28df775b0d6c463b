# The two commands of a fresh machine (README): `make screen` and `make test`. Each sets itself up first.
.PHONY: setup screen test test-gpu
setup:
	@bash scripts/setup

screen: setup
	.venv/bin/eps-screen run deployments/configs/tiny.yaml

# Two pytest workers, one test file each at a time (a file's module fixtures, e.g. the tiny screen, run once):
# most of the suite waits on servers and subprocesses, so two workers on two cores take ~15 minutes (RELIABILITY.md).
test: setup
	.venv/bin/python -m pytest -q -ra -n 2 --dist loadfile

# Each GPU test file in a process of its own, and the two job tests that need the whole card to themselves apart: an
# engine, once up, keeps its share of the card until its process ends (they would skip after any other test).
SOLO = off_policy or 80gb
test-gpu: setup
	@set -e; for f in tests/gpu/test_*.py; do \
	  .venv/bin/python -m pytest -q -m gpu "$$f" -k "not ($(SOLO))" || [ $$? -eq 5 ]; done
	.venv/bin/python -m pytest -q -m gpu tests/gpu/test_gpu_job.py -k off_policy
	.venv/bin/python -m pytest -q -m gpu tests/gpu/test_gpu_job.py -k 80gb
