"""Sequence lengths of an A x B condition by rule of thumb (not measured): what the estimate and the memory plan
count tokens with."""

from __future__ import annotations

from eps_screen.spec.config import ScreenConfig

ANSWER_TOKENS = {0: 50, 1: 1050}  # docs/experiment.md: tokens before the marker under B0 / B1
TOKENS_PER_WORD = 1.33  # English prose in Qwen2.5's tokenizer, about
CHAT_OVERHEAD_TOKENS = 30  # role headers, persona framing, question and format instruction


def sequence_tokens(config: ScreenConfig, a: int, b: int) -> tuple[float, float, float]:
    """(prompt tokens, answer tokens, training sequence tokens) of a condition, by rule of thumb."""
    from eps_screen.panels import load_panels

    words = len(load_panels().long_system_prompt.split())
    if config.texts.long_prompt_words:
        words = min(words, config.texts.long_prompt_words)
    prompt = CHAT_OVERHEAD_TOKENS + (words * TOKENS_PER_WORD if a else 0)
    answer = min(ANSWER_TOKENS[b], config.eval.max_new_tokens)
    seq = min(prompt + answer + 6, config.training.max_length)  # marker and end of turn
    return prompt, answer, seq
