"""Decompositions of PyTorch's fused layer kernels, which `torch._decomp` lacks.

`nn.TransformerEncoderLayer` in eval mode under `torch.no_grad()` takes its "fast
path": one `aten._transformer_encoder_layer_fwd` call for the whole layer, which no
table decomposes, so the layer ran eagerly. Written here in the ops the layer's
slow path runs (linear, layer_norm, scaled_dot_product_attention), it lowers like
any other layer. A mask (a padding or attention mask) keeps the fused op: its
conventions differ between the mask types the op takes.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

aten = torch.ops.aten


def encoder_layer(src, embed_dim, num_heads, qkv_weight, qkv_bias, proj_weight, proj_bias, use_gelu, norm_first,
                  eps, norm_weight_1, norm_bias_1, norm_weight_2, norm_bias_2, ffn_weight_1, ffn_bias_1, ffn_weight_2,
                  ffn_bias_2, mask=None, mask_type=None):
    if mask is not None or src.dim() != 3:
        return NotImplemented

    def attention(x):
        b, t, _ = x.shape
        q, k, v = F.linear(x, qkv_weight, qkv_bias).view(b, t, 3, num_heads, -1).permute(2, 0, 3, 1, 4)
        o = F.scaled_dot_product_attention(q, k, v)
        return F.linear(o.transpose(1, 2).reshape(b, t, embed_dim), proj_weight, proj_bias)

    def feed_forward(x):
        h = F.linear(x, ffn_weight_1, ffn_bias_1)
        return F.linear(F.gelu(h) if use_gelu else F.relu(h), ffn_weight_2, ffn_bias_2)

    def norm(x, weight, bias):
        return F.layer_norm(x, (embed_dim,), weight, bias, eps)

    if norm_first:
        x = src + attention(norm(src, norm_weight_1, norm_bias_1))
        return x + feed_forward(norm(x, norm_weight_2, norm_bias_2))
    x = norm(src + attention(src), norm_weight_1, norm_bias_1)
    return norm(x + feed_forward(x), norm_weight_2, norm_bias_2)


TABLE = {aten._transformer_encoder_layer_fwd.default: encoder_layer}
