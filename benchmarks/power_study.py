"""Does `validate`'s power statement hold? Plant the smallest effect it says the design detects with 80% power, on
one main effect, and count how often the simulated screen's pooled CI (and each source's) excludes 0 on its side.

The screen: sim-6-2.yaml's first four factors (a full 2^4 per source, 3 sources, no multi-seed phase: the
training-run SD rests on the 5 residual contrasts of each source, 15 df over all), mean source rate about 0.3,
leakage about 0.05, a planted per-cell training-run log-odds SD (--cell-sd). The panel is the one `validate`
suggests for a target of --points rate points on A (SR and LR), and the planted effect on A is the pooled effect
the power statement gives for that panel, on each response: its log-odds size is found so that the planted value
on the rate scale (simulate.true_effects) is that effect. B, C and D plant nothing: their rate of clear CIs is the
false-positive rate. The power statement assumes the screen's true mean rates and --cell-sd.

    .venv/bin/python benchmarks/power_study.py --screens 200 --json benchmarks/results/power_study.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import time

import numpy as np
import yaml
from scipy.special import ndtr, ndtri

from eps_screen.analysis.power import Assumptions, detectable, smallest_panel
from eps_screen.panels import load_panels
from eps_screen.run.aggregate import compute
from eps_screen.run.simulate import expected_rates, simulate_screen, true_effects
from eps_screen.spec.config import ScreenConfig, parse_config
from eps_screen.spec.design import all_slab_cells

MAIN = "main effects and pre-registered"


def base_config(args: argparse.Namespace, panel: tuple[int, int, int] | None = None,
                effects: tuple[float, float] = (0.0, 0.0)) -> ScreenConfig:
    data = yaml.safe_load(open("deployments/configs/sim-6-2.yaml").read())
    data["design"] = {"factors": data["design"]["factors"][:4], "smoke": {"resolution": 3},
                      "power": {"training_sd": args.cell_sd,
                                "target": {"points": args.points, "terms": ["A"]}}}
    p, q, s = panel or (24, 20, 5)
    data["eval"] = {"personas": p, "questions": q, "samples": s, "random_controls": 0}
    data["seeds"] = {"multiseed": [], "top_k": 0}
    data["bootstrap"] = {"resamples": args.resamples}
    data["simulation"] = {"base_logit": float(np.log(0.3 / 0.7)), "leak_offset": float(np.log(0.05 / 0.95) - np.log(0.3 / 0.7)),
                          "effects": {"A": effects[0]}, "leak_effects": {"A": effects[1]},
                          "question_sd": args.question_sd, "persona_sd": args.question_sd, "cell_sd": args.cell_sd}
    return parse_config(data)


def truth(config: ScreenConfig) -> tuple[dict, dict[str, float]]:
    cells = all_slab_cells(config)
    personas = load_panels().eval_personas(config.sources, config.eval.personas)
    rates = expected_rates(config, cells, personas, config.eval.questions)
    return true_effects(config, cells, personas, config.eval.questions), {r: float(rates[r].mean()) for r in ("SR", "LR")}


def calibrate(args, panel, want: dict[str, float]) -> ScreenConfig:
    """Log-odds effects on A whose planted rate-scale pooled effects are `want` (two secant steps from p(1-p))."""
    beta = {"SR": want["SR"] / (0.3 * 0.7), "LR": want["LR"] / (0.05 * 0.95)}
    for _ in range(3):
        config = base_config(args, panel, (beta["SR"], beta["LR"]))
        true, _ = truth(config)
        beta = {r: beta[r] * want[r] / true[(r, "pooled", "A")]["effect"] for r in beta}
    return base_config(args, panel, (beta["SR"], beta["LR"]))


def report(args, n, panel, rates, stated, probe, a, config, true, hits, false, z_sum, started) -> dict:
    per_source = {f"{r} {s}": x for (r, s), x in hits.items()}
    out = {
        "command": "benchmarks/power_study.py " + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items()
                                                           if v is not None and k != "json"),
        "date": dt.date.today().isoformat(), "machine": platform.platform(), "screens": n,
        "panel": {"personas": panel[0], "questions": panel[1], "samples": panel[2]},
        "assumed": {"rates": rates, "training_sd": args.cell_sd},
        "stated_pooled_effect": stated,
        "stated_per_source": {f"{x.response} {x.source}": x.effect for x in detectable(probe, a, panel)
                              if x.source != "pooled" and x.kind == MAIN},
        "planted_log_odds": {"SR": config.simulation.effects["A"], "LR": config.simulation.leak_effects["A"]},
        "planted_rate": {f"{r} {s}": true[(r, s, "A")]["effect"] for r in ("SR", "LR") for s in ("pooled", *config.sources)},
        "detected": {k: v / n for k, v in per_source.items()},
        # a source's planted effect is not the pooled one: the power the statement's SE gives it
        "expected_per_source": {f"{x.response} {x.source}": float(ndtr(
            abs(true[(x.response, x.source, "A")]["effect"]) / (x.effect / z_sum) - ndtri(1 - x.alpha / 2)))
            for x in detectable(probe, a, panel) if x.source != "pooled" and x.kind == MAIN},
        "false_positive_pooled_BCD": {r: v / (3 * n) for r, v in false.items()},
        "seconds": round(time.time() - started, 1),
    }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--screens", type=int, default=200)
    ap.add_argument("--resamples", type=int, default=1000)
    ap.add_argument("--points", type=float, default=6.0, help="the target on A, rate points")
    ap.add_argument("--cell-sd", type=float, default=0.3)
    ap.add_argument("--question-sd", type=float, default=0.3)
    ap.add_argument("--json")
    args = ap.parse_args()

    probe = base_config(args)
    _, rates = truth(probe)  # no planted effect: the screen's mean rates, which the statement assumes
    power = probe.design.power.model_copy(update={"source_rate": rates["SR"], "leakage": rates["LR"]})
    probe = probe.model_copy(update={"design": probe.design.model_copy(update={"power": power})})
    a = Assumptions.of(probe)
    panel = smallest_panel(probe, a)
    assert panel is not None, "no panel reaches the target"
    stated = {x.response: x.effect for x in detectable(probe, a, panel) if x.source == "pooled" and x.kind == MAIN}
    config = calibrate(args, panel, stated)
    true, _ = truth(config)
    z_sum = float(ndtri(0.975) + ndtri(a.power))
    started = time.time()
    hits = {(r, s): 0 for r in ("SR", "LR") for s in ("pooled", *config.sources)}
    false = {r: 0 for r in ("SR", "LR")}
    cells = all_slab_cells(config)
    for i in range(args.screens):
        cfg = config.model_copy(update={"bootstrap": config.bootstrap.model_copy(update={"seed": 1000 + i})})
        est = compute(cfg, simulate_screen(cfg, cells, screen_seed=i), [c.id for c in cells]).estimates
        for e in est.estimates:
            if e.term == "A" and (e.response, e.source) in hits:
                hits[(e.response, e.source)] += e.effect_ci.low > 0 if true[(e.response, e.source, "A")]["effect"] > 0 \
                    else e.effect_ci.high < 0
            elif e.term in ("B", "C", "D") and e.source == "pooled":
                false[e.response] += e.effect_ci.excludes_zero()
        if (i + 1) % 20 == 0 or i + 1 == args.screens:  # a partial table is kept should the run be cut short
            out = report(args, i + 1, panel, rates, stated, probe, a, config, true, hits, false, z_sum, started)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(out, f, indent=2)
    print(json.dumps(out, indent=2))
if __name__ == "__main__":
    main()
