"""A fuzzer of the CLIENT against a hostile service: every call the client makes (AIDL v4's
calls with hints and the feature level among them) is answered
with a real reply, a mutated one (truncated, bits flipped, a count or a dimension made huge,
trailing bytes, random bytes), another kind (events of junk, unknown kinds), an ERROR of any
status, stray descriptors, a message cut off by a close, or nothing. The client only ever
returns HAL results (never raises), returns within its bounds, and leaks no descriptor."""

from __future__ import annotations

import os
import random
import socket
import threading
import time

import numpy as np
from helpers import add_model
from hostile import Hostile, mutate, real_reply

from nnhal.core.version import FeatureLevel
from nnhal.hal.builder import RequestBuilder
from nnhal.hal.interfaces import PreparedModelCallback
from nnhal.hal.types import (
    BufferDesc,
    ErrorStatus,
    ExecutionConfig,
    MeasureTiming,
    PrepareModelConfig,
    TokenValuePair,
)
from nnhal.hidl import ExecutionCallback
from nnhal.hidl import execute as execute_1_3
from nnhal.service import wire as w
from nnhal.service.client import (
    RemoteBurst,
    RemoteDevice,
    RemoteExecution,
    RemotePreparedModel,
)
from nnhal.service.transport import send_message

CONNECTIONS = 300
CALLS_PER_CONNECTION = 20
SEED = 20240601


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _policy(rng: random.Random):
    def policy(sock: socket.socket, kind: w.Kind, call_id: int) -> None:
        how = rng.randrange(100)
        real = real_reply(kind)
        if how < 25:
            send_message(sock, w.Kind.REPLY, call_id, real)
        elif how < 60:
            send_message(sock, w.Kind.REPLY, call_id, mutate(rng, real))
        elif how < 68:  # an event or another kind, junk inside
            k = rng.choice([w.Kind.NOTIFY_PREPARED, w.Kind.NOTIFY_EXECUTION,
                            w.Kind.FENCE_STATE, w.Kind.GET_TYPE, w.Kind.RELEASE])
            send_message(sock, k, rng.choice([call_id, 0, 12345]), mutate(rng, real))
            send_message(sock, w.Kind.REPLY, call_id, real)
        elif how < 76:
            wr = w.Writer()
            wr.u32(rng.choice([0, 2, 5, 8, 9, 0xFFFF_FFFF]))
            send_message(sock, w.Kind.ERROR, call_id, wr.buf)
        elif how < 84:  # stray descriptors with the reply
            r, wfd = os.pipe()
            try:
                send_message(sock, w.Kind.REPLY, call_id, real, [r, wfd])
            finally:
                os.close(r)
                os.close(wfd)
        elif how < 90:  # a header of another kind or version: the framing breaks
            hdr = bytearray(w.pack_header(w.Kind.REPLY, call_id, len(real), 0))
            hdr[rng.randrange(len(hdr))] ^= 0xFF
            sock.sendall(bytes(hdr) + real)
        elif how < 95:  # cut off by a close
            sock.sendall(w.pack_header(w.Kind.REPLY, call_id, len(real) + 100, 0) + real)
            sock.shutdown(socket.SHUT_RDWR)
        elif how < 98:
            sock.sendall(os.urandom(rng.randrange(1, 40)))
        # else: never answers
    return policy


def _calls(dev: RemoteDevice, rb: RequestBuilder):
    pm = RemotePreparedModel(dev.conn, 1)
    ex = RemoteExecution(dev.conn, 2)
    ex.request = rb.request
    model = add_model((4, 4))

    def prepare():
        cb = PreparedModelCallback()
        dev.prepare_model(model, callback=cb)
        return cb.wait(4)

    def execute():
        cb = ExecutionCallback()
        execute_1_3(pm, rb.request, 0, None, None, cb)
        return cb.wait(4)

    def fenced():
        status, fence, fcb = pm.execute_fenced(rb.request, [])
        if fence is not None:
            assert fence.wait(4)
            return fcb.get_execution_info()
        return status, fence, fcb

    # AIDL v4: the feature level, and the calls with hints (their own messages)
    hints = (TokenValuePair(0x7AAA0001, b"\1\2"),)
    config = ExecutionConfig(MeasureTiming.YES, None, hints)
    burst = RemoteBurst(dev.conn, 3)

    def prepare_with_config():
        cb = PreparedModelCallback()
        dev.prepare_model_with_config(model, PrepareModelConfig(compilation_hints=hints), cb)
        return cb.wait(4)

    def fenced_with_config():
        status, fence, fcb = pm.execute_fenced_with_config(rb.request, [], config)
        if fence is not None:
            assert fence.wait(4)
            return fcb.get_execution_info()
        return status, fence, fcb

    def feature_level():
        dev._feature_level = None  # asked again each time
        level = dev.feature_level
        assert isinstance(level, FeatureLevel)
        return ErrorStatus.NONE, level

    v4 = [feature_level, prepare_with_config, fenced_with_config,
          lambda: pm.execute_synchronously_with_config(rb.request, config),
          lambda: pm.create_reusable_execution_with_config(rb.request, config),
          lambda: burst.execute_with_config(rb.request, config)]
    return v4 + [dev.get_type, dev.get_version_string, dev.get_capabilities,
            dev.get_supported_extensions, dev.get_number_of_cache_files_needed,
            lambda: dev.get_supported_operations(model), prepare, execute, fenced,
            lambda: pm.execute_synchronously(rb.request),
            lambda: pm.execute_synchronously(rb.request, deadline=time.monotonic_ns() + 10**8),
            lambda: pm.create_reusable_execution(rb.request), ex.compute,
            lambda: dev.allocate(BufferDesc([4, 4]), [pm], [], [])]


def test_a_hostile_service_gets_only_hal_results_from_the_client(tmp_path):
    rng = random.Random(SEED)
    srv = Hostile(str(tmp_path / "h.sock"), _policy(rng))
    errors: list[BaseException] = []
    old_hook = threading.excepthook
    threading.excepthook = lambda a: errors.append(a.exc_value)
    a = np.ones((4, 4), np.float32)
    before = _fds()
    inputs = 0
    t_start = time.monotonic()
    try:
        for _ in range(CONNECTIONS):
            dev = RemoteDevice(srv.path, timeout_s=0.05, long_timeout_s=0.1)
            rb = RequestBuilder([a, a], [a.nbytes])
            calls = _calls(dev, rb)
            for _ in range(CALLS_PER_CONNECTION):
                call = rng.choice(calls)
                t0 = time.monotonic()
                result = call()
                inputs += 1
                assert time.monotonic() - t0 < 5, call
                status = result[0] if isinstance(result, tuple) else result
                assert isinstance(status, ErrorStatus), result
                if dev.conn.dead:
                    break
            dev.close()
            rb.close()
    finally:
        threading.excepthook = old_hook
        srv.close()
    assert errors == []
    assert inputs >= CONNECTIONS  # at least one call per connection
    deadline = time.monotonic() + 5
    while _fds() > before and time.monotonic() < deadline:
        time.sleep(0.05)  # the service threads close their ends
    assert _fds() <= before, "descriptors leaked"
    assert time.monotonic() - t_start < 60
    print(f"{inputs} calls answered by a hostile service in {time.monotonic() - t_start:.1f} s")
