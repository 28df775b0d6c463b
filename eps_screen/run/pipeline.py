"""One cell, end to end: training answers -> LoRA SFT -> evaluation -> scoring -> store; and a GPU job of cells.

Each stage reads the cell's resolved recipe (design.recipe: the config with the cell's levels applied), so a factor
that sets lora.rank trains that rank and one that sets eval.temperature evaluates at it. These are the functions
the Prefect tasks wrap; each checks the store first, so finished work is never redone,
whichever process or machine did it. `run_cell` does one cell at a time (an in-process screen's cells); `run_job`
does a GPU job's cells by stage (execution.job_eval = per_job, the default): their answer sets, every training with
the engine asleep, the short cells together in shared passes over the base (eps_screen.train.stages), then every
evaluation in one multi-LoRA engine call; or with per_cell one cell after another, each trained alone.
BENCHMARKS.md measured on the H200: evaluation equally fast either way ("The GPU job"); a job of 8 A0B0 cells trained
in 111 s together against 266 s alone ("Cells trained together"). per_cell loses less when a pod vanishes.
With training.processes > 1 a job's stages train in worker processes (eps_screen.run.trainers) while its engines,
awake, evaluate the stage before: SmolLM2's 8-cell A1 stage took 110 s in four workers on the H200, each cell 40-48 s.
"""

from __future__ import annotations

import hashlib
import time
from contextlib import ExitStack
from pathlib import Path

import polars as pl

from eps_screen.models.tiny import build_screen_models
from eps_screen.run import tracking
from eps_screen.spec.config import ScreenConfig
from eps_screen.train import data
from eps_screen.spec.design import (
    Cell,
    Recipe,
    Regime,
    pre_screen_conditions,
    recipe,
    recipe_at,
    regime_of,
    regime_recipe,
)
from eps_screen.generation import GenerationParams
from eps_screen.run import engines, warm
from eps_screen.run.scoring import answers_table, cell_rates
from eps_screen.run.trainers import TrainerPool
from eps_screen.store.provenance import provenance
from eps_screen.store.result_store import ResultStore, cell_key, regime_key
from eps_screen.train.lora import StepLog
from eps_screen.train.stages import CellTraining, by_stage, stages, train_cells


def _engine_config(config: ScreenConfig) -> ScreenConfig:
    """The config the engines load models by: a tiny model built for the screen's marker (eps_screen.models.tiny),
    where the marker is not [ZLT]. Only the engines see it; store keys read the config as declared."""
    from eps_screen.models.tiny import CONTAMINATION_MARKER, tiny_model_path
    from eps_screen.spec.config import is_tiny

    if is_tiny(config.model.base) and config.marker != CONTAMINATION_MARKER:
        return config.with_sets({"model.base": str(tiny_model_path(config.model.base, config.marker))})
    return config


def _train_params(config: ScreenConfig, seed: int, samples: int) -> GenerationParams:
    # Training answers are capped like eval answers: on-policy means "what the model says under this prompt".
    return GenerationParams(
        max_new_tokens=config.eval.max_new_tokens,
        temperature=config.eval.temperature,
        top_p=config.eval.top_p,
        samples=samples,
        seed=seed,
    )


def regime_answers(config: ScreenConfig, regime: Regime, store: ResultStore, trains: bool = True) -> tuple[list[dict], bool]:
    """The training answers of a regime, generated once and stored; returns (answers, generated_now)."""
    cached = store.regime_answers(config, regime)
    if cached is not None:
        return cached, False
    return answer_sets(config, [regime], store, trains)[regime.id], True


def answer_sets(config: ScreenConfig, regimes: list[Regime], store: ResultStore, trains: bool = True) -> dict[str, list[dict]]:
    """The regimes' training answers, {regime id: answers}, each set generated once and stored. The sets a model
    generates go to its engine in one call per model (a job's sets fill the engine's batch together instead of one
    short wave each), the base model's first; the off-policy model's engine is then released (on a GPU its own
    process ends: eps_screen.run.engines): nothing later in a job asks it again."""
    sets: dict[str, list[dict]] = {}
    by_model: dict[str, list[tuple[Regime, Recipe]]] = {}
    for regime in regimes:
        cached = store.regime_answers(config, regime)
        if cached is not None:
            sets[regime.id] = cached
            continue
        resolved = regime_recipe(config, regime)
        op = resolved.config.off_policy
        if regime.off_policy and (op.kind == "jsonl" or op.hosted):
            sets[regime.id] = _answers_from_outside(config, regime, resolved, store)
        else:
            model_ref = op.model if regime.off_policy else _engine_config(resolved.config).model.base
            by_model.setdefault(model_ref, []).append((regime, resolved))
    base = _engine_config(config).model.base
    for model_ref, group in by_model.items():
        if model_ref != base:  # its process starts now and imports while the base model's engine works
            engines.prepare(_engine_config(group[0][1].config), model_ref)
    for model_ref, group in sorted(by_model.items(), key=lambda item: item[0] != base):
        sets.update(_answers_from_model(config, model_ref, group, store, trains))
        if model_ref != base:
            engines.release(model_ref)
    return {r.id: sets[r.id] for r in regimes}


def _answers_from_outside(config: ScreenConfig, regime: Regime, resolved: Recipe, store: ResultStore) -> list[dict]:
    """An off-policy regime's answers from a JSONL file or a hosted API, stored."""
    requests = data.regime_requests(config, regime)
    started = time.perf_counter()
    if resolved.config.off_policy.kind == "jsonl":
        from eps_screen.run.offpolicy import jsonl_answers

        texts = jsonl_answers(resolved.config, regime, requests)
        source = f"jsonl:{resolved.config.off_policy.path}"
    else:
        from eps_screen.run.offpolicy import hosted_answers

        texts, source = hosted_answers(resolved.config, regime, requests, store,
                                       _train_params(resolved.config, regime.seed, 1))
    return _save_answers(config, regime, requests, texts, store,
                         {"answers_from": source, "seconds": time.perf_counter() - started})


def _answers_from_model(config: ScreenConfig, model_ref: str, group: list[tuple[Regime, Recipe]],
                        store: ResultStore, trains: bool) -> dict[str, list[dict]]:
    """The group's answer sets from model_ref's engine in one call, each stored."""
    started = time.perf_counter()
    requests = [data.regime_requests(config, regime) for regime, _ in group]
    # Requests with k samples are sent as k prompts with one sample each: per-prompt seeds stay simple.
    jobs = [([data.request_prompt(resolved, r) for r in reqs for _ in range(r.samples)], None)
            for (_, resolved), reqs in zip(group, requests, strict=True)]
    params = [_train_params(resolved.config, regime.seed, 1) for regime, resolved in group]
    gen = engines.generator(_engine_config(group[0][1].config), model_ref, trains=trains)
    outputs = gen.generate_many(jobs, params)
    meta = {"seconds": time.perf_counter() - started, "sets_in_engine_call": len(group)}
    return {regime.id: _save_answers(config, regime, reqs, [o[0] for o in outs], store,
                                     {"answers_from": f"model:{_declared_model(resolved.config, regime)}", **meta})
            for (regime, resolved), reqs, outs in zip(group, requests, outputs, strict=True)}


def _declared_model(config: ScreenConfig, regime: Regime) -> str:
    """The model a regime's answers come from, as the config names it (not the engine's tiny build of it)."""
    return config.off_policy.model if regime.off_policy else config.model.base


def _save_answers(config: ScreenConfig, regime: Regime, requests: list, texts: list[str], store: ResultStore,
                  meta: dict) -> list[dict]:
    """A regime's answers (one text per sample of each request, in request order), stored with their meta."""
    answers = []
    sample_of: dict[tuple[str, int], int] = {}
    for r, text in zip((req for req in requests for _ in range(req.samples)), texts, strict=True):
        k = sample_of[(r.persona, r.question)] = sample_of.get((r.persona, r.question), -1) + 1
        answers.append({"persona": r.persona, "question": r.question, "sample": k, "answer": text, "positive": r.positive})
    store.save_regime(config, regime, answers, {"regime": regime.id, "key": regime_key(config, regime), **meta,
                                                "answers": len(answers), "provenance": provenance()})
    return answers


def _eval_params(config: ScreenConfig, seed: int) -> GenerationParams:
    ev = config.eval
    return GenerationParams(max_new_tokens=ev.max_new_tokens, temperature=ev.temperature, top_p=ev.top_p,
                            samples=ev.samples, seed=seed)


def evaluate(cell_recipe: Recipe, cell: dict, factors: str, adapter: str | None, seed: int, trains: bool = True):
    """A cell's answers on the eval panel, under its recipe."""
    return evaluate_many([(cell_recipe, cell, adapter, seed)], factors, trains)[0]


def evaluate_many(items: list[tuple[Recipe, dict, str | None, int]], factors: str, trains: bool = True) -> list:
    """Each (recipe, cell, adapter, seed)'s answers on the eval panel under its recipe, as `evaluate` gives them:
    the items one engine serves go to it in one call (the pre-screen's conditions fill its batch together)."""
    prompt_sets = [data.eval_prompts(r) for r, *_ in items]
    engine_configs = [_engine_config(r.config) for r, *_ in items]
    by_engine: dict[tuple[str, str], list[int]] = {}
    for i, engine in enumerate(engine_configs):
        by_engine.setdefault((engine.backend.generation, engine.model.base), []).append(i)
    outputs: dict[int, list] = {}
    for (_, model_ref), index in by_engine.items():
        gen = engines.generator(engine_configs[index[0]], model_ref, trains=trains)
        outs = gen.generate_many([([p for *_, p in prompt_sets[i]], items[i][2]) for i in index],
                                 [_eval_params(items[i][0].config, items[i][3]) for i in index])
        outputs.update(zip(index, outs, strict=True))
    return [answers_table(cell, [(panel, persona, q) for panel, persona, q, _ in prompts], outputs[i], r.config.marker,
                          factors)
            for i, ((r, cell, _, _), prompts) in enumerate(zip(items, prompt_sets, strict=True))]


def _cell_training(config: ScreenConfig, cell: Cell, store: ResultStore,
                   on_step: StepLog | None = None) -> tuple[CellTraining, float]:
    """What training a cell's adapter takes, under its resolved recipe: (its training, seconds its answers took)."""
    t = time.perf_counter()
    regime_rows, _ = regime_answers(config, regime_of(config, cell), store)
    answers_s = time.perf_counter() - t
    resolved = recipe(config, cell)
    return CellTraining(resolved.config, data.training_set(config, cell, regime_rows),
                        resolved.condition.whole_answer_loss, cell.seed, store.cell_dir(config, cell) / "adapter",
                        cell.id, on_step), answers_s


def _train(config: ScreenConfig, cell: Cell, store: ResultStore,
           on_step: StepLog | None) -> tuple[str, object, dict[str, float]]:
    """A cell's adapter, trained alone with the engines asleep: (adapter dir, train report, timings)."""
    from eps_screen.train.lora import train_lora

    training, answers_s = _cell_training(config, cell, store, on_step)
    timings = {"answers_s": answers_s}
    base = engines.training_base(_engine_config(training.config))
    t = time.perf_counter()
    with engines.training():
        report = train_lora(base, training.examples, training.config, training.whole_answer, training.seed,
                            training.out_dir, training.on_step)
    timings["train_s"] = time.perf_counter() - t
    return str(training.out_dir), report, timings


def _train_stage(base, prepared: list[tuple], stage) -> list[tuple]:
    """A stage's adapters, trained with the engines asleep: cells that share passes together, the rest alone
    (eps_screen.train.stages.train_cells), each under its own resolved recipe. `prepared`: (cell, started,
    training, timings) of each of the stage's cells. Returns (cell, started, adapter dir, train report, timings)
    per cell; the stage's training wall time is charged to its cells by their own training seconds (a shared
    pass's by the tokens each cell had in it)."""
    t = time.perf_counter()
    with engines.training():
        reports = train_cells(base, [training for _, _, training, _ in prepared], stage)
    train_s = time.perf_counter() - t
    own = sum(r.seconds for r in reports)
    for report, (*_, times) in zip(reports, prepared, strict=True):
        times["train_s"] = train_s * report.seconds / own if own else train_s / len(reports)
        times["job_train_s"] = train_s
    return [(cell, t0, str(training.out_dir), report, times)
            for (cell, t0, training, times), report in zip(prepared, reports, strict=True)]


def _finish(config: ScreenConfig, cell: Cell, store: ResultStore, answers: pl.DataFrame, adapter: str | None,
            train_report, timings: dict[str, float], started: float) -> dict:
    """Score a cell's answers and write it to the store, metrics last: from here on the cell is finished."""
    t = time.perf_counter()
    rates = cell_rates(answers)
    timings["score_s"] = time.perf_counter() - t
    metrics = {
        **cell.as_dict(),
        "key": cell_key(config, cell),
        **rates,
        "adapter": None if adapter is None else store.location_of(Path(adapter)),
        "train": None if train_report is None else {k: v for k, v in vars(train_report).items() if k != "losses"},
        "timings": {**timings, "total_s": time.perf_counter() - started},
        "config": config.model_dump(mode="json"),
        "recipe": _recipe_record(recipe(config, cell)),
        "provenance": provenance(),
    }
    t = time.perf_counter()
    store.save_cell(config, cell, answers, metrics)
    metrics["timings"]["store_s"] = time.perf_counter() - t  # known only after the write: in the summary, not the file
    return {**metrics, "reused": False}


def _recipe_record(resolved: Recipe) -> dict:
    """What a cell trained and was evaluated with: the fields factors vary, and every treatment's side."""
    c = resolved.config
    return {
        "lora": {"rank": c.lora.rank, "alpha": c.lora.alpha, "dropout": c.lora.dropout},
        "training": {"learning_rate": c.training.learning_rate, "epochs": c.training.epochs,
                     "batch_size": c.training.batch_size},
        "data": {"positives": c.data.positives, "negatives": c.data.negatives},
        "eval": {"temperature": c.eval.temperature, "max_new_tokens": c.eval.max_new_tokens},
        "model": c.model.base,
        "marker": c.marker,
        "treatments": vars(resolved.condition),
    }


def _tracked(config: ScreenConfig, cell: Cell, store: ResultStore):
    """The cell's tracking run while it is computed (eps_screen.run.tracking; logs nothing when tracking is off)."""
    return tracking.cell_run(config, cell, store, _recipe_record(recipe(config, cell)))


def run_cell(config: ScreenConfig, cell: Cell, store: ResultStore) -> dict:
    """Train, evaluate and score one cell; returns its metrics (from the store when already finished)."""
    done = store.cell_metrics(config, cell)
    if done is not None:
        return {**done, "reused": True}
    with _tracked(config, cell, store) as run:
        metrics = _compute_cell(config, cell, store, run.step)
        run.finished(metrics, store.cell_dir(config, cell) / "metrics.json")
    return metrics


def _compute_cell(config: ScreenConfig, cell: Cell, store: ResultStore, on_step: StepLog) -> dict:
    """run_cell's work, each optimizer step's figures to on_step."""
    started = time.perf_counter()
    if config.simulated:
        from eps_screen.panels import panels_of
        from eps_screen.run.simulate import simulate_cell_answers

        personas = panels_of(config).eval_personas(config.sources, config.eval.personas)
        answers = simulate_cell_answers(
            config, cell, personas, config.eval.questions, config.eval.samples, config.eval.random_controls
        )
        return _finish(config, cell, store, answers, None, None, {}, started)
    adapter, report, timings = _train(config, cell, store, on_step)
    t = time.perf_counter()
    answers = evaluate(recipe(config, cell), cell.as_dict(), cell.factors, adapter, cell.seed)
    timings["eval_s"] = time.perf_counter() - t
    return _finish(config, cell, store, answers, adapter, report, timings, started)


def run_job(config: ScreenConfig, cells: list[Cell], store: ResultStore) -> dict[str, dict]:
    """A GPU job's cells by stage (train.stages.by_stage; otherwise one by one through run_cell): answer sets,
    then in stages of execution.cells_per_stage cells the stage's trainings (engine asleep; shareable cells
    together) and one multi-LoRA evaluation of its adapters (`generate_many`), each cell scored and stored as its
    answers arrive. Returns {cell id: metrics}. Finished cells come from the store; a cell whose adapter was trained by an earlier, interrupted
    run of the job is trained again (an adapter is only trusted once its cell's metrics are written)."""
    out: dict[str, dict] = {}
    todo: list[Cell] = []
    for cell in cells:
        done = store.cell_metrics(config, cell)
        if done is not None:
            out[cell.id] = {**done, "reused": True}
        else:
            todo.append(cell)
    if not todo:
        return out
    if not by_stage(config):
        for cell in todo:
            out[cell.id] = run_cell(config, cell, store)
        return out
    with ExitStack() as stack:
        runs = {c.id: stack.enter_context(_tracked(config, c, store)) for c in todo}
        out.update(_compute_job(config, todo, store, runs))
    return out


def _compute_job(config: ScreenConfig, todo: list[Cell], store: ResultStore,
                 runs: dict[str, tracking.CellRun]) -> dict[str, dict]:
    """run_job's work by stage, each cell's training steps and results on its tracking run: every cell's answer
    set first (each engine starts once a job), then stage by stage (train.stages.stages) its cells' trainings and
    one evaluation of their adapters, each cell stored before the next stage's are. With training.processes > 1
    the trainings run in worker processes, started before the answer sets, a stage's beside the evaluation of the
    stage before (`_overlapped`)."""
    with ExitStack() as stack:
        workers = config.training.processes
        pool = stack.enter_context(warm.trainer_pool(_engine_config(config), workers)) if workers > 1 else None
        prepared = []
        for cell in todo:
            started = time.perf_counter()
            training, answers_s = _cell_training(config, cell, store, runs[cell.id].step)
            prepared.append((cell, started, training, {"answers_s": answers_s}))
        if pool is not None:
            return _overlapped(config, prepared, store, runs, pool)
        # One base for the job, as one engine evaluates it: run_job takes this path only when no factor varies the
        # model.
        base = engines.training_base(_engine_config(config))
        out = {}
        for stage in stages(base.tokenizer, [training for _, _, training, _ in prepared],
                            config.execution.cells_per_stage):
            trained = _train_stage(base, [prepared[i] for i in stage.cells], stage)
            out.update(_evaluate_stage(config, trained, store, runs))
        return out


def _overlapped(config: ScreenConfig, prepared: list[tuple], store: ResultStore, runs: dict[str, tracking.CellRun],
                pool: TrainerPool) -> dict[str, dict]:
    """The stages trained in the pool's workers, stage k+1's while stage k is evaluated (the engines awake). A
    cell's train_s is its own training's seconds in its worker; job_train_s the stage's, from its submission to its
    last training's end (the evaluation before it included)."""
    engine_config = _engine_config(config)
    trainings = [training for _, _, training, _ in prepared]
    plan = stages(None, trainings, config.execution.cells_per_stage, pool.recipes(trainings))

    def submit(stage):
        return pool.submit([prepared[i][2] for i in stage.cells], stage)

    out = {}
    pending = submit(plan[0])
    # The engines start (or wake) while the first stage trains, not after it: a cold start of four took minutes on
    # the H100. Each takes a share of what the card had free when the group began; a fixed KV cache
    # (eval.vllm_kv_cache_gib) uses a fraction of that share, which leaves the trainers room to grow meanwhile.
    engines.generator(engine_config, engine_config.model.base)
    for k, stage in enumerate(plan):
        reports, wall = pending.result()
        if k + 1 < len(plan):
            pending = submit(plan[k + 1])
        trained = []
        for i, report in zip(stage.cells, reports, strict=True):
            cell, started, training, times = prepared[i]
            times.update(train_s=report.seconds, job_train_s=wall)
            trained.append((cell, started, str(training.out_dir), report, times))
        out.update(_evaluate_stage(config, trained, store, runs))
    return out


def _evaluate_stage(config: ScreenConfig, trained: list[tuple], store: ResultStore,
                    runs: dict[str, tracking.CellRun]) -> dict[str, dict]:
    """One multi-LoRA evaluation of a stage's adapters (`generate_many`), each cell scored and stored."""
    out = {}
    t = time.perf_counter()
    # One engine serves every adapter of the stage: a factor on the base model or the decoding runs per cell instead.
    tables = evaluate_many([(recipe(config, cell), cell.as_dict(), str(store.cell_dir(config, cell) / "adapter"),
                             cell.seed) for cell, *_ in trained], trained[0][0].factors, trains=True)
    eval_s = time.perf_counter() - t
    chars = [int(table["text"].str.len_chars().sum()) for table in tables]
    for (cell, cell_started, adapter, report, timings), answers, n in zip(trained, tables, chars, strict=True):
        # One engine call evaluated the stage: each cell is charged its share of it, by the characters it generated.
        timings["eval_s"] = eval_s * n / max(1, sum(chars))
        timings["job_eval_s"] = eval_s
        out[cell.id] = _finish(config, cell, store, answers, adapter, report, timings, cell_started)
        runs[cell.id].finished(out[cell.id], store.cell_dir(config, cell) / "metrics.json")
    return out


def _pre_screen_key(config: ScreenConfig) -> str:
    """The key of the base cell at level 0 (as before factors were declared), or, where a factor that touches
    evaluation sets fields (eval.temperature, model.base), a hash of every condition's key."""
    shorts = config.design.shorts
    conditions = pre_screen_conditions(config)
    cells = [Cell("base", tuple(cond.get(f, 0) for f in shorts), config.seeds.primary, shorts) for cond in conditions]
    if all(recipe(config, c).config is config for c in cells):
        return cell_key(config, Cell("base", (0,) * len(shorts), config.seeds.primary, shorts))
    return hashlib.sha256(" ".join(cell_key(config, c) for c in cells).encode()).hexdigest()[:16]


def _base_cell(config: ScreenConfig, levels: dict[str, int]) -> dict:
    """The pre-screen's row for the base model under one condition, named by its levels (base-A0B0C0)."""
    code = "".join(f"{f}{lv}" for f, lv in levels.items())
    return {"cell_id": f"base-{code}" if code else "base", "source": None, "seed": config.seeds.primary}


def finished_pre_screen(config: ScreenConfig, store: ResultStore) -> dict | None:
    """The pre-screen's result if the store holds it for this config's base model, panel and code."""
    done = store.phase("pre_screen")
    return done if done is not None and done.get("key") == _pre_screen_key(config) else None


def pre_screen(config: ScreenConfig, store: ResultStore, trains: bool = False) -> dict:
    """The base model, no adapter, on the eval panel under every condition of the factors that touch evaluation
    (the marker screen: A x B x C). `trains`: cells of the same job train after it, so the engine must leave room
    for the training base (eps_screen.run.engines)."""
    done = finished_pre_screen(config, store)
    if done is not None:
        return done
    if not config.simulated:
        build_screen_models(config)
    key = _pre_screen_key(config)
    shorts = config.design.shorts
    conditions = pre_screen_conditions(config)
    if config.simulated:
        from eps_screen.run.simulate import simulate_base_answers

        # named as the real pre-screen names its conditions, whatever factors the screen declares
        frames = [simulate_base_answers(config, levels) for levels in conditions]
    else:
        frames = evaluate_many([(recipe_at(config, levels), _base_cell(config, levels), None, config.seeds.primary)
                                for levels in conditions], shorts, trains=trains)
    answers = pl.concat(frames)
    rate = float(answers.filter(pl.col("panel") == "persona")["marker"].mean())
    result = {
        "key": key,
        "marker_rate": rate,
        "answers": answers.height,
        "markers": int(answers["marker"].sum()),
        # The persona panel only, as the pooled rate: gate 1 judges the worst condition on the same answers.
        "by_condition": {
            cid: float(g["marker"].mean())
            for (cid,), g in answers.filter(pl.col("panel") == "persona").group_by("cell_id", maintain_order=True)
        },
        "threshold": config.gates.contamination,
        "config": config.model_dump(mode="json"),
        "provenance": provenance(),
    }
    store.save_phase("pre_screen", result, answers)
    return result
