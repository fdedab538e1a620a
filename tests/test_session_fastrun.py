"""A Session's repeated runs as one native call (``fastrun.c`` over the LiteRT driver's
``direct.c``) and their Python twins (``fast_way``): feeds no one here chose must get the
answer, or the error, that the general way gives; a call into the interpreter that raises, an
output of another shape and a dropped Session must each end as the twin's do."""

from __future__ import annotations

import gc
import logging
import threading
import weakref

import numpy as np
import pytest
from helpers import add_model
from test_session_bound import ByRequest, _litert_or_skip

from nnhal.errors import NnhalError
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.types import OperandType, OperationType
from nnhal.session import Session

F32 = np.float32


def _bound_session() -> Session:
    _litert_or_skip()
    s = Session(add_model((2, 3)), "litert")
    ones = np.ones((2, 3), F32)
    s.run({"input_0": ones, "input_1": ones})
    s.run({"input_0": ones, "input_1": ones})
    assert "run" in s.__dict__
    return s


class Sub(np.ndarray):
    pass


class Key(str):
    """A str of the input's name, hashing as it does, that is not a str exactly."""


def _outcome(s: Session, feeds: object) -> object:
    try:
        return s.run(feeds)["output_0"].tolist()  # type: ignore[arg-type]
    except NnhalError as e:
        return type(e)


def _hostile(ones: np.ndarray) -> list[object]:
    a = np.arange(6, dtype=F32).reshape(2, 3)
    return [
        {"input_0": a.view(Sub), "input_1": ones},
        {"input_0": a.astype(">f4"), "input_1": ones},
        {"input_0": np.asfortranarray(a), "input_1": ones},
        {"input_0": a.T.copy().T, "input_1": ones},
        {"input_0": np.arange(12, dtype=F32).reshape(2, 6)[:, ::2], "input_1": ones},
        {"input_0": a.astype(np.float64), "input_1": ones},
        {"input_0": a.reshape(3, 2), "input_1": ones},
        {"input_0": a.reshape(1, 2, 3), "input_1": ones},
        {"input_0": np.float32(1), "input_1": ones},
        {"input_0": a, "input_1": ones, "input_2": ones},
        {"input_0": a},
        {Key("input_0"): a, "input_1": ones},
        {"input_0": a, 1: ones},
        {"input_0": a.tolist(), "input_1": ones},
        {"input_0": a, "input_1": np.ones((2, 3), np.dtype("float32").newbyteorder("=")),},
        [a, ones],
        (a, ones),
        None,
        "input_0",
        {},
    ]


def test_hostile_feeds_get_the_general_ways_answer(fast_way):
    ones = np.ones((2, 3), F32)
    with _bound_session() as s, Session(add_model((2, 3)), "reference") as ref:
        for feeds in _hostile(ones):
            got = _outcome(s, feeds)
            want = _outcome(ref, ByRequest(feeds) if isinstance(feeds, dict) else feeds)
            assert got == want, feeds
            # The bound layout still runs, and right, after each.
            assert _outcome(s, {"input_0": ones, "input_1": ones}) == (ones * 2).tolist()
        assert "run" in s.__dict__ and s._bound.runner is not None


def test_a_key_whose_comparison_raises_is_the_callers_error(fast_way):
    class Raising:
        def __hash__(self):
            return hash("input_0")

        def __eq__(self, other):
            raise ZeroDivisionError("the caller's")

    ones = np.ones((2, 3), F32)
    with _bound_session() as s:
        with pytest.raises(ZeroDivisionError):
            s.run({Raising(): ones, "input_1": ones})
        assert s.run({"input_0": ones, "input_1": ones})["output_0"].tolist() == \
            (ones * 2).tolist()


def test_an_interpreter_call_that_raises_is_logged_and_goes_by_request(fast_way, caplog):
    ones = np.ones((2, 3), F32)
    with _bound_session() as s:
        engines = s._bound.runner.engines._free
        assert engines

        class Wrapper:
            def SetTensor(self, *args):
                raise RuntimeError("injected")

            Invoke = GetTensor = SetTensor

        class Interpreter:
            _interpreter = Wrapper()

        # The engine the next run takes (the last free one) calls into the fake.
        engines[-1].interpreter, engines[-1].calls = Interpreter(), None
        bound = s._bound
        with caplog.at_level(logging.DEBUG):
            got = s.run({"input_0": ones, "input_1": np.full((2, 3), 2, F32)})
        assert got["output_0"].tolist() == np.full((2, 3), 3, F32).tolist()
        assert bound.runner is None  # this binding is not used again
        assert "bound run failed" in caplog.text
        assert s.run({"input_0": ones, "input_1": ones})["output_0"].tolist() == \
            (ones * 2).tolist()


class FakeWrapper:
    """ai-edge-litert's wrapper as the direct calls use it, recording the calls."""

    def __init__(self, out_shape=(2,), fail=None):
        self.log: list[tuple] = []
        self.tensors: dict[int, np.ndarray] = {}
        self.out_shape = out_shape
        self.fail = fail

    def SetTensor(self, idx, arr):
        self.log.append(("set", idx))
        if self.fail == "set":
            raise RuntimeError("set failed")
        self.tensors[idx] = np.array(arr)

    def Invoke(self):
        self.log.append(("invoke",))
        if self.fail == "invoke":
            raise KeyboardInterrupt  # not an Exception: goes up as it is

    def GetTensor(self, idx, subgraph):
        self.log.append(("get", idx, subgraph))
        return (self.tensors[7] + self.tensors[8]).reshape(self.out_shape)


class FakeEngine:
    def __init__(self, wrapper, shapes):
        self.interpreter = type("I", (), {"_interpreter": wrapper})()
        self.shapes = shapes
        self.calls = None


def _calls(pool, general_log, failed_log, fixed_log, **kw):
    from nnhal.drivers.litert import direct

    def general(arrays):
        general_log.append(len(arrays))
        return ["general"]

    def fix(outs):
        fixed_log.append([o.shape for o in outs])
        return [o.reshape(2) for o in outs]

    direct.DIRECT.module()  # built now (calls() itself would start a build and answer None)
    made = direct.calls(pool=pool, calls=kw.get("calls"), shapes=kw.get("shapes"),
                        inputs=(7, 8), outputs=(9,), known=[(2,)], general=general,
                        failed=lambda e, arrays: failed_log.append(e), fix=fix)
    if made is None:
        pytest.skip(f"native calls not built: {direct.DIRECT.status()}")
    return made


def test_the_native_calls_do_the_twins_steps():
    """direct.c alone, over a fake wrapper: the steps, and each case handed back."""
    from nnhal.executor import profile

    shapes = [(2,), (2,)]
    w = FakeWrapper()
    engine = FakeEngine(w, list(shapes))
    pool = [engine]
    general, failed, fixed = [], [], []
    run = _calls(pool, general, failed, fixed, shapes=shapes)
    a, b = np.array([1, 2], F32), np.array([3, 4], F32)
    outs = run([a, b])
    assert [o.tolist() for o in outs] == [[4, 6]] and pool == [engine]
    assert w.log == [("set", 7), ("set", 8), ("invoke",), ("get", 9, 0)]
    assert engine.calls is not None and not general and not failed and not fixed
    # Not a list of the inputs' count, a profile taken, no free engine, an engine fitted to
    # other shapes: the general way, and the pool as it was.
    assert run((a, b)) == ["general"] and run([a]) == ["general"]
    with profile.profiling():
        assert run([a, b]) == ["general"]
    pool.clear()
    assert run([a, b]) == ["general"]
    other = FakeEngine(FakeWrapper(), [(3,), (2,)])
    pool.append(other)
    assert run([a, b]) == ["general"] and pool == [other]
    assert general == [2, 1, 2, 2, 2]
    # An output of another shape: handed to fix.
    pool[:] = [FakeEngine(FakeWrapper(out_shape=(1, 2)), list(shapes))]
    assert [o.shape for o in run([a, b])] == [(2,)] and fixed == [[(1, 2)]]
    # A call that raises: reported, None, the engine not given back.
    pool[:] = [FakeEngine(FakeWrapper(fail="set"), list(shapes))]
    assert run([a, b]) is None and pool == []
    assert len(failed) == 1 and str(failed[0]) == "set failed"
    # Not an Exception: goes up (the engine not given back either).
    pool[:] = [FakeEngine(FakeWrapper(fail="invoke"), list(shapes))]
    with pytest.raises(KeyboardInterrupt):
        run([a, b])
    assert pool == [] and len(failed) == 1
    with pytest.raises(TypeError):
        run()


def test_the_native_calls_with_fixed_calls_and_bad_construction():
    w = FakeWrapper()
    general, failed, fixed = [], [], []
    run = _calls(None, general, failed, fixed, calls=(w.SetTensor, w.Invoke, w.GetTensor))
    a = np.array([1, 2], F32)
    assert [o.tolist() for o in run([a, a])] == [[2, 4]]
    from nnhal.drivers.litert import direct

    module = direct.DIRECT.module()
    for bad in [dict(pool=None, calls=(1, 2)), dict(pool=(), calls=None),
                dict(pool=[], calls=None, inputs=(1.5,)),
                dict(pool=[], calls=None, known=((2,), (3,))),
                dict(pool=[], calls=None, bools=[0])]:
        args = dict(pool=[], calls=None, shapes=None, inputs=(7,), outputs=(9,),
                    known=((2,),), general=print, failed=print, fix=print, profile=None,
                    bools=())
        args.update(bad)
        with pytest.raises(TypeError):
            module.Calls(*args.values())


def test_a_dropped_session_with_the_direct_way_is_freed(fast_way):
    s = _bound_session()
    me = weakref.ref(s)
    run = s.run
    del s
    assert me() is None  # closed by its __del__ at once: the direct way holds no Session
    del run
    gc.collect()


def test_bindings_of_one_layout_on_one_pool_alternate_rightly(fast_way):
    """Two bindings of the same layout over one prepared model's interpreters (as Sessions
    restored from one cache have): alternating runs keep giving each its own answers."""
    _litert_or_skip()
    ones = np.ones((2, 3), F32)
    with Session(add_model((2, 3)), "litert") as s:
        s.run({"input_0": ones, "input_1": ones})
        pm = s._prepared
        first, second = pm.bind_arrays([(2, 3), (2, 3)]), pm.bind_arrays([(2, 3), (2, 3)])
        a, b = first.direct(), second.direct()
        for k in range(5):
            x = np.full((2, 3), k, F32)
            assert a([x, ones])[0].tolist() == (x + 1).tolist()
            assert b([ones, x])[0].tolist() == (x + 1).tolist()
        if fast_way == "native":
            layout = pm.engines.layout([(2, 3), (2, 3)])
            assert layout is pm.engines.layout(((2, 3), (2, 3)))
            assert all(e.calls is None or e.calls[3] is layout for e in pm.engines._free)


def test_boolean_tensors_are_bound_and_read_as_a_run_by_request_reads_them(fast_way):
    """A model with boolean inputs and outputs binds its arrays too; a boolean array whose
    bytes are not all 0 or 1 (a view of other bytes: numpy reads any nonzero as true) gives
    what a run by request gives (nonzero is true). Set raw, TFLite's LOGICAL_NOT gives 3 for
    2 (it flips the low bit): true, where not-true is false."""
    _litert_or_skip()
    b = ModelBuilder()
    x = b.input(OperandType.TENSOR_BOOL8, [2, 4])
    out = b.output(OperandType.TENSOR_BOOL8, [2, 4])
    b.operation(OperationType.LOGICAL_NOT, [x], [out])
    with Session(b.build(), "litert") as s, Session(b.build(), "reference") as ref:
        rng = np.random.default_rng(5)
        for _ in range(3):
            s.run({"input_0": np.ones((2, 4), np.bool_)})
        from nnhal.drivers.litert.prepared_model import LiteRTArrays

        assert isinstance(s._bound.runner, LiteRTArrays) and "run" in s.__dict__
        raw = rng.integers(2, 256, (2, 4), dtype=np.uint8)
        raw[0, 0] = 0
        for a in [rng.random((2, 4)) > 0.5, raw.view(np.bool_), raw.view(np.bool_)[:, ::-1],
                  np.arange(8, dtype=np.uint8).reshape(2, 4).view(np.bool_)]:
            got = s.run({"input_0": a})["output_0"]
            want = ref.run(ByRequest({"input_0": a}))["output_0"]
            assert got.dtype == np.bool_ and got.view(np.uint8).max() <= 1
            assert got.tolist() == want.tolist() == (a == 0).tolist()


# ---- the Session's native lock ---------------------------------------------------------------

def _native_lock():
    from nnhal.session import bound

    m = bound.FASTRUN.module()
    if m is None:
        pytest.skip(f"native fast runs not built: {bound.FASTRUN.status()}")
    return m.Lock()


def test_the_native_lock_behaves_as_threading_lock_and_knows_its_holder() -> None:
    import threading
    import time

    lock = _native_lock()
    assert lock.acquire(False) and lock.locked() and lock.held()
    assert lock.acquire(False) is False  # not reentrant
    other: list[bool] = []
    t = threading.Thread(target=lambda: other.extend([lock.held(), lock.acquire(timeout=0.05)]))
    t.start()
    t.join(5)
    assert other == [False, False]  # held by this thread, not that one; its wait timed out
    t0 = time.monotonic()
    assert lock.acquire(timeout=0.1) is False and time.monotonic() - t0 >= 0.09
    threading.Timer(0.05, lock.release).start()  # released by another thread, as a Lock may be
    assert lock.acquire(timeout=5)
    lock.release()
    assert not lock.locked() and not lock.held()
    with pytest.raises(RuntimeError, match="unlocked"):
        lock.release()
    with lock:
        assert lock.held()
    assert not lock.locked()
    for bad, err in (({"blocking": False, "timeout": 1}, ValueError),
                     ({"timeout": -2}, ValueError), ({"timeout": 1e30}, OverflowError)):
        with pytest.raises(err):
            lock.acquire(**bad)
    with pytest.raises(TypeError):
        type(lock)(1)


def test_a_signal_handler_runs_while_the_native_lock_waits() -> None:
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals reach the main thread only")
    lock = _native_lock()
    lock.acquire()

    def alarm(*_):
        raise TimeoutError("the handler ran")

    old = signal.signal(signal.SIGALRM, alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        with pytest.raises(TimeoutError, match="handler ran"):
            lock.acquire(timeout=10)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        lock.release()


def test_a_session_takes_the_native_lock_once_built() -> None:
    _native_lock()
    s = _bound_session()
    assert type(s._lock).__name__ == "Lock" and s._held() is False


def test_a_session_opened_before_the_build_compiles_nothing(tmp_path, monkeypatch) -> None:
    """Where the module is not built yet, a Session's open takes a threading.Lock and runs
    no compiler (the build waits for a later run); the module then builds as before."""
    import threading

    from nnhal.session import bound

    monkeypatch.setenv("NNHAL_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(bound.FASTRUN, "_loaded", None)
    assert type(bound.session_lock()) is type(threading.Lock())
    assert not (tmp_path / "native").exists() or not list((tmp_path / "native").iterdir())
    assert bound.FASTRUN._loaded is None  # nothing remembered: a later call may build


def test_a_stream_never_waits_for_a_compiler(tmp_path, monkeypatch) -> None:
    """With no build in the cache, the second run installs the Python twins and starts the
    builds on threads (no compiler run inside the call); once they end, the twin gives way
    and the next runs are the native calls, with the same answers throughout."""
    import time

    from nnhal.core import native
    from nnhal.drivers.litert import direct
    from nnhal.session import bound

    if native.switched_off() or bound.FASTRUN.module() is None:
        pytest.skip(f"native fast runs not built: {bound.FASTRUN.status()}")
    _litert_or_skip()
    monkeypatch.setenv("NNHAL_CACHE_DIR", str(tmp_path))
    for m in (bound.FASTRUN, direct.DIRECT):
        monkeypatch.setattr(m, "_loaded", None)
    compiles = []
    real = native.compile_into

    def counted(*args, **kw):
        compiles.append(threading.current_thread().name)
        return real(*args, **kw)

    monkeypatch.setattr(native, "compile_into", counted)
    s = Session(add_model((2, 3)), "litert", cache=False)
    ones = np.ones((2, 3), F32)
    feeds = {"input_0": ones, "input_1": ones}
    assert type(s._lock) is type(threading.Lock())  # (opened before any build)
    for _ in range(3):
        assert s.run(feeds)["output_0"].tolist() == [[2.0] * 3] * 2
    assert all(name.startswith("nnhal-build-") for name in compiles)  # never this thread
    deadline = time.monotonic() + 120
    while native.building() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not native.building()
    for _ in range(3):
        assert s.run(feeds)["output_0"].tolist() == [[2.0] * 3] * 2
    assert type(s.__dict__["run"]).__name__ == "FastRun"
    assert sorted(compiles) == ["nnhal-build-nnhal_litert_direct",
                                "nnhal-build-nnhal_session_fastrun"]
