"""vllm_like's KV-cache ops on npu tensors, through
npubridge.vllm._custom_ops: reshape_and_cache (legacy layout) and
reshape_and_cache_flash element by element, padding slots skipped;
copy_blocks over every layer; swap_blocks npu->cpu->npu (the round trip
restores the blocks exactly), cpu->npu, npu->npu and cpu->cpu; a cache
written by reshape_and_cache read back by paged attention; errors by
message, with the caches unchanged."""
import pytest
import torch

import npubridge
from npubridge.vllm import _custom_ops as ops

# The in-tree plugin is built with the extension: not loaded is a failure,
# never a skip (a broken build must not shrink the suite).
@pytest.fixture(autouse=True)
def _vllm_like_is_loaded():
    assert any(p["name"] == "vllm_like" for p in npubridge.plugins()), \
        f"the vllm_like plugin is not loaded: {npubridge.load_failures()}"

DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def legacy_caches(nb, kvh, d, bs, dtype):
    kshape, vshape = ops.legacy_cache_shapes(nb, kvh, d, bs, dtype)
    return torch.randn(kshape).to(dtype), torch.randn(vshape).to(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("bs", [8, 16, 32])
def test_reshape_and_cache_writes_each_slot(dtype, bs):
    torch.manual_seed(bs)
    nb, kvh, d, tokens = 5, 2, 64, 30
    kc, vc = legacy_caches(nb, kvh, d, bs, dtype)
    key, value = torch.randn(tokens, kvh, d).to(dtype), torch.randn(tokens, kvh, d).to(dtype)
    slots = torch.randperm(nb * bs)[:tokens]
    slots[::5] = -1  # padding tokens
    kn, vn = kc.to("npu"), vc.to("npu")
    ops.reshape_and_cache(key.to("npu"), value.to("npu"), kn, vn, slots.to("npu"), "auto", 1.0, 1.0)
    kn, vn = kn.cpu(), vn.cpu()
    x = ops.kv_cache_x(dtype)
    written = set()
    for t, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        written.add(slot)
        b, off = divmod(slot, bs)
        for h in range(kvh):
            for dim in range(0, d, 7):
                assert kn[b, h, dim // x, off, dim % x] == key[t, h, dim]
            assert torch.equal(vn[b, h, :, off], value[t, h])
            assert torch.equal(kn[b, h, :, off, :].reshape(-1), key[t, h])
    # Every other slot keeps its contents.
    for slot in range(nb * bs):
        if slot not in written:
            b, off = divmod(slot, bs)
            assert torch.equal(kn[b, :, :, off], kc[b, :, :, off]) and torch.equal(vn[b, :, :, off], vc[b, :, :, off])


@pytest.mark.parametrize("dtype", DTYPES)
def test_reshape_and_cache_flash(dtype):
    torch.manual_seed(0)
    nb, bs, kvh, d, tokens = 4, 16, 3, 32, 20
    kc, vc = torch.randn(nb, bs, kvh, d).to(dtype), torch.randn(nb, bs, kvh, d).to(dtype)
    key, value = torch.randn(tokens + 2, kvh, d).to(dtype), torch.randn(tokens + 2, kvh, d).to(dtype)
    slots = torch.randperm(nb * bs)[:tokens]
    slots[3] = -1
    kn, vn = kc.to("npu"), vc.to("npu")
    # Key rows beyond slot_mapping's length (padding) are not written, as in vLLM.
    ops.reshape_and_cache_flash(key.to("npu"), value.to("npu"), kn, vn, slots.to("npu"), "auto", 1.0, 1.0)
    ek, ev = kc.clone(), vc.clone()
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            ek[slot // bs, slot % bs], ev[slot // bs, slot % bs] = key[t], value[t]
    assert torch.equal(kn.cpu(), ek) and torch.equal(vn.cpu(), ev)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reshape_and_cache_flash_through_strides_as_vllm_lays_it_out(dtype):
    """vLLM's layout (npubridge.vllm.attention): one [blocks, kv_heads,
    block_size, 2 * head_size] tensor per layer, key and value the two
    halves of its last dim seen as [blocks, block_size, kv_heads, head_size]
    views, and key and value slices of the fused qkv projection. Written in
    place through the strides, nothing else of the tensor touched."""
    torch.manual_seed(2)
    nb, bs, kvh, d, h, tokens = 5, 16, 2, 16, 4, 37
    kv = torch.randn(nb, kvh, bs, 2 * d).to(dtype)
    qkv = torch.randn(tokens, (h + 2 * kvh) * d).to(dtype)
    slots = torch.randperm(nb * bs)[:tokens]
    slots[5] = -1
    kvn, qkvn = kv.to("npu"), qkv.to("npu")

    def views(kv_, qkv_):
        kc, vc = kv_.transpose(1, 2).split(d, dim=-1)
        _, k, v = qkv_.split([h * d, kvh * d, kvh * d], dim=-1)
        return kc, vc, k.view(tokens, kvh, d), v.view(tokens, kvh, d)

    kcn, vcn, kn, vn = views(kvn, qkvn)
    assert not kcn.is_contiguous() and not kn.is_contiguous()
    npubridge.reset_stats()
    ops.reshape_and_cache_flash(kn, vn, kcn, vcn, slots.to("npu"), "auto", 1.0, 1.0)
    assert npubridge.stats()["vllm_like::reshape_and_cache_flash"]["fallbacks"] == 0
    expected = kv.clone()
    kc, vc, k, v = views(expected, qkv)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            kc[slot // bs, slot % bs], vc[slot // bs, slot % bs] = k[t], v[t]
    assert torch.equal(kvn.cpu(), expected)


def test_cache_written_by_reshape_and_cache_serves_paged_attention():
    torch.manual_seed(1)
    n, h, kvh, d, bs = 45, 4, 2, 64, 16
    kc, vc = legacy_caches(6, kvh, d, bs, torch.float32)
    kc, vc = kc.to("npu"), vc.to("npu")
    key, value, q = torch.randn(n, kvh, d), torch.randn(n, kvh, d), torch.randn(1, h, d)
    table = torch.tensor([[4, 0, 5, 2]], dtype=torch.int32)
    slots = torch.tensor([int(table[0, t // bs]) * bs + t % bs for t in range(n)])
    ops.reshape_and_cache(key.to("npu"), value.to("npu"), kc, vc, slots.to("npu"), "auto", 1.0, 1.0)
    out = torch.empty(1, h, d, device="npu")
    ops.paged_attention_v1(out, q.to("npu"), kc, vc, kvh, d**-0.5, table.to("npu"),
                           torch.tensor([n], dtype=torch.int32).to("npu"), bs, n, None, "auto")
    # The float64 reference and the float32 kernel's derived error bound of
    # the attention tests.
    from test_vllm_attention import bound, check, reference

    qq, kk, vv = q.double(), [key.double()], [value.double()]
    ref = reference(qq, kk, vv, [n], d**-0.5)
    check(out, ref, bound(qq, kk, vv, [n], d**-0.5, torch.float32, ref))


@pytest.mark.parametrize("dtype", DTYPES)
def test_copy_blocks_every_layer(dtype):
    torch.manual_seed(2)
    layers = [legacy_caches(6, 2, 32, 8, dtype) for _ in range(3)]
    keys = [k.to("npu") for k, _ in layers]
    values = [v.to("npu") for _, v in layers]
    mapping = [(0, 3), (1, 5), (1, 4)]
    ops.copy_blocks(keys, values, torch.tensor(mapping))
    for (k, v), kn, vn in zip(layers, keys, values):
        ek, ev = k.clone(), v.clone()
        for s, dst in mapping:
            ek[dst], ev[dst] = k[s], v[s]
        assert torch.equal(kn.cpu(), ek) and torch.equal(vn.cpu(), ev)


@pytest.mark.parametrize("dtype", DTYPES)
def test_swap_blocks_npu_cpu_round_trip(dtype):
    torch.manual_seed(3)
    dev, _ = legacy_caches(8, 2, 64, 16, dtype)
    host = torch.zeros((5, ) + dev.shape[1:], dtype=dtype)
    dev_npu = dev.to("npu")
    out_pairs = [(6, 0), (2, 3), (7, 4)]
    ops.swap_blocks(dev_npu, host, out_pairs)  # swap out: npu -> cpu
    for s, d in out_pairs:
        assert torch.equal(host[d], dev[s])
    assert (host[[1, 2]] == 0).all()
    back = torch.zeros_like(dev_npu)
    ops.swap_blocks(host, back, torch.tensor([(0, 1), (3, 5), (4, 0)]))  # swap in: cpu -> npu
    back = back.cpu()
    assert torch.equal(back[1], dev[6]) and torch.equal(back[5], dev[2]) and torch.equal(back[0], dev[7])
    assert (back[[2, 3, 4, 6, 7]] == 0).all()


def test_swap_blocks_same_device():
    torch.manual_seed(4)
    src, dst = torch.randn(4, 3, 8), torch.randn(6, 3, 8)
    sn, dn = src.to("npu"), dst.to("npu")
    ops.swap_blocks(sn, dn, [(3, 5), (0, 0)])  # the npu kernel
    expected = dst.clone()
    expected[5], expected[0] = src[3], src[0]
    assert torch.equal(dn.cpu(), expected)
    ops.swap_blocks(src, dst, [(3, 5), (0, 0)])  # host caches
    assert torch.equal(dst, expected)


def test_swap_blocks_errors_leave_dst_unchanged():
    src, dst = torch.randn(4, 3, 8).to("npu"), torch.zeros(6, 3, 8)
    with pytest.raises(IndexError, match=r"vllm_like::swap_blocks: block_mapping\[1\]\[1\]: destination block 6 is "
                       r"out of range for 6 cache blocks \(expected 0 <= id < 6\)"):
        ops.swap_blocks(src, dst, [(0, 0), (1, 6)])
    assert (dst == 0).all()
    with pytest.raises(IndexError, match=r"block_mapping\[0\]\[0\]: source block 4 is out of range"):
        ops.swap_blocks(src, dst, [(4, 0)])
    with pytest.raises(RuntimeError, match=r"swap_blocks: dst: expected blocks of src's dtype and shape"):
        ops.swap_blocks(src, torch.zeros(6, 3, 8, dtype=torch.float16), [(0, 0)])
    with pytest.raises(IndexError, match=r"vllm_like::swap_blocks: block_mapping\[0\]\[0\]: source block of src "
                       r"4 is out of range"):
        torch.ops.vllm_like.swap_blocks(src, torch.zeros(6, 3, 8, device="npu"),
                                        torch.tensor([[4, 0]], device="npu"))


def test_cache_op_errors_by_message():
    kc, vc = legacy_caches(2, 2, 64, 16, torch.float32)
    kn, vn = kc.to("npu"), vc.to("npu")
    key = torch.randn(3, 2, 64, device="npu")
    with pytest.raises(IndexError, match=r"vllm_like::reshape_and_cache: slot_mapping\[2\]: slot 32 is out of range "
                       r"for 2 blocks of 16 slots \(expected a slot < 32, or a negative one to skip the token\)"):
        ops.reshape_and_cache(key, key, kn, vn, torch.tensor([0, 1, 32], device="npu"), "auto", 1.0, 1.0)
    assert torch.equal(kn.cpu(), kc)  # checked before anything is written
    with pytest.raises(RuntimeError, match=r"reshape_and_cache: kv_cache_dtype: expected 'auto' .* but found "
                       r"'fp8_e4m3'"):
        ops.reshape_and_cache(key, key, kn, vn, torch.tensor([0, 1, 2], device="npu"), "fp8_e4m3", 1.0, 1.0)
    with pytest.raises(RuntimeError, match=r"reshape_and_cache: k_scale, v_scale: expected 1.0"):
        ops.reshape_and_cache(key, key, kn, vn, torch.tensor([0, 1, 2], device="npu"), "auto", 0.5, 1.0)
    with pytest.raises(RuntimeError, match=r"reshape_and_cache: key: expected \[num_tokens, num_kv_heads, "
                       r"head_size\] = \[\*, 2, 64\] \(from key_cache\) but found \[3, 2, 32\]"):
        ops.reshape_and_cache(key[..., :32].contiguous(), key[..., :32].contiguous(), kn, vn,
                              torch.tensor([0, 1, 2], device="npu"), "auto", 1.0, 1.0)
    with pytest.raises(IndexError, match=r"vllm_like::copy_blocks: block_mapping\[0\]\[1\]: destination block of "
                       r"key_caches\[0\] 2 is out of range for 2 cache blocks"):
        ops.copy_blocks([kn], [vn], [(0, 2)])
    with pytest.raises(RuntimeError, match=r"copy_blocks: value_caches: expected one per key cache \(1\) but found 2"):
        ops.copy_blocks([kn], [vn, vn.clone()], [(0, 1)])


# Errors of the cache ops' arguments (from the retired engine's user-error tests).


def _legacy_cache_lists(num_blocks=4, kv_heads=2, head_size=8, block_size=8, layers=2):
    from npubridge.vllm import _custom_ops
    kshape, vshape = _custom_ops.legacy_cache_shapes(num_blocks, kv_heads, head_size, block_size, torch.float32)
    return ([torch.randn(kshape).to("npu") for _ in range(layers)],
            [torch.randn(vshape).to("npu") for _ in range(layers)])


def test_copy_blocks_refuses_empty_lists_and_overlapping_caches():
    from npubridge.vllm import _custom_ops
    with pytest.raises(RuntimeError, match="copy_blocks: key_caches, value_caches: expected one cache per layer but "
                       "found lists of 0 and 0"):
        _custom_ops.copy_blocks([], [], [(0, 3)])
    keys, values = _legacy_cache_lists()
    with pytest.raises(RuntimeError, match="value_caches\\[1\\] and key_caches\\[0\\] overlap|key_caches\\[0\\] and "
                       "value_caches\\[1\\] overlap"):
        _custom_ops.copy_blocks(keys, [values[0], keys[0]], [(0, 3)])
    # Per-layer views of one allocation do not overlap: accepted, and copied.
    whole = torch.randn((2, ) + tuple(keys[0].shape)).to("npu")
    _custom_ops.copy_blocks([whole[0], whole[1]], values, [(0, 3)])
    assert torch.equal(whole[1, 3].cpu(), whole[1, 0].cpu())


def test_copy_blocks_kernel_refuses_caches_that_disagree():
    keys, values = _legacy_cache_lists()
    mapping = torch.tensor([[0, 3]]).to("npu")
    # A value cache with another block size than the key cache's (16 tokens, not 8).
    wrong_value = torch.zeros(4, 2, 8, 16).to("npu")
    with pytest.raises(RuntimeError, match="value_caches\\[0\\]: expected the dtype and the block size .* of "
                       "key_caches\\[0\\] \\(float32 \\[4, 2, 2, 8, 4\\]\\) but found float32 \\[4, 2, 8, 16\\]"):
        torch.ops.vllm_like.copy_blocks([keys[0]], [wrong_value], mapping)
    with pytest.raises(RuntimeError, match="key_caches\\[1\\]: expected key_caches\\[0\\]'s dtype and shape"):
        torch.ops.vllm_like.copy_blocks([keys[0], keys[1][:, :1].contiguous()], values, mapping)
    # A dtype mismatch is refused by the dispatcher (one dispatch dtype per call), naming the list.
    with pytest.raises(RuntimeError, match="'value_caches' to be float32 .* but found float16"):
        torch.ops.vllm_like.copy_blocks(keys, [values[0], values[1].half()], mapping)
    # Empty lists never reach the kernel (the dispatch dtype would be block_mapping's int64): _custom_ops refuses them.


def test_swap_blocks_of_0d_tensors_asks_for_a_block_dimension():
    from npubridge.vllm import _custom_ops
    msg = "swap_blocks: src, dst: expected caches with a block dimension \\(dim 0\\) but found shapes \\[\\] and \\[\\]"
    with pytest.raises(RuntimeError, match=msg):
        _custom_ops.swap_blocks(torch.tensor(1.0), torch.tensor(2.0), [(0, 0)])
    with pytest.raises(RuntimeError, match=msg):
        torch.ops.vllm_like.swap_blocks(torch.tensor(1.0).to("npu"), torch.tensor(2.0).to("npu"),
                                        torch.zeros(1, 2, dtype=torch.int64).to("npu"))
