"""`eps-screen verify`: read back every file of a store; --repair keeps the unreadable ones aside (no Prefect)."""

from __future__ import annotations

import sys

from eps_screen.store.verify import verify


def run(args) -> int:
    try:
        found = verify(args.store, args.screen, repair=args.repair)
    except FileNotFoundError as exc:
        print(f"error: {exc} (--store names a directory or a URL)", file=sys.stderr)
        return 2
    for path, why in found.bad:
        print(f"unreadable  {path}: {why}")
    for path in found.aside:
        print(f"kept aside  {path}")
    summary = f"{found.location}: {found.checked} files checked, {len(found.bad)} unreadable"
    if not found.bad:
        print(summary)
        return 0
    if found.repaired:
        print(f"{summary}, kept aside: the next run of their screen computes what they held again")
        return 0
    print(f"{summary}: `eps-screen verify --repair` keeps them aside, so the next run computes them again")
    return 1
