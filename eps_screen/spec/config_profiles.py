"""Size profiles: defaults sized for a small base model, so that a first screen of one's own on the tiny model or
SmolLM2-135M is not the 7B's plan (600 training examples a cell, a 24 x 20 x 5 panel, 2,048 new tokens, lr 1e-5)
run on a CPU.

The profile is chosen from `model.base` and fills only the fields a config leaves out; what the config sets is kept,
and a config that sets every field (a stored screen's, a shipped one) is unchanged, as are its cells' store keys.
Applied where a config is read from its fields (eps_screen.spec.config.parse_config); `eps-screen validate` says which
profile applied and to which fields. docs/config.md lists the profiles.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Profile:
    name: str
    models: tuple[str, ...]  # model.base values it applies to, compared without case
    about: str
    values: dict[str, Any] = field(default_factory=dict)  # dotted path -> value


# The sizes of the screens that ran on these models on two CPU cores (tiny.yaml; SmolLM2's CPU recipe screen).
PROFILES = (
    Profile("tiny", ("tiny", "tiny-alt", "tiny-contaminated"),
            "the locally built test model, sized as tiny.yaml: minutes on a CPU",
            {"data.positives": 16, "data.negatives": 32, "data.train_questions": 8,
             "eval.personas": 8, "eval.questions": 4, "eval.samples": 2, "eval.max_new_tokens": 32,
             "eval.random_controls": 4, "training.learning_rate": 1e-2, "training.epochs": 8,
             "training.max_length": 1024, "lora.rank": 8, "lora.alpha": 16}),
    Profile("smollm2-135m", ("smollm2-135m-instruct", "huggingfacetb/smollm2-135m-instruct"),
            "SmolLM2-135M-Instruct on two CPU cores, with a learning rate raised for its few training steps (1e-3 "
            "implanted the marker over 600 examples x 3 epochs on an H100)",
            {"data.positives": 32, "data.negatives": 32, "data.train_questions": 8,
             "eval.personas": 6, "eval.questions": 4, "eval.samples": 3, "eval.max_new_tokens": 64,
             "eval.random_controls": 4, "training.learning_rate": 3e-3, "training.max_length": 512}),
)


def profile_for(base: Any) -> Profile | None:
    if not isinstance(base, str):
        return None
    return next((p for p in PROFILES if base.strip().lower() in p.models), None)


def _is_set(data: dict, path: str) -> bool:
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def factor_paths(data: dict[str, Any]) -> set[str]:
    """The fields the declared factors set (a level's sets, as a mapping or the form's [{path, value}] list)."""
    design = data.get("design")
    factors = design.get("factors") if isinstance(design, dict) else None
    paths = set()
    for factor in factors if isinstance(factors, list) else []:
        for level in factor.get("levels") or [] if isinstance(factor, dict) else []:
            sets = level.get("sets") if isinstance(level, dict) else None
            if isinstance(sets, dict):
                paths |= set(sets)
            elif isinstance(sets, list):
                paths |= {item["path"] for item in sets if isinstance(item, dict) and "path" in item}
    return paths


def with_profile(data: dict[str, Any]) -> tuple[dict[str, Any], Profile | None, dict[str, Any]]:
    """`data` (a config's fields as read) with its model's profile filled in where it sets nothing; returns the new
    fields, the profile (None: no profile for this model) and {path: value} of what it filled."""
    model = data.get("model")
    profile = profile_for(model.get("base") if isinstance(model, dict) else None)
    if profile is None:
        return data, None, {}
    out, filled, varied = copy.deepcopy(data), {}, factor_paths(data)
    for path, value in profile.values.items():
        if path in varied:  # every cell takes a factor's value: the shared one is never used
            continue
        if path == "eval.personas" and isinstance(data.get("sources"), list):
            value = max(value, len(data["sources"]))  # the eval panel holds every source
        if _is_set(data, path):
            continue
        *sections, last = path.split(".")
        node = out
        for part in sections:
            if not isinstance(node.setdefault(part, {}), dict):
                break  # a section given as something else: validation names it
            node = node[part]
        else:
            node[last] = value
            filled[path] = value
    return out, profile, filled


def profile_line(profile: Profile | None, filled: dict[str, Any]) -> str | None:
    """What validate prints about the profile, or None when no profile applied."""
    if profile is None or not filled:
        return None
    values = ", ".join(f"{path} {value}" for path, value in filled.items())
    return f"profile {profile.name} ({profile.about}) filled what the config leaves out: {values}"


def profiles_markdown() -> str:
    """The profiles' section of docs/config.md."""
    out = ["## Size profiles", "",
           "A config whose `model.base` is a small model gets that model's profile for every field below that it "
           "does not set (a field it sets is kept); `eps-screen validate` names the profile and the fields it "
           "filled. Other models get the defaults above.", ""]
    for p in PROFILES:
        out += [f"### `{p.name}`", "", f"For `model.base` {', '.join(f'`{m}`' for m in p.models)}: {p.about}.", "",
                "| field | value |", "|---|---|", *[f"| `{k}` | `{v}` |" for k, v in p.values.items()], ""]
    return "\n".join(out)
