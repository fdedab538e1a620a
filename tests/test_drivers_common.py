"""What every driver shares (nnhal.drivers.common), tested without the reference driver."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from nnhal.drivers.common import tokens as tokens_module
from nnhal.drivers.common.callbacks import NotifyOnce, notify_prepared
from nnhal.drivers.common.request_checks import check_request, resolve_pools
from nnhal.drivers.common.tokens import TokenRegistry, TokenRegistryFull
from nnhal.drivers.common.workers import WorkerPools
from nnhal.hal.builder import RequestBuilder
from nnhal.hal.types import (
    NO_TIMING,
    DataLocation,
    ErrorStatus,
    MeasureTiming,
    MemoryPool,
    Operand,
    OperandLifeTime,
    OperandType,
    Priority,
    Request,
    RequestArgument,
    Subgraph,
)
from nnhal.hidl import notify_execution
from nnhal.validation import BUFFER_POOL, ValidationError


def test_token_registry_round_robin_lookup_release():
    reg: TokenRegistry[str] = TokenRegistry()
    t1, b1 = reg.register(lambda t: f"buffer {t}")
    t2, _ = reg.register(lambda t: f"buffer {t}")
    assert (t1, t2, b1) == (1, 2, "buffer 1") and len(reg) == 2
    assert reg.lookup(t1) == "buffer 1" and reg.lookup(np.uint32(t2)) == "buffer 2"
    assert reg.release(t1) == "buffer 1" and reg.release(t1) is None
    assert reg.lookup(t1) is None and len(reg) == 1
    t3, _ = reg.register(str)
    assert t3 == 3  # a released token is not reused at once


def test_token_registry_wraps_and_reports_full(monkeypatch):
    monkeypatch.setattr(tokens_module, "MAX_TOKEN", 3)
    reg: TokenRegistry[int] = TokenRegistry()
    assert [reg.register(int)[0] for _ in range(3)] == [1, 2, 3]
    called = []
    with pytest.raises(TokenRegistryFull):
        reg.register(lambda t: called.append(t))
    assert called == []  # nothing made when no token is free
    reg.release(2)
    assert reg.register(int) == (2, 2)


def test_token_registry_is_thread_safe():
    reg: TokenRegistry[int] = TokenRegistry()
    got: list[int] = []

    def work() -> None:
        for _ in range(200):
            got.append(reg.register(int)[0])

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == list(range(1, 801)) and len(reg) == 800


def test_worker_pools_one_per_priority():
    pools = WorkerPools(2, name="test")
    try:
        pools.start()
        high, low = pools.for_priority(Priority.HIGH), pools.for_priority(Priority.LOW)
        assert high is not low and pools.for_priority(Priority.HIGH) is high
        assert high.submit(threading.current_thread).result().name.startswith("test-high")
    finally:
        pools.close()
    with pytest.raises(RuntimeError):
        high.submit(int)


class _Raising:
    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def notify(self, *args: object) -> None:
        self.calls.append(args)
        raise RuntimeError("client bug")


def test_notifications_swallow_client_exceptions_and_notify_once():
    cb = _Raising()
    notify_prepared(cb, ErrorStatus.NONE, None)
    notify_execution(cb, ErrorStatus.NONE, [], NO_TIMING)
    assert len(cb.calls) == 2
    once = NotifyOnce(_Raising())
    once(ErrorStatus.GENERAL_FAILURE)
    once(ErrorStatus.NONE)
    assert once.callback.calls == [(ErrorStatus.GENERAL_FAILURE, None)]


# ---- request checking for any prepared model ------------------------------------------------

def _signature() -> Subgraph:
    def tensor(lifetime: OperandLifeTime) -> Operand:
        return Operand(type=OperandType.TENSOR_FLOAT32, dimensions=[2], number_of_consumers=0,
                       scale=0.0, zero_point=0, lifetime=lifetime, location=DataLocation())

    return Subgraph([tensor(OperandLifeTime.SUBGRAPH_INPUT),
                     tensor(OperandLifeTime.SUBGRAPH_OUTPUT)], [], [0], [1])


class _Buffer:
    """A driver buffer as request checking sees it."""

    def __init__(self) -> None:
        self.uses: list[object] = []

    def check_request_use(self, prepared_model: object, request: Request) -> None:
        self.uses.append(prepared_model)


def test_check_request_maps_memory_and_tokens_and_asks_buffers():
    reg: TokenRegistry = TokenRegistry()
    token, buf = reg.register(lambda t: _Buffer())
    rb = RequestBuilder([np.ones(2, np.float32)], [8])
    try:
        request = Request(rb.request.inputs, [RequestArgument(False, DataLocation(1, 0, 0), [])],
                          [rb.request.pools[0], MemoryPool.of_token(token)])
        pm = object()

        def check(req: object) -> list:
            return check_request(pm, _signature(), lambda r: resolve_pools(r, reg), req,
                                 MeasureTiming.NO, None)

        pools = check(request)
        assert isinstance(pools[0], np.ndarray) and pools[1] is buf and buf.uses == [pm]
        assert resolve_pools(request, reg)[1] == [8, BUFFER_POOL]
        reg.release(token)
        with pytest.raises(ValidationError, match="unknown buffer token"):
            check(request)
        with pytest.raises(ValidationError, match="not a Request"):
            check("nope")
    finally:
        rb.close()
