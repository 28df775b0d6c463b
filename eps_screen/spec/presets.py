"""A screen config named the short way: a shipped preset or a file, plus a few overrides.

What the `screen/preset` deployment's form takes (flows/preset.py). Relative paths are read from the working
directory: a run of that deployment starts in the repository (the directory `prefect deploy` ran in), so a preset
is deployments/configs/NAME.yaml there, the same file `eps-screen run deployments/configs/NAME.yaml` reads.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from eps_screen.spec.config import ConfigError, ScreenConfig, parse_config

PRESET_DIR = Path("deployments") / "configs"
SUMMARY_CHARS = 200


def preset_path(preset: str, base: Path | None = None) -> Path:
    return (base or Path.cwd()) / PRESET_DIR / f"{preset}.yaml"


def preset_names(base: Path) -> list[str]:
    """The presets shipped in `base` (a repository root), sorted."""
    return sorted(p.stem for p in (base / PRESET_DIR).glob("*.yaml"))


def preset_summary(path: Path) -> str:
    """The first sentence of a shipped config's opening comment (after its `eps-screen run ...` line), at most
    SUMMARY_CHARS, with angle brackets made plain: Prefect's form drops text between them."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    text = " ".join(x for x in lines if x and not x.startswith("eps-screen "))
    first = re.split(r"(?<=[.;])\s", text, maxsplit=1)[0].rstrip(";.")
    first = first.replace("<=", "at most").replace("<", "").replace(">", "")
    if len(first) > SUMMARY_CHARS:  # a form's help, not the whole story: what comes before the sentence's colon
        cuts = {sep: [m.start() for m in re.finditer(sep, first[:SUMMARY_CHARS])
                      if first[:m.start()].count("(") == first[:m.start()].count(")")] for sep in (": ", ", ")}
        cut = cuts[": "][:1] or cuts[", "][-1:]
        first = first[:cut[0]] + " ..." if cut else first
    return first


def preset_summaries(base: Path) -> dict[str, str]:
    """{preset: its summary} of the presets shipped in `base` (a repository root), sorted by name."""
    return {name: preset_summary(preset_path(name, base)) for name in preset_names(base)}


def with_overrides(data: dict[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """`data` with `overrides` applied: a dotted key ("execution.pool") sets one field, a mapping value is merged
    into the section it names ({"eval": {"samples": 2}} keeps eval's other fields)."""
    out = copy.deepcopy(data)
    for key, value in overrides.items():
        parts = str(key).split(".")
        if not all(parts):
            raise ConfigError([f"overrides: {key!r} is not a field path; write a dotted path such as execution.pool"])
        section = out
        for i, part in enumerate(parts[:-1]):
            if not isinstance(section.setdefault(part, {}), dict):
                raise ConfigError([f"overrides: {key!r}: {'.'.join(parts[:i + 1])} is a value, not a section"])
            section = section[part]
        last = parts[-1]
        if isinstance(value, Mapping) and isinstance(section.get(last), dict):
            section[last] = with_overrides(section[last], value)
        else:
            section[last] = copy.deepcopy(value)
    return out


def config_file(preset: str | None, config_path: str | None, base: Path | None = None) -> tuple[Path, str]:
    """The file a preset form names, and the field that named it: config_path wins over preset."""
    if config_path:
        path = Path(config_path)
        return (path if path.is_absolute() else (base or Path.cwd()) / path), "config_path"
    if preset:
        return preset_path(preset, base), "preset"
    names = ", ".join(preset_names(base or Path.cwd())) or "none found in deployments/configs"
    raise ConfigError([f"preset: choose a preset ({names}) or give config_path"])


def resolve(preset: str | None, config_path: str | None = None, name: str | None = None, store: str | None = None,
            overrides: Mapping[str, Any] | None = None, base: Path | None = None) -> ScreenConfig:
    """The config of a preset (or of config_path, which wins), with name, store and overrides applied; a
    ConfigError names the field and the fix."""
    path, field = config_file(preset, config_path, base)
    if not path.is_file():
        where = base or Path.cwd()
        raise ConfigError([f"{field}: {path} does not exist (read from the run's working directory {where}: run "
                           "`eps-screen deploy` from the repository root, or give an absolute config_path)"])
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError([f"{field}: {path} is not valid YAML ({err})"]) from None
    if not isinstance(data, dict):
        raise ConfigError([f"{field}: {path} must be a mapping of config fields"])
    data = with_overrides(data, overrides or {})
    data.update({k: v for k, v in (("name", name), ("store", store)) if v})
    try:
        return parse_config(data)
    except ConfigError as err:
        raise ConfigError([f"{problem} (config from {path}{', with overrides' if overrides else ''})"
                           for problem in err.problems]) from None


def screen_name(parameters: Mapping[str, Any], base: Path | None = None) -> str:
    """The screen a run of either screen deployment is for, from its parameters: `config` (the full form, the
    CLI) or the preset form's name / overrides / the preset's own `name`. Never raises: "screen" when unknown."""
    config = parameters.get("config")
    if config is not None:
        found = config.get("name") if isinstance(config, Mapping) else getattr(config, "name", None)
        return str(found or "screen")
    overrides = parameters.get("overrides") or {}
    for found in (parameters.get("name"), overrides.get("name")):
        if found:
            return str(found)
    try:
        path, _ = config_file(parameters.get("preset"), parameters.get("config_path"), base)
        data = yaml.safe_load(path.read_text())
    except (ConfigError, OSError, yaml.YAMLError):
        return "screen"
    return str(data.get("name") or "screen") if isinstance(data, dict) else "screen"
