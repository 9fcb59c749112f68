"""Turning text into this node's token ids: prompts (optionally with a hint) and peers' completions."""
from __future__ import annotations

from node.scoring.verifiers import SYSTEM_PROMPT
from policy.models import LoadedPolicy

HINT_HEADER = "\n\nHint: "


def render_prompt(policy: LoadedPolicy, question: str, hint: str | None = None,
                  system_prompt: str = SYSTEM_PROMPT) -> list[int]:
    """Prompt token ids: the chat template with our answer-format instructions (`system_prompt`, see
    SYSTEM_PROMPTS) for chat models, bos + raw text for the tiny from-scratch model. An abstract hint is
    appended to the question (chat models only: the tiny model has no words to read one with)."""
    tok = policy.tokenizer
    if policy.chat:
        content = question if hint is None else question + HINT_HEADER + hint
        messages = [{"role": "system", "content": system_prompt}, {"role": "user", "content": content}]
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return tok(text, add_special_tokens=False)["input_ids"]
    if hint is not None:
        raise ValueError("the tiny model cannot condition on an abstract hint (no chat template)")
    return [tok.bos_token_id] + tok(question, add_special_tokens=False)["input_ids"]


class Retokenizer:
    """Encodes peers' text with this node's tokenizer (raises on text it cannot encode, e.g. a
    character outside the tiny vocabulary)."""

    def __init__(self, policy: LoadedPolicy, eos_ids: list[int], system_prompt: str = SYSTEM_PROMPT):
        self.policy = policy
        self.system_prompt = system_prompt  # a peer's completion is scored and trained under OUR prompt
        self.eos_ids = list(eos_ids)  # every token that ends a completion for this model
        self.fingerprint = policy.tokenizer_fingerprint

    @property
    def eos_id(self) -> int:
        return self.policy.tokenizer.eos_token_id

    def prompt(self, question: str) -> list[int]:
        return render_prompt(self.policy, question, system_prompt=self.system_prompt)

    def encode_text(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
        """(token ids, character span of each token) of `text`, no special tokens: a literal
        "<eos>" in a peer's text stays text (split_special_tokens), it never becomes our eos id."""
        encoded = self.policy.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True,
                                        split_special_tokens=True)
        return list(encoded["input_ids"]), [tuple(span) for span in encoded["offset_mapping"]]

    def encode_texts(self, texts: list[str]) -> list[tuple[list[int], list[tuple[int, int]]] | Exception]:
        """[self.encode_text(t) for t in texts] in one batched tokenizer call (a group's completions
        at once), except that an item encode_text would raise on comes back as that Exception
        instance instead of raising, so one untokenizable text neither loses the others nor hides
        which one failed: check each item with isinstance(item, Exception)."""
        texts = list(texts)
        if not texts:
            return []
        try:
            encoded = self.policy.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True,
                                            split_special_tokens=True)
        except Exception:  # the batch call names no culprit: redo it item by item
            return [self._encode_or_error(text) for text in texts]
        return [(list(ids), [tuple(span) for span in spans])
                for ids, spans in zip(encoded["input_ids"], encoded["offset_mapping"], strict=True)]

    def _encode_or_error(self, text: str) -> tuple[list[int], list[tuple[int, int]]] | Exception:
        try:
            return self.encode_text(text)
        except Exception as err:
            return err
