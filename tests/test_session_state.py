"""Streaming models whose state the LiteRT driver keeps in its interpreter
(``bind_arrays_with_state``, the Session's stateful binding): every call must give what
ai-edge-litert gives on the converter's own file (whose resource variables stay in its
interpreter), and the Session's state semantics (reset, runs by request in between, errors,
threads) must be those of the state carried as inputs and outputs."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from test_session_bound import WAKE, ByRequest, accumulator

from nnhal.errors import ExecutionError
from nnhal.session import Session

F32 = np.float32
DATA = Path(__file__).parent / "tflite" / "data"
STREAMS = ["streaming_f32.tflite", "streaming_int8.tflite"]


def _litert():
    from nnhal.drivers.litert.engine import unavailable

    why = unavailable()
    if why is not None:
        pytest.skip(why)
    from ai_edge_litert.interpreter import Interpreter

    return Interpreter


class Peer:
    """ai-edge-litert on the original file, one input and one output."""

    def __init__(self, path: Path):
        self.it = _litert()(model_path=str(path))
        self.it.allocate_tensors()
        self.inp = self.it.get_input_details()[0]
        self.out = self.it.get_output_details()[0]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.it.set_tensor(self.inp["index"], x)
        self.it.invoke()
        return self.it.get_tensor(self.out["index"])


def _inputs(session: Session, n: int, seed: int = 0) -> list[np.ndarray]:
    info = session.inputs[0]
    rng = np.random.default_rng(seed)
    if info.dtype == np.int8:
        return [rng.integers(-128, 128, info.shape).astype(np.int8) for _ in range(n)]
    return [rng.uniform(-1, 1, info.shape).astype(info.dtype) for _ in range(n)]


def _out(session: Session, feeds) -> np.ndarray:
    (value,) = session.run(feeds).values()
    return value


def _in_interpreter(s: Session) -> bool:
    """The stream's state is in the driver's interpreter, and calls take the direct way."""
    b = s._bound
    return b is not None and b.stateful and s._state_holder is b.runner and "run" in s.__dict__


@pytest.mark.parametrize("name", STREAMS)
@pytest.mark.parametrize("device", ["litert", None])
def test_a_stream_equals_litert_on_the_converters_file(name, device, fast_way):
    path = DATA / name
    peer = Peer(path)
    with Session(path, device=device, cache=False) as s:
        xs = _inputs(s, 40)
        key = s.inputs[0].name
        got = [_out(s, {key: x}) for x in xs]
        want = [peer(x) for x in xs]
        assert _in_interpreter(s)
    assert all(np.array_equal(g.reshape(w.shape), w) for g, w in zip(got, want))
    assert len({w.tobytes() for w in want}) > 20  # the outputs move with the state


def test_reset_runs_by_request_and_lists_share_one_stream(fast_way):
    """Bound calls, calls by request (a Mapping that is not a dict) and lists in one stream,
    reset twice: the outputs are ai-edge-litert's on a fresh interpreter each time."""
    path = DATA / "streaming_f32.tflite"
    with Session(path, device="litert", cache=False) as s:
        key = s.inputs[0].name
        xs = _inputs(s, 24, seed=3)
        kinds = [lambda x: {key: x}, lambda x: ByRequest({key: x}), lambda x: [x]]
        for stream in range(3):
            peer = Peer(path)
            for k, x in enumerate(xs):
                feeds = kinds[(k // 3 + stream) % 3](x) if k >= 6 else {key: x}
                np.testing.assert_array_equal(_out(s, feeds), peer(x).reshape(1, 3))
            s.reset_state()
        assert _in_interpreter(s) is False  # reset: the next call hands the initial state in
        np.testing.assert_array_equal(_out(s, {key: xs[0]}), Peer(path)(xs[0]).reshape(1, 3))
        assert _in_interpreter(s)


def test_the_state_read_back_is_the_carried_state():
    with Session(accumulator(), "litert") as s, Session(accumulator(), "reference") as ref:
        ones = np.ones(2, F32)
        for k in range(1, 8):
            assert s.run({"x": ones})["y"].tolist() == [k, k]
            ref.run({"x": ones})
        assert _in_interpreter(s)
        np.testing.assert_array_equal(s._state[0], ref._state[0])  # read from the interpreter
        assert not _in_interpreter(s)
        assert s.run({"x": ones})["y"].tolist() == [8, 8]
        assert _in_interpreter(s)


def test_a_failed_call_hands_the_state_back_and_goes_by_request(monkeypatch, fast_way):
    """A call that fails in the binding (the direct way's, then the usual one's) leaves the
    state as it was before it: the Session runs it by request from that state."""
    from nnhal.drivers.litert.state import LiteRTStateArrays

    calls = []

    def failing_once(made, one_array):
        def make(self):
            one = made(self)

            def call(x):
                calls.append(x)
                if len(calls) == 2:
                    self.failure = "RuntimeError: injected"
                    return None
                if one_array:
                    return one(x)
                assert type(x) is list and len(x) == 1  # the native way's call
                return one(x)
            return call
        return make

    # The Python way calls one_call's closure, the native one the binding's direct call.
    monkeypatch.setattr(LiteRTStateArrays, "one_call",
                        failing_once(LiteRTStateArrays.one_call, True))
    monkeypatch.setattr(LiteRTStateArrays, "direct",
                        failing_once(LiteRTStateArrays.direct, False))
    with Session(accumulator(), "litert") as s:
        ones = np.ones(2, F32)
        assert [s.run({"x": ones})["y"].tolist() for _ in range(3)] == [[1, 1], [2, 2], [3, 3]]
        assert _in_interpreter(s) and len(calls) == 1  # the third call: the direct way's
        assert s.run({"x": ones})["y"].tolist() == [4, 4]  # failed there, then by request
        assert s._bound.runner is None
        assert [s.run({"x": ones})["y"].tolist() for _ in range(2)] == [[5, 5], [6, 6]]
    with Session(accumulator(), "litert") as s:
        for _ in range(3):
            s.run({"x": ones})
        runner = s._bound.runner
        invoke = runner.invoke

        def fail(*args):
            if not args:  # the main subgraph; the state's subgraphs still work
                raise RuntimeError("injected")
            return invoke(*args)

        runner.invoke = fail
        del s.__dict__["run"]  # the usual way's call of the binding
        assert s.run({"x": ones})["y"].tolist() == [4, 4]
        assert s._bound.runner is None


def test_a_lost_state_is_an_error_and_the_stream_restarts(fast_way):
    with Session(accumulator(), "litert") as s:
        ones = np.ones(2, F32)
        for _ in range(3):
            s.run({"x": ones})
        runner = s._bound.runner

        def fail(*args):
            raise RuntimeError("injected")

        runner.invoke = fail
        del s.__dict__["run"]  # the usual way's call of the binding, which uses it
        with pytest.raises(ExecutionError, match="lost the stream's state"):
            s.run({"x": ones})
        assert s.run({"x": ones})["y"].tolist() == [1, 1]


def test_threads_sharing_a_stream_lose_no_step(fast_way):
    with Session(accumulator(), "litert") as s:
        ones = np.ones(2, F32)
        s.run({"x": ones})
        s.run({"x": ones})
        assert _in_interpreter(s)
        errors: list[BaseException] = []

        def work() -> None:
            try:
                for k in range(200):
                    s.run({"x": ones} if k % 7 else ByRequest({"x": ones}))
            except BaseException as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert s.run({"x": ones})["y"].tolist() == [803, 803]


def test_a_closed_stream_refuses_calls(fast_way):
    with Session(accumulator(), "litert") as s:
        ones = np.ones(2, F32)
        for _ in range(3):
            s.run({"x": ones})
        assert _in_interpreter(s)
    with pytest.raises(Exception, match="closed"):
        s.run({"x": ones})


def test_the_reference_driver_streams_the_converters_file():
    """The reference driver carries the state as inputs and outputs, as before: within
    float32 roundings of ai-edge-litert's stream."""
    path = DATA / "streaming_f32.tflite"
    peer = Peer(path)
    with Session(path, device="reference", cache=False) as s:
        key = s.inputs[0].name
        xs = _inputs(s, 20, seed=5)
        for x in xs:
            np.testing.assert_allclose(_out(s, {key: x}), peer(x).reshape(1, 3), atol=1e-6)
        assert s._bound is not None and not s._bound.stateful
        s.reset_state()
        np.testing.assert_allclose(_out(s, {key: xs[0]}), Peer(path)(xs[0]).reshape(1, 3),
                                   atol=1e-6)


@pytest.mark.skipif(not WAKE, reason="pymicro-wakeword is not installed (test extra)")
@pytest.mark.parametrize("path", WAKE, ids=[p.stem for p in WAKE])
def test_wakeword_streams_equal_litert(path):
    """The test extra's wake-word models (int8, six state variables): 30 calls on LiteRT,
    outputs equal to ai-edge-litert's on the file, and the state equal to that of the same
    stream carried as inputs and outputs (runs by request). Random features leave the
    detectors' outputs near 0 after the first calls: the state's comparison is the one that
    bites (it has moved from its initial value in every variable)."""
    peer = Peer(path)
    with Session(path, device="litert", cache=False) as s, \
            Session(path, device="litert", cache=False) as plain:
        key = s.inputs[0].name
        for x in _inputs(s, 30, seed=11):
            x = (x // 2 - 64).astype(np.int8)  # quieter features: some outputs above 0
            want = peer(x)
            np.testing.assert_array_equal(_out(s, {key: x}).reshape(want.shape), want)
            np.testing.assert_array_equal(_out(plain, ByRequest({key: x})).reshape(want.shape),
                                          want)
        assert _in_interpreter(s)
        state = s._state
        assert all(np.array_equal(a, b) for a, b in zip(state, plain._state))
        assert all(not np.array_equal(a, b) for a, b in zip(state, s._initial))


def test_a_dropped_stream_is_freed_at_once(fast_way):
    """The direct way holds no reference to its Session: dropping an unclosed one frees it
    (and its __del__ closes it) without waiting for the cycle collector."""
    import gc
    import weakref

    s = Session(accumulator(), "litert")
    for _ in range(3):
        s.run({"x": np.ones(2, F32)})
    assert _in_interpreter(s)
    ref = weakref.ref(s)
    gc.disable()
    try:
        del s
        assert ref() is None
    finally:
        gc.enable()


def test_without_a_stateful_binding_the_state_is_carried_as_before(monkeypatch):
    """A prepared model that offers no stateful binding (here LiteRT's, refused) binds
    arrays with the state carried in and out, as before, and streams the same."""
    from nnhal.drivers.litert.prepared_model import LiteRTArrays, LiteRTPreparedModel

    monkeypatch.setattr(LiteRTPreparedModel, "bind_arrays_with_state", lambda *a: None)
    path = DATA / "streaming_int8.tflite"
    peer = Peer(path)
    with Session(path, device="litert", cache=False) as s:
        key = s.inputs[0].name
        for x in _inputs(s, 12, seed=9):
            np.testing.assert_array_equal(_out(s, {key: x}), peer(x).reshape(1, 3))
        assert not s._bound.stateful and isinstance(s._bound.runner, LiteRTArrays)
        assert "run" not in s.__dict__
