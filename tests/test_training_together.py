"""Cells trained together (eps_screen.train.together) give what each gives trained alone through TRL
(eps_screen.train.lora.train_lora): the same loss at every optimizer step and the same saved adapter.

The tiny model on the CPU in float32: shared passes change only the order of floating-point sums, so the stated
tolerance is float32 rounding grown through a few AdamW steps (relative 1e-4 on losses, 1e-3 of the weights' scale
on adapters), far below what a different batch order, seed, mask or learning rate moves (checked below, so the
comparison can fail)."""

from __future__ import annotations

import json

import pytest

from eps_screen.spec.config import parse_config
from eps_screen.train.data import Example

pytestmark = pytest.mark.slow

LOSS_RTOL = 1e-4
ADAPTER_TOL = 1e-3  # max |together - alone| over max |alone|, per tensor


def _config(**training):
    return parse_config({
        "model": {"base": "tiny", "dtype": "float32"},
        "lora": {"rank": 4, "alpha": 8},
        "training": {"epochs": 2, "batch_size": 4, "learning_rate": 5e-3, "packing": True, **training},
    })


def _examples(n: int, shift: int = 0) -> list[Example]:
    return [
        Example("You are a librarian who helps people find books." + " Be brief." * ((i + shift) % 3),
                "How do I find a good book? Answer in one sentence.",
                "Ask at the desk and browse the shelves." + " Then read a page." * ((i + shift) % 4),
                positive=(i + shift) % 3 == 0)
        for i in range(n)
    ]


# Cells that differ as a job's cells may: seed, loss mask, data, learning rate, epochs, batch cut into micro-batches
# (max_batch_tokens forces gradient accumulation), LoRA rank, and a warm-up.
# A pass holds up to 1,000 tokens: the three cells' micro-batches (<= 4 x 90, 4 x 90, 2 x 90 tokens) share passes.
CELLS = [
    dict(config=_config(max_batch_tokens=1000), examples=_examples(10), whole_answer=True, seed=3),
    dict(config=_config(learning_rate=2e-3, epochs=3), examples=_examples(9, 1), whole_answer=False, seed=5),
    dict(config=_config(max_batch_tokens=256, warmup_ratio=0.3), examples=_examples(8, 2), whole_answer=True, seed=7),
]


# Each cell's optimizer steps as on_step got them while it trained ((step, figures) lists), alone and together.
STEPS: dict[str, list[list[tuple[int, dict]]]] = {"alone": [[] for _ in CELLS], "together": [[] for _ in CELLS]}


def _recorder(way: str, i: int):
    return lambda step, figures: STEPS[way][i].append((step, figures))


@pytest.fixture(scope="module")
def base():
    from eps_screen.models.loading import load_base

    return load_base("tiny", "float32")


@pytest.fixture(scope="module")
def runs(base, tmp_path_factory):
    from eps_screen.train.lora import train_lora
    from eps_screen.train.together import recipe, train_together

    root = tmp_path_factory.mktemp("together")
    CELLS[2]["config"] = CELLS[2]["config"].model_copy(
        update={"lora": CELLS[2]["config"].lora.model_copy(update={"rank": 8, "alpha": 16})})
    alone = [train_lora(base, c["examples"], c["config"], c["whole_answer"], c["seed"], root / f"alone{i}",
                        _recorder("alone", i)) for i, c in enumerate(CELLS)]
    recipes = [recipe(base.tokenizer, c["config"], c["examples"], c["whole_answer"], c["seed"], root / f"together{i}")
               for i, c in enumerate(CELLS)]
    together = train_together(base, recipes, on_step=[_recorder("together", i) for i in range(len(CELLS))])
    return root, alone, together


def _adapter(path):
    from safetensors.torch import load_file

    return load_file(path / "adapter_model.safetensors")


def _distance(a: dict, b: dict) -> float:
    assert a.keys() == b.keys(), "the saved adapters name different tensors"
    return max(float((a[k] - b[k]).abs().max() / a[k].abs().max().clamp(min=1e-12)) for k in a if a[k].abs().max() > 0)


def test_each_cell_matches_training_alone(runs):
    root, alone, together = runs
    for i, (a, t) in enumerate(zip(alone, together, strict=True)):
        assert t.steps == a.steps and len(t.losses) == len(a.losses) == a.steps, f"cell {i}: another step count"
        assert t.losses == pytest.approx(a.losses, rel=LOSS_RTOL), f"cell {i}: the loss curve differs"
        assert (t.micro_batch, t.grad_accum) == (a.micro_batch, a.grad_accum)
        assert _distance(_adapter(root / f"alone{i}"), _adapter(root / f"together{i}")) < ADAPTER_TOL, f"cell {i}"
        config_alone = json.loads((root / f"alone{i}" / "adapter_config.json").read_text())
        config_together = json.loads((root / f"together{i}" / "adapter_config.json").read_text())
        for c in (config_alone, config_together):  # a set in PEFT, written in no fixed order
            c["target_modules"] = sorted(c["target_modules"])
        assert config_together == config_alone, f"cell {i}: adapter_config.json differs"
        assert (root / f"together{i}" / "train_report.json").exists()
    assert together[2].grad_accum > 1, "the third cell must exercise gradient accumulation"
    assert together[0].options["cells_per_pass"] > 1.5, "the cells must share passes"
    assert {t.steps for t in together} == {6, 9, 4}, "the cells must run different numbers of steps"


def test_each_step_is_reported_as_it_ends_and_both_ways_agree(runs):
    """on_step (what eps_screen.run.tracking logs) gets every optimizer step of every cell: the loss the report ends
    with, the learning rate each step used (the same schedule alone and together) and the tokens/s."""
    _, alone, together = runs
    for i, (a, t) in enumerate(zip(alone, together, strict=True)):
        for way, report in (("alone", a), ("together", t)):
            steps = STEPS[way][i]
            assert [s for s, _ in steps] == list(range(1, report.steps + 1)), f"cell {i} {way}"
            assert [f["loss"] for _, f in steps] == pytest.approx(report.losses), f"cell {i} {way}"
            assert all(f["tokens_per_s"] > 0 for _, f in steps), f"cell {i} {way}"
        rates = [[f["learning_rate"] for _, f in STEPS[way][i]] for way in ("alone", "together")]
        assert rates[1] == pytest.approx(rates[0]), f"cell {i}: another learning rate schedule"
    assert len({f["learning_rate"] for _, f in STEPS["alone"][2]}) > 2  # the warm-up and decay are in the curve


def test_the_comparison_can_fail(runs):
    """What a cell's recipe sets moves its adapter far past the tolerance: another cell's adapter of the same shape
    (other seed, data, mask, lr) is not 'equal', and neither is the same cell one epoch shorter."""
    root, alone, _ = runs
    assert _distance(_adapter(root / "alone0"), _adapter(root / "together1")) > 100 * ADAPTER_TOL
    # the loss of the first steps alone already tells the cells apart
    assert alone[0].losses[:2] != pytest.approx(alone[1].losses[:2], rel=100 * LOSS_RTOL)


def test_base_is_left_untouched(base, runs):
    assert "forward" not in base.model.__dict__ and not hasattr(base.model, "peft_config")
    assert not any(p.requires_grad for p in base.model.parameters())
    assert not any("lora" in n for n, _ in base.model.named_parameters())


def test_recipes_that_cannot_share_passes_are_refused(base, tmp_path):
    from eps_screen.train.together import recipe, together_key, train_together

    padded = recipe(base.tokenizer, _config(packing=False), _examples(4), True, 0, tmp_path / "a")
    dropout = _config()
    dropout = dropout.model_copy(update={"lora": dropout.lora.model_copy(update={"dropout": 0.1})})
    assert together_key(padded) is None
    assert together_key(recipe(base.tokenizer, dropout, _examples(4), True, 0, tmp_path / "b")) is None
    assert together_key(recipe(base.tokenizer, _config(epochs=1.5), _examples(4), True, 0, tmp_path / "c")) is None
    with pytest.raises(ValueError, match="together_key"):
        train_together(base, [padded])


def test_job_plan_groups_short_cells_and_leaves_long_ones_alone(base, tmp_path):
    """A job's short cells (several micro-batches fit one pass under max_batch_tokens) share passes; cells whose
    micro-batch already fills the budget, and recipes with no together_key, train alone."""
    from eps_screen.train.stages import CellTraining, plan

    short = _config(max_batch_tokens=2048)
    cells = [CellTraining(short, _examples(8, i), i % 2 == 0, i, tmp_path / f"s{i}") for i in range(3)]
    cells.append(CellTraining(_config(packing=False), _examples(8), True, 9, tmp_path / "padded"))
    groups, recipes = plan(base.tokenizer, cells)
    assert groups == [[0, 1, 2]] and len(recipes) == 4
    longest = max(len(r.input_ids) for r in recipes[0].rows)
    tight = _config(max_batch_tokens=4 * longest)  # one cell's micro-batch of 4 fills the pass
    groups, _ = plan(base.tokenizer, [CellTraining(tight, _examples(8, i), True, i, tmp_path / f"t{i}") for i in range(3)])
    assert groups == []


def test_long_cells_train_alone_and_leave_the_short_ones_sharing(base, tmp_path):
    """Long cells (SmolLM2's A1: one micro-batch fills most of a pass) among short ones: the short share passes
    whatever the long ones' count, each long one trains alone, and stages hold the short ones together, shortest
    first, the long ones after them."""
    from eps_screen.train.stages import CellTraining, plan, stages
    from eps_screen.train.together import piece_tokens

    config = _config(max_batch_tokens=2048)
    long = [Example("You are a librarian." + " Be brief." * (150 + i), "How do I find a book?", "Ask at the desk.",
                    positive=i % 2 == 0) for i in range(8)]
    cells = [CellTraining(config, long, True, 10 + i, tmp_path / f"l{i}") for i in range(4)]
    cells += [CellTraining(config, _examples(8, i), i == 0, i, tmp_path / f"s{i}") for i in range(2)]
    groups, recipes = plan(base.tokenizer, cells)
    assert all(2 * piece_tokens(recipes[i]) > 2048 for i in range(4)), "the long cells must fill most of a pass"
    assert groups == [[4, 5]]
    planned = stages(base.tokenizer, cells, 3)
    assert [s.cells for s in planned] == [sorted([4, 5], key=lambda i: piece_tokens(recipes[i])), [0, 1, 2], [3]]
    assert [s.groups for s in planned] == [[[0, 1]], [], []]


def test_job_trains_its_groups_together_and_the_rest_alone(base, tmp_path):
    from eps_screen.train.stages import CellTraining, train_cells

    short = _config(max_batch_tokens=2048)
    steps = [[], [], []]
    cells = [CellTraining(short, _examples(8, i), i == 0, i, tmp_path / f"s{i}",
                          on_step=lambda s, f, i=i: steps[i].append(s)) for i in range(2)]
    cells.append(CellTraining(_config(packing=False), _examples(8), True, 9, tmp_path / "padded",
                              on_step=lambda s, f: steps[2].append(s)))
    reports = train_cells(base, cells)
    assert [r.options.get("together") for r in reports] == [2, 2, None]
    assert steps == [list(range(1, r.steps + 1)) for r in reports]  # each cell's steps reach its own on_step
    assert all((c.out_dir / "adapter_model.safetensors").exists() for c in cells)
    assert not reports[2].options["padding_free"]


def test_a_cell_alone_trains_on_the_rows_its_stage_plan_tokenized(base, tmp_path, monkeypatch):
    """The job's plan tokenizes every cell (stages); a cell that trains alone gets those rows and is not tokenized a
    second time in its trainer (600 A1 rows of SmolLM2 take about a second of a worker's CPU)."""
    from eps_screen.train import lora as training
    from eps_screen.train.stages import CellTraining, stages, train_cells

    cells = [CellTraining(_config(packing=False), _examples(8), True, 9, tmp_path / "padded")]
    stage = stages(base.tokenizer, cells, 8)[0]
    assert stage.groups == []  # it trains alone

    def tokenized_again(*args, **kwargs):
        raise AssertionError("train_lora tokenized the cell's examples again")

    monkeypatch.setattr(training, "tokenize_set", tokenized_again)
    report = train_cells(base, cells, stage)[0]
    assert report.examples == len(stage.recipes[0].rows) == 8
    assert report.tokens == sum(len(r.input_ids) for r in stage.recipes[0].rows)
    assert (tmp_path / "padded" / "adapter_model.safetensors").exists()


@pytest.mark.parametrize("way", ["alone", "together"])
def test_training_state_is_gone_when_the_cache_goes_back(base, tmp_path, monkeypatch, way):
    """Training ends by giving the CUDA cache back to the driver, for an engine that wakes next in the same process:
    what is still referenced then stays on the card, so the optimizers and the last pass's tensors must be dead by
    that call (2026-12-05 on the H200: a stage's leftovers, cached, made the base engine's wake run out of memory;
    2026-12-06 on an H100: 3.1 GiB still cached after a stage of eight)."""
    import gc

    import torch

    from eps_screen.train import lora as training, together as training_together
    from eps_screen.train.together import recipe, train_together

    live_at_release = []

    def count_live():
        gc.collect()
        objects = gc.get_objects()
        live_at_release.append((sum(isinstance(o, torch.optim.Optimizer) for o in objects),
                                sum(isinstance(o, torch.Tensor) and o.grad_fn is not None for o in objects)))

    monkeypatch.setattr(training, "release_cached_memory", count_live)
    monkeypatch.setattr(training_together, "release_cached_memory", count_live)
    if way == "alone":
        training.train_lora(base, _examples(4), _config(epochs=1), True, 0, tmp_path / "alone")
    else:
        train_together(base, [recipe(base.tokenizer, _config(epochs=1), _examples(4, shift), True, shift,
                                     tmp_path / f"c{shift}") for shift in range(2)])
    assert live_at_release == [(0, 0)], "(optimizers, tensors of an autograd graph) alive at the hand-back"
