"""Tiny randomly initialised Qwen2 models with a real (word-level) tokenizer, for fast tests of the
decoding engine. Same architecture and code path as the real models, just small."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import Whitespace
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from models.llm.torch_lm import TorchLM

SPECIALS = ["<unk>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|> {{ m['role'] }} {{ m['content'] }} <|im_end|> {% endfor %}"
    "{% if add_generation_prompt %}<|im_start|> assistant {% endif %}"
)


def tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    words = SPECIALS + ["system", "user", "assistant"] + [f"w{i}" for i in range(vocab_size)]
    vocab = {w: i for i, w in enumerate(words[:vocab_size])}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    tok.add_special_tokens(SPECIALS)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>",
                                   pad_token="<|endoftext|>")
    fast.chat_template = TEMPLATE
    return fast


def tiny_lm(seed: int, vocab_size: int = 64, layers: int = 2, hidden: int = 64, name: str = "tiny",
            scale: float = 1.0) -> TorchLM:
    """A random Qwen2 in float32. `scale` multiplies the output weights: larger means peakier
    distributions (closer to a trained model's)."""
    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).float()
    with torch.no_grad():
        model.lm_head.weight.mul_(scale)
    return TorchLM.from_model(model, tokenizer(vocab_size), name=name)
