"""eps-screen: the domain library (pure Python; never imports prefect)."""

__version__ = "0.1.0"
# Bumped when a change alters what a stored artifact means; part of every cache key.
PIPELINE_VERSION = "1"
