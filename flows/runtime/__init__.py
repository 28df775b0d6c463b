"""The machinery under the flows (names, Prefect runs, status, submit, deploy, workers, dispatch): no @flow here."""
