"""When the service dies (SIGKILL), pending and later calls return DEVICE_UNAVAILABLE at once,
callbacks and fences are completed, and a restarted service is found again."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import add_model, float_inputs

from nnhal.hal.builder import RequestBuilder
from nnhal.hal.fence import FenceState, SyncFence
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import ErrorStatus, ExecutionPreference, MeasureTiming, Priority
from nnhal.hidl import ExecutionCallback
from nnhal.hidl import execute as execute_1_3
from nnhal.service import transport
from nnhal.service.client import RemoteDevice

E = ErrorStatus
ROOT = Path(__file__).resolve().parents[2]
DELAY_S = 3.0  # the served driver sleeps this long in each prepare and execution


def start(sock: Path, delay: float = DELAY_S) -> subprocess.Popen:
    env = dict(os.environ, NNHAL_SERVICE_TEST_DELAY_S=str(delay), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "nnhal.cli", "serve", "reference",
                             "--socket", str(sock), "--runtime-dir", str(sock.parent / "rt"),
                             "--name", "dying"],
                            cwd=ROOT, env=env, stderr=subprocess.PIPE)
    end = time.monotonic() + 20
    entry = sock.parent / "rt" / "dying.service"
    while not (entry.exists() and f"pid={proc.pid}\n" in entry.read_text()):
        if proc.poll() is not None or time.monotonic() > end:
            proc.kill()
            pytest.fail(f"service did not start: {proc.stderr.read().decode()}")
        time.sleep(0.02)
    return proc


@pytest.fixture
def sock(tmp_path):
    return tmp_path / "svc.sock"


def prepared(dev):
    cb = PreparedModelCallback()
    dev.prepare_model(add_model((2, 2)), ExecutionPreference.FAST_SINGLE_ANSWER,
                      Priority.MEDIUM, None, [], [], b"", cb)
    status, pm = cb.wait(30)
    assert status == E.NONE
    return pm


def kill_during(proc, fn, settle=0.3):
    """Run fn() (a call that takes DELAY_S) in this thread; SIGKILL the service after
    ``settle`` seconds; return (fn's result, seconds from the kill to the return)."""
    import threading

    killed = []

    def killer():
        time.sleep(settle)
        killed.append(time.monotonic())
        proc.send_signal(signal.SIGKILL)

    t = threading.Thread(target=killer)
    t.start()
    result = fn()
    done = time.monotonic()
    t.join()
    return result, done - killed[0]


def test_kill_during_prepare(sock):
    proc = start(sock)
    dev = RemoteDevice(sock)
    try:
        cb = PreparedModelCallback()

        def call():
            dev.prepare_model(add_model((2, 2)), ExecutionPreference.FAST_SINGLE_ANSWER,
                              Priority.MEDIUM, None, [], [], b"", cb)
            return cb.wait(10)

        (status, pm), after = kill_during(proc, call)
        assert status == E.DEVICE_UNAVAILABLE and pm is None and cb.calls == 1
        assert after < 1.0
        assert dev.get_type()[0] == E.DEVICE_UNAVAILABLE  # later calls too
    finally:
        dev.close()
        proc.wait(10)


@contextlib.contextmanager
def served_pm(sock: Path, delay: float = DELAY_S):
    """(service process, device, prepared model, request) of a service whose prepares and
    executions each take ``delay``."""
    proc = start(sock, delay)
    dev = RemoteDevice(sock)
    a, b = float_inputs(0, (2, 2))
    rb = RequestBuilder([a, b], [a.nbytes])
    try:
        pm = prepared(dev)  # takes ``delay``
        yield proc, dev, pm, rb
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        dev.close()
        rb.close()


@pytest.fixture
def slow_pm(sock):
    with served_pm(sock) as served:
        yield served


def test_kill_during_synchronous_execution(slow_pm):
    proc, dev, pm, rb = slow_pm
    (status, shapes, _), after = kill_during(proc, lambda: pm.execute_synchronously(rb.request))
    assert status == E.DEVICE_UNAVAILABLE and shapes == [] and after < 1.0
    assert pm.execute_synchronously(rb.request)[0] == E.DEVICE_UNAVAILABLE


def test_kill_during_a_repeated_synchronous_execution(sock, monkeypatch):
    # The same execution again takes the client's short way (its message remembered, the
    # reply read by the caller): it fails as the first one does.
    monkeypatch.setattr(transport.os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # it looks
    monkeypatch.setattr(transport, "cpu_pressure", lambda: None)
    with served_pm(sock, delay=0.6) as (proc, dev, pm, rb):
        # The first defines the memories; the second is remembered; the third goes the
        # short way and measures its round trip, which the next one sleeps towards.
        for _ in range(3):
            assert pm.execute_synchronously(rb.request)[0] == E.NONE
        assert dev.conn.sent_again == 1 and dev.conn.looked == 0
        (status, shapes, _), after = kill_during(
            proc, lambda: pm.execute_synchronously(rb.request))
        assert status == E.DEVICE_UNAVAILABLE and shapes == [] and after < 1.0
        assert dev.conn.looked == 1  # it slept towards the expected reply when killed
        assert pm.execute_synchronously(rb.request)[0] == E.DEVICE_UNAVAILABLE


def test_kill_while_a_repeated_execution_looks_for_its_reply(sock, monkeypatch):
    # Awake and polling for the reply (not blocked in the kernel): the end of the socket is
    # what the look finds, at once, not after its window.
    from nnhal.service import client

    monkeypatch.setattr(transport.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(transport, "cpu_pressure", lambda: None)
    monkeypatch.setattr(transport, "YIELD_GAVE_S", 10.0)  # a busy machine does not end it
    monkeypatch.setattr(client, "REPLY_LOOK_S", 0.55)  # looks from about 50 ms in
    monkeypatch.setattr(client, "REPLY_LOOK_MAX_S", 5.0)
    with served_pm(sock, delay=0.6) as (proc, dev, pm, rb):
        for _ in range(3):
            assert pm.execute_synchronously(rb.request)[0] == E.NONE
        (status, shapes, _), after = kill_during(
            proc, lambda: pm.execute_synchronously(rb.request), settle=0.35)
        assert status == E.DEVICE_UNAVAILABLE and shapes == [] and after < 0.5
        assert dev.conn.looked == 1 and dev.conn.found == 1  # the look found the end
        assert pm.execute_synchronously(rb.request)[0] == E.DEVICE_UNAVAILABLE


def test_kill_during_asynchronous_execution(slow_pm):
    proc, dev, pm, rb = slow_pm
    cb = ExecutionCallback()
    assert execute_1_3(pm, rb.request, MeasureTiming.NO, None, None, cb) == E.NONE

    (status, _, _), after = kill_during(proc, lambda: cb.wait(10))
    assert status == E.DEVICE_UNAVAILABLE and cb.calls == 1 and after < 1.0


def test_kill_during_burst_and_fenced(slow_pm):
    proc, dev, pm, rb = slow_pm
    status, burst = pm.configure_execution_burst()
    assert status == E.NONE
    gate = SyncFence()
    status, fence, fcb = pm.execute_fenced(rb.request, [gate])
    assert status == E.NONE
    (status, _, _), after = kill_during(proc, lambda: burst.execute(rb.request))
    assert status == E.DEVICE_UNAVAILABLE and after < 1.0
    assert fence.wait(1.0) == FenceState.ERROR
    assert fcb.get_execution_info()[0] == E.DEVICE_UNAVAILABLE


def test_restarted_service_is_found_again(sock, monkeypatch):
    from nnhal.drivers import registry

    monkeypatch.setattr(registry, "_DEVICES", dict(registry._DEVICES))
    monkeypatch.setattr(registry, "_discovered", registry._discovered)
    proc = start(sock, delay=0.0)
    proc.kill()
    proc.wait(10)
    proc = start(sock, delay=0.0)  # the stale socket of the dead one is replaced
    try:
        monkeypatch.setenv("NNHAL_RUNTIME_DIR", str(sock.parent / "rt"))
        status = Path(f"/proc/{proc.pid}/status").read_text()
        assert "NoNewPrivs:\t1" in status  # the service dropped the right to gain privileges
        assert registry.reason("remote:dying") is None
        dev = registry.open_device("remote:dying")
        try:
            assert dev.get_type()[0] == E.NONE
            assert prepared(dev) is not None
        finally:
            dev.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    assert not sock.exists()  # a clean stop removes its socket and its registration
    assert not (sock.parent / "rt" / "dying.service").exists()
