# The two commands of a fresh machine (README): `make screen` and `make test`. Each sets itself up first.
.PHONY: setup screen test test-gpu
setup:
	@bash scripts/setup

screen: setup
	.venv/bin/eps-screen run deployments/configs/tiny.yaml

test: setup
	.venv/bin/python -m pytest -q -ra

test-gpu: setup
	.venv/bin/python -m pytest -q -m gpu tests/gpu
