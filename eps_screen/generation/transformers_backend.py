"""Generation with transformers `generate` (any machine); adapters are applied with PEFT and removed after."""

from __future__ import annotations

from collections.abc import Sequence

from eps_screen.generation import GenerationParams, Prompt, params_per_job


def chat_messages(prompt: Prompt) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": prompt.system}] if prompt.system else []
    return [*messages, {"role": "user", "content": prompt.user}]


class TransformersGenerator:
    name = "transformers"
    engine_in_process = True  # nothing of it lives outside this process (engine_process ends such a child at once)

    def __init__(self, base, batch_size: int = 64, batch_prompt_tokens: int | None = None):
        self.base = base  # eps_screen.models.loading.BaseModel
        self.batch_size = batch_size
        self.batch_prompt_tokens = batch_prompt_tokens

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

    def generate_many(self, jobs, params):
        """[job][prompt][sample] for jobs of (prompts, adapter), params one for all or one per job: one
        generate() per job (transformers batches within a call only)."""
        per_job = params_per_job(jobs, params)
        return [self.generate(prompts, p, adapter) for (prompts, adapter), p in zip(jobs, per_job, strict=True)]

    def close(self) -> None:
        pass

    def _generate(self, model, prompts: Sequence[Prompt], params: GenerationParams) -> list[list[str]]:
        import torch

        tok = self.base.tokenizer
        greedy = params.temperature == 0
        out: list[list[str]] = []
        lengths = None
        if self.batch_prompt_tokens:
            texts = tok.apply_chat_template([chat_messages(p) for p in prompts], add_generation_prompt=True,
                                            tokenize=False)
            lengths = [len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"]]
        for start, end in batch_spans(len(prompts), self.batch_size, params.samples, lengths, self.batch_prompt_tokens):
            batch = prompts[start:end]
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


def batch_spans(n: int, batch_size: int, samples: int, lengths: Sequence[int] | None = None,
                max_tokens: int | None = None) -> list[tuple[int, int]]:
    """[start, end) of each generate() call over n prompts in order: at most batch_size prompts, and, given prompt
    lengths and max_tokens, at most max_tokens padded prompt tokens over the call's rows (prompts x samples,
    each as long as the call's longest prompt): short prompts go in big calls, long ones in small ones, since
    prefill memory grows with rows x length. A prompt alone over the cap still gets a call of its own."""
    spans, start = [], 0
    while start < n:
        end, longest = start + 1, lengths[start] if lengths else 0
        while end < n and end - start < batch_size:
            if lengths is not None and max_tokens:
                longer = max(longest, lengths[end])
                if (end + 1 - start) * samples * longer > max_tokens:
                    break
                longest = longer
            end += 1
        spans.append((start, end))
        start = end
    return spans
