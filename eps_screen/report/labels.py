"""What each factor level meant in the screen that ran, for the page and its figures.

config.factors carries generic level words ("long (~1000 tokens)" for A1) that hold for qwen7b.yaml only.
A level the config still describes with the default words is described here from the fields that decide it:
texts.long_prompt_words (A1), texts.format_short/format_long (B), off_policy (D1), data.mask_separator (E0).
A level the config describes itself (its own `factors:`) is kept as written.
"""

from __future__ import annotations

from pathlib import Path

from eps_screen.config import FactorSpec, ScreenConfig

def long_prompt_words(config: ScreenConfig) -> int:
    """Words of guidance text appended under A1 (eps_screen/data.py cuts it to texts.long_prompt_words)."""
    from eps_screen.panels import load_panels

    words = len(load_panels().long_system_prompt.split())
    return min(words, config.texts.long_prompt_words) if config.texts.long_prompt_words else words


def _off_policy(config: ScreenConfig) -> str:
    op = config.off_policy
    source = Path(op.path).name if op.kind == "jsonl" and op.path else op.model
    return f"off-policy ({op.kind if op.kind not in {'model', 'jsonl'} else ''} {source or op.kind})".replace("( ", "(")


def derived_levels(config: ScreenConfig) -> dict[str, tuple[str, str]]:
    """(level 0, level 1) of each factor, from the config's own fields."""
    return {
        "A": ("persona line only", f"persona line + {long_prompt_words(config)}-word guidance text"),
        "B": (f'"{config.texts.format_short}"', f'"{config.texts.format_long}"'),
        "C": ("role framing", "neutral context"),
        "D": ("on-policy (the base model's own answers)", _off_policy(config)),
        "E": ("loss on the " + ("separator and " if config.data.mask_separator else "") + "marker tokens only",
              "loss on the whole answer"),
    }


def with_level_labels(config: ScreenConfig) -> ScreenConfig:
    """The config with its factors' level words replaced by derived_levels where it kept the defaults."""
    defaults = ScreenConfig.model_fields["factors"].default_factory()
    derived = derived_levels(config)
    factors = {}
    for name, spec in config.factors.items():
        low, high = derived[name]
        factors[name] = FactorSpec(
            label=spec.label,
            low=low if spec.low == defaults[name].low else spec.low,
            high=high if spec.high == defaults[name].high else spec.high,
        )
    return config.model_copy(update={"factors": factors})
