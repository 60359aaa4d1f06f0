"""torch_npu APIs this compatibility package does not provide: each exists
(so code that looks it up finds it) and raises NotImplementedError naming
itself when called. docs/torch-npu-compat.md lists what is implemented."""

# Frequently used torch_npu functions without a kernel here.
FUNCTIONS = (
    "npu_confusion_transpose", "npu_incre_flash_attention", "npu_prompt_flash_attention",
    "npu_fused_infer_attention_score", "npu_scaled_masked_softmax", "npu_dropout_with_add_softmax", "npu_geglu",
    "npu_moe_gating_top_k_softmax", "npu_moe_init_routing", "npu_moe_finalize_routing", "npu_grouped_matmul",
    "npu_quant_matmul", "npu_weight_quant_batchmatmul", "npu_anti_quant", "npu_dynamic_quant", "npu_quantize",
    "npu_mm_all_reduce_base", "npu_all_gather_base_mm", "npu_mm_reduce_scatter_base", "npu_bmmV2",
    "npu_layer_norm_eval", "npu_ps_roi_pooling", "npu_nms_v4", "npu_deformable_conv2d", "npu_ciou", "npu_giou",
    "npu_fast_gelu", "npu_mish", "npu_linear", "npu_dtype_cast", "npu_broadcast", "npu_stride_copy",
)

OPTIMIZERS = ("NpuFusedAdam", "NpuFusedSGD", "NpuFusedLamb", "NpuFusedAdadelta", "NpuFusedRMSprop",
              "NpuFusedRMSpropTF", "NpuFusedBertAdam")


def stub(qualified_name: str, hint: str = ""):
    """A callable that raises NotImplementedError naming `qualified_name`."""

    def not_implemented(*args, **kwargs):
        raise NotImplementedError(
            f"{qualified_name} is not implemented by npubridge's torch_npu compatibility package "
            f"(npubridge-torch-npu){hint}; docs/torch-npu-compat.md lists the torch_npu APIs it provides")

    not_implemented.__name__ = qualified_name.rsplit(".", 1)[-1]
    not_implemented.__qualname__ = not_implemented.__name__
    not_implemented.__doc__ = f"Not implemented on npubridge: raises NotImplementedError naming {qualified_name}."
    return not_implemented


def stub_class(qualified_name: str):
    """A class whose construction raises NotImplementedError naming it."""
    name = qualified_name.rsplit(".", 1)[-1]
    raise_it = stub(qualified_name)
    return type(name, (), {"__init__": lambda self, *a, **k: raise_it(), "__doc__": raise_it.__doc__})
