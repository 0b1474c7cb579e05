"""Build the tiny test model locally (no hub): a random Qwen2 decoder and a BPE tokenizer.

usage: python scripts/make_tiny_model.py OUT_DIR
       python scripts/make_tiny_model.py OUT_DIR --small        (random Qwen2, ~9.5M params: prefill
                                                                 costs many decode steps on one core)
       python scripts/make_tiny_model.py OUT_DIR --qwen3-0.6b   (config + tokenizer only, for load_format=dummy)

The tokenizer is trained on a small generated corpus of agent/tool words and digits, so
the arithmetic tool task of the runtime tokenizes sensibly. Deterministic (seeded).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
WORDS = (
    "agent tool call calc lookup key value result answer observe reward step plan think the a of to is "
    "add sub mul plus minus times equals user assistant system error ok done next final question number"
).split()


def _corpus(lines: int, seed: int):
    rng = random.Random(seed)
    for _ in range(lines):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 24))]
        nums = [str(rng.randint(0, 9999)) for _ in range(rng.randint(0, 5))]
        yield " ".join(words + nums) + rng.choice([".", "?", " =", "\n", ":"])


def build_tokenizer(out: Path, vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(3000, 7), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<pad>",
        additional_special_tokens=["<|im_start|>", "<|endoftext|>"],
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 4096
    fast.save_pretrained(out)
    return fast


def build_tiny(out: Path, hidden: int = 128, layers: int = 2, heads: int = 4, kv_heads: int = 2) -> int:
    """Random Qwen2 in fp32 with the local tokenizer; returns the parameter count."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    tok = build_tokenizer(out, 1024)
    torch.manual_seed(0)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    cfg = Qwen2Config(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=4096,
        tie_word_embeddings=False, eos_token_id=eos, pad_token_id=tok.pad_token_id, torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos, "pad_token_id": tok.pad_token_id}))
    return sum(p.numel() for p in model.parameters())


def write_qwen3_06b_config(out: Path) -> None:
    """Real Qwen3-0.6B architecture numbers; weights come from vLLM's load_format='dummy'."""
    tok = build_tokenizer(out, 1024)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    cfg = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
        "hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128, "max_position_embeddings": 40960, "rms_norm_eps": 1e-6,
        "rope_theta": 1000000, "tie_word_embeddings": True, "hidden_act": "silu", "attention_bias": False,
        "torch_dtype": "bfloat16", "eos_token_id": eos, "pad_token_id": tok.pad_token_id,
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("out")
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--qwen3-0.6b", dest="qwen3", action="store_true")
    size.add_argument("--small", action="store_true", help="hidden 384, 4 layers: where P/D disaggregation can pay on CPU")
    a = ap.parse_args(argv)
    t0 = time.time()
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    if a.qwen3:
        write_qwen3_06b_config(out)
        print(f"wrote Qwen3-0.6B config (dummy weights) to {out} in {time.time() - t0:.1f}s")
    elif a.small:
        n = build_tiny(out, hidden=384, layers=4, heads=6, kv_heads=2)
        print(f"built small Qwen2 ({n} params) in {out} in {time.time() - t0:.1f}s")
    else:
        n = build_tiny(out)
        print(f"built tiny Qwen2 ({n} params) in {out} in {time.time() - t0:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
