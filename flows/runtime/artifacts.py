"""The rule for the keys of the screen's Prefect artifacts (progress, cells, summary, report link)."""


def artifact_key(text: str) -> str:
    """Prefect artifact keys allow lowercase letters, digits and dashes only."""
    return "".join(ch if ch.isalnum() else "-" for ch in text.lower())
