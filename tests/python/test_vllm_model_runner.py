"""npubridge.vllm.ModelRunner: a tiny random-weight transformers Llama run
on the npu over vllm_like's ops and a paged KV cache, against transformers'
own forward of a float64 copy on the CPU (logits, and the K/V it caches).

Error bound (see Note [The error model] in dispatcher/error_bound.h): every
value the runner produces is a chain of float32 reductions (projections,
attention scores and sums, norms) whose rounding errors each stay within
gamma_K * (sum of |terms|). Along the chain the magnitudes are normalised by
the RMS norms, so the worst case accumulates as gamma over the total number
of terms summed along the chain, times the magnitude of the last reduction
(|W| @ |x| of the final projection, from the float64 reference). A wrong
position, block, slot or sequence length moves a logit by far more (the test
weights are scaled up so that attention is sharp, not near uniform).
float16 / bfloat16 runners add each value's roundings to the dtype.
"""
import random

import pytest
import torch

import npubridge  # noqa: F401  (the npu device and the plugins)

import transformers
from npubridge.vllm.model_runner import ModelInput, ModelRunner  # noqa: E402

BLOCK = 8
U32 = 2.0**-24


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                                   initializer_range=0.15, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(cfg).eval()
    reference = transformers.LlamaForCausalLM(cfg).double().eval()
    reference.load_state_dict(model.state_dict())
    return model, reference


def gamma(k):
    return k * U32 / (1 - k * U32)


def chain_terms(cfg, layers, seq_len):
    """Terms summed along the longest chain through `layers` decoder layers
    (norms, qkv, scores, weighted sum, o_proj, gate_up, down)."""
    hd = cfg.hidden_size // cfg.num_attention_heads
    per_layer = 2 * cfg.hidden_size + cfg.hidden_size + hd + seq_len + cfg.num_attention_heads * hd + \
        cfg.hidden_size + cfg.intermediate_size
    return layers * per_layer


class Reference:
    """transformers' float64 forward of whole sequences: logits, each layer's
    cached K/V, and the magnitudes the error bounds need."""

    def __init__(self, model, ids):
        self.normed = []  # per layer: input_layernorm's output
        hooks = [layer.input_layernorm.register_forward_hook(lambda m, i, o: self.normed.append(o[0]))
                 for layer in model.model.layers]
        with torch.no_grad():
            out = model(torch.tensor([ids]), use_cache=True, output_hidden_states=True)
        for h in hooks:
            h.remove()
        cfg = model.config
        self.logits = out.logits[0]
        cache = out["cache"] if "cache" in out else out["past_key_values"]  # renamed in transformers 5
        self.keys = [layer.keys[0].transpose(0, 1) for layer in cache.layers]  # [L, kv_heads, head_size]
        self.values = [layer.values[0].transpose(0, 1) for layer in cache.layers]
        n, L = cfg.num_hidden_layers, len(ids)
        # Magnitudes of the last reduction of each value (|W| @ |x|), and
        # the float32 chain's bounds on them.
        self.logit_mag = out.hidden_states[-1][0].abs() @ model.lm_head.weight.abs().t()
        self.logit_bound = gamma(chain_terms(cfg, n, L) + cfg.hidden_size) * self.logit_mag + 1e-7
        self.k_mag, self.v_mag, self.k_bound, self.v_bound = [], [], [], []
        kv, hd = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
        for i, layer in enumerate(model.model.layers):
            g = gamma(chain_terms(cfg, i, L) + cfg.hidden_size)
            x = self.normed[i].abs()
            mk = (x @ layer.self_attn.k_proj.weight.abs().t()).view(L, kv, hd)
            mv = (x @ layer.self_attn.v_proj.weight.abs().t()).view(L, kv, hd)
            mk = mk + torch.cat([mk[..., hd // 2:], mk[..., :hd // 2]], -1)  # rotate-half mixes pairs
            self.k_mag.append(mk)
            self.v_mag.append(mv)
            self.k_bound.append(g * mk + 1e-7)
            self.v_bound.append(g * mv + 1e-7)


def assert_within(got, want, bound, what):
    err = (got.double() - want).abs()
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"{what}: error {err.max().item():.3g} exceeds its bound by {worst:.3g}x"


class Blocks:
    """Hands out device blocks in a shuffled order, so that no sequence's
    blocks are contiguous or in order."""

    def __init__(self, num_blocks, seed=1):
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)

    def take(self, n):
        taken, self.free = self.free[:n], self.free[n:]
        return taken


def blocks_for(length):
    return (length + BLOCK - 1) // BLOCK


def step(runner, seqs, sample_all=False):
    """One step: seqs = [(token_ids, first_position, block_table)]; returns
    the logits split per sequence (every row when sample_all, else the last)."""
    inp = ModelInput([], [], [], [], [])
    for s, (tokens, start, table) in enumerate(seqs):
        first = len(inp.token_ids)
        inp.token_ids += tokens
        inp.positions += list(range(start, start + len(tokens)))
        inp.seq_index += [s] * len(tokens)
        inp.block_tables.append(table)
        inp.sample_rows += list(range(first, first + len(tokens))) if sample_all else [first + len(tokens) - 1]
    logits = runner.execute(inp)
    assert logits.dtype == torch.float32 and logits.device.type == "cpu"
    assert logits.shape == (len(inp.sample_rows), runner.vocab_size)
    out, row = [], 0
    for tokens, _, _ in seqs:
        n = len(tokens) if sample_all else 1
        out.append(logits[row:row + n])
        row += n
    return out


def check_cache(runner, ref, table, length, what):
    for layer in range(runner.num_layers):
        for b, block in enumerate(table):
            lo, hi = b * BLOCK, min((b + 1) * BLOCK, length)
            if lo >= hi:
                break
            k, v = runner.read_block(layer, block)
            assert k.shape == v.shape == (BLOCK, runner.num_kv_heads, runner.head_size)
            assert_within(k[:hi - lo], ref.keys[layer][lo:hi], ref.k_bound[layer][lo:hi], f"{what} K layer {layer}")
            assert_within(v[:hi - lo], ref.values[layer][lo:hi], ref.v_bound[layer][lo:hi], f"{what} V layer {layer}")


def test_prefill_of_several_sequences_then_decode(models):
    model, reference = models
    runner = ModelRunner(model, block_size=BLOCK, num_device_blocks=40)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 256, (n, ), generator=g).tolist() for n in (5, 17, 33)]
    pool = Blocks(40)
    tables = [pool.take(blocks_for(len(p) + 4)) for p in prompts]
    logits = step(runner, [(p, 0, t) for p, t in zip(prompts, tables)], sample_all=True)
    for s, (p, t) in enumerate(zip(prompts, tables)):
        ref = Reference(reference, p)
        assert_within(logits[s], ref.logits, ref.logit_bound, f"prefill logits of sequence {s}")
        check_cache(runner, ref, t, len(p), f"prefill sequence {s}")
    seqs = [list(p) for p in prompts]
    for _ in range(3):  # decode steps, greedy on the reference's logits
        for s in seqs:
            s.append(int(Reference(reference, s).logits[-1].argmax()))
        logits = step(runner, [(s[-1:], len(s) - 1, t) for s, t in zip(seqs, tables)])
        for s, (seq, t) in enumerate(zip(seqs, tables)):
            ref = Reference(reference, seq)
            assert_within(logits[s][0], ref.logits[-1], ref.logit_bound[-1], f"decode logits of sequence {s}")
    for seq, t in zip(seqs, tables):
        check_cache(runner, Reference(reference, seq), t, len(seq), "after decode")


def test_chunked_prefill_mixed_with_a_decode(models):
    model, reference = models
    runner = ModelRunner(model, block_size=BLOCK, num_device_blocks=16)
    g = torch.Generator().manual_seed(3)
    prompt = torch.randint(0, 256, (23, ), generator=g).tolist()
    other = torch.randint(0, 256, (9, ), generator=g).tolist()
    pool = Blocks(16, seed=4)
    table, other_table = pool.take(blocks_for(23)), pool.take(blocks_for(10))
    first, _ = step(runner, [(prompt[:10], 0, table), (other, 0, other_table)])
    other.append(7)
    # The prompt's second chunk and the other sequence's decode token, in one step.
    second, decode = step(runner, [(prompt[10:], 10, table), (other[-1:], 9, other_table)], sample_all=True)
    ref = Reference(reference, prompt)
    assert_within(first[0], ref.logits[9], ref.logit_bound[9], "first chunk")
    assert_within(second, ref.logits[10:], ref.logit_bound[10:], "second chunk")
    ref_other = Reference(reference, other)
    assert_within(decode[0], ref_other.logits[-1], ref_other.logit_bound[-1], "decode beside the chunk")
    check_cache(runner, ref, table, 23, "chunked prefill")


def test_prefix_cached_prefill_reuses_the_first_sequences_full_blocks(models):
    model, reference = models
    runner = ModelRunner(model, block_size=BLOCK, num_device_blocks=16)
    g = torch.Generator().manual_seed(5)
    a = torch.randint(0, 256, (20, ), generator=g).tolist()  # two full blocks and a partial one
    b = a[:16] + torch.randint(0, 256, (6, ), generator=g).tolist()
    pool = Blocks(16, seed=6)
    table_a = pool.take(blocks_for(20))
    step(runner, [(a, 0, table_a)])
    before = [runner.read_block(layer, blk) for layer in range(runner.num_layers) for blk in table_a]
    table_b = table_a[:2] + pool.take(1)
    logits = step(runner, [(b[16:], 16, table_b)], sample_all=True)[0]  # only the uncached tokens run
    ref = Reference(reference, b)
    assert_within(logits, ref.logits[16:], ref.logit_bound[16:], "prefix-cached prefill")
    check_cache(runner, ref, table_b, len(b), "prefix-cached sequence")
    after = [runner.read_block(layer, blk) for layer in range(runner.num_layers) for blk in table_a]
    for (k0, v0), (k1, v1) in zip(before, after):  # the shared blocks were read, not written
        assert torch.equal(k0, k1) and torch.equal(v0, v1)


def test_long_decode_takes_paged_attention_v2(models):
    model, reference = models
    runner = ModelRunner(model, block_size=BLOCK, num_device_blocks=80)
    g = torch.Generator().manual_seed(7)
    seq = torch.randint(0, 256, (600, ), generator=g).tolist()
    table = Blocks(80, seed=8).take(blocks_for(601))
    step(runner, [(seq, 0, table)])  # 600 queries x 4 heads > 512: v1
    assert runner.attention_calls == {"v1": runner.num_layers, "v2": 0}
    seq.append(11)
    logits = step(runner, [(seq[-1:], 600, table)])[0][0]  # one query over two partitions: v2
    assert runner.attention_calls == {"v1": runner.num_layers, "v2": runner.num_layers}
    ref = Reference(reference, seq)
    assert_within(logits, ref.logits[-1], ref.logit_bound[-1], "decode at 601 tokens")


def test_copy_blocks_and_swap_round_trip(models):
    model, reference = models
    runner = ModelRunner(model, block_size=BLOCK, num_device_blocks=12, num_cpu_blocks=6)
    g = torch.Generator().manual_seed(9)
    seq = torch.randint(0, 256, (21, ), generator=g).tolist()
    table = [5, 2, 9]
    step(runner, [(seq, 0, table)])
    layers = range(runner.num_layers)
    original = {blk: [runner.read_block(i, blk) for i in layers] for blk in table}

    runner.copy_blocks([(5, 0), (9, 7)])  # copy-on-write copies, every layer
    for src, dst in [(5, 0), (9, 7)]:
        for i in layers:
            assert all(torch.equal(x, y) for x, y in zip(runner.read_block(i, dst), original[src][i]))

    runner.swap_out([(5, 3), (2, 0), (9, 5)])
    for dev, cpu in [(5, 3), (2, 0), (9, 5)]:
        for i in layers:
            assert all(torch.equal(x, y) for x, y in zip(runner.read_block(i, cpu, on="cpu"), original[dev][i]))
    runner.copy_blocks([(1, 5), (1, 2), (1, 9)])  # clobber the device blocks (block 1 was never written)
    runner.swap_in([(3, 10), (0, 4), (5, 2)])  # back into other device blocks
    moved = [10, 4, 2]
    for old, new in zip(table, moved):
        for i in layers:
            assert all(torch.equal(x, y) for x, y in zip(runner.read_block(i, new), original[old][i]))
    # And the swapped-in cache serves a decode step.
    seq.append(3)
    logits = step(runner, [(seq[-1:], 21, moved)])[0][0]
    ref = Reference(reference, seq)
    assert_within(logits, ref.logits[-1], ref.logit_bound[-1], "decode after swap-in")


def test_tied_embeddings_and_block_bytes():
    torch.manual_seed(1)
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                   tie_word_embeddings=True, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(cfg).eval()
    runner = ModelRunner(model, block_size=4, num_device_blocks=2)
    assert runner.lm_head is runner.embed
    reference = transformers.LlamaForCausalLM(cfg).double().eval()
    reference.load_state_dict(model.state_dict())
    ids = [1, 5, 9, 2, 33]
    ref = Reference(reference, ids)
    got = runner.execute(ModelInput(ids, list(range(5)), [0] * 5, [[1, 0]], [4]))
    assert_within(got[0], ref.logits[-1], ref.logit_bound[-1], "tied-embedding logits")
    assert ModelRunner.block_bytes(cfg, 16, torch.float16) == 2 * 1 * 16 * 1 * 16 * 2


def test_bad_input_is_refused_by_name(models):
    model, _ = models
    runner = ModelRunner(model, block_size=BLOCK, num_device_blocks=4)
    with pytest.raises(IndexError, match=r"positions\[1\] = 8 needs block 1 of sequence 0"):
        runner.execute(ModelInput([1, 2], [7, 8], [0, 0], [[3]], [1]))
    with pytest.raises(IndexError, match="seq_index"):
        runner.execute(ModelInput([1], [0], [1], [[3]], [0]))
    with pytest.raises(IndexError, match=r"block_tables\[0\]\[1\] = 4 is outside the 4 device blocks"):
        runner.execute(ModelInput([1, 2], [7, 8], [0, 0], [[3, 4]], [1]))
    with pytest.raises(IndexError, match=r"positions\[0\] = 1024 is outside \[0, 1024\)"):
        runner.execute(ModelInput([1], [1024], [0], [[3]], [0]))
    with pytest.raises(IndexError, match="token ids"):
        runner.execute(ModelInput([256], [0], [0], [[3]], [0]))
    with pytest.raises(IndexError, match="copy_blocks"):
        runner.copy_blocks([(0, 4)])
    with pytest.raises(IndexError, match=r"swap_blocks: block_mapping\[0\]\[1\]: destination block 0 is out of range"):
        runner.swap_out([(0, 0)])  # no CPU blocks
    assert runner.execute(ModelInput([], [], [], [], [])).shape == (0, 256)


# Roundings to the compute dtype along one layer of the chain (norm, qkv,
# rope, attention output, o_proj, residual add, norm, gate_up, activation,
# down, residual add) and after the last (final norm, logits). A HEURISTIC,
# not a derived bound: it charges each rounding u times the logit (or K/V)
# magnitude once, i.e. assumes every rounding error reaches the output with a
# gain of at most one relative to that magnitude, which the norms and the
# softmax do not guarantee. It holds with margin on this model; a derived
# 16-bit bound would propagate each rounding through the later layers.
ROUNDINGS_PER_LAYER, ROUNDINGS_AFTER = 11, 2


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_caches_and_logits(models, dtype):
    """16-bit caches use x = 8 in the key layout (float32: 4): the cache
    contents and logits of a prefill and a decode, within the float32 bound
    plus a rounding-count heuristic (see ROUNDINGS_PER_LAYER; u = 2^-11 /
    2^-8 per rounding), not a derived bound."""
    model, reference = models
    runner = ModelRunner(model, block_size=BLOCK, num_device_blocks=12, dtype=dtype)
    assert runner.key_caches[0].shape[-1] == 8 and runner.key_caches[0].dtype == dtype
    u = 2.0**-11 if dtype == torch.float16 else 2.0**-8
    g = torch.Generator().manual_seed(10)
    seq = torch.randint(0, 256, (19, ), generator=g).tolist()
    table = Blocks(12, seed=11).take(blocks_for(20))
    step(runner, [(seq, 0, table)])
    seq.append(5)
    logits = step(runner, [(seq[-1:], 19, table)])[0][0]
    ref = Reference(reference, seq)
    layers = runner.num_layers
    bound = ref.logit_bound[-1] + (ROUNDINGS_PER_LAYER * layers + ROUNDINGS_AFTER) * u * ref.logit_mag[-1]
    assert_within(logits, ref.logits[-1], bound, f"{dtype} decode logits")
    for layer in range(layers):
        extra = (ROUNDINGS_PER_LAYER * layer + 3) * u  # earlier layers', then this one's norm, projection, rope
        for b, block in enumerate(table):
            lo, hi = b * BLOCK, min((b + 1) * BLOCK, len(seq))
            k, v = runner.read_block(layer, block)
            assert k.dtype == v.dtype == dtype
            assert_within(k[:hi - lo], ref.keys[layer][lo:hi],
                          ref.k_bound[layer][lo:hi] + extra * ref.k_mag[layer][lo:hi], f"{dtype} K layer {layer}")
            assert_within(v[:hi - lo], ref.values[layer][lo:hi],
                          ref.v_bound[layer][lo:hi] + extra * ref.v_mag[layer][lo:hi], f"{dtype} V layer {layer}")


def test_attention_ops_and_layout_come_from_custom_ops(models, monkeypatch):
    """One implementation each: the runner's attention is
    _custom_ops.paged_attention (v1/v2 choice and v2's buffers), its ops come
    from _custom_ops._op, and the cache shapes (x = 16 / element size, checked
    against head_size) from _custom_ops.legacy_cache_shapes."""
    from npubridge.vllm import _custom_ops

    model, _ = models
    versions = []
    original = _custom_ops.paged_attention

    def spy(*args, **kwargs):
        versions.append(original(*args, **kwargs))
        return versions[-1]

    monkeypatch.setattr(_custom_ops, "paged_attention", spy)
    runner = ModelRunner(model, block_size=BLOCK, num_device_blocks=4)
    runner.execute(ModelInput([1, 2], [0, 1], [0, 0], [[3]], [1]))
    assert versions == ["v1"] * runner.num_layers and runner.attention_calls["v1"] == runner.num_layers
    with pytest.raises(RuntimeError, match=r"vllm_like::no_such_op is not available: the loaded vllm_like plugin "
                       r"\(.*\) has no such op"):
        _custom_ops._op("no_such_op")
    cfg = transformers.LlamaConfig(hidden_size=24, num_attention_heads=4, num_hidden_layers=1)  # head_size 6
    with pytest.raises(ValueError, match="head_size: expected a multiple of x = 16 / element_size = 8"):
        ModelRunner.block_bytes(cfg, 16, torch.float16)
