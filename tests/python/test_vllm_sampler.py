"""npubridge.vllm.sampler: greedy is torch.argmax, the filters keep the
right tokens, seeded draws reproduce, min_tokens holds the stop tokens back."""
import pytest
import torch

from npubridge.vllm.sampler import SampleRequest, _filter_top_k_top_p, sample
from npubridge.vllm.sampling_params import SamplingParams


def one(logits, params, generator=None, num_samples=1, num_output_tokens=0, engine_seed=0):
    req = SampleRequest(params, generator, num_samples, num_output_tokens)
    return sample(logits[None, :], [req], torch.Generator().manual_seed(engine_seed))[0]


def test_greedy_is_argmax_with_ties_to_the_lowest_index():
    logits = torch.tensor([0.5, 2.0, -1.0, 2.0, 2.0])
    assert one(logits, SamplingParams(temperature=0.0)) == [(1, pytest.approx(float(torch.log_softmax(logits,
                                                                                                       0)[1])))]
    g = torch.Generator().manual_seed(0)
    rows = torch.randn(50, 100, generator=g)
    got = sample(rows, [SampleRequest(SamplingParams(temperature=0.0), None)] * 50, torch.Generator())
    assert [s[0][0] for s in got] == torch.argmax(rows, dim=1).tolist()


def test_top_k_and_top_p_keep_exactly_the_expected_tokens():
    x = torch.tensor([1.0, 3.0, 2.0, 0.0, 2.5])
    kept = lambda out: sorted(torch.nonzero(out > float("-inf")).flatten().tolist())  # noqa: E731
    assert kept(_filter_top_k_top_p(x, 2, 1.0)) == [1, 4]
    assert kept(_filter_top_k_top_p(x, -1, 1.0)) == [0, 1, 2, 3, 4]
    probs = torch.softmax(x, 0)  # sorted: 1 (0.48), 4 (0.29), 2 (0.18), 0 (0.06), 3 (0.02)
    assert kept(_filter_top_k_top_p(x, -1, float(probs[1]) - 1e-3)) == [1]
    assert kept(_filter_top_k_top_p(x, -1, float(probs[1] + probs[4]) + 1e-3)) == [1, 2, 4]
    assert kept(_filter_top_k_top_p(x, 2, 0.99)) == [1, 4]
    assert kept(_filter_top_k_top_p(x, -1, 1e-6)) == [1]  # the most likely token always stays
    out = _filter_top_k_top_p(x, 3, 1.0)
    assert torch.equal(out[[1, 2, 4]], x[[1, 2, 4]])


def test_draws_follow_the_filtered_distribution():
    x = torch.tensor([1.0, 3.0, 2.0, 0.0, 2.5])
    params = SamplingParams(temperature=0.7, top_k=3)
    g = torch.Generator().manual_seed(0)
    draws = [t for t, _ in one(x, params, g, num_samples=4000)]
    assert set(draws) <= {1, 2, 4}
    expected = torch.softmax(_filter_top_k_top_p(x / 0.7, 3, 1.0), 0)
    freq = torch.bincount(torch.tensor(draws), minlength=5).double() / 4000
    # Binomial standard error at 4000 draws is under 0.008; 5 of them.
    assert torch.allclose(freq, expected.double(), atol=0.04)


def test_seeded_draws_reproduce_and_the_engine_generator_serves_the_rest():
    x = torch.randn(64, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(temperature=1.0, seed=7)
    a = one(x, params, torch.Generator().manual_seed(7), num_samples=10)
    b = one(x, params, torch.Generator().manual_seed(7), num_samples=10, engine_seed=123)
    assert a == b
    c = one(x, SamplingParams(temperature=1.0), None, num_samples=10, engine_seed=5)
    d = one(x, SamplingParams(temperature=1.0), None, num_samples=10, engine_seed=5)
    assert c == d and c != a


def test_min_tokens_masks_eos_and_stop_tokens():
    x = torch.zeros(10)
    x[4], x[6], x[1] = 5.0, 4.0, 3.0
    params = SamplingParams(temperature=0.0, min_tokens=2, stop_token_ids=[6])
    params._eos_token_ids = [4]
    assert one(x, params, num_output_tokens=1)[0][0] == 1
    assert one(x, params, num_output_tokens=2)[0][0] == 4
    # With ignore_eos the eos is an ordinary token: only stop_token_ids are held back.
    params.ignore_eos = True
    x[4] = 3.5
    assert one(x, params, num_output_tokens=1)[0][0] == 4
    assert one(x, params, num_output_tokens=2)[0][0] == 6


def test_bad_logits_are_refused():
    with pytest.raises(ValueError, match=r"logits must be \[1, vocab\], found \[2, 3\]"):
        sample(torch.zeros(2, 3), [SampleRequest(SamplingParams(), None)], torch.Generator())
    with pytest.raises(ValueError, match="float32 on the cpu, found torch.float64"):
        sample(torch.zeros(1, 3, dtype=torch.float64), [SampleRequest(SamplingParams(), None)], torch.Generator())
