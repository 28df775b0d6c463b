"""eps-screen: the domain library (pure Python; never imports prefect), in wings, each a concern, lowest
first: panels, spec, models, store, generation, train, plan, analysis, report, run
(tests/test_wings.py; docs/architecture.md says what each holds)."""

__version__ = "0.1.0"
# Bumped when a change alters what a stored artifact means; part of every cache key.
PIPELINE_VERSION = "1"
