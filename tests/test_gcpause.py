"""nnhal.core.gcpause: collections held off for an open, resumed after (nested and threaded
opens share one pause), never turned on when the caller had them off."""

import gc
import threading

from nnhal.core import gcpause


def test_paused_nests_and_restores():
    assert gc.isenabled()
    with gcpause.paused():
        assert not gc.isenabled()
        with gcpause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()


def test_paused_restores_after_an_exception_and_keeps_a_disabled_gc_off():
    try:
        with gcpause.paused():
            raise KeyError("x")
    except KeyError:
        pass
    assert gc.isenabled()
    gc.disable()
    try:
        with gcpause.paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the caller turned it off: it stays off
    finally:
        gc.enable()


def test_threads_share_one_pause():
    inside, release = threading.Event(), threading.Event()

    def other():
        with gcpause.paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    with gcpause.paused():
        t.start()
        assert inside.wait(10)
    assert not gc.isenabled()  # the other thread's open is still going
    release.set()
    t.join(10)
    assert gc.isenabled()
