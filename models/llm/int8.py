"""Int8 layers whose results do not depend on how many tokens pass together.

Weights are quantized once per output channel; activations per row (per token) at each call; the
product is an exact int32 matrix product (torch._int_mm), scaled back per row and per channel. So a
token's output is bit-for-bit the same whether it goes through alone (plain decoding) or with K
drafted tokens (speculative verification), and greedy speculation stays equal to plain decoding.
PyTorch's own dynamic quantization shares one activation scale across the rows of a call, which
breaks exactly that. On the 2-core development CPU these layers decode the Qwen2.5 0.5B twice as
fast as bfloat16 and the 1.5B 2.5 times.

Attention must be batch-invariant too: a float32 kernel over 9 query rows rounds differently from
one over 1, and the next layer's int8 rounding can turn that last-bit difference into a different
token. `rowwise_attention` therefore computes each query row exactly as a one-token decoding step
would (the same kernel over the same keys).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

ACCURACY_LIMIT = 0.05  # relative error of an int8 product beyond which its kernels are not to be trusted


class Int8Linear(nn.Module):
    weight_t: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor | None

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()  # [N, K]
        scale = weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0  # [N]
        quantized = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)  # [N, K]
        self.register_buffer("weight_t", quantized.t())  # [K, N], a column-major view (the fast layout)
        self.register_buffer("scale", scale)
        bias = linear.bias.detach().float() if linear.bias is not None else None
        self.register_buffer("bias", bias)
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        rows = x.reshape(-1, shape[-1]).float()  # [M, K]
        row_scale = rows.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127.0  # [M, 1]
        q = torch.round(rows / row_scale).clamp(-127, 127).to(torch.int8)  # [M, K]
        acc = torch._int_mm(q, self.weight_t)  # [M, N] int32, exact
        out = acc.float() * row_scale * self.scale  # [M, N]
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)


@functools.cache
def int8_error() -> float:
    """The relative error of an Int8Linear against float32 on fixed random data, on this CPU.
    About 0.01 where the int8 kernels are exact (AVX-512 VNNI, AVX-VNNI, AMX, arm64); measured at
    0.15 under AVX2-only kernels, whose u8 x s8 pair products saturate at 16 bits."""
    generator = torch.Generator().manual_seed(0)
    linear = nn.Linear(96, 160)
    with torch.no_grad():
        linear.weight.copy_((torch.rand(160, 96, generator=generator) * 2 - 1) * 0.1)
        linear.bias.zero_()
        x = torch.randn(9, 96, generator=generator) * 3
        want = linear(x)
        got = Int8Linear(linear)(x)
    return float((got - want).norm() / want.norm())


def int8_is_accurate() -> bool:
    return int8_error() < ACCURACY_LIMIT


def quantize_linears(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear (the LM head included) with an Int8Linear, in place."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear):
            setattr(model, name, Int8Linear(child))
        else:
            quantize_linears(child)
    return model


ROWWISE = "voice_agent_rowwise"


def rowwise_attention(
    module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
    attention_mask: torch.Tensor | None, **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Causal attention one query row at a time. query [1, H, q, D] holds the last q of the k
    positions in key/value [1, Hkv, k, D]; row i attends to the first k - q + i + 1 keys, through
    the same SDPA call a one-token step makes. Batch size 1 without padding (the engine's case), so
    the mask is not needed."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    q_len, k_len = query.shape[2], key.shape[2]
    kwargs = {k: v for k, v in kwargs.items() if k != "is_causal"}
    rows = []
    for i in range(q_len):
        end = k_len - q_len + i + 1
        out, _ = sdpa_attention_forward(
            module, query[:, :, i:i + 1], key[:, :, :end].contiguous(), value[:, :, :end].contiguous(), None,
            is_causal=False, **kwargs,
        )
        rows.append(out)  # [1, 1, H, D]
    return torch.cat(rows, dim=1), None  # [1, q, H, D]


def use_rowwise_attention(model: Any) -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(ROWWISE, rowwise_attention)
    model.set_attn_implementation(ROWWISE)
