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

test-gpu: setup
	.venv/bin/python -m pytest -q -m gpu tests/gpu
