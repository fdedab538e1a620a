"""nnhal.memory.collector: a model's open keeps full collections to its own objects, and
leaves the process's collector as it found it."""

from __future__ import annotations

import gc
import threading
import weakref

import numpy as np
import pytest
from helpers import add_model

from nnhal.memory.collector import new_objects_only
from nnhal.session import Session


@pytest.fixture(autouse=True)
def _collector_as_found():
    enabled = gc.isenabled()
    gc.unfreeze()
    yield
    gc.unfreeze()
    (gc.enable if enabled else gc.disable)()


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_older_objects_are_frozen_inside_and_unfrozen_after() -> None:
    old = _Node()
    with new_objects_only():
        assert gc.get_freeze_count() > 0
        assert not any(o is old for o in gc.get_objects())
    assert gc.get_freeze_count() == 0
    assert any(o is old for o in gc.get_objects())


def test_garbage_made_inside_is_collected_inside() -> None:
    with new_objects_only():
        ref = weakref.ref(_Node())
        gc.collect()
        assert ref() is None


def test_older_garbage_is_collected_after() -> None:
    ref = weakref.ref(_Node())
    with new_objects_only():
        gc.collect()
        assert ref() is not None  # frozen: not walked
    gc.collect()
    assert ref() is None


def test_a_process_that_froze_objects_keeps_them_frozen() -> None:
    gc.freeze()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    with new_objects_only():
        pass
    assert gc.get_freeze_count() == frozen


def test_a_disabled_collector_is_left_alone() -> None:
    gc.disable()
    with new_objects_only():
        assert gc.get_freeze_count() == 0
    assert not gc.isenabled()


def test_nested_and_concurrent_windows_unfreeze_when_the_last_leaves() -> None:
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with new_objects_only():
            inside.set()
            leave.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(10)
    with new_objects_only():
        with new_objects_only():
            pass
        assert gc.get_freeze_count() > 0
    assert gc.get_freeze_count() > 0  # the other thread's window is still open
    leave.set()
    t.join(10)
    assert gc.get_freeze_count() == 0


def test_a_failed_window_unfreezes() -> None:
    with pytest.raises(RuntimeError):
        with new_objects_only():
            raise RuntimeError("open failed")
    assert gc.get_freeze_count() == 0


def test_a_session_opens_in_a_window_and_leaves_nothing_frozen(monkeypatch) -> None:
    seen = []
    opened = Session._open

    def spy(self, *args):
        seen.append(gc.get_freeze_count())
        return opened(self, *args)

    monkeypatch.setattr(Session, "_open", spy)
    with Session(add_model(), "reference") as s:
        assert seen and seen[0] > 0
        assert gc.get_freeze_count() == 0
        got = s.run({s.inputs[0].name: np.ones(s.inputs[0].shape, np.float32),
                     s.inputs[1].name: np.ones(s.inputs[1].shape, np.float32)})
        assert np.allclose(next(iter(got.values())), 2.0)
    assert gc.get_freeze_count() == 0
