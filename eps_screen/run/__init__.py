"""A cell from answers to metrics, a job's engines, the in-process cell pool, tracking, and a screen's
aggregation: the wing the flows and tasks call."""
