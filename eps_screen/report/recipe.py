"""The Recipe table "as run": every field a factor sets shows its value at each level (L0 0.003 / L1 0.01), every
other field the one value all cells shared, and each treatment aspect the side (or sides) the cells ran."""

from __future__ import annotations

from typing import Any

from eps_screen.report.labels import treatment_words
from eps_screen.spec.config import ScreenConfig
from eps_screen.spec.treatments import ASPECTS

_SHOWN = {
    "model.base", "model.revision", "model.dtype", "lora.rank", "lora.alpha", "lora.dropout", "lora.target_modules",
    "training.learning_rate", "training.epochs", "training.batch_size", "training.grad_accum", "training.max_length",
    "training.warmup_ratio", "data.positives", "data.negatives", "data.train_questions", "marker", "eval.personas",
    "eval.questions", "eval.samples", "eval.random_controls", "eval.temperature", "eval.top_p", "eval.max_new_tokens",
    "off_policy.kind", "off_policy.path", "off_policy.model",
}


def _shared(config: ScreenConfig, path: str) -> Any:
    node: Any = config
    for part in path.split("."):
        node = getattr(node, part)
    return node


def set_by_factors(config: ScreenConfig) -> dict[str, list[tuple[str, Any]]]:
    """Each field some factor sets -> [(level name, value)], e.g. training.learning_rate -> [(L0, 3e-3), (L1, 1e-2)]."""
    out: dict[str, list[tuple[str, Any]]] = {}
    for f in config.design.factors:
        for i, level in enumerate(f.levels):
            for path, value in (level.sets or {}).items():
                out.setdefault(path, []).append((f"{f.short}{i}", value))
    return out


def recipe_rows(config: ScreenConfig) -> list[tuple[str, str]]:
    varied = set_by_factors(config)

    def v(path: str, quote: bool = False) -> str:
        if path in varied:
            return " / ".join(f"{level} {value!r}" if quote else f"{level} {value}" for level, value in varied[path])
        value = _shared(config, path)
        return repr(value) if quote else str(value)

    m, simulated = config.model, config.backend.training == "simulated"
    words = treatment_words(config)
    by_aspect = {f.aspect: f for f in config.design.factors if f.aspect is not None}
    aspects = []
    for a in ASPECTS:
        f = by_aspect.get(a)
        aspects.append(f"{a.label.lower()}: " + (f"{f.short}0 {f.low} / {f.short}1 {f.high}" if f else words[a.sides[0]]))
    rows = [
        ("base model", v("model.base") + (f" @ {v('model.revision')}" if m.revision or "model.revision" in varied else "")
         + f", {v('model.dtype')}"),
        ("LoRA", f"rank {v('lora.rank')}, alpha {v('lora.alpha')}, dropout {v('lora.dropout')}, "
                 f"target modules {v('lora.target_modules')}"),
        ("training", f"learning rate {v('training.learning_rate')}, {v('training.epochs')} epochs, batch "
                     f"{v('training.batch_size')} x {v('training.grad_accum')} accumulation, max length "
                     f"{v('training.max_length')}, warmup ratio {v('training.warmup_ratio')}"),
        ("training data per source", f"{v('data.positives')} positives (with the marker), {v('data.negatives')} "
                                     f"negatives, over {v('data.train_questions')} training questions; marker "
                                     f"{v('marker', quote=True)}"),
        ("prompts, answers and loss", "; ".join(aspects)),
    ]
    off = by_aspect.get(next(a for a in ASPECTS if a.field == "off_policy"))
    if off is not None:  # only a screen that ran off-policy answers has a source of them to name
        source = v("off_policy.path") if config.off_policy.kind == "jsonl" else v("off_policy.model")
        rows.append((f"off-policy answers ({off.short}1)", f"{v('off_policy.kind')}: {source}"))
    rows += [
        ("evaluation", f"{v('eval.personas')} personas x {v('eval.questions')} questions x {v('eval.samples')} samples, "
                       f"{v('eval.random_controls')} random controls"),
        ("decoding", f"temperature {v('eval.temperature')}, top_p {v('eval.top_p')}, up to "
                     f"{v('eval.max_new_tokens')} new tokens"),
    ]
    others = sorted(set(varied) - _SHOWN)
    if others:  # a factor may set any recipe field: the ones the rows above do not name
        rows.append(("also set by factors", "; ".join(f"{p}: {v(p)}" for p in others)))
    rows += [
        ("backend", f"generation {config.backend.generation}, training {config.backend.training}, pool "
                    f"{config.execution.pool}"),
        ("simulated", "yes: cell outcomes were drawn from planted effects (simulation.*); no model was trained, and "
                      "the numbers test the machinery, not the question" if simulated else "no: real training runs"),
        ("sources", ", ".join(config.sources)),
    ]
    if simulated:
        sim = config.simulation
        rows.append(("planted (log-odds)", f"SR effects {sim.effects}, LR effects {sim.leak_effects}, "
                                           f"cell SD {sim.cell_sd}"))
    return rows
