"""What a cell's content key depends on: the inputs that change its adapter and answers, not how fast or how
politely they were produced (store._SPEED_ONLY)."""

from __future__ import annotations

from eps_screen.spec.design import Cell, regime_of
from eps_screen.store.result_store import ResultStore, cell_key, regime_key
from tests.conftest import qwen7b_config, tiny_config

CELL = Cell("librarian", (0, 0, 0, 1, 0), 42)


def test_speed_and_pacing_settings_keep_the_keys():
    base = qwen7b_config(off_policy={"kind": "anthropic", "model": "claude-x"})
    same = [
        qwen7b_config(off_policy={"kind": "anthropic", "model": "claude-x", "max_concurrent": 16, "requests_per_minute": 500,
                          "max_retries": 2, "timeout_s": 30, "api_key_env": "MY_KEY"}),
        qwen7b_config(off_policy={"kind": "anthropic", "model": "claude-x"}, eval={"vllm_max_num_seqs": 512,
                                                                          "vllm_gpu_memory_utilization": 0.5,
                                                                          "vllm_cudagraph_max_batch": 512,
                                                                          "vllm_cudagraph_capture_sizes": [1, 64, 512],
                                                                          "vllm_cudagraph_specialize_lora": False,
                                                                          "vllm_engine_core": "own_process",
                                                                          "vllm_async_scheduling": False}),
        qwen7b_config(off_policy={"kind": "anthropic", "model": "claude-x"}, training={"max_batch_tokens": 9000, "compile": False}),
        qwen7b_config(off_policy={"kind": "anthropic", "model": "claude-x"}, execution={"job_eval": "per_job", "cells_per_job": 2,
                                                                                "engine_cache_dir": "/elsewhere"}),
    ]
    for other in same:
        assert cell_key(other, CELL) == cell_key(base, CELL)
        assert regime_key(other, regime_of(other, CELL)) == regime_key(base, regime_of(base, CELL))


def test_what_changes_the_answers_changes_the_keys():
    base = qwen7b_config(off_policy={"kind": "anthropic", "model": "claude-x"})
    other_model = qwen7b_config(off_policy={"kind": "anthropic", "model": "claude-y"})
    assert regime_key(other_model, regime_of(other_model, CELL)) != regime_key(base, regime_of(base, CELL))
    assert cell_key(other_model, CELL) != cell_key(base, CELL)
    # merging the adapter into bf16 weights changes the numbers the evaluation sees
    merged = qwen7b_config(off_policy={"kind": "anthropic", "model": "claude-x"}, eval={"vllm_merge_adapter": True})
    assert cell_key(merged, CELL) != cell_key(base, CELL)
    # answers left to the engine's one random stream are other draws than seeded ones
    unseeded = qwen7b_config(off_policy={"kind": "anthropic", "model": "claude-x"}, eval={"vllm_seed_each_answer": False})
    assert cell_key(unseeded, CELL) != cell_key(base, CELL)
    assert regime_key(unseeded, regime_of(unseeded, CELL)) != regime_key(base, regime_of(base, CELL))
    # the off-policy engine's 8-bit KV cache changes its answers in the low bits; at 'auto' (added later) the key
    # is the one stores already hold (tests/test_factors_config.py pins those)
    model = qwen7b_config(off_policy={"vllm_quantization": "none"})  # the off-policy model's weights as it was built
    fp8 = qwen7b_config(off_policy={"vllm_kv_cache_dtype": "fp8", "vllm_quantization": "none"})
    auto = qwen7b_config(off_policy={"vllm_kv_cache_dtype": "auto", "vllm_quantization": "none"})
    assert regime_key(fp8, regime_of(fp8, CELL)) != regime_key(model, regime_of(model, CELL))
    assert cell_key(fp8, CELL) != cell_key(model, CELL) == cell_key(auto, CELL)
    # so do its weights in 8 bits; 'none' (added later) keeps the key
    eight_bits = qwen7b_config(off_policy={"vllm_quantization": "fp8"})
    assert regime_key(eight_bits, regime_of(eight_bits, CELL)) != regime_key(model, regime_of(model, CELL))
    assert cell_key(qwen7b_config(off_policy={"vllm_quantization": "none"}), CELL) == cell_key(model, CELL)
    assert cell_key(qwen7b_config(), CELL) == cell_key(eight_bits, CELL)  # as shipped: 8 bits


def test_answers_missing_from_the_store_get_no_cache_key(tmp_path):
    """A fresh-clone CI run met it: a store made again at a path an earlier run had used, Prefect's cached result
    for the answers task from that run, no answers in the store, so each cell generated its regime's answers. A task
    of several sets gets a key only once every one of them is stored, and a key that changes with any of them."""
    from tasks.cells import _answer_sets_cache_key

    config = tiny_config(tmp_path)
    one, other = regime_of(config, CELL), regime_of(config, Cell("librarian", (1, 1, 1, 0, 0), 42))
    assert one != other
    store = ResultStore.for_config(config)

    def key(regimes):
        return _answer_sets_cache_key(None, {"config": config, "regimes": regimes, "store": store})

    assert key([one]) is None
    store.save_regime(config, one, [], {"regime": one.id})
    assert key([one]) is not None and key([one, other]) is None
    store.save_regime(config, other, [], {"regime": other.id})
    assert len({key([one]), key([other]), key([one, other])}) == 3
    assert key([one]).startswith(f"answer-sets-{store.location}-")
