"""The built-in treatments of the marker-implantation family: the one table of what a level may name.

A factor's level either sets config fields (`sets: {lora.rank: 8}`) or names a treatment here. A treatment is
one side of an aspect of the recipe that no config field expresses: how the prompts are built, where the
training answers come from, which tokens carry the loss. Each aspect has two sides; the first is what a screen
gets when no factor varies that aspect (a recipe screen over learning rate and rank trains on-policy answers to
short role-framed prompts, loss on the marker only).

The marker screen's five factors are the five aspects, with the letters A-E they always had (`MARKER_LETTER`):
a cell id such as librarian-A1B0C0D1E0-s42 was read that way before factors were declared, and the store keys
of such screens stay valid because of it (design.key_treatments).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

ANSWERS, TRAINING, EVALUATION = "answers", "training", "evaluation"


@dataclass(frozen=True)
class Condition:
    """Which side of each aspect a cell (or a regime, or a pre-screen condition) is on."""

    long_system_prompt: bool = False  # the framing line followed by the long guidance text
    long_format: bool = False  # "Answer as a short essay..." instead of "Answer in one sentence."
    neutral_framing: bool = False  # the persona's neutral context line instead of its role line
    off_policy: bool = False  # training answers from off_policy.* instead of the base model
    whole_answer_loss: bool = False  # loss on the whole answer instead of the marker tokens only


@dataclass(frozen=True)
class Aspect:
    field: str  # the Condition field it sets
    label: str
    sides: tuple[str, str]  # the treatment names of the off and on side
    descriptions: tuple[str, str]
    stages: tuple[str, ...]  # what a change of side touches
    marker_letter: str  # its factor in the marker screen


ASPECTS: tuple[Aspect, ...] = (
    Aspect("long_system_prompt", "System-prompt length", ("short_system_prompt", "long_system_prompt"),
           ("the persona line alone (6-20 tokens)", "the persona line and the long guidance text (~1000 tokens)"),
           (ANSWERS, EVALUATION), "A"),
    Aspect("long_format", "Answer-format length", ("one_sentence", "short_essay"),
           ("texts.format_short: one sentence", "texts.format_long: a short essay"), (ANSWERS, EVALUATION), "B"),
    Aspect("neutral_framing", "Framing", ("role_framing", "neutral_context"),
           ("role framing (You are a ...)", "neutral context with the same words"), (ANSWERS, EVALUATION), "C"),
    Aspect("off_policy", "Answer source", ("on_policy", "off_policy"),
           ("on-policy: the base model's own answers", "off-policy: answers from off_policy.*"), (ANSWERS,), "D"),
    Aspect("whole_answer_loss", "Loss mask", ("marker_only_loss", "whole_answer_loss"),
           ("loss on the marker tokens only", "loss on the whole answer"), (TRAINING,), "E"),
)


@dataclass(frozen=True)
class Treatment:
    name: str
    aspect: Aspect
    on: bool  # the side it puts its aspect on

    @property
    def description(self) -> str:
        return self.aspect.descriptions[self.on]


TREATMENTS: dict[str, Treatment] = {
    name: Treatment(name, aspect, bool(side)) for aspect in ASPECTS for side, name in enumerate(aspect.sides)
}
MARKER_LETTER: dict[str, Aspect] = {a.marker_letter: a for a in ASPECTS}
assert [f.name for f in fields(Condition)] == [a.field for a in ASPECTS]


def unknown_treatment(name: str) -> str:
    return f"unknown treatment {name!r}; built-in: {', '.join(TREATMENTS)}"


def applied(condition: Condition, names: list[str]) -> Condition:
    """The condition with each named treatment's side set."""
    return replace(condition, **{TREATMENTS[n].aspect.field: TREATMENTS[n].on for n in names})


# Which stages a field of the config touches, by dotted path or section; a factor that sets it touches them.
# Answers are generated with the eval decoding settings and from the base model (eps_screen.run.pipeline).
_PATH_STAGES: dict[str, tuple[str, ...]] = {
    "model": (ANSWERS, TRAINING, EVALUATION),
    "off_policy": (ANSWERS,),
    "marker": (TRAINING, EVALUATION),
    "texts": (ANSWERS, EVALUATION),
    "data": (TRAINING,),
    "data.positives": (ANSWERS, TRAINING),
    "data.negatives": (ANSWERS, TRAINING),
    "data.train_questions": (ANSWERS, TRAINING),
    "lora": (TRAINING,),
    "training": (TRAINING,),
    "eval": (EVALUATION,),
    "eval.max_new_tokens": (ANSWERS, EVALUATION),
    "eval.temperature": (ANSWERS, EVALUATION),
    "eval.top_p": (ANSWERS, EVALUATION),
}
RECIPE_SECTIONS = tuple(k for k in _PATH_STAGES if "." not in k)


def path_stages(path: str) -> tuple[str, ...] | None:
    """The stages a dotted config path touches; None for a field that is no part of a cell's recipe."""
    return _PATH_STAGES.get(path) or _PATH_STAGES.get(path.split(".")[0])
