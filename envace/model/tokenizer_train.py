r"""Train the tiny preset's byte-level BPE tokenizer, and check any tokenizer speaks ChatML.

The tokenizer is trained with the `tokenizers` library on texts the caller supplies (task data,
rendered trajectories) and wrapped as a transformers `PreTrainedTokenizerFast`:

- byte-level BPE: every string encodes and decodes losslessly, whatever its characters;
- special tokens `<|endoftext|>`=0 (pad), `<|im_start|>`=1, `<|im_end|>`=2 (eos, the stop token);
- `<tool_call>` and `</tool_call>` as ordinary added tokens (single ids, not special: they are
  part of the text the policy writes, so they survive `skip_special_tokens`);
- a newline is always its own pre-token, so a ChatML header's trailing `\n` never merges with
  the message that follows: tokenizing `envace.model.chat`'s segments one by one gives exactly the
  ids of tokenizing the whole rendered string.

    tok = train_tokenizer(["<|im_start|>user\nhi<|im_end|>\n", ...], vocab_size=4096)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
ENDOFTEXT = "<|endoftext|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
ADDED_TOKENS = ("<tool_call>", "</tool_call>")

# Plain ChatML for `apply_chat_template` users; `envace.model.chat.render` is the format of record
# (it adds the tool listing and the <tool_call> blocks).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def train_tokenizer(
    texts: Iterable[str], vocab_size: int = 4096, model_max_length: int = 4096
) -> Any:
    """Train a byte-level BPE tokenizer of about `vocab_size` ids on `texts`.

    Returns a `PreTrainedTokenizerFast` with eos=`<|im_end|>`, pad=`<|endoftext|>`, no bos, no
    tokenization-space cleanup, and a plain ChatML chat template. A small corpus gives fewer ids
    than `vocab_size` (BPE stops when nothing is left to merge).
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    if vocab_size < 512:
        raise ValueError(f"vocab_size={vocab_size} is too small: use at least 512")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex("\n"), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(ADDED_TOKENS),
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator((t for t in texts if t), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in ADDED_TOKENS])
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    check_chat_tokens(wrapped)
    return wrapped


def check_chat_tokens(tokenizer: Any) -> dict[str, int]:
    """Ids of `<|im_start|>` and `<|im_end|>`; raises ValueError unless each is one token."""
    ids: dict[str, int] = {}
    for marker in (IM_START, IM_END):
        token_id = tokenizer.convert_tokens_to_ids(marker)
        encoded = tokenizer(marker, add_special_tokens=False)["input_ids"]
        if token_id is None or encoded != [token_id]:
            raise ValueError(
                f"tokenizer does not encode {marker!r} as one token (got {encoded}): the envace "
                "chat format is ChatML and needs <|im_start|>/<|im_end|> as special tokens"
            )
        ids[marker] = int(token_id)
    return ids
