"""Int8 linear layers whose results do not depend on how many tokens pass together.

Weights are quantized once per output channel; activations per row (per token) at each call; the
product is an exact int32 matrix product (torch._int_mm), scaled back per row and per channel. So a
token's output is bit-for-bit the same whether it goes through alone (plain decoding) or with K
drafted tokens (speculative verification), and greedy speculation stays equal to plain decoding.
PyTorch's own dynamic quantization shares one activation scale across the rows of a call, which
breaks exactly that. On the 2-core development CPU these layers decode the Qwen2.5 0.5B several
times faster than bfloat16.
"""

from __future__ import annotations

import torch
from torch import nn


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


def quantize_linears(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear (the LM head included) with an Int8Linear, in place."""
    for name, child in list(model.named_children()):
        if isinstance(child, nn.Linear):
            setattr(model, name, Int8Linear(child))
        else:
            quantize_linears(child)
    return model
