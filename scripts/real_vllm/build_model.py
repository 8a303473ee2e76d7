"""Build a tiny random Llama + a locally trained tokenizer that vLLM can serve (no downloads).

Runs in the vLLM venv (it needs torch, transformers and tokenizers):

    ~/.cache/fleetscope/vllm-venv/bin/python scripts/real_vllm/build_model.py OUT_DIR

The model is a 2-layer Llama (hidden 128, 4 heads of 32 — the CPU attention backend needs a
head size >= 32 — intermediate 256) with random weights from a fixed seed; the tokenizer is a
byte-level BPE (vocab 512) trained on a generated corpus, wrapped in ``PreTrainedTokenizerFast``
with bos/eos/pad tokens and a simple chat template. Everything is deterministic.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

VOCAB_SIZE = 512
SPECIAL = ["<pad>", "<s>", "</s>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for m in messages %}"
    "<|{{ m['role'] }}|>\n{{ m['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

# the load generator builds its prompts from the same words (scripts/real_vllm/loadgen.py)
from words import WORDS  # noqa: E402 - the same words in both scripts


def corpus(n_lines: int = 4000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for _ in range(n_lines):
        n = rng.randint(5, 30)
        words = [rng.choice(WORDS) for _ in range(n)]
        lines.append(" ".join(words) + rng.choice([".", "?", "!", ",", ";", ":"]))
    lines += ["<|user|>", "<|assistant|>", "<|system|>", "0123456789"]
    return lines


def build_tokenizer(out: Path) -> PreTrainedTokenizerFast:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=512,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def build_model(out: Path, tokenizer: PreTrainedTokenizerFast) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    build_model(out, tokenizer)
    # sanity: the tokenizer round-trips and the chat template renders
    ids = tokenizer("the fleet engine token cache")["input_ids"]
    chat = tokenizer.apply_chat_template(
        [{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True
    )
    info = {"dir": str(out), "vocab": len(tokenizer), "sample_ids": ids, "chat": chat}
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main())
