"""npubridge.vllm.scheduler and the engine's step loop, over a stand-in
model runner whose "KV cache" holds each slot's (token, position).

HistoryRunner has ModelRunner's interface; its logits are a fixed
pseudo-random function of the token history it READS BACK from its paged
cache through the block table, so a wrong block table, a missing
copy-on-write copy or a bad swap gives different tokens than the reference
(the same function applied to the true history). The real runner on the
npu is tested in test_vllm_engine.py.
"""
import pytest
import torch

from npubridge.vllm import SamplingParams
from npubridge.vllm.engine import LLMEngine

VOCAB = 40
EOS = 3


def next_logits(tokens):
    g = torch.Generator().manual_seed(hash(tuple(tokens)) & 0x7FFFFFFF)
    return torch.randn(VOCAB, generator=g)


def reference_greedy(prompt, max_tokens, eos=EOS):
    out = []
    while len(out) < max_tokens:
        t = int(torch.argmax(next_logits(prompt + out)))
        out.append(t)
        if t == eos:
            break
    return out


class HistoryRunner:

    def __init__(self, block_size, num_device_blocks, num_cpu_blocks=0):
        self.block_size = block_size
        self.device = torch.full((num_device_blocks, block_size, 2), -1, dtype=torch.long)
        self.cpu = torch.full((max(num_cpu_blocks, 1), block_size, 2), -1, dtype=torch.long)
        self.log = []

    def execute(self, inp):
        bs = self.block_size
        assert len(inp.token_ids) == len(inp.positions) == len(inp.seq_index)
        for tok, pos, s in zip(inp.token_ids, inp.positions, inp.seq_index):
            self.device[inp.block_tables[s][pos // bs], pos % bs] = torch.tensor([tok, pos])
        rows = []
        for r in inp.sample_rows:
            table, pos = inp.block_tables[inp.seq_index[r]], inp.positions[r]
            hist = [self.device[table[p // bs], p % bs] for p in range(pos + 1)]
            assert [int(h[1]) for h in hist] == list(range(pos + 1)), "the cache holds another sequence's slots"
            rows.append(next_logits([int(h[0]) for h in hist]))
        self.log.append(("execute", len(inp.token_ids)))
        return torch.stack(rows) if rows else torch.empty(0, VOCAB)

    def copy_blocks(self, pairs):
        for s, d in pairs:
            self.device[d] = self.device[s]
        self.log.append(("copy", list(pairs)))

    def swap_out(self, pairs):
        for d, c in pairs:
            self.cpu[c] = self.device[d]
        self.log.append(("swap_out", list(pairs)))

    def swap_in(self, pairs):
        for c, d in pairs:
            self.device[d] = self.cpu[c]
        self.log.append(("swap_in", list(pairs)))

    def read_block(self, layer, block, on="npu"):
        cache = self.cpu if on == "cpu" else self.device
        return cache[block, :, 0], cache[block, :, 1]


def make_engine(block_size=4, num_device_blocks=64, num_cpu_blocks=0, **kw):
    runner = HistoryRunner(block_size, num_device_blocks, num_cpu_blocks)
    kw.setdefault("watermark", 0.0)
    engine = LLMEngine(runner, block_size=block_size, num_device_blocks=num_device_blocks,
                       num_cpu_blocks=num_cpu_blocks, vocab_size=VOCAB, max_model_len=512, eos_token_id=EOS, **kw)
    return engine, runner


def check_cache_contents(engine, runner):
    """Every running sequence finds its computed tokens in its blocks."""
    bm, bs = engine.block_manager, engine.block_manager.block_size
    for group in engine.scheduler.running:
        for seq in group.unfinished_seqs():
            table = bm.get_block_table(seq)
            for p in range(seq.num_computed_tokens):
                tok, pos = runner.read_block(0, table[p // bs])
                assert (int(tok[p % bs]), int(pos[p % bs])) == (seq.token_at(p), p), f"{seq} at position {p}"


def run(engine, runner, prompts, params, check=True):
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(str(i), {"prompt_token_ids": p}, sp)
    done, steps = {}, []
    while engine.has_unfinished_requests():
        outs = engine.step()
        engine.block_manager.check_invariants()
        if check:
            check_cache_contents(engine, runner)
        steps.append(engine.scheduler)
        for o in outs:
            if o.finished:
                done[o.request_id] = o
    assert engine.block_manager.get_num_free_device_blocks() == engine.block_manager.device.num_blocks
    return [done[str(i)] for i in range(len(prompts))]


PROMPTS = [[(7 * i + j) % VOCAB for j in range(n)] for i, n in enumerate([5, 17, 1, 9, 30, 12, 4, 23])]


def greedy(max_tokens=12, **kw):
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kw)


def assert_reference(outs, prompts, max_tokens=12):
    for out, p in zip(outs, prompts):
        assert out.outputs[0].token_ids == reference_greedy(p, max_tokens), out.request_id
        last = out.outputs[0].token_ids[-1]
        assert out.outputs[0].finish_reason == ("stop" if last == EOS else "length")


def test_greedy_matches_the_reference_with_prefill_and_decode_in_one_step():
    engine, runner = make_engine()
    original = engine.scheduler.schedule
    mixed = []

    def spy():
        out = original()
        kinds = {s.do_sample and s.num_new_tokens == 1 for s in out.scheduled}
        mixed.append(len(kinds) == 2)
        return out

    engine.scheduler.schedule = spy
    # Requests arrive while others decode.
    engine.add_request("a", {"prompt_token_ids": PROMPTS[0]}, greedy())
    engine.step()
    engine.add_request("b", {"prompt_token_ids": PROMPTS[1]}, greedy())
    outs = {}
    while engine.has_unfinished_requests():
        for o in engine.step():
            outs[o.request_id] = o
    assert any(mixed)
    assert_reference([outs["a"], outs["b"]], PROMPTS[:2])


def test_budgets_max_num_seqs_and_max_num_batched_tokens():
    engine, runner = make_engine(max_num_seqs=3, max_num_batched_tokens=40)
    seen = []
    original = engine.scheduler.schedule

    def spy():
        out = original()
        seen.append((len(engine.scheduler.running), out.num_batched_tokens))
        return out

    engine.scheduler.schedule = spy
    outs = run(engine, runner, PROMPTS, [greedy()] * len(PROMPTS))
    assert_reference(outs, PROMPTS)
    assert max(r for r, _ in seen) == 3
    assert max(t for _, t in seen) <= 40
    with pytest.raises(ValueError, match="more than max_num_batched_tokens"):
        engine.add_request("long", {"prompt_token_ids": [1] * 41}, greedy())


def test_chunked_prefill_splits_a_long_prompt_across_steps():
    engine, runner = make_engine(max_num_seqs=4, max_num_batched_tokens=8, enable_chunked_prefill=True)
    outs = run(engine, runner, PROMPTS, [greedy()] * len(PROMPTS))
    assert_reference(outs, PROMPTS)
    assert all(n <= 8 for kind, n in runner.log if kind == "execute")


@pytest.mark.parametrize("mode", [None, "swap", "recompute"])
def test_preemption_keeps_outputs_exact(mode):
    # 16 device blocks of 4 tokens for 8 requests growing to up to 42 tokens.
    engine, runner = make_engine(num_device_blocks=16, num_cpu_blocks=32 if mode != "recompute" else 0,
                                 preemption_mode=mode)
    outs = run(engine, runner, PROMPTS, [greedy(ignore_eos=True)] * len(PROMPTS))
    for out, p in zip(outs, PROMPTS):
        expected = []
        for _ in range(12):
            expected.append(int(torch.argmax(next_logits(p + expected))))
        assert out.outputs[0].token_ids == expected
    st = engine.stats()
    if mode == "recompute":
        assert st["num_preemptions_recompute"] > 0 and st["num_preemptions_swap"] == 0
    else:
        assert st["num_preemptions_swap"] > 0 and st["blocks_swapped_in"] == st["blocks_swapped_out"] > 0
    assert st["num_free_cpu_blocks"] == st["num_cpu_blocks"]


def test_swap_falls_back_to_recompute_when_the_cpu_pool_is_full():
    engine, runner = make_engine(num_device_blocks=16, num_cpu_blocks=2, preemption_mode="swap")
    outs = run(engine, runner, PROMPTS, [greedy(ignore_eos=True)] * len(PROMPTS))
    st = engine.stats()
    assert st["num_preemptions_recompute"] > 0
    assert all(len(o.outputs[0].token_ids) == 12 for o in outs)


def test_swapped_groups_come_back_before_new_admissions():
    engine, runner = make_engine(num_device_blocks=10, num_cpu_blocks=32)
    order = []
    original = engine.scheduler.schedule

    def spy():
        out = original()
        for s in out.scheduled:
            if s.seq.num_computed_tokens == 0:
                order.append(s.group.request_id)
        # Nothing is admitted from waiting while anything is swapped out.
        if engine.scheduler.swapped:
            assert not any(s.seq.num_computed_tokens == 0 and not s.seq.output_token_ids for s in out.scheduled)
        return out

    engine.scheduler.schedule = spy
    run(engine, runner, PROMPTS[:6], [greedy(ignore_eos=True)] * 6)
    assert order == sorted(order, key=int)  # admitted first come, first served
    assert engine.stats()["num_preemptions_swap"] > 0


def test_parallel_sampling_forks_shares_the_prompt_and_copies_on_write():
    engine, runner = make_engine(num_device_blocks=64)
    prompt = PROMPTS[1]  # 17 tokens: 4 full blocks and one with 1 token
    engine.add_request("n4", {"prompt_token_ids": prompt}, SamplingParams(n=4, temperature=1.0, seed=5,
                                                                          max_tokens=6, ignore_eos=True))
    engine.step()  # prefill once, fork into 4
    group = engine.scheduler.running[0]
    assert len(group.seqs) == 4
    tables = [list(engine.block_manager.get_block_table(s)) for s in group.seqs]
    assert all(t == tables[0] for t in tables)
    assert [engine.block_manager.device.ref_counts[b] for b in tables[0]] == [4] * 5
    prefills = [n for kind, n in runner.log if kind == "execute"]
    assert prefills == [17]
    engine.step()  # the first decode writes into the shared last block
    copies = [p for kind, p in runner.log if kind == "copy"]
    assert len(copies) == 1 and len(copies[0]) == 3 and {s for s, _ in copies[0]} == {tables[0][4]}
    check_cache_contents(engine, runner)
    while engine.has_unfinished_requests():
        outs = engine.step()
        check_cache_contents(engine, runner)
    assert len(outs[0].outputs) == 4 and all(len(c.token_ids) == 6 for c in outs[0].outputs)
    assert len({tuple(c.token_ids) for c in outs[0].outputs}) > 1


def test_prefix_caching_skips_cached_blocks_and_keeps_outputs():
    engine, runner = make_engine(enable_prefix_caching=True)
    shared = list(range(20))
    prompts = [shared + [30 + i] for i in range(4)]
    first = run(engine, runner, prompts[:1], [greedy()])
    computed = []
    for i, p in enumerate(prompts[1:], 1):
        engine.add_request(f"p{i}", {"prompt_token_ids": p}, greedy())
    while engine.has_unfinished_requests():
        engine.step()
        check_cache_contents(engine, runner)
    computed = [n for kind, n in runner.log if kind == "execute"]
    assert computed[0] == 21  # the first prompt in full
    st = engine.stats()
    assert st["prefix_cache_hits"] == 3 * 20  # 5 full blocks of each later prompt
    assert first[0].outputs[0].token_ids == reference_greedy(prompts[0], 12)
    # The later prompts' prefill is their last token alone.
    assert computed[len(first[0].outputs[0].token_ids)] == 3


def test_abort_frees_blocks_everywhere():
    engine, runner = make_engine(num_device_blocks=10, num_cpu_blocks=32)
    for i, p in enumerate(PROMPTS[:5]):
        engine.add_request(str(i), {"prompt_token_ids": p}, greedy(max_tokens=30, ignore_eos=True))
    for _ in range(6):
        engine.step()
    sched = engine.scheduler
    assert sched.running and (sched.swapped or sched.waiting)
    engine.abort_request([str(i) for i in range(5)])
    assert not engine.has_unfinished_requests()
    engine.block_manager.check_invariants()
    st = engine.stats()
    assert st["num_free_device_blocks"] == 10 and st["num_free_cpu_blocks"] == 32


def test_stop_conditions():
    engine, runner = make_engine()
    p = PROMPTS[3]
    ref = reference_greedy(p, 30, eos=-1)
    stop_at = ref[4]
    first = ref.index(stop_at)
    outs = run(engine, runner, [p] * 4, [
        greedy(30, ignore_eos=True, stop_token_ids=[stop_at]),
        greedy(30, ignore_eos=True, stop_token_ids=[stop_at], min_tokens=first + 2),
        greedy(3, ignore_eos=True),
        greedy(30, ignore_eos=False),
    ])
    assert outs[0].outputs[0].token_ids == ref[:first + 1]
    assert outs[0].outputs[0].finish_reason == "stop" and outs[0].outputs[0].stop_reason == stop_at
    assert stop_at not in outs[1].outputs[0].token_ids[:first + 2]
    assert outs[2].outputs[0].token_ids == ref[:3] and outs[2].outputs[0].finish_reason == "length"
    assert outs[3].outputs[0].token_ids == reference_greedy(p, 30)


def test_bad_requests_are_refused_by_name():
    engine, _ = make_engine(num_device_blocks=4)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 40\), found \[40\]"):
        engine.add_request("x", {"prompt_token_ids": [1, 40]})
    with pytest.raises(ValueError, match="needs 5 KV blocks of 4 tokens, the device pool has 4"):
        engine.add_request("y", {"prompt_token_ids": [1] * 17})
    with pytest.raises(ValueError, match="needs a tokenizer"):
        engine.add_request("z", "hello")
    with pytest.raises(ValueError, match="the prompt is empty"):
        engine.add_request("e", {"prompt_token_ids": []})
    small, _ = make_engine(max_num_seqs=2)
    with pytest.raises(ValueError, match=r"n=3 completions are more than max_num_seqs \(2\)"):
        small.add_request("n", {"prompt_token_ids": [1]}, SamplingParams(n=3))
    with pytest.raises(ValueError, match="preemption_mode must be one of"):
        make_engine(preemption_mode="later")
    with pytest.raises(ValueError, match="top_p must be in"):
        SamplingParams(top_p=0)


class LetterTokenizer:
    """One letter per token id (transformers' decode signature)."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(ord("a") + i % 26) for i in ids)


@pytest.mark.parametrize("include", [False, True])
def test_stop_strings_end_and_trim_the_text(include):
    engine, runner = make_engine(tokenizer=LetterTokenizer())
    p = PROMPTS[4]
    ref = reference_greedy(p, 20, eos=-1)
    text = LetterTokenizer().decode(ref)
    stop = text[6:8]
    at = text.find(stop)
    out = run(engine, runner, [p], [greedy(20, ignore_eos=True, stop=stop, include_stop_str_in_output=include)])[0]
    c = out.outputs[0]
    assert c.token_ids == ref[:at + 2] and c.finish_reason == "stop" and c.stop_reason == stop
    assert c.text == (text[:at + 2] if include else text[:at])


@pytest.mark.parametrize("seed", range(6))
def test_random_workloads_keep_accounting_cache_contents_and_outputs(seed):
    import random

    rng = random.Random(seed)
    engine, runner = make_engine(block_size=rng.choice([2, 4, 8]), num_device_blocks=rng.randrange(24, 48),
                                 num_cpu_blocks=rng.choice([0, 8, 64]), max_num_seqs=rng.randrange(2, 9),
                                 max_num_batched_tokens=rng.choice([16, 64, 512]),
                                 enable_chunked_prefill=rng.random() < 0.5,
                                 enable_prefix_caching=rng.random() < 0.5,
                                 preemption_mode=rng.choice([None, "swap", "recompute"]))
    shared = [rng.randrange(4, VOCAB) for _ in range(12)]
    prompts, params = [], []
    for i in range(10):
        n = rng.randrange(1, 14)
        prompts.append((shared[:rng.randrange(0, 12)] + [rng.randrange(4, VOCAB) for _ in range(n)])[:14])
        if rng.random() < 0.3:
            params.append(SamplingParams(n=2, temperature=1.0, seed=i, max_tokens=rng.randrange(1, 10)))
        else:
            params.append(greedy(rng.randrange(1, 12)))
    outs = run(engine, runner, prompts, params)
    for out, p, sp in zip(outs, prompts, params):
        assert len(out.outputs) == sp.n
        if sp.greedy:
            assert out.outputs[0].token_ids == reference_greedy(p, sp.max_tokens)
