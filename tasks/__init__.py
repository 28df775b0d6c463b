"""Prefect tasks: thin wrappers (retries, cache keys, tags, artifacts) around eps_screen."""


def artifact_key(text: str) -> str:
    """The key of a Prefect artifact the tasks and flows create: lowercase letters, digits and dashes only."""
    return "".join(ch if ch.isalnum() else "-" for ch in text.lower())
