"""npu tensors and torch.multiprocessing (npubridge/_ipc.py, Note [npu
tensors are not shared between processes yet]): pickling one for another
process raises a clear error at once, a consumer waiting for one through a
Queue gets that error instead of hanging, and CPU tensors still share."""
import queue
import warnings
from multiprocessing.reduction import ForkingPickler

import pytest
import torch
import torch.multiprocessing as mp

import npubridge  # noqa: F401

NOT_SHARED = "npubridge: npu tensors cannot be shared between processes yet"
JOIN_TIMEOUT_S = 90  # two spawned interpreters import torch: seconds each, never minutes


def test_pickling_an_npu_tensor_for_another_process_raises_at_once():
    with pytest.raises(RuntimeError) as e:
        ForkingPickler.dumps(torch.ones(2, device="npu"))
    assert str(e.value) == (
        "npubridge: npu tensors cannot be shared between processes yet (torch.multiprocessing's "
        "torch.multiprocessing.reductions.reduce_tensor was given a tensor on npu:0); move it to the CPU first "
        "(tensor.cpu()), send that, and move it to the npu in the receiving process")


@pytest.mark.parametrize("make", [
    lambda: torch.nn.Parameter(torch.ones(2, device="npu:1")),
    lambda: torch.ones(3, device="npu").untyped_storage(),
    lambda: torch.ones(3, device="npu").storage(),
    lambda: torch.ones(4, device="npu")[1:],
])
def test_parameters_views_and_storages_on_the_npu_are_refused_too(make):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TypedStorage is deprecated; that is not what is tested
        obj = make()
        with pytest.raises(RuntimeError, match=NOT_SHARED):
            ForkingPickler.dumps(obj)


def test_cpu_tensors_still_pickle_for_other_processes():
    t = torch.arange(4.0)
    data = ForkingPickler.dumps(t)
    assert torch.equal(ForkingPickler.loads(data), t)


def _producer(q, done, device):
    q.put(torch.arange(3.0, device=device))
    # A shared CPU tensor travels as a file descriptor the producer serves:
    # it stays alive until the consumer has it (as torch.multiprocessing
    # asks of producers).
    done.wait(JOIN_TIMEOUT_S)


def _consumer(q, done, results):
    try:
        got = q.get(timeout=JOIN_TIMEOUT_S)
        results.put(("ok", got.cpu().tolist() if isinstance(got, torch.Tensor) else repr(got)))
    except queue.Empty:
        results.put(("timeout", ""))
    except Exception as e:  # noqa: BLE001  (the message is what is tested)
        results.put((type(e).__name__, str(e)))
    finally:
        done.set()


def _run_pair(device):
    ctx = mp.get_context("spawn")
    q, results, done = ctx.Queue(), ctx.Queue(), ctx.Event()
    producer = ctx.Process(target=_producer, args=(q, done, device))
    consumer = ctx.Process(target=_consumer, args=(q, done, results))
    consumer.start()
    producer.start()
    try:
        outcome = results.get(timeout=JOIN_TIMEOUT_S)
    finally:
        for p in (producer, consumer):
            p.join(timeout=JOIN_TIMEOUT_S)
            if p.is_alive():
                p.kill()
    return outcome, producer.exitcode, consumer.exitcode


def test_a_consumer_waiting_for_an_npu_tensor_gets_the_error_instead_of_hanging():
    (kind, message), producer_code, consumer_code = _run_pair("npu")
    assert kind == "RuntimeError"
    assert message.startswith(NOT_SHARED)
    assert "tensor.cpu()" in message
    assert (producer_code, consumer_code) == (0, 0)  # both ended on their own


def test_a_cpu_tensor_goes_through_the_same_pair():
    (kind, value), producer_code, consumer_code = _run_pair("cpu")
    assert (kind, value) == ("ok", [0.0, 1.0, 2.0])
    assert (producer_code, consumer_code) == (0, 0)
