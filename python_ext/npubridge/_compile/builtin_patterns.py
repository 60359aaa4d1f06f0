"""npubridge's own fusion patterns, for the graphs Hugging Face models give,
as pattern TEXT (docs/graph-mode.md, "Fusion patterns"): registered into
the one C++ table (``_C._register_fusion_pattern``) when patterns.py is
imported (with ``import npubridge``), beside the plugins' patterns
(plugins/*/src/fusion_patterns.cpp). The table is the single source: there
is no Python copy of the plugins' patterns.

``rms_norm_upcast``: HF's RMSNorm casts its input to float32 first; in
bfloat16 the fused op must take the bfloat16 input itself (the cast is
inside the match), and in float32 the no-op cast is looked through (Note
[No-op casts are looked through] in patterns.py). Tried before
rms_norm_cast. The fused op computes in float32 and rounds once to the
input's dtype, which is what the composite does only when the first cast
is an up-cast to float32 (not from float64) and the last goes back to the
input's dtype; gamma must be 1-D over the last dim (npu_rms_norm normalises
over all the dims gamma covers).

``sdpa_bool_mask``: HF passes a boolean mask (True = attend); the kernel
takes the opposite (True = masked out), so the mask goes through
where(mask, False, True); a float (additive) mask is left alone. AOTAutograd
would otherwise decompose SDPA into the math path: the eager backend choice
of _sdpa.py does not happen in a compiled graph."""
import logging

from .. import _C

_log = logging.getLogger("npubridge.compile")

HOST_PATTERNS = {
    "rms_norm_upcast": """
pattern rms_norm_upcast priority 22
  %x = aten::to.dtype(%h, $dt0)
  %sq = aten::pow.Tensor_Scalar(%x, 2)
  %ms = aten::mean.dim(%sq, [-1], True)
  %var = aten::add.Tensor(%ms, $eps)
  %r = aten::rsqrt(%var)
  %n = aten::mul.Tensor(%x, %r)
  %nc = aten::to.dtype(%n, $dtype)
  %y = aten::mul.Tensor(%gamma, %nc)
  where $dt0 == float32
  where %h.dtype != float64
  where $dtype == %h.dtype
  where %gamma.dim() == 1
  where %gamma.size(0) == %h.size(-1)
  => mindspeed_like::npu_rms_norm(%h, %gamma, $eps)[0]
end
""",
    "sdpa_bool_mask": """
pattern sdpa_bool_mask priority 10
  %o = aten::scaled_dot_product_attention(%q, %k, %v, %mask, 0.0, False, $scale)
  where %mask.dtype == bool
  => mindspeed_like::npu_fusion_attention(%q, %k, %v, %q.size(1), "BNSD", None, None, aten::where.Scalar(%mask, False, True), $scale, 1.0, 2147483647, 2147483647, 0, None, None, None, 0)[0]
end
""",
}

_registered = False


def register_host_patterns():
    """Adds HOST_PATTERNS to the table once per process. A pattern whose
    fused op is not defined (its plugin is not loaded) is left out: it
    could not fire."""
    global _registered
    if _registered:
        return
    have = {p["name"] for p in _C._fusion_patterns()}
    for name, text in HOST_PATTERNS.items():
        if name in have:
            continue
        try:
            _C._register_fusion_pattern(text)
        except ValueError as err:
            if "is not defined" not in str(err):
                raise
            _log.info("fusion pattern %s not registered: %s", name, err)
    _registered = True
