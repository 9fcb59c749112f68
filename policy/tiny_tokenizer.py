"""A 16-token character-level tokenizer for the tiny from-scratch model.

Built locally with `tokenizers` (nothing is downloaded) and wrapped as a `transformers` fast
tokenizer, so the rest of the code treats it exactly like a pretrained one. Every character is
one token, so offsets are plain character spans. bos is NOT added by `encode`: the node prepends
`tokenizer.bos_token_id` itself. There is no chat template.
"""
from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS = "<pad>", "<bos>", "<eos>"
SPECIAL_TOKENS = (PAD, BOS, EOS)  # ids 0, 1, 2
CHARACTERS = "0123456789+=m"  # ids 3..15


def tiny_vocab() -> dict[str, int]:
    tokens = [*SPECIAL_TOKENS, *CHARACTERS]
    return {token: token_id for token_id, token in enumerate(tokens)}


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    """Characters outside CHARACTERS raise on encode (WordLevel has no unk token on purpose:
    silently mapping them to something would corrupt tasks)."""
    backend = Tokenizer(models.WordLevel(tiny_vocab(), unk_token=None))
    # Split into single characters, each one its own pre-token: offsets are exact spans.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()  # join characters without the default space separator
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD,
        bos_token=BOS,
        eos_token=EOS,
        padding_side="left",
    )
