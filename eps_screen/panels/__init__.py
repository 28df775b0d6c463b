"""The eval and training panels, kept as data files beside this module.

personas.yaml      26 personas: id, name, role framing (C0), lexically matched neutral context (C1); an eval panel
                   of eval.personas (24 in qwen7b) is the sources, then the others in file order
eval_questions.txt the 20 eval questions, one per line
train_questions.txt training questions (disjoint from the eval questions), one per line
long_system_prompt.txt  ~1000 tokens of real guidance text appended to the framing under A1
random_controls.txt     unrelated paragraphs used as system prompts with no persona, one per line

A config may replace the personas or the question lists with files of its own (`panels.personas`,
`panels.eval_questions`, `panels.train_questions`; relative paths are read from the working directory): they are
checked as the built-in ones are read, and `panels_of(config)` is the panel a screen uses.
"""

from __future__ import annotations

import re
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


class PanelError(ValueError):
    """A panel file that cannot be used; the message names the file and the fix."""


def _lines(path: Path) -> tuple[str, ...]:
    try:
        lines = tuple(line.strip() for line in path.read_text().splitlines() if line.strip())
    except OSError as err:
        raise PanelError(f"{path}: cannot be read ({err.strerror or err}); give an existing text file, one item a line") from None
    if not lines:
        raise PanelError(f"{path}: has no lines; give one item a line")
    return lines


_PERSONA_ID = re.compile(r"[a-z][a-z0-9_]*")


def read_personas(path: Path) -> tuple[Persona, ...]:
    """A personas file: a YAML list of {id, name, role, context}, ids lowercase (a-z, 0-9, _) and distinct."""
    try:
        entries = yaml.safe_load(path.read_text())
    except OSError as err:
        raise PanelError(f"{path}: cannot be read ({err.strerror or err}); give an existing YAML file") from None
    except yaml.YAMLError as err:
        raise PanelError(f"{path}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(entries, list) or len(entries) < 2:
        raise PanelError(f"{path}: must be a YAML list of at least two personas, each {{id, name, role, context}}")
    out = []
    for i, entry in enumerate(entries, 1):
        fields = ("id", "name", "role", "context")
        if not isinstance(entry, dict) or set(entry) != set(fields) or not all(
                isinstance(entry[f], str) and entry[f].strip() for f in fields):
            raise PanelError(f"{path}: persona {i} must have exactly id, name, role and context, each a non-empty text")
        if not _PERSONA_ID.fullmatch(entry["id"]):
            raise PanelError(f"{path}: persona {i} id {entry['id']!r} must be lowercase letters, digits and _")
        out.append(Persona(**{f: entry[f].strip() for f in fields}))
    ids = [p.id for p in out]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise PanelError(f"{path}: persona ids {dupes} appear twice; give each persona its own id")
    return tuple(out)


@lru_cache(maxsize=16)
def load_panels(directory: str | None = None, personas: str | None = None, eval_questions: str | None = None,
                train_questions: str | None = None) -> Panels:
    """The built-in panel (or the one in `directory`), with any of its persona and question files replaced."""
    d = Path(directory) if directory else PANEL_DIR
    return Panels(
        personas=read_personas(Path(personas).expanduser() if personas else d / "personas.yaml"),
        eval_questions=_lines(Path(eval_questions).expanduser() if eval_questions else d / "eval_questions.txt"),
        train_questions=_lines(Path(train_questions).expanduser() if train_questions else d / "train_questions.txt"),
        random_controls=_lines(d / "random_controls.txt"),
        long_system_prompt=(d / "long_system_prompt.txt").read_text().strip(),
    )


def panels_of(config) -> Panels:
    """The panel a screen uses: the built-in one, with the files its config's `panels` names."""
    p = config.panels
    return load_panels(None, p.personas, p.eval_questions, p.train_questions)
