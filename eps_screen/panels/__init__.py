"""The eval and training panels, kept as data files beside this module.

personas.yaml      26 personas: id, name, role framing (C0), lexically matched neutral context (C1); an eval panel
                   of eval.personas (24 in qwen7b) is the sources, then the others in file order
eval_questions.txt the 20 eval questions, one per line
train_questions.txt training questions (disjoint from the eval questions), one per line
long_system_prompt.txt  ~1000 tokens of real guidance text appended to the framing under A1
random_controls.txt     unrelated paragraphs used as system prompts with no persona, one per line
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import yaml

PANEL_DIR = Path(__file__).parent


@dataclass(frozen=True)
class Persona:
    id: str
    name: str
    role: str
    context: str


@dataclass(frozen=True)
class Panels:
    personas: tuple[Persona, ...]
    eval_questions: tuple[str, ...]
    train_questions: tuple[str, ...]
    random_controls: tuple[str, ...]
    long_system_prompt: str

    def persona(self, persona_id: str) -> Persona:
        for p in self.personas:
            if p.id == persona_id:
                return p
        raise KeyError(f"unknown persona {persona_id!r}")

    def eval_personas(self, sources: list[str], n: int) -> list[str]:
        """The sources first, then panel personas in file order up to n."""
        others = [p.id for p in self.personas if p.id not in sources]
        return list(sources) + others[: n - len(sources)]


def _lines(path: Path) -> tuple[str, ...]:
    return tuple(line.strip() for line in path.read_text().splitlines() if line.strip())


@lru_cache(maxsize=4)
def load_panels(directory: str | None = None) -> Panels:
    d = Path(directory) if directory else PANEL_DIR
    personas = tuple(Persona(**p) for p in yaml.safe_load((d / "personas.yaml").read_text()))
    return Panels(
        personas=personas,
        eval_questions=_lines(d / "eval_questions.txt"),
        train_questions=_lines(d / "train_questions.txt"),
        random_controls=_lines(d / "random_controls.txt"),
        long_system_prompt=(d / "long_system_prompt.txt").read_text().strip(),
    )
