"""Session's repeated runs of one feed layout (the bound way, ``_Bound``): plain arrays of the
bound dtypes and shapes skip the full feed check, and a driver that binds arrays
(``IPreparedModel.bind_arrays``: the LiteRT driver) runs them without request memory. Every
answer must be the one the general way (by request) gives, every wrong feed still refused."""

from __future__ import annotations

import importlib.metadata
import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest
from helpers import add_model

from nnhal.errors import InputError, NnhalError
from nnhal.executor import profile
from nnhal.hal.builder import ModelBuilder
from nnhal.hal.types import ErrorStatus, OperandType, OperationType, Timing
from nnhal.session import Session
from nnhal.tflite.model import ImportedModel, StateVariable

F32 = np.float32
DATA = Path(__file__).parent / "tflite" / "data"


def _litert_or_skip() -> None:
    from nnhal.drivers.litert.engine import unavailable

    why = unavailable()
    if why is not None:
        pytest.skip(why)


class ByRequest(Mapping):
    """Feeds as a Mapping that is not a dict: never the bound way (the general one checks and
    runs them by request), for answers to compare with."""

    def __init__(self, feeds: dict):
        self.feeds = feeds

    def __getitem__(self, key):
        return self.feeds[key]

    def __iter__(self):
        return iter(self.feeds)

    def __len__(self):
        return len(self.feeds)


def accumulator() -> ImportedModel:
    """y = acc + x, acc := acc + x (a state variable, the last input and output, as the
    importer makes them)."""
    b = ModelBuilder()
    x = b.input(OperandType.TENSOR_FLOAT32, [2])
    acc = b.input(OperandType.TENSOR_FLOAT32, [2])
    y = b.output(OperandType.TENSOR_FLOAT32, [2])
    acc_out = b.output(OperandType.TENSOR_FLOAT32, [2])
    b.operation(OperationType.ADD, [acc, x, b.scalar(OperandType.INT32, 0)], [y])
    b.operation(OperationType.ADD, [acc, x, b.scalar(OperandType.INT32, 0)], [acc_out])
    return ImportedModel(b.build(), ["x", "acc_in"], ["y", "acc_out"],
                         [StateVariable("acc", np.zeros(2, F32), input=1, output=1)], "<acc>")


DEVICES = ["reference", "litert"]


def _session(model, device: str) -> Session:
    if device == "litert":
        _litert_or_skip()
    return Session(model, device)


@pytest.mark.parametrize("device", DEVICES)
def test_repeated_runs_are_bound_and_right(device):
    with _session(add_model((2,)), device) as s:
        a, b = np.array([1, 2], F32), np.array([3, 4], F32)
        assert s._bound is None
        assert s.run({"input_0": a, "input_1": b})["output_0"].tolist() == [4, 6]
        assert s._bound is not None
        assert (s._bound.runner is not None) == (device == "litert")
        for k in range(5):
            got = s.run({"input_1": b, "input_0": np.full(2, k, F32)})["output_0"]
            assert got.tolist() == [k + 3, k + 4]
            assert s.run([a, np.full(2, k, F32)])["output_0"].tolist() == [k + 1, k + 2]
        first = s.run([a, b])["output_0"]
        second = s.run([a, b])["output_0"]
        assert first is not second and not np.shares_memory(first, second)  # fresh arrays


def test_the_litert_binding_runs_without_requests():
    with _session(add_model((2,)), "litert") as s:
        ones = np.ones(2, F32)
        s.run([ones, ones])
        pm = s._prepared

        def refuse(*a, **k):
            raise AssertionError("a bound run went by request")

        pm.execute_synchronously = refuse
        assert s.run([ones, np.array([1, 5], F32)])["output_0"].tolist() == [2, 6]


@pytest.mark.parametrize("device", DEVICES)
def test_feeds_that_do_not_match_are_still_checked(device):
    with _session(add_model((2,)), device) as s:
        ones = np.ones(2, F32)
        s.run([ones, ones])
        assert s._bound is not None
        with pytest.raises(InputError, match="'input_0' is float64"):
            s.run([ones.astype(np.float64), ones])
        with pytest.raises(InputError, match="'input_1' has shape"):
            s.run({"input_0": ones, "input_1": np.ones(3, F32)})
        with pytest.raises(InputError, match="unknown input 'x'"):
            s.run({"input_0": ones, "x": ones})
        with pytest.raises(InputError, match="missing input 'input_1'"):
            s.run({"input_0": ones})
        with pytest.raises(InputError, match="1 inputs given"):
            s.run([ones])
        # converted feeds (a list of numbers, a numpy scalar-free view) take the general way
        assert s.run([[1, 2], ones[::1]])["output_0"].tolist() == [2, 3]
        assert s.run([np.ones(4, F32)[::2], ones])["output_0"].tolist() == [2, 2]


@pytest.mark.parametrize("device", DEVICES)
def test_state_carried_the_bound_way_equals_runs_by_request(device):
    rng = np.random.default_rng(0)
    xs = [rng.standard_normal(2).astype(F32) for _ in range(6)]
    with _session(accumulator(), device) as bound, _session(accumulator(), device) as plain:
        for x in xs:
            got = bound.run({"x": x})
            want = plain.run(ByRequest({"x": x}))
            assert list(got) == ["y"]
            np.testing.assert_array_equal(got["y"], want["y"])
        assert plain._bound is not None and bound._bound is not None
        np.testing.assert_allclose(got["y"], np.sum(xs, axis=0), rtol=1e-6)
        bound.reset_state()
        np.testing.assert_array_equal(bound.run({"x": xs[0]})["y"], xs[0])


def _wakeword_models() -> list[Path]:
    try:
        files = importlib.metadata.files("pymicro-wakeword") or []
    except importlib.metadata.PackageNotFoundError:
        return []
    return sorted(Path(f.locate()) for f in files if str(f).endswith(".tflite"))


WAKE = _wakeword_models()


@pytest.mark.skipif(not WAKE, reason="pymicro-wakeword is not installed (test extra)")
def test_a_wakeword_model_streams_the_same_bound_and_by_request(fast_way):
    """Six streaming runs of a real int8 model with six state variables: the bound way (the
    LiteRT driver's binding) and the way by request give the same outputs and states."""
    _litert_or_skip()
    path = WAKE[0]
    rng = np.random.default_rng(1)
    with Session(path, device="litert") as bound, Session(path, device="litert") as plain:
        info = bound.inputs[0]
        moved = 0
        for _ in range(6):
            x = rng.integers(-128, 128, info.shape).astype(info.dtype)
            before = list(bound._state)
            got = bound.run({info.name: x})
            want = plain.run(ByRequest({info.name: x}))
            assert all(np.array_equal(got[k], want[k]) for k in want)
            assert all(np.array_equal(a, b) for a, b in zip(bound._state, plain._state))
            moved += sum(not np.array_equal(a, b) for a, b in zip(before, bound._state))
        assert bound._bound.runner is not None
        assert moved > 0, "the state never changed: the comparison would be empty"


@pytest.mark.parametrize("name", ["select_v2_broadcast.tflite", "bmm_f32.tflite"])
def test_converter_models_agree_with_litert_when_bound(name):
    """Converter-made files on the default path and pinned to LiteRT, run again and again
    the bound way, against ai-edge-litert on the file itself."""
    _litert_or_skip()
    from ai_edge_litert.interpreter import Interpreter

    path = DATA / name
    peer = Interpreter(model_path=str(path))
    peer.allocate_tensors()
    rng = np.random.default_rng(2)
    with Session(path, cache=False) as rt, Session(path, device="litert", cache=False) as lit:
        details = peer.get_input_details()
        for _ in range(3):
            feeds = {i.name: rng.standard_normal([d or 1 for d in i.shape]).astype(i.dtype)
                     for i in lit.inputs}
            for d in details:
                peer.set_tensor(d["index"], feeds[d["name"]])
            peer.invoke()
            want = [peer.get_tensor(d["index"]) for d in peer.get_output_details()]
            for s in (rt, lit):
                got = list(s.run(feeds).values())
                assert all(np.array_equal(g.reshape(w.shape), w) for g, w in zip(got, want))
        assert lit._bound is not None and lit._bound.runner is not None


def test_a_binding_that_cannot_run_leaves_the_layout_to_requests():
    with _session(add_model((2,)), "litert") as s:
        ones = np.ones(2, F32)
        s.run([ones, ones])
        bound = s._bound
        calls = []

        class Failing:
            def run(self, inputs):
                calls.append(1)
                return None

        bound.runner = Failing()
        assert s.run([ones, np.array([1, 2], F32)])["output_0"].tolist() == [2, 3]
        assert bound.runner is None and calls == [1]
        assert s.run([ones, ones])["output_0"].tolist() == [2, 2]  # by request, bound views


def test_a_binding_answering_other_shapes_is_not_believed():
    with _session(add_model((2,)), "litert") as s:
        ones = np.ones(2, F32)
        s.run([ones, ones])
        bound = s._bound

        class Wrong:
            def run(self, inputs):
                return [np.zeros((1, 2), F32)]

        bound.runner = Wrong()
        assert s.run([ones, ones])["output_0"].tolist() == [2, 2]
        assert bound.runner is None


def test_a_failing_driver_behind_the_runtime_still_falls_back():
    """Session(model) over LiteRT with the reference as CPU fallback: a bound run the driver
    fails goes by request, and the runtime's fallback answers."""
    _litert_or_skip()
    from nnhal.runtime.plan import FallbackPrepared

    with Session(add_model((2,)), devices=None) as s:
        if not isinstance(s._prepared, FallbackPrepared):
            pytest.skip(f"compiled for {s.device_name}: no fallback around a driver")
        ones = np.ones(2, F32)
        s.run([ones, ones])
        if s._bound.runner is None:
            pytest.skip(f"{s.device_name} binds no arrays")
        s._bound.runner.run = lambda inputs: None
        s._prepared.primary.execute_synchronously = \
            lambda *a, **k: (ErrorStatus.GENERAL_FAILURE, [], Timing())
        assert s.run([ones, np.full(2, 3, F32)])["output_0"].tolist() == [4, 4]


def test_outputs_of_other_dimensions_are_read_in_them():
    """A model whose output dimensions depend on an input's values: the same input shapes,
    other output dimensions, read in the dimensions the driver reports."""
    b = ModelBuilder()
    x = b.input(OperandType.TENSOR_FLOAT32, [6])
    shape = b.input(OperandType.TENSOR_INT32, [2])
    out = b.output(OperandType.TENSOR_FLOAT32, [0, 0])
    b.operation(OperationType.RESHAPE, [x, shape], [out])
    with Session(b.build(), "reference") as s:
        x = np.arange(6, dtype=F32)
        assert s.run([x, np.array([2, 3], np.int32)])["output_0"].shape == (2, 3)
        assert s._bound is not None
        got = s.run([x, np.array([3, 2], np.int32)])["output_0"]
        assert got.shape == (3, 2) and got.ravel().tolist() == x.tolist()
        assert s.run([x, np.array([6, 1], np.int32)])["output_0"].shape == (6, 1)


@pytest.mark.parametrize("device", DEVICES)
def test_threads_sharing_a_bound_session_get_their_own_answers(device, fast_way):
    with _session(add_model((2,)), device) as s:
        ones = np.ones(2, F32)
        s.run([ones, ones])
        errors = []

        def work(k: int) -> None:
            try:
                for _ in range(50):
                    got = s.run([np.full(2, k, F32), ones])["output_0"]
                    if got.tolist() != [k + 1, k + 1]:
                        errors.append((k, got))
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors


def test_a_feed_converting_may_not_start_a_bound_run(fast_way):
    with Session(add_model((2,)), "reference") as s:
        ones = np.ones(2, F32)
        s.run([ones, ones])
        assert s._bound is not None

        class Reenters:
            def __array__(self, dtype=None, copy=None):
                s.run([ones, ones])
                return ones

        with pytest.raises(NnhalError, match="converting the feeds"):
            s.run([Reenters(), ones])
        assert s.run([ones, ones])["output_0"].tolist() == [2, 2]


def test_a_closed_session_refuses_bound_runs(fast_way):
    with _session(add_model((2,)), "reference") as s:
        ones = np.ones(2, F32)
        s.run([ones, ones])
    with pytest.raises(NnhalError, match="closed"):
        s.run([ones, ones])


def test_a_profiled_bound_run_is_timed(fast_way):
    with _session(add_model((2,)), "litert") as s:
        ones = np.ones(2, F32)
        s.run([ones, ones])
        with profile.profiling() as prof:
            s.run([ones, ones])
        assert s._bound.runner is not None
        assert sum(prof.driver.values()) > 0


def test_a_session_binds_again_for_another_prepared_model():
    """The binding belongs to the prepared model it was made with: runs after the Session's
    prepared model changed go the general way once, then bind to the new one."""
    with _session(add_model((2,)), "reference") as s:
        ones = np.ones(2, F32)
        s.run([ones, ones])
        first = s._bound
        real = s._prepared

        class Forwarding:
            def execute_synchronously(self, request, measure):
                return real.execute_synchronously(request, measure)

        s._prepared = Forwarding()
        assert s.run([ones, ones])["output_0"].tolist() == [2, 2]
        assert s._bound is not first and s._bound.prepared is s._prepared
        s._prepared = real
        assert s.run([ones, ones])["output_0"].tolist() == [2, 2]
        assert s._bound.prepared is real


def test_the_first_run_goes_by_arrays_where_the_driver_binds_them():
    """A model without state on a driver that binds arrays: the first run makes no request
    memory (as ai-edge-litert's own first invoke), and a run the binding cannot do later goes
    by request, binding that layout; the answers are the general way's."""
    with _session(add_model((2,)), "litert") as s:
        a, b = np.array([1, 2], F32), np.array([3, 4], F32)
        first = s.run({"input_0": a, "input_1": b})
        assert first["output_0"].tolist() == [4, 6]
        assert s._layout is None and s._bound is not None and s._bound.layout is None
        assert s.run(ByRequest({"input_0": b, "input_1": b}))["output_0"].tolist() == [6, 8]
        assert s._layout is not None
        assert s.run([a, a])["output_0"].tolist() == [2, 4]


def test_a_first_run_the_binding_cannot_do_goes_by_request(monkeypatch):
    from nnhal.drivers.litert.prepared_model import LiteRTArrays

    _litert_or_skip()
    monkeypatch.setattr(LiteRTArrays, "run", lambda self, inputs: None)
    with _session(add_model((2,)), "litert") as s:
        ones = np.ones(2, F32)
        assert s.run([ones, ones])["output_0"].tolist() == [2, 2]
        assert s._layout is not None and s._bound.layout is s._layout


def test_a_stateful_first_run_still_goes_by_request():
    _litert_or_skip()
    with Session(accumulator(), "litert") as s:
        assert s.run({"x": np.ones(2, F32)})["y"].tolist() == [1, 1]
        assert s._layout is not None
        assert s.run({"x": np.ones(2, F32)})["y"].tolist() == [2, 2]


def test_a_model_without_state_gets_the_direct_way_and_the_same_answers(fast_way):
    """Once LiteRT's binding answered well, ``run`` is a closure straight to the binding
    (:func:`nnhal.session.bound.plain_fast`); its answers are the general way's, and any other
    feed still goes the general way, which checks it."""
    with _session(add_model((2,)), "litert") as s:
        ones = np.ones(2, F32)
        s.run({"input_0": ones, "input_1": ones})
        assert "run" not in s.__dict__
        s.run({"input_0": ones, "input_1": ones})
        assert "run" in s.__dict__  # installed at the first bound run of the binding
        rng = np.random.default_rng(3)
        for _ in range(5):
            a, b = rng.standard_normal(2).astype(F32), rng.standard_normal(2).astype(F32)
            got = s.run({"input_0": a, "input_1": b})["output_0"]
            want = s.run(ByRequest({"input_0": a, "input_1": b}))["output_0"]
            assert got.tolist() == want.tolist() == (a + b).tolist()
        with pytest.raises(InputError):
            s.run({"input_0": ones.astype(np.float64), "input_1": ones})
        with pytest.raises(InputError):
            s.run({"input_0": ones, "input_2": ones})
        # Another shape the model refuses, then the bound layout again: still right.
        with pytest.raises(InputError):
            s.run({"input_0": np.ones(3, F32), "input_1": np.ones(3, F32)})
        assert s.run({"input_0": ones, "input_1": ones})["output_0"].tolist() == [2, 2]
    with pytest.raises(NnhalError, match="closed"):
        s.run({"input_0": ones, "input_1": ones})


def test_the_direct_way_falls_back_when_its_binding_fails(fast_way):
    with _session(add_model((2,)), "litert") as s:
        ones = np.ones(2, F32)
        s.run([ones, ones])
        s.run([ones, ones])
        assert "run" in s.__dict__
        bound = s._bound
        direct = bound.runner.direct()
        calls = []

        def failing(inputs):
            calls.append(1)
            return None

        bound.runner.direct = lambda: failing
        s.__dict__.pop("run")
        bound.fast = False
        s.run([ones, ones])  # installs the direct way over the failing call
        assert s.run({"input_0": ones, "input_1": np.array([1, 2], F32)})["output_0"] \
            .tolist() == [2, 3]
        assert calls == [1] and bound.runner is None  # by request from then on
        assert s.run({"input_0": ones, "input_1": ones})["output_0"].tolist() == [2, 2]
        assert direct([ones, ones]) is not None  # the real binding's direct way still runs


def test_a_run_from_inside_the_direct_way_is_refused_not_a_deadlock(fast_way):
    """A binding that calls Python code (an extension's, say) which runs the same Session:
    NnhalError, not a wait on the Session's own lock."""
    with _session(add_model((2,)), "litert") as s:
        ones = np.ones(2, F32)
        s.run([ones, ones])
        s.run([ones, ones])
        bound = s._bound
        real = bound.runner.direct()
        seen = []

        def reenter(inputs):
            try:
                s.run({"input_0": ones, "input_1": ones})
            except NnhalError as e:
                seen.append(str(e))
            return real(inputs)

        bound.runner.direct = lambda: reenter
        s.__dict__.pop("run")
        bound.fast = False
        s.run([ones, ones])
        assert s.run({"input_0": ones, "input_1": ones})["output_0"].tolist() == [2, 2]
        assert seen and "re-entered" in seen[0]
