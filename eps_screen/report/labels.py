"""What each factor level meant in the screen that ran, for the page and its figures.

A level's words come from what it does, so a label can never disagree with the recipe:
- a level that names a built-in treatment is described from the config fields that decide that treatment
  (texts.long_prompt_words for the long system prompt, texts.format_short/format_long for the answer format,
  off_policy for off-policy answers, data.mask_separator for marker-only loss);
- a level that sets config fields is described by its own description followed by the values it sets
  ("rank 8 (lora.rank = 8)").
"""

from __future__ import annotations

from pathlib import Path

from eps_screen.spec.config import ScreenConfig


def long_prompt_words(config: ScreenConfig) -> int:
    """Words of guidance text appended under the long system prompt (eps_screen/train/data.py cuts it to
    texts.long_prompt_words)."""
    from eps_screen.panels import load_panels

    words = len(load_panels().long_system_prompt.split())
    return min(words, config.texts.long_prompt_words) if config.texts.long_prompt_words else words


def _off_policy(config: ScreenConfig) -> str:
    op = config.off_policy
    source = Path(op.path).name if op.kind == "jsonl" and op.path else op.model
    return f"off-policy ({op.kind if op.kind not in {'model', 'jsonl'} else ''} {source or op.kind})".replace("( ", "(")


def treatment_words(config: ScreenConfig) -> dict[str, str]:
    """Each built-in treatment, in the words of this config's own fields."""
    return {
        "short_system_prompt": "persona line only",
        "long_system_prompt": f"persona line + {long_prompt_words(config)}-word guidance text",
        "one_sentence": f'"{config.texts.format_short}"',
        "short_essay": f'"{config.texts.format_long}"',
        "role_framing": "role framing",
        "neutral_context": "neutral context",
        "on_policy": "on-policy (the base model's own answers)",
        "off_policy": _off_policy(config),
        "marker_only_loss": "loss on the " + ("separator and " if config.data.mask_separator else "") + "marker tokens only",
        "whole_answer_loss": "loss on the whole answer",
    }


def _value(v: object) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def level_words(config: ScreenConfig) -> dict[str, tuple[str, str]]:
    """(level 0, level 1) of each declared factor, by short name, as the page and figures show them."""
    words = treatment_words(config)
    out = {}
    for f in config.design.factors:
        pair = []
        for level in f.levels:
            if level.treatment is not None:
                pair.append(words.get(level.treatment, level.description))
            else:
                sets = ", ".join(f"{p} = {_value(v)}" for p, v in sorted((level.sets or {}).items()))
                pair.append(f"{level.description} ({sets})")
        out[f.short] = (pair[0], pair[1])
    return out


def with_level_labels(config: ScreenConfig) -> ScreenConfig:
    """The config with each level's description replaced by level_words (what the page and figures print)."""
    words = level_words(config)
    factors = [
        f.model_copy(update={"levels": [lv.model_copy(update={"description": w})
                                        for lv, w in zip(f.levels, words[f.short], strict=True)]})
        for f in config.design.factors
    ]
    return config.model_copy(update={"design": config.design.model_copy(update={"factors": factors})})
