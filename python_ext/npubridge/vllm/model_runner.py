"""The model runner: a transformers LlamaForCausalLM's architecture on the
npu over vllm_like's ops and a paged KV cache (vLLM's model runner and
Llama model in one, for one architecture).

The runner keeps its own device copies of the weights (q/k/v and gate/up
fused into one matmul each) and per-layer KV caches in vLLM's legacy layout,
the one paged_attention reads: key [num_blocks, kv_heads, head_size/x,
block_size, x] with x = 16 / element_size, value [num_blocks, kv_heads,
head_size, block_size]. Projections and the LM head are plain torch matmuls
on the npu (the dispatcher routes them to cann_like); everything else is a
vllm_like op.

Every token of a step is its own attention query: its K/V are written into
the cache first (reshape_and_cache), then paged attention reads positions
0..pos of its sequence through the sequence's block table, so a prompt, a
chunk of a prompt, a prompt whose first blocks are already cached (prefix
caching) and a decode token all take the same path, and one step may mix
them freely.
"""
import math
from dataclasses import dataclass
from typing import List

import torch

from . import _custom_ops
from .model_check import check_model

__all__ = ["ModelInput", "ModelRunner"]

_COMPUTE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# Looked up at construction, so that a plugin without them fails there.
_OPS = ("rms_norm", "fused_add_rms_norm", "rotary_embedding", "reshape_and_cache", "paged_attention_v1",
        "paged_attention_v2", "silu_and_mul", "copy_blocks", "swap_blocks")


@dataclass
class ModelInput:
    token_ids: List[int]  # this step's new tokens, all sequences flattened (prefill chunks and decode tokens)
    positions: List[int]  # position of each token within its sequence
    seq_index: List[int]  # per token: index of its sequence in block_tables
    block_tables: List[List[int]]  # per sequence scheduled this step: its device block ids (covering all positions)
    sample_rows: List[int]  # indices into token_ids whose logits are wanted (each sampling sequence's last token)


def _kv_heads_and_head_size(config):
    head_size = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return getattr(config, "num_key_value_heads", None) or config.num_attention_heads, head_size


def _rope_parameters(config):
    """(rope_type, rope_theta) from a transformers config of either era
    (rope_parameters since 5.0, rope_theta / rope_scaling before)."""
    params = getattr(config, "rope_parameters", None) or {}
    scaling = getattr(config, "rope_scaling", None) or {}
    rope_type = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    return rope_type, params.get("rope_theta", getattr(config, "rope_theta", 10000.0))


class ModelRunner:
    """Runs a LlamaForCausalLM over a paged KV cache on the npu.

    model: a transformers LlamaForCausalLM in any dtype, on any device; the
    runner copies its weights (tied embeddings handled) and computes in the
    model's dtype when the ops support it (float32, float16, bfloat16), else
    in float32, or in ``dtype`` when given. num_device_blocks KV blocks of
    block_size tokens live on ``device`` for every layer, num_cpu_blocks on
    the CPU for swapping.
    """

    def __init__(self, model, *, block_size=16, num_device_blocks, num_cpu_blocks=0, device="npu", dtype=None):
        check_model(model, "ModelRunner")
        config = model.config
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"ModelRunner: hidden_act must be 'silu' (Llama's SwiGLU), found {config.hidden_act!r}")
        if block_size <= 0 or num_device_blocks <= 0 or num_cpu_blocks < 0:
            raise ValueError(f"ModelRunner: expected block_size > 0, num_device_blocks > 0, num_cpu_blocks >= 0 "
                             f"but found {block_size}, {num_device_blocks}, {num_cpu_blocks}")
        self.dtype = self.compute_dtype(model, dtype)
        self.config = config
        self.device = torch.device(device)
        self.block_size = block_size
        self.num_device_blocks = num_device_blocks
        self.num_cpu_blocks = num_cpu_blocks
        self.num_heads = config.num_attention_heads
        self.num_kv_heads, self.head_size = _kv_heads_and_head_size(config)
        self.num_layers = config.num_hidden_layers
        self.vocab_size = config.vocab_size
        self.eps = float(config.rms_norm_eps)
        self.scale = self.head_size**-0.5  # LlamaAttention.scaling
        self.max_position = config.max_position_embeddings
        self._ops = {name: _custom_ops._op(name).default for name in _OPS}
        self.attention_calls = {"v1": 0, "v2": 0}  # paged attention calls by version (all layers)
        self._load_weights(model)
        self.cos_sin_cache = self._cos_sin_cache(model)
        self.key_caches, self.value_caches = self._allocate_caches(num_device_blocks, self.device)
        self.cpu_key_caches, self.cpu_value_caches = self._allocate_caches(num_cpu_blocks, torch.device("cpu"))

    @staticmethod
    def compute_dtype(model, dtype=None) -> torch.dtype:
        """The dtype of the runner's weights, activations and KV caches:
        ``dtype`` when given, else the model's when the ops support it, else
        float32 (a float64 model). The one rule, also for sizing the cache
        from a byte budget (LLM)."""
        if dtype is None:
            model_dtype = next(model.parameters()).dtype
            dtype = model_dtype if model_dtype in _COMPUTE_DTYPES else torch.float32
        if dtype not in _COMPUTE_DTYPES:
            raise ValueError(f"ModelRunner: dtype must be float32, float16 or bfloat16, found {dtype}")
        return dtype

    # --- setup -----------------------------------------------------------------

    def _to_device(self, t):
        return t.detach().to(device=self.device, dtype=self.dtype).contiguous()

    def _load_weights(self, model):
        base = model.model
        self.embed = self._to_device(base.embed_tokens.weight)
        # A tied head is the embedding itself: one device copy serves both.
        tied = model.lm_head.weight is base.embed_tokens.weight or (
            getattr(self.config, "tie_word_embeddings", False) and
            model.lm_head.weight.data_ptr() == base.embed_tokens.weight.data_ptr())
        self.lm_head = self.embed if tied else self._to_device(model.lm_head.weight)
        self.final_norm = self._to_device(base.norm.weight)
        self.layers = []
        for layer in base.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv = [attn.q_proj, attn.k_proj, attn.v_proj]
            self.layers.append({
                "input_norm": self._to_device(layer.input_layernorm.weight),
                "post_norm": self._to_device(layer.post_attention_layernorm.weight),
                "qkv": self._to_device(torch.cat([p.weight for p in qkv])),
                "qkv_bias": self._to_device(torch.cat([p.bias for p in qkv])) if attn.q_proj.bias is not None else None,
                "o": self._to_device(attn.o_proj.weight),
                "o_bias": self._to_device(attn.o_proj.bias) if attn.o_proj.bias is not None else None,
                "gate_up": self._to_device(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight])),
                "gate_up_bias": (self._to_device(torch.cat([mlp.gate_proj.bias, mlp.up_proj.bias]))
                                 if mlp.gate_proj.bias is not None else None),
                "down": self._to_device(mlp.down_proj.weight),
                "down_bias": self._to_device(mlp.down_proj.bias) if mlp.down_proj.bias is not None else None,
            })

    def _cos_sin_cache(self, model):
        """cat(cos, sin) per position, as transformers' LlamaRotaryEmbedding
        computes them: the module's own inv_freq (whatever rope type built
        it) times the position in float32, scaled by attention_scaling, then
        rounded to the compute dtype."""
        rope_type, theta = _rope_parameters(self.config)
        if rope_type in ("dynamic", "longrope"):
            raise ValueError(f"ModelRunner: rope type {rope_type!r} changes its frequencies with the sequence length; "
                             f"only static ones (default, linear, llama3, yarn) are supported")
        rotary = getattr(model.model, "rotary_emb", None)
        if rotary is not None:
            inv_freq, scaling = rotary.inv_freq.detach().float().cpu(), float(rotary.attention_scaling)
        else:
            inv_freq = 1.0 / (theta**(torch.arange(0, self.head_size, 2, dtype=torch.float) / self.head_size))
            scaling = 1.0
        freqs = torch.arange(self.max_position, dtype=torch.float)[:, None] * inv_freq[None, :]
        cache = torch.cat([freqs.cos() * scaling, freqs.sin() * scaling], dim=-1)
        return self._to_device(cache)

    def _allocate_caches(self, num_blocks, device):
        kshape, vshape = _custom_ops.legacy_cache_shapes(num_blocks, self.num_kv_heads, self.head_size,
                                                         self.block_size, self.dtype)
        keys = [torch.zeros(kshape, dtype=self.dtype, device=device) for _ in range(self.num_layers)]
        values = [torch.zeros(vshape, dtype=self.dtype, device=device) for _ in range(self.num_layers)]
        return keys, values

    @staticmethod
    def block_bytes(config, block_size, dtype) -> int:
        """One block's K and V bytes over all layers (the caches' shapes, so
        a head_size the layout cannot hold is refused here too)."""
        kv_heads, head_size = _kv_heads_and_head_size(config)
        kshape, vshape = _custom_ops.legacy_cache_shapes(1, kv_heads, head_size, block_size, dtype)
        return config.num_hidden_layers * (math.prod(kshape) + math.prod(vshape)) * dtype.itemsize

    # --- one step --------------------------------------------------------------

    def _step_tables(self, inp):
        """Per-token block-table rows, sequence lengths and cache slots, on the
        device: token i attends to positions 0..positions[i] of its sequence."""
        n = len(inp.token_ids)
        if not (len(inp.positions) == len(inp.seq_index) == n):
            raise ValueError(f"ModelInput: token_ids, positions and seq_index must have one entry per token, "
                             f"found {n}, {len(inp.positions)}, {len(inp.seq_index)}")
        lens = torch.tensor([len(t) for t in inp.block_tables], dtype=torch.int64)
        tables = torch.zeros(len(inp.block_tables), max(int(lens.max()) if len(lens) else 0, 1), dtype=torch.int64)
        for s, table in enumerate(inp.block_tables):
            tables[s, :len(table)] = torch.tensor(table, dtype=torch.int64)
        # A bad block id would become a negative slot (skipped as padding by
        # reshape_and_cache) or another sequence's block: refuse it here.
        bad = ((tables < 0) | (tables >= self.num_device_blocks)) & (torch.arange(tables.shape[1]) < lens[:, None])
        if bad.any():
            s, j = (int(v) for v in bad.nonzero()[0])
            raise IndexError(f"ModelInput: block_tables[{s}][{j}] = {inp.block_tables[s][j]} is outside the "
                             f"{self.num_device_blocks} device blocks")
        pos = torch.tensor(inp.positions, dtype=torch.int64)
        seq = torch.tensor(inp.seq_index, dtype=torch.int64)
        for name, values, bound, what in (("seq_index", seq, len(inp.block_tables), "block tables"),
                                          ("positions", pos, self.max_position, "max_position_embeddings")):
            wrong = ((values < 0) | (values >= bound)).nonzero()
            if len(wrong):
                i = int(wrong[0])
                raise IndexError(f"ModelInput: {name}[{i}] = {int(values[i])} is outside [0, {bound}) ({what})")
        short = (pos // self.block_size >= lens[seq]).nonzero()
        if len(short):
            i = int(short[0])
            s = int(seq[i])
            raise IndexError(f"ModelInput: positions[{i}] = {int(pos[i])} needs block {int(pos[i]) // self.block_size} "
                             f"of sequence {s}, whose block table has {int(lens[s])}")
        rows = tables[seq]
        slots = rows.gather(1, (pos // self.block_size)[:, None])[:, 0] * self.block_size + pos % self.block_size
        return (rows.to(torch.int32).to(self.device), (pos + 1).to(torch.int32).to(self.device),
                slots.to(self.device), pos.to(self.device), int(pos.max()) + 1)

    def _attention(self, query, key_cache, value_cache, block_rows, seq_lens, max_seq_len):
        out = torch.empty_like(query)
        version = _custom_ops.paged_attention(out, query, key_cache, value_cache, self.num_kv_heads, self.scale,
                                              block_rows, seq_lens, self.block_size, max_seq_len)
        self.attention_calls[version] += 1
        return out

    @staticmethod
    def _linear(x, weight, bias):
        y = torch.matmul(x, weight.t())
        return y if bias is None else y + bias

    @torch.no_grad()
    def execute(self, inp: ModelInput) -> torch.Tensor:
        """Float32 logits on the CPU, [len(sample_rows), vocab], for the
        tokens sample_rows names, after writing every token's K/V."""
        if not inp.token_ids:
            return torch.empty(0, self.vocab_size)
        if any(not 0 <= r < len(inp.token_ids) for r in inp.sample_rows):
            raise IndexError(f"ModelInput: sample_rows {inp.sample_rows} must index the {len(inp.token_ids)} tokens")
        ops = self._ops
        block_rows, seq_lens, slots, positions, max_seq_len = self._step_tables(inp)
        tokens = torch.tensor(inp.token_ids, dtype=torch.int64)
        if int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size:
            raise IndexError(f"ModelInput: token ids must be in [0, {self.vocab_size}), found "
                             f"[{int(tokens.min())}, {int(tokens.max())}]")
        n = tokens.numel()
        nh, nkv, hd = self.num_heads, self.num_kv_heads, self.head_size
        hidden = torch.nn.functional.embedding(tokens.to(self.device), self.embed)
        residual = None
        for i, layer in enumerate(self.layers):
            # vLLM's pre-norm: the first layer normalises the embedding, later
            # ones fold the residual add into the norm.
            if residual is None:
                residual = hidden
                hidden = torch.empty_like(residual)
                ops["rms_norm"](hidden, residual, layer["input_norm"], self.eps)
            else:
                ops["fused_add_rms_norm"](hidden, residual, layer["input_norm"], self.eps)
            qkv = self._linear(hidden, layer["qkv"], layer["qkv_bias"])
            query = qkv[:, :nh * hd].contiguous()
            key = qkv[:, nh * hd:(nh + nkv) * hd].contiguous()
            value = qkv[:, (nh + nkv) * hd:].contiguous()
            ops["rotary_embedding"](positions, query, key, hd, self.cos_sin_cache, True)
            ops["reshape_and_cache"](key.view(n, nkv, hd), value.view(n, nkv, hd), self.key_caches[i],
                                     self.value_caches[i], slots, "auto")
            attn = self._attention(query.view(n, nh, hd), self.key_caches[i], self.value_caches[i], block_rows,
                                   seq_lens, max_seq_len)
            hidden = self._linear(attn.view(n, nh * hd), layer["o"], layer["o_bias"])
            ops["fused_add_rms_norm"](hidden, residual, layer["post_norm"], self.eps)
            gate_up = self._linear(hidden, layer["gate_up"], layer["gate_up_bias"])
            act = torch.empty(n, gate_up.shape[1] // 2, dtype=self.dtype, device=self.device)
            ops["silu_and_mul"](act, gate_up)
            hidden = self._linear(act, layer["down"], layer["down_bias"])
        # Only the sampled rows need the final norm and the LM head.
        rows = torch.tensor(inp.sample_rows, dtype=torch.int64, device=self.device)
        hidden = hidden.index_select(0, rows).contiguous()
        residual = residual.index_select(0, rows).contiguous()
        ops["fused_add_rms_norm"](hidden, residual, self.final_norm, self.eps)
        return torch.matmul(hidden, self.lm_head.t()).float().cpu()

    # --- cache management ------------------------------------------------------

    def copy_blocks(self, pairs):
        """Copy device blocks src -> dst in every layer's K and V cache
        (copy-on-write when sequences that shared a block diverge)."""
        pairs = list(pairs)
        if not pairs:
            return
        # The kernel checks every id (IndexError naming the cache and pair).
        _custom_ops.copy_blocks(self.key_caches, self.value_caches, pairs)

    def _swap(self, pairs, src_caches, dst_caches):
        pairs = list(pairs)
        if not pairs:
            return
        # _custom_ops.swap_blocks checks every id before copying anything.
        mapping = torch.tensor(pairs, dtype=torch.int64)  # on the CPU, as vLLM passes it
        for src, dst in zip(src_caches, dst_caches):
            _custom_ops.swap_blocks(src, dst, mapping)

    def swap_out(self, pairs):
        """[(device block, cpu block)]: copy device blocks to the CPU caches."""
        self._swap(pairs, self.key_caches + self.value_caches, self.cpu_key_caches + self.cpu_value_caches)

    def swap_in(self, pairs):
        """[(cpu block, device block)]: copy CPU blocks back to the device."""
        self._swap(pairs, self.cpu_key_caches + self.cpu_value_caches, self.key_caches + self.value_caches)

    def read_block(self, layer, block, on="npu"):
        """One block's K and V of one layer as CPU tensors [block_size,
        kv_heads, head_size] each (token-major, undoing the legacy layout)."""
        if on == "cpu":
            keys, values, count = self.cpu_key_caches, self.cpu_value_caches, self.num_cpu_blocks
        else:
            keys, values, count = self.key_caches, self.value_caches, self.num_device_blocks
        if not (0 <= layer < self.num_layers and 0 <= block < count):
            raise IndexError(f"ModelRunner.read_block: layer {layer} / block {block} outside "
                             f"{self.num_layers} layers / {count} {on} blocks")
        k = keys[layer][block].cpu()  # [kv_heads, head_size/x, block_size, x]
        v = values[layer][block].cpu()  # [kv_heads, head_size, block_size]
        k = k.permute(2, 0, 1, 3).reshape(self.block_size, self.num_kv_heads, self.head_size)
        return k, v.permute(2, 0, 1).contiguous()
