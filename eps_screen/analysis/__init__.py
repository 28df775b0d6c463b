"""Statistics and verdicts on finished cells: effects and their CIs, training-run noise, power, the kill
criteria, the predictions, and the aggregation's artifacts' schemas."""
