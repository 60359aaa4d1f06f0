"""The layers vLLM lets a platform replace (CustomOp.register_oot), on
vllm_like's fused ops: RMSNorm (rms_norm, fused_add_rms_norm), SiluAndMul
(silu_and_mul) and RotaryEmbedding (rotary_embedding, in place on the query
and key). Imported by register_ops when the npu is vLLM's platform."""
import torch

from vllm.model_executor.layers.activation import SiluAndMul
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding

from ._custom_ops import _op


@RMSNorm.register_oot
class NpuRMSNorm(RMSNorm):

    def forward_oot(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if self.variance_size_override is not None or not self.has_weight or x.device.type != "npu":
            return self.forward_native(x, residual)
        if residual is not None:
            x, residual = x.contiguous(), residual.contiguous()
            _op("fused_add_rms_norm")(x, residual, self.weight.data, self.variance_epsilon)
            return x, residual
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
        _op("rms_norm")(out, x.contiguous(), self.weight.data, self.variance_epsilon)
        return out


@SiluAndMul.register_oot
class NpuSiluAndMul(SiluAndMul):

    def forward_oot(self, x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "npu":
            return self.forward_native(x)
        out = torch.empty(x.shape[:-1] + (x.shape[-1] // 2, ), dtype=x.dtype, device=x.device)
        _op("silu_and_mul")(out, x.contiguous())
        return out


@RotaryEmbedding.register_oot
class NpuRotaryEmbedding(RotaryEmbedding):

    def forward_oot(self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor | None = None):
        if query.device.type != "npu":
            return self.forward_native(positions, query, key)
        if self.cos_sin_cache.device != query.device or self.cos_sin_cache.dtype != query.dtype:
            self.cos_sin_cache = self.cos_sin_cache.to(query.device, dtype=query.dtype)
        _op("rotary_embedding")(positions, query, key, self.head_size, self.cos_sin_cache, self.is_neox_style)
        return query, key
