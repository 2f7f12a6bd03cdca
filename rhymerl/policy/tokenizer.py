"""The built-in model's tokenizer, in a module without torch so the run's input checks load it in seconds.

`build_tokenizer` makes the byte-level tokenizer every built-in model is saved with
(`rhymerl.policy.build`); `builtin_tokenizer` is that tokenizer as a run renders prompts with it:
given `rhymerl.data.chat.DEFAULT_CHAT_TEMPLATE`, since it has no chat template of its own.
`is_builtin_model` tells a folder written by `rhymerl.policy.build.build_model` (it holds `BUILD_INFO`).
"""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers

PAD, EOS, UNK = "<pad>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, EOS, UNK)  # ids 0, 1, 2; byte b is id 3 + b
BUILD_INFO = "rhymerl_build.json"


def is_builtin_model(model_dir: str | Path) -> bool:
    """Whether `model_dir` is a built-in model folder (written by `build_model`)."""
    return (Path(model_dir) / BUILD_INFO).is_file()


def builtin_tokenizer():
    """`build_tokenizer()` with the default chat template, as prompts are rendered with it."""
    from rhymerl.data.chat import install_default_chat_template

    tok = build_tokenizer()
    install_default_chat_template(tok)
    return tok



def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-in for each byte 0..255 (the ByteLevel pre-tokenizer's alphabet)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\xa1"), ord("\xac") + 1),
            *range(ord("\xae"), ord("\xff") + 1)]
    symbols, extra = {}, 0
    for b in range(256):
        if b in keep:
            symbols[b] = chr(b)
        else:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def build_tokenizer():
    """A fast byte-level tokenizer with no merges: one token per byte, so one per ASCII character.

    decode(encode(s)) == s for any NFC text (newlines included), and nothing is ever <unk>. It is
    a BPE model with an empty merge list rather than a WordLevel one because transformers 5 loads
    every `model_type == "qwen2"` folder through `Qwen2Tokenizer`, which rebuilds the pipeline as
    NFC + byte-level BPE from the saved vocab; this tokenizer is exactly that pipeline, so
    `AutoTokenizer`, vLLM and the `tokenizers` library all split text the same way.
    """
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + tuple(_byte_symbols()))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=PAD, eos_token=EOS,
                                   unk_token=UNK, padding_side="left",
                                   model_max_length=512, clean_up_tokenization_spaces=False)
