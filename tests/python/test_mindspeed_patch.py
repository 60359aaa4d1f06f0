"""npubridge.mindspeed's patch manager and its transformers features: tiny
random Llama and Qwen2 models (nothing downloaded), patched against
unpatched, judged by npubridge's error model against the model in float64."""
import copy
import sys
import types
import warnings

import pytest
import torch

import npubridge
import npubridge.mindspeed as ms
from npubridge.mindspeed import functional

from tiny_models import tiny_config

import transformers
from transformers.models.llama import modeling_llama
from transformers.models.qwen2 import modeling_qwen2
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb  # noqa: E402  (a copy to be rebound)

FEATURE_OPS = {f["name"]: f for f in ms.features()}


def available(name):
    return FEATURE_OPS[name]["unavailable"] is None


@pytest.fixture(autouse=True)
def unpatched():
    ms.unpatch()
    yield
    ms.unpatch()


def _config(kind):
    sizes = dict(vocab_size=96, intermediate_size=96, hidden_act="silu")
    if kind == "llama":
        return transformers.LlamaForCausalLM, tiny_config(transformers.LlamaConfig, **sizes)
    return transformers.Qwen2ForCausalLM, tiny_config(transformers.Qwen2Config, **sizes)


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request):
    """(kind, fp32 model on npu, the same in float64 on the CPU, input ids on the CPU)."""
    torch.manual_seed(0)
    cls, cfg = _config(request.param)
    cpu = cls(cfg)
    wide = copy.deepcopy(cpu).double()
    return request.param, cpu.to("npu"), wide, torch.randint(0, cfg.vocab_size, (2, 10))


def _forward_backward(m, ids):
    m.zero_grad()
    out = m(ids, labels=ids)
    out.loss.backward()
    return out.logits.detach(), {n: p.grad.detach().clone() for n, p in m.named_parameters()}


def _assert_judged(got, host, wide, what):
    # got within a few times host's own error against wide (float64), plus
    # a few roundings: npubridge's host-calibrated error model.
    msg = npubridge._C.judge(got.cpu(), host.cpu(), wide.cpu())
    assert not msg, f"{what}: {msg}"


def test_patched_model_matches_unpatched_and_runs_the_fused_ops(model):
    kind, m, wide, ids = model
    enabled = ms.patch()
    assert "rms_norm" in enabled
    npubridge.reset_stats()
    logits, grads = _forward_backward(m, ids.npu())
    stats = npubridge.stats()
    ms.unpatch()
    host_logits, host_grads = _forward_backward(m, ids.npu())
    wide_logits, wide_grads = _forward_backward(wide, ids)
    # The patched model within a few times the unpatched one's own error
    # against the float64 model.
    _assert_judged(logits, host_logits, wide_logits, f"{kind} logits")
    for name, g in grads.items():
        _assert_judged(g, host_grads[name], wide_grads[name], f"{kind} grad of {name}")

    def native(op):
        return stats.get(f"mindspeed_like::{op}", {}).get("native", {}).get("mindspeed_like", 0)

    layers = m.config.num_hidden_layers
    # Two norms per layer and the final one; add_rms_norm takes the post-attention norms.
    fused_adds = layers if "add_rms_norm" in enabled else 0
    assert native("npu_rms_norm") == native("npu_rms_norm_backward") == 2 * layers + 1 - fused_adds
    assert native("npu_add_rms_norm") == native("npu_add_rms_norm_backward") == fused_adds
    if "rotary" in enabled:
        assert native("npu_rotary_position_embedding") == 2 * layers
    if "swiglu" in enabled:
        assert native("npu_swiglu") == layers and native("npu_swiglu_backward") == layers
    if "flash_attention" in enabled:
        assert native("npu_fusion_attention") == layers and native("npu_fusion_attention_grad") == layers


def test_a_cpu_model_keeps_the_original_code():
    torch.manual_seed(0)
    cls, cfg = _config("llama")
    m = cls(cfg)
    ids = torch.randint(0, cfg.vocab_size, (1, 6))
    before = m(ids).logits
    with ms.patched():
        npubridge.reset_stats()
        after = m(ids).logits
        assert not any(op.startswith("mindspeed_like::") for op in npubridge.stats())
    assert torch.equal(before, after)


def _bindings():
    """What each feature's targets and the known copies are bound to now."""
    return {
        "LlamaRMSNorm.forward": modeling_llama.LlamaRMSNorm.forward,
        "Qwen2RMSNorm.forward": modeling_qwen2.Qwen2RMSNorm.forward,
        "llama.apply_rotary_pos_emb": modeling_llama.apply_rotary_pos_emb,
        "qwen2.apply_rotary_pos_emb": modeling_qwen2.apply_rotary_pos_emb,
        "test copy of apply_rotary_pos_emb": sys.modules[__name__].apply_rotary_pos_emb,
        "LlamaMLP.forward": modeling_llama.LlamaMLP.forward,
        "Qwen2MLP.forward": modeling_qwen2.Qwen2MLP.forward,
        "sdpa": transformers.modeling_utils.AttentionInterface._global_mapping["sdpa"],
        "sdpa_attention.sdpa_attention_forward":
            transformers.integrations.sdpa_attention.sdpa_attention_forward,
        "LlamaDecoderLayer.forward": modeling_llama.LlamaDecoderLayer.forward,
        "Qwen2DecoderLayer.forward": modeling_qwen2.Qwen2DecoderLayer.forward,
    }


FEATURE_BINDINGS = {
    "rms_norm": {"LlamaRMSNorm.forward", "Qwen2RMSNorm.forward"},
    "rotary": {"llama.apply_rotary_pos_emb", "qwen2.apply_rotary_pos_emb", "test copy of apply_rotary_pos_emb"},
    "swiglu": {"LlamaMLP.forward", "Qwen2MLP.forward"},
    "flash_attention": {"sdpa", "sdpa_attention.sdpa_attention_forward"},
    "add_rms_norm": {"LlamaDecoderLayer.forward", "Qwen2DecoderLayer.forward"},
}


def test_features_switch_one_by_one_and_unpatch_restores_every_name():
    original = _bindings()
    assert set(FEATURE_BINDINGS) == {f["name"] for f in ms.features()}
    for name, touched in FEATURE_BINDINGS.items():
        if not available(name):
            with pytest.raises(RuntimeError, match=f"feature '{name}' cannot be enabled: .*mindspeed_like"):
                ms.patch([name])
            assert _bindings() == original
            continue
        assert ms.patch(name) == [name]
        now = _bindings()
        assert {k for k in original if now[k] is not original[k]} == touched, name
        assert [f["name"] for f in ms.features() if f["enabled"]] == [name]
        ms.unpatch()
        assert all(_bindings()[k] is original[k] for k in original), name
    assert not any(f["enabled"] for f in ms.features())


def test_levels():
    original = _bindings()
    assert ms.patch(level=0) == []
    assert _bindings() == original
    levels = {f["name"]: f["level"] for f in ms.features()}
    assert levels == {"rms_norm": 1, "rotary": 1, "swiglu": 2, "flash_attention": 2, "add_rms_norm": 2}
    for level in (1, 2):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            enabled = ms.patch(level=level)
        assert enabled == [n for n, lv in levels.items() if lv <= level and available(n)]
        skipped = [n for n, lv in levels.items() if lv <= level and not available(n)]
        messages = [str(w.message) for w in caught if "npubridge.mindspeed.patch(): skipped" in str(w.message)]
        assert len(messages) == (1 if skipped else 0) and all(f"{n}: " in messages[0] for n in skipped)
    with pytest.raises(ValueError, match=r"patch\(\): feature 'swiglu' has level 2, above level=1"):
        ms.patch(["swiglu"], level=1)


def test_unknown_features_and_levels_are_clear_errors():
    with pytest.raises(ValueError, match=r"^patch\(\): unknown feature 'rmsnorm'; the features are rms_norm, rotary, "
                       r"swiglu, flash_attention, add_rms_norm$"):
        ms.patch(["rms_norm", "rmsnorm"])
    with pytest.raises(ValueError, match=r"patch\(\): expected level to be one of 0, 1, 2 but found 3"):
        ms.patch(level=3)
    with pytest.raises(ValueError, match="found True"):
        ms.patch(level=True)
    assert not any(f["enabled"] for f in ms.features())


def test_features_lists_name_level_enabled_and_what_it_replaces():
    listed = {f["name"]: f for f in ms.features()}
    assert listed["rms_norm"]["replaces"] == [
        "transformers.models.llama.modeling_llama.LlamaRMSNorm.forward",
        "transformers.models.qwen2.modeling_qwen2.Qwen2RMSNorm.forward"
    ]
    assert listed["flash_attention"]["replaces"] == ["transformers.modeling_utils.AttentionInterface._global_mapping.sdpa"]
    with ms.patched(["rms_norm"]) as enabled:
        assert enabled == ["rms_norm"]
        assert {f["name"]: f["enabled"] for f in ms.features()}["rms_norm"]
    assert not any(f["enabled"] for f in ms.features())


# --- The patch manager on its own (a PatchManager, on modules made here) ---


@pytest.fixture
def fake_modules():
    target = types.ModuleType("npub_fake_target")

    def f(x):
        return x + 1

    class Base:
        def method(self):
            return "base"

    class Child(Base):
        pass

    target.f, target.Base, target.Child, target.table = f, Base, Child, {"k": f}
    user = types.ModuleType("npub_fake_user")
    user.f, user.renamed = target.f, target.f  # `from npub_fake_target import f` (and `as renamed`)
    sys.modules["npub_fake_target"], sys.modules["npub_fake_user"] = target, user
    yield target, user, f
    del sys.modules["npub_fake_target"], sys.modules["npub_fake_user"]


def test_a_patch_rebinds_the_copies_and_remove_restores_them(fake_modules):
    target, user, f = fake_modules
    pm = ms.PatchManager()

    def g(x):
        return x + 2

    pm.register_patch("npub_fake_target.f", g)
    pm.apply_patches()
    assert target.f is g and user.f is g and user.renamed is g
    assert target.table["k"] is f  # a dict entry is not a module attribute: only named ones are patched
    late = types.ModuleType("npub_fake_late")
    late.f = target.f  # imported while patched
    sys.modules["npub_fake_late"] = late
    try:
        pm.remove_patches()
        assert target.f is f and user.f is f and user.renamed is f and late.f is f
    finally:
        del sys.modules["npub_fake_late"]


def test_wrappers_wrap_in_order_over_the_replacement(fake_modules):
    target, user, f = fake_modules
    pm = ms.PatchManager()

    def times_ten_wrapper(fn):
        return lambda x: fn(x) * 10

    def minus_one_decorator(fn):
        return lambda x: fn(x) - 1

    pm.register_patch("npub_fake_target.f", times_ten_wrapper)
    pm.register_patch("npub_fake_target.f", minus_one_decorator)
    pm.apply_patches()
    assert target.f(1) == 19 and user.f(1) == 19  # ((1 + 1) * 10) - 1
    pm.remove_patches()
    pm.register_patch("npub_fake_target.f", lambda x: x * 3)
    pm.apply_patches()
    assert target.f(1) == 29  # ((1 * 3) * 10) - 1
    pm.remove_patches()
    assert target.f is f


def test_a_second_replacement_needs_force_patch(fake_modules):
    target, _, f = fake_modules
    pm = ms.PatchManager()

    def g(x):
        return 2

    def h(x):
        return 3

    pm.register_patch("npub_fake_target.f", g)
    with pytest.raises(ms.PatchError, match=r"npub_fake_target.f already has a replacement \(.*g\); pass "
                       r"force_patch=True"):
        pm.register_patch("npub_fake_target.f", h)
    pm.register_patch("npub_fake_target.f", h, force_patch=True)
    pm.apply_patches()
    assert target.f is h
    with pytest.raises(ms.PatchError, match="is applied; remove_patches"):
        pm.register_patch("npub_fake_target.f", g, force_patch=True)
    pm.remove_patches()
    assert target.f is f


def test_inherited_methods_and_mapping_entries(fake_modules):
    target, _, f = fake_modules
    pm = ms.PatchManager()
    pm.register_patch("npub_fake_target.Child.method", lambda self: "patched")
    pm.register_patch("npub_fake_target.table.k", lambda x: "entry")
    pm.apply_patches()
    assert target.Child().method() == "patched" and target.Base().method() == "base"
    assert target.table["k"](0) == "entry"
    pm.remove_patches()
    assert "method" not in target.Child.__dict__  # inherited again, not a copy of Base's
    assert target.Child().method() == "base" and target.table["k"] is f


def test_missing_targets_and_create_dummy(fake_modules):
    target, _, _ = fake_modules
    pm = ms.PatchManager()
    pm.register_patch("npub_fake_target.nothing", lambda: 1)
    with pytest.raises(ms.PatchError, match=r"cannot patch npub_fake_target.nothing: it does not exist \(register it "
                       r"with create_dummy=True"):
        pm.apply_patches()
    assert not hasattr(target, "nothing")
    pm = ms.PatchManager()

    def placeholder_wrapper(fn):
        return fn

    pm.register_patch("npub_fake_target.sub.missing", placeholder_wrapper, create_dummy=True)
    pm.apply_patches()
    with pytest.raises(NotImplementedError, match="placeholder created by npubridge.mindspeed's patch manager"):
        target.sub.missing()
    pm.remove_patches()
    assert not hasattr(target, "sub")
    with pytest.raises(ValueError, match="expected dotted_name to be 'module.attribute'"):
        pm.register_patch("f", lambda: 1)


def test_the_real_apply_rotary_pos_emb_copy_here_is_rebound_and_restored():
    # Independent of the rotary kernel: the manager on transformers itself.
    original = modeling_llama.apply_rotary_pos_emb
    assert apply_rotary_pos_emb is original
    pm = ms.PatchManager()

    def counting_wrapper(fn):
        def counted(*args, **kwargs):
            counted.calls += 1
            return fn(*args, **kwargs)

        counted.calls = 0
        return counted

    pm.register_patch("transformers.models.llama.modeling_llama.apply_rotary_pos_emb", counting_wrapper)
    pm.apply_patches()
    try:
        patched = modeling_llama.apply_rotary_pos_emb
        assert patched is not original and sys.modules[__name__].apply_rotary_pos_emb is patched
        torch.manual_seed(0)
        cls, cfg = _config("llama")
        cls(cfg)(torch.randint(0, cfg.vocab_size, (1, 4)))
        assert patched.calls == cfg.num_hidden_layers
    finally:
        pm.remove_patches()
    assert modeling_llama.apply_rotary_pos_emb is original and sys.modules[__name__].apply_rotary_pos_emb is original


def test_functional_names_the_plugin_when_an_op_is_missing():
    reason = functional.missing_reason("npu_no_such_op")
    assert "mindspeed_like" in reason and "npu_no_such_op" in reason
    with pytest.raises(RuntimeError, match=r"npubridge.mindspeed.npu_no_such_op: the loaded mindspeed_like plugin "
                       r"\(.*libnpub_mindspeed_like.so, version .*\) has no op mindspeed_like::npu_no_such_op"):
        functional._op("npu_no_such_op")


def test_functional_says_how_to_load_a_plugin_that_is_not_loaded(monkeypatch):
    monkeypatch.setattr(npubridge, "plugins", lambda: [])
    monkeypatch.setattr(npubridge, "load_failures", lambda: [])
    assert functional.missing_reason("npu_no_such_op") == (
        "the mindspeed_like plugin is not loaded (libnpub_mindspeed_like.so was not found in npubridge's plugin "
        "directory); it loads at the npu runtime's start (the first npu use) from the plugin directory shipped "
        "with npubridge, or set NPUB_PLUGIN_PATH=/path/to/libnpub_mindspeed_like.so (a file or its directory) "
        "before the first npu use")
    monkeypatch.setattr(npubridge, "load_failures",
                        lambda: ["plugin '/x/libnpub_mindspeed_like.so' rejected: ABI 9.0 is newer"])
    assert functional.missing_reason("npu_no_such_op").startswith(
        "the mindspeed_like plugin is not loaded (plugin '/x/libnpub_mindspeed_like.so' rejected: ABI 9.0 is newer)")


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_training_with_patch_and_fused_adamw_gives_the_same_losses(kind):
    # mindspeed_like is built with the extension: a failure, never a skip.
    assert functional.missing_reason("npu_apply_adam_w") is None, functional.missing_reason("npu_apply_adam_w")
    cls, cfg = _config(kind)
    torch.manual_seed(0)
    start = cls(cfg).state_dict()
    batches = [torch.randint(0, cfg.vocab_size, (2, 12))] * 5  # one batch, so the loss must fall

    def train(fused):
        m = cls(cfg)
        m.load_state_dict(start)
        m.to("npu").train()
        opt = (ms.FusedAdamW if fused else torch.optim.AdamW)(m.parameters(), lr=1e-2)
        losses = []
        for ids in batches:
            opt.zero_grad()
            loss = m(ids.npu(), labels=ids.npu()).loss
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    plain = train(False)
    with ms.patched():
        fused = train(True)
    assert plain[-1] < plain[0]  # it learns
    for a, b in zip(fused, plain):
        assert abs(a - b) <= 1e-3 * abs(b), (fused, plain)


def test_a_padding_mask_takes_the_masked_path(model):
    kind, m, wide, ids = model
    mask = torch.ones(ids.shape, dtype=torch.long)
    mask[1, :3] = 0  # left padding: transformers passes a boolean [B, 1, S, S] mask
    with torch.no_grad():
        with ms.patched():
            npubridge.reset_stats()
            got = m(ids.npu(), attention_mask=mask.npu()).logits
            calls = npubridge.stats().get("mindspeed_like::npu_fusion_attention", {}).get("calls", 0)
        host = m(ids.npu(), attention_mask=mask.npu()).logits
        ref = wide(ids, attention_mask=mask).logits
    _assert_judged(got, host, ref, f"{kind} padded logits")
    assert calls == (m.config.num_hidden_layers if available("flash_attention") else 0)


def test_a_bfloat16_model_takes_the_fused_path_too(model):
    kind, m, wide, ids = model
    half = copy.deepcopy(m).to(torch.bfloat16)
    with torch.no_grad():
        with ms.patched():
            npubridge.reset_stats()
            got = half(ids.npu()).logits
            stats = npubridge.stats()
        host = half(ids.npu()).logits
        ref = wide(ids).logits
    _assert_judged(got, host, ref.to(torch.float64), f"{kind} bfloat16 logits")
    assert stats["mindspeed_like::npu_rms_norm"]["native"]["mindspeed_like"] >= 1


def test_a_disabled_plugin_or_a_low_optim_level_skips_the_features():
    level = npubridge._C.optim_level()
    try:
        npubridge.disable_plugin("mindspeed_like")
        with pytest.raises(RuntimeError, match=r"patch\(\): feature 'rms_norm' cannot be enabled: the mindspeed_like "
                           r"plugin is disabled \(npubridge.disable_plugin\); npubridge.enable_plugin\('mindspeed_like'\)"):
            ms.patch(["rms_norm"])
        npubridge.enable_plugin("mindspeed_like")
        npubridge.set_optim_level(1)
        with pytest.warns(RuntimeWarning, match="rms_norm: npubridge's optimisation level is 1 and mindspeed_like's fused "
                          r"kernels need 2 \(npubridge.set_optim_level\(2\), or NPUB_OPT_LEVEL=2\)"):
            assert ms.patch() == []
    finally:
        npubridge.enable_plugin("mindspeed_like")
        npubridge.set_optim_level(level)
    assert "rms_norm" in ms.patch()
