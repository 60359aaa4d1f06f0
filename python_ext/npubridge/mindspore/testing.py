"""A tiny Llama-style network written in MindSpore, for the tests and the
benchmark (`./scripts/bench.sh mindspore`): built in code, nothing
downloaded.

`fused=True` writes it as MindSpore model code for Ascend does, with the
fused operators (ops.rms_norm, ops.rotary_position_embedding,
ops.flash_attention_score, ops.swiglu), which npubridge.mindspore routes to
the plugins (MindSpore's CPU build has no kernel for them); `fused=False`
writes the same computation with MindSpore's basic operators, which its CPU
build runs: the native network the adapter is compared with.
"""
import math

import numpy as np

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops


class Config:
    def __init__(self, vocab=64, hidden=32, heads=4, layers=2, intermediate=64, seq=8, eps=1e-6):
        self.vocab, self.hidden, self.heads, self.layers = vocab, hidden, heads, layers
        self.intermediate, self.seq, self.eps = intermediate, seq, eps
        self.head_dim = hidden // heads


def _rms_norm(x, gamma, eps, fused):
    if fused:
        return ops.rms_norm(x, gamma, eps)[0]
    return x * ops.rsqrt(ops.mean(x * x, -1, keep_dims=True) + eps) * gamma


def _rotate_half(x):
    half = x.shape[-1] // 2
    return ops.concat((-x[..., half:], x[..., :half]), -1)


class RMSNorm(nn.Cell):
    def __init__(self, cfg, dtype, fused):
        super().__init__()
        self.weight = Parameter(Tensor(np.ones(cfg.hidden), dtype), name="weight")
        self.eps, self.fused = cfg.eps, fused

    def construct(self, x):
        return _rms_norm(x, self.weight, self.eps, self.fused)


class Attention(nn.Cell):
    def __init__(self, cfg, dtype, fused):
        super().__init__()
        self.cfg, self.fused = cfg, fused
        self.q = nn.Dense(cfg.hidden, cfg.hidden, has_bias=False, dtype=dtype)
        self.k = nn.Dense(cfg.hidden, cfg.hidden, has_bias=False, dtype=dtype)
        self.v = nn.Dense(cfg.hidden, cfg.hidden, has_bias=False, dtype=dtype)
        self.o = nn.Dense(cfg.hidden, cfg.hidden, has_bias=False, dtype=dtype)
        self.scale = 1.0 / math.sqrt(cfg.head_dim)

    def _heads(self, x):  # (B, S, H) -> (B, N, S, D)
        b, s = x.shape[0], x.shape[1]
        return ops.transpose(ops.reshape(x, (b, s, self.cfg.heads, self.cfg.head_dim)), (0, 2, 1, 3))

    def construct(self, x, cos, sin, mask):
        b, s = x.shape[0], x.shape[1]
        q, k, v = self._heads(self.q(x)), self._heads(self.k(x)), self._heads(self.v(x))
        if self.fused:
            q = ops.rotary_position_embedding(q, cos, sin, 0)
            k = ops.rotary_position_embedding(k, cos, sin, 0)
            out = ops.flash_attention_score(q, k, v, self.cfg.heads, attn_mask=mask, scalar_value=self.scale,
                                            input_layout="BNSD")
        else:
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            scores = ops.matmul(q, ops.transpose(k, (0, 1, 3, 2))) * self.scale
            scores = ops.masked_fill(scores, mask, Tensor(-1e30, scores.dtype))
            out = ops.matmul(ops.softmax(scores, -1), v)
        out = ops.reshape(ops.transpose(out, (0, 2, 1, 3)), (b, s, self.cfg.hidden))
        return self.o(out)


class MLP(nn.Cell):
    def __init__(self, cfg, dtype, fused):
        super().__init__()
        self.fused = fused
        self.gate_up = nn.Dense(cfg.hidden, 2 * cfg.intermediate, has_bias=False, dtype=dtype)
        self.down = nn.Dense(cfg.intermediate, cfg.hidden, has_bias=False, dtype=dtype)

    def construct(self, x):
        h = self.gate_up(x)
        if self.fused:
            h = ops.swiglu(h, -1)
        else:
            half = h.shape[-1] // 2
            h = ops.silu(h[..., :half]) * h[..., half:]
        return self.down(h)


class Block(nn.Cell):
    def __init__(self, cfg, dtype, fused):
        super().__init__()
        self.norm1, self.attn = RMSNorm(cfg, dtype, fused), Attention(cfg, dtype, fused)
        self.norm2, self.mlp = RMSNorm(cfg, dtype, fused), MLP(cfg, dtype, fused)

    def construct(self, x, cos, sin, mask):
        x = x + self.attn(self.norm1(x), cos, sin, mask)
        return x + self.mlp(self.norm2(x))


class TinyLlama(nn.Cell):
    """Embedding, `layers` blocks (RMSNorm, rotary attention with a causal
    mask, SwiGLU MLP), final RMSNorm, LM head; construct(ids) returns the mean
    cross-entropy of predicting each next token."""

    def __init__(self, cfg, dtype=ms.float32, fused=True):
        super().__init__()
        self.cfg, self.dtype = cfg, dtype
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden, dtype=ms.float32)
        self.blocks = nn.CellList([Block(cfg, dtype, fused) for _ in range(cfg.layers)])
        self.norm = RMSNorm(cfg, dtype, fused)
        self.head = nn.Dense(cfg.hidden, cfg.vocab, has_bias=False, dtype=dtype)
        inv = 1.0 / (10000 ** (np.arange(0, cfg.head_dim, 2) / cfg.head_dim))
        angles = np.outer(np.arange(cfg.seq), inv)
        angles = np.concatenate([angles, angles], -1)[None, None]
        self.cos = Tensor(np.cos(angles), dtype)
        self.sin = Tensor(np.sin(angles), dtype)
        self.mask = Tensor(np.triu(np.ones((cfg.seq, cfg.seq), bool), 1)[None, None])

    def construct(self, ids):
        x = ops.cast(self.embed(ids), self.dtype)
        for block in self.blocks:
            x = block(x, self.cos, self.sin, self.mask)
        logits = self.head(self.norm(x))
        logits = ops.reshape(logits[:, :-1], (-1, self.cfg.vocab))
        return ops.cross_entropy(logits, ops.reshape(ids[:, 1:], (-1,)))


def copy_weights(src, dst):
    """dst's parameters take src's values (in dst's dtypes), by name."""
    values = {p.name: p.asnumpy() for p in src.trainable_params()}
    for p in dst.trainable_params():
        p.set_data(Tensor(values[p.name].astype(ms.dtype_to_nptype(p.dtype))))


def batch(cfg, batch_size=2, seed=0):
    rng = np.random.default_rng(seed)
    return Tensor(rng.integers(0, cfg.vocab, (batch_size, cfg.seq)), ms.int32)
