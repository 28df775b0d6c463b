"""`eps-screen config --defaults`: every config field, its type, default and description, from the schema (no
Prefect); --markdown writes docs/config.md's text."""

from __future__ import annotations

import sys

from eps_screen.spec.config_reference import reference_markdown, reference_text, sections


def run(args) -> int:
    if not args.defaults:
        print("give --defaults: eps-screen config --defaults [--section SECTION] [--markdown]", file=sys.stderr)
        return 2
    if args.section and args.section not in sections():
        print(f"error: --section {args.section!r} is not a section; sections: {', '.join(sections())}", file=sys.stderr)
        return 2
    if args.markdown and args.section:
        print("error: --markdown writes the whole reference (docs/config.md): drop --section", file=sys.stderr)
        return 2
    sys.stdout.write(reference_markdown() if args.markdown else reference_text(args.section))
    return 0
