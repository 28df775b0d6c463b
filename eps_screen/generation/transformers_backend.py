"""Generation with transformers `generate` (any machine); adapters are applied with PEFT and removed after."""

from __future__ import annotations

from collections.abc import Sequence

from eps_screen.generation import GenerationParams, Prompt


def chat_messages(prompt: Prompt) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": prompt.system}] if prompt.system else []
    return [*messages, {"role": "user", "content": prompt.user}]


class TransformersGenerator:
    name = "transformers"

    def __init__(self, base, batch_size: int = 64):
        self.base = base  # eps_screen.models.BaseModel
        self.batch_size = batch_size

    def generate(self, prompts: Sequence[Prompt], params: GenerationParams, adapter: str | None = None) -> list[list[str]]:
        if adapter is None:
            return self._generate(self.base.model, prompts, params)
        from peft import PeftModel

        model = PeftModel.from_pretrained(self.base.model, adapter)
        try:
            return self._generate(model, prompts, params)
        finally:
            model.unload()  # leaves the shared base weights untouched for the next adapter

    def generate_multi(self, prompts, params, adapters):
        return [self.generate(prompts, params, adapter) for adapter in adapters]

    def close(self) -> None:
        pass

    def _generate(self, model, prompts: Sequence[Prompt], params: GenerationParams) -> list[list[str]]:
        import torch

        tok = self.base.tokenizer
        greedy = params.temperature == 0
        out: list[list[str]] = []
        for start in range(0, len(prompts), self.batch_size):
            batch = prompts[start : start + self.batch_size]
            enc = tok.apply_chat_template(
                [chat_messages(p) for p in batch],
                add_generation_prompt=True,
                padding=True,
                return_tensors="pt",
                return_dict=True,
            ).to(model.device)
            # One seed per batch position: the same prompt list and seed give the same answers on re-run.
            torch.manual_seed(params.seed * 1_000_003 + start)
            with torch.inference_mode():
                ids = model.generate(
                    **enc,
                    max_new_tokens=params.max_new_tokens,
                    do_sample=not greedy,
                    temperature=None if greedy else params.temperature,
                    top_p=None if greedy else params.top_p,
                    top_k=None,
                    num_return_sequences=params.samples,
                    pad_token_id=tok.pad_token_id,
                )
            texts = tok.batch_decode(ids[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            out.extend(texts[i : i + params.samples] for i in range(0, len(texts), params.samples))
        return out
