"""The URLs a config names (its result store's, its tracking server's), checked where the config is validated:
whether a store is a URL at all, whether its filesystem can be used here, and which option names are credentials,
which never go in a config. A module of its own, below the store, so that the config can check them without importing
the store."""

from __future__ import annotations

import importlib.util
import re

from fsspec.registry import known_implementations

# Words in an option name that mean a credential: those belong in the environment, never in the config.
SECRET_WORDS = re.compile(r"key|secret|token|password|credential", re.IGNORECASE)


def is_url(store: str) -> bool:
    """A remote store: a URL other than file:// (which is a local directory)."""
    return "://" in store and not store.startswith("file://")


def scheme_problem(url: str) -> str | None:
    """Why this URL's filesystem cannot be used here (unknown scheme, library not installed), or None."""
    scheme = url.split("://", 1)[0]
    impl = known_implementations.get(scheme)
    if impl is None:
        return f"unknown URL scheme {scheme + '://'!r}; use a local directory or an fsspec URL such as s3://bucket/prefix"
    package = impl["class"].split(".", 1)[0]
    if importlib.util.find_spec(package) is None:
        return f"{scheme}:// needs the {package} package, which is not installed: pip install {package}"
    return None


def secret_options(options: dict, prefix: str = "") -> list[str]:
    """Dotted names of options (at any depth) that look like credentials."""
    found = []
    for name, value in options.items():
        path = f"{prefix}{name}"
        if SECRET_WORDS.search(str(name)):
            found.append(path)
        elif isinstance(value, dict):
            found += secret_options(value, f"{path}.")
    return found
