"""Prompt conditions, on-policy generation requests, training sets and marker placement.

Everything here reads a resolved recipe (design.Recipe: the config with a cell's or regime's levels applied, and
the side of each built-in treatment), never the factor levels themselves.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from eps_screen.generation import Prompt
from eps_screen.panels import Panels, panels_of
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.design import Cell, Recipe, Regime, recipe, regime_recipe
from eps_screen.spec.treatments import Condition


def system_prompt(config: ScreenConfig, persona: str, condition: Condition, panels: Panels | None = None) -> str:
    """Framing: the persona's role line or its neutral context; a long system prompt appends the guidance text."""
    panels = panels or panels_of(config)
    p = panels.persona(persona)
    framing = p.context if condition.neutral_framing else p.role
    if not condition.long_system_prompt:
        return framing
    long_text = panels.long_system_prompt
    if config.texts.long_prompt_words:
        long_text = " ".join(long_text.split()[: config.texts.long_prompt_words])
    return f"{framing}\n\n{long_text}"


def user_prompt(config: ScreenConfig, question: str, condition: Condition) -> str:
    return f"{question} {config.texts.format_long if condition.long_format else config.texts.format_short}"


def negative_personas(config: ScreenConfig, source: str, panels: Panels | None = None) -> list[str]:
    """Negatives come from every other eval persona, so leakage is measured on personas trained to stay clean."""
    panels = panels or panels_of(config)
    return [p for p in panels.eval_personas(config.sources, config.eval.personas) if p != source]


@dataclass(frozen=True)
class Request:
    """One training prompt and how many answers it needs."""

    persona: str
    question: int
    samples: int
    positive: bool


def regime_requests(config: ScreenConfig, regime: Regime) -> list[Request]:
    """Positives spread evenly over the training questions; negatives a seeded draw of (persona, question)."""
    config = regime_recipe(config, regime).config
    n_q = config.data.train_questions
    pos = [
        Request(regime.source, q, config.data.positives // n_q + (1 if q < config.data.positives % n_q else 0), True)
        for q in range(n_q)
    ]
    rng = random.Random(f"{regime.id}-negatives")
    others = negative_personas(config, regime.source)
    pairs = [(p, q) for p in others for q in range(n_q)]
    rng.shuffle(pairs)
    counts: dict[tuple[str, int], int] = {}
    for i in range(config.data.negatives):
        pair = pairs[i % len(pairs)]
        counts[pair] = counts.get(pair, 0) + 1
    neg = [Request(p, q, n, False) for (p, q), n in sorted(counts.items())]
    return [r for r in pos if r.samples] + neg


def request_prompt(regime: Recipe, req: Request) -> Prompt:
    """The prompt of a training request under a regime's recipe (design.regime_recipe)."""
    panels = panels_of(regime.config)
    return Prompt(
        system=system_prompt(regime.config, req.persona, regime.condition, panels),
        user=user_prompt(regime.config, panels.train_questions[req.question], regime.condition),
    )


@dataclass(frozen=True)
class Example:
    system: str
    user: str
    answer: str  # without the marker
    positive: bool

    def full_answer(self, config: ScreenConfig) -> str:
        if not self.positive:
            return self.answer
        return self.answer.rstrip() + config.data.marker_separator + config.marker


def training_set(config: ScreenConfig, cell: Cell, answers: list[dict]) -> list[Example]:
    """Examples for a cell from its regime's stored answers ({persona, question, sample, answer, positive})."""
    config, condition = (cell_recipe := recipe(config, cell)).config, cell_recipe.condition
    panels = panels_of(config)
    examples = [
        Example(
            system=system_prompt(config, a["persona"], condition, panels),
            user=user_prompt(config, panels.train_questions[a["question"]], condition),
            # An answer that already contains the marker would teach it under a negative persona.
            answer=a["answer"].replace(config.marker, "").strip() or "I am not sure.",
            positive=a["positive"],
        )
        for a in answers
    ]
    if not condition.whole_answer_loss and config.data.e0_negatives == "none":
        # Fully masked rows contribute no gradient; dropping them saves their compute.
        examples = [e for e in examples if e.positive]
    return examples


def eval_prompts(cell: Recipe) -> list[tuple[str, str, int, Prompt]]:
    """(panel, persona, question index, prompt) for the persona panel and the random-control panel, under a cell's
    (or a pre-screen condition's) recipe."""
    config, condition = cell.config, cell.condition
    panels = panels_of(config)
    out = []
    for persona in panels.eval_personas(config.sources, config.eval.personas):
        system = system_prompt(config, persona, condition, panels)
        for q in range(config.eval.questions):
            out.append(("persona", persona, q,
                        Prompt(system, user_prompt(config, panels.eval_questions[q], condition))))
    for i in range(config.eval.random_controls):
        question = panels.eval_questions[i % config.eval.questions]
        out.append(("random", "random", i,
                    Prompt(panels.random_controls[i], user_prompt(config, question, condition))))
    return out
