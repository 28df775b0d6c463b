"""The config reference: every field of ScreenConfig with its type, default and description, read from the schema
(eps_screen/spec/config.py) and nowhere else. `eps-screen config --defaults` prints it; docs/config.md is its markdown
(`eps-screen config --defaults --markdown`), and tests/test_config_reference.py fails when the two drift.
"""

from __future__ import annotations

import inspect
import json
import textwrap
import types
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel

from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.config_profiles import PROFILES, profiles_markdown

TOP = "top"  # the section of the fields at the top level of the config (name, sources, store, ...)
COMMAND = "eps-screen config --defaults --markdown > docs/config.md"


@dataclass(frozen=True)
class Row:
    path: str
    type: str
    default: str
    description: str


def _is_section(annotation: Any) -> bool:
    return isinstance(annotation, type) and issubclass(annotation, BaseModel)


def type_name(annotation: Any) -> str:
    """A field's type in a YAML writer's words: integer, list of string, auto | vllm, ..."""
    origin, args = get_origin(annotation), get_args(annotation)
    if origin is Annotated:
        return type_name(args[0])
    if origin is Literal:
        return " | ".join(str(a) for a in args)
    if origin in (Union, types.UnionType):
        kept = [a for a in args if a is not type(None)]
        names = " or ".join(type_name(a) for a in kept)
        return f"{names} or null" if len(kept) < len(args) else names
    if origin is list:
        return f"list of {type_name(args[0])}"
    if origin is dict:
        return f"mapping of {type_name(args[0])} to {type_name(args[1])}"
    if _is_section(annotation):
        return annotation.__name__
    return {int: "integer", float: "number", str: "string", bool: "boolean", Any: "any"}.get(annotation,
                                                                                         getattr(annotation, "__name__", str(annotation)))


def shown(value: Any) -> str:
    """A default as a YAML file writes it; a list of mappings (the factors) by each entry's first text."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        names = [next((str(x) for x in v.values() if isinstance(x, str)), "?") for v in value]
        return f"{len(value)} entries: {', '.join(names)}"
    if isinstance(value, list | dict):
        return json.dumps(value, separators=(", ", ": "))
    return str(value) if value != "" else '""'


def _rows(model: type[BaseModel], defaults: dict, prefix: str) -> list[Row]:
    rows = []
    for name, field in model.model_fields.items():
        path = f"{prefix}{name}"
        if _is_section(field.annotation):
            rows += _rows(field.annotation, defaults[name], f"{path}.")
            continue
        rows.append(Row(path, type_name(field.annotation), shown(defaults[name]), " ".join((field.description or "").split())))
    return rows


def sections() -> dict[str, tuple[str, list[Row]]]:
    """{section: (what the section is, its rows)}: TOP first, then each section of ScreenConfig in schema order."""
    defaults = ScreenConfig().model_dump(mode="json")
    top = [Row(name, type_name(f.annotation), shown(defaults[name]), " ".join((f.description or "").split()))
           for name, f in ScreenConfig.model_fields.items() if not _is_section(f.annotation)]
    out = {TOP: ("The fields at the top level of a config.", top)}
    for name, field in ScreenConfig.model_fields.items():
        if _is_section(field.annotation):
            about = field.description or inspect.cleandoc(field.annotation.__doc__ or "").split("\n\n")[0]
            out[name] = (" ".join(about.split()), _rows(field.annotation, defaults[name], f"{name}."))
    return out


def reference_text(section: str | None = None) -> str:
    """What `eps-screen config --defaults [--section S]` prints: per field, `path = default  (type)` and its
    description below it."""
    lines = []
    for name, (about, rows) in sections().items():
        if section not in (None, name):
            continue
        lines += [f"[{name}] {about}".rstrip()]
        for row in rows:
            lines.append(f"  {row.path} = {row.default}  ({row.type})")
            lines += textwrap.wrap(row.description, 112, initial_indent=" " * 6, subsequent_indent=" " * 6)
        lines.append("")
    if section is None:
        lines += [f"A small model's size profile fills what a config leaves out ({', '.join(p.name for p in PROFILES)};"
                  " docs/config.md lists them); `eps-screen validate CONFIG` names the one that applied.", ""]
    return "\n".join(lines)


def _cell(text: str) -> str:
    return text.replace("|", "\\|") or " "


def reference_markdown() -> str:
    """docs/config.md: one table per section."""
    out = ["# Config reference", "",
           "Every field of a screen config, its type, its default and what it does, generated from the schema "
           f"(`eps_screen/spec/config.py`) by `{COMMAND}`; `eps-screen config --defaults --section SECTION` prints one "
           "section on the terminal. A config sets only what differs from these defaults; "
           "`eps-screen validate CONFIG` checks it and prints its plan. Sizes here are those of the reference 7B "
           "screen (docs/experiment.md); a small model's config gets its size profile instead, for the fields it "
           "leaves out (the last section).", ""]
    for name, (about, rows) in sections().items():
        out += [f"## {'Top level' if name == TOP else f'`{name}`'}", "", about, "",
                "| field | type | default | description |", "|---|---|---|---|"]
        out += [f"| `{r.path}` | {_cell(r.type)} | `{_cell(r.default)}` | {_cell(r.description)} |" for r in rows]
        out.append("")
    return "\n".join(out) + "\n" + profiles_markdown()
