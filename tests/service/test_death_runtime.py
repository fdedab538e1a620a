"""A served driver that dies (SIGKILL) under the runtime and under the conformance runner.

Through the runtime, a compilation on the dead device only (createForDevices) answers
DEAD_OBJECT at once, for the call that was running and every later one; a compilation over
several devices (plain create) falls back to the reference driver and still gives the right
results. The conformance runner fails the case it was running and every case left at once,
as device unavailable, and exits 1 without a traceback.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import nnhal
from nnhal.hal.fence import SyncFence
from nnhal.runtime import Event, OperandSpec
from nnhal.runtime import ndk as N
from nnhal.runtime.codes import ResultCode as R
from nnhal.runtime.devices import Device

runtime_devices = sys.modules["nnhal.runtime.devices"]  # the module (its name is a function)

ROOT = Path(__file__).resolve().parents[2]
DELAY_S = 2.0  # the served driver sleeps this long in each prepare and execution
NAME = "dying-rt"
#: A hang guard, as in test_death.py: the answer comes from the death, not from a timeout
#: (the runtime's own are 600 s) nor from the slow driver.
PROMPT_S = 1.0
X = np.arange(16, dtype=np.float32).reshape(1, 16)
WANT = 2 * X


def start(rt: Path, delay: float = DELAY_S) -> subprocess.Popen:
    """``nnhal serve reference`` registered as NAME in the runtime directory ``rt``."""
    env = dict(os.environ, NNHAL_SERVICE_TEST_DELAY_S=str(delay), PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-m", "nnhal.cli", "serve", "reference",
                             "--socket", str(rt.parent / "svc.sock"), "--runtime-dir", str(rt),
                             "--name", NAME],
                            cwd=ROOT, env=env, stderr=subprocess.PIPE)
    end = time.monotonic() + 30
    entry = rt / f"{NAME}.service"
    while not (entry.exists() and f"pid={proc.pid}\n" in entry.read_text()):
        if proc.poll() is not None or time.monotonic() > end:
            proc.kill()
            pytest.fail(f"service did not start: {proc.stderr.read().decode()}")
        time.sleep(0.02)
    return proc


@pytest.fixture
def served(tmp_path, monkeypatch):
    """(service process, its device as the runtime names it, the reference device); the
    runtime's device list is [remote, reference], so plain create picks the served one."""
    from nnhal.drivers import registry

    monkeypatch.setattr(registry, "_DEVICES", dict(registry._DEVICES))
    monkeypatch.setattr(registry, "_discovered", False)
    monkeypatch.setenv("NNHAL_RUNTIME_DIR", str(tmp_path / "rt"))
    proc = start(tmp_path / "rt")
    remote = None
    try:
        # Found by name, through the registry, as any client finds it.
        assert f"remote:{NAME}" in registry.available()
        remote = Device(f"remote:{NAME}", registry.open_device(f"remote:{NAME}"))
        ref = Device("reference", registry.open_device("reference"))
        # Equal capabilities: the first device wins, so the served one runs plain create.
        monkeypatch.setattr(runtime_devices, "_devices", [remote, ref])
        yield proc, remote, ref
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        if remote is not None:
            remote.hal.close()


def model() -> nnhal.Model:
    """ADD of two float [1, 16] inputs."""
    m = nnhal.Model()
    t = OperandSpec(3, [1, 16])
    a, b = m.add_operand(t), m.add_operand(t)
    act = m.add_operand(OperandSpec(1))
    out = m.add_operand(t)
    m.set_operand_value(act, np.int32(0).tobytes())
    m.add_operation(0, [a, b, act], [out])
    m.identify_inputs_and_outputs([a, b], [out])
    m.finish()
    return m


def execution(c: nnhal.Compilation) -> tuple[nnhal.Execution, np.ndarray]:
    out = np.zeros((1, 16), np.float32)
    e = nnhal.Execution(c)
    e.set_input(0, None, X)
    e.set_input(1, None, X)
    e.set_output(0, None, out)
    return e, out


def kill_during(proc: subprocess.Popen, fn, settle: float = 0.4):
    """Run fn() (a call that takes DELAY_S) here; SIGKILL the service ``settle`` s in;
    (fn's result or the exception it raised, seconds from the kill to the return)."""
    killed: list[float] = []

    def killer() -> None:
        time.sleep(settle)
        killed.append(time.monotonic())
        proc.send_signal(signal.SIGKILL)

    t = threading.Thread(target=killer)
    t.start()
    try:
        result = fn()
    except nnhal.NdkError as e:
        result = e
    done = time.monotonic()
    t.join()
    proc.wait(10)
    return result, done - killed[0]


PATHS = ("compute", "start", "fenced", "burst", "reusable")


def run_path(c: nnhal.Compilation, path: str, burst: nnhal.Burst | None = None,
             gate: SyncFence | None = None) -> np.ndarray:
    """One execution of ``c`` through ``path``; its output. A fenced execution waits for
    ``gate`` in the driver (the service delays no fenced execution: this holds one)."""
    e, out = execution(c)
    if path == "compute":
        e.compute()
    elif path == "start":
        e.start_compute().wait()
    elif path == "fenced":
        e.start_compute_with_dependencies([] if gate is None else [Event(fence=gate)]).wait()
    elif path == "burst":
        e.burst_compute(burst if burst is not None else nnhal.Burst(c))
    else:
        e.set_reusable(True)
        e.compute()
        e.compute()
    return out


def dead_object(fn) -> None:
    with pytest.raises(nnhal.NdkError) as e:
        fn()
    assert e.value.code == R.DEAD_OBJECT, str(e.value)


@pytest.mark.parametrize("path", PATHS)
def test_for_devices_killed_mid_execution_is_dead_object(served, path):
    proc, remote, _ref = served
    m = model()
    c = nnhal.Compilation.for_devices(m, [remote])
    c.finish()  # DELAY_S
    burst = nnhal.Burst(c)
    err, after = kill_during(proc, lambda: run_path(c, path, burst, gate=SyncFence()))
    assert isinstance(err, nnhal.NdkError) and err.code == R.DEAD_OBJECT, err
    assert after < PROMPT_S
    # Every later call on the compilation, every path, and the device itself: dead.
    for later in PATHS:
        dead_object(lambda p=later: run_path(c, p, burst))
    dead_object(remote.wait)
    dead_object(lambda: m.supported_operations_for_devices([remote]))
    again = nnhal.Compilation.for_devices(m, [remote])
    dead_object(again.finish)


def test_for_devices_killed_during_prepare_is_dead_object(served):
    proc, remote, _ref = served
    c = nnhal.Compilation.for_devices(model(), [remote])
    err, after = kill_during(proc, c.finish)
    assert isinstance(err, nnhal.NdkError) and err.code == R.DEAD_OBJECT, err
    assert after < PROMPT_S


def test_all_devices_killed_mid_execution_falls_back(served):
    proc, remote, _ref = served
    c = nnhal.Compilation(model())
    c.finish()
    assert c.device is remote  # the served driver runs it
    e, out = execution(c)
    err, after = kill_during(proc, e.compute)
    assert err is None, err
    np.testing.assert_array_equal(out, WANT)
    assert c.fallbacks == 1 and after < PROMPT_S
    # Later executions, on every path, fall back too.
    for path in PATHS:
        np.testing.assert_array_equal(run_path(c, path), WANT, err_msg=path)


def test_all_devices_killed_during_prepare_and_before_compiling(served):
    proc, remote, ref = served
    c = nnhal.Compilation(model())
    err, _after = kill_during(proc, c.finish)
    assert err is None, err
    assert c.device is ref and c.fell_back  # prepared on the reference instead
    later = nnhal.Compilation(model())  # the dead device supports nothing now
    later.finish()
    assert later.device is ref
    for comp in (c, later):
        e, out = execution(comp)
        e.compute()
        np.testing.assert_array_equal(out, WANT)


def test_c_face_answers_dead_object(served):
    proc, remote, _ref = served
    m = N.ANeuralNetworksModel_create()[1]
    t = N.ANeuralNetworksOperandType(3, [1, 16])
    for spec in (t, t, N.ANeuralNetworksOperandType(1), t):
        assert N.ANeuralNetworksModel_addOperand(m, spec) == R.NO_ERROR
    assert N.ANeuralNetworksModel_setOperandValue(m, 2, np.int32(0).tobytes(), 4) == 0
    assert N.ANeuralNetworksModel_addOperation(m, 0, [0, 1, 2], [3]) == 0
    assert N.ANeuralNetworksModel_identifyInputsAndOutputs(m, [0, 1], [3]) == 0
    assert N.ANeuralNetworksModel_finish(m) == 0
    code, c = N.ANeuralNetworksCompilation_createForDevices(m, [remote])
    assert code == 0 and N.ANeuralNetworksCompilation_finish(c) == 0
    out = np.zeros((1, 16), np.float32)
    code, e = N.ANeuralNetworksExecution_create(c)
    assert N.ANeuralNetworksExecution_setInput(e, 0, None, X, 64) == 0
    assert N.ANeuralNetworksExecution_setInput(e, 1, None, X, 64) == 0
    assert N.ANeuralNetworksExecution_setOutput(e, 0, None, out, 64) == 0
    code, after = kill_during(proc, lambda: N.ANeuralNetworksExecution_compute(e))
    assert code == R.DEAD_OBJECT and after < PROMPT_S
    assert N.ANeuralNetworksDevice_wait(remote) == R.DEAD_OBJECT
    code, c2 = N.ANeuralNetworksCompilation_createForDevices(m, [remote])
    assert code == 0 and N.ANeuralNetworksCompilation_finish(c2) == R.DEAD_OBJECT
    for obj, free in ((e, N.ANeuralNetworksExecution_free), (c, N.ANeuralNetworksCompilation_free),
                      (c2, N.ANeuralNetworksCompilation_free), (m, N.ANeuralNetworksModel_free)):
        free(obj)


# ---- the conformance runner -------------------------------------------------------------

def test_conformance_killed_half_way_fails_the_rest_at_once(tmp_path):
    specs = Path(os.environ.get("NNHAL_CONFORMANCE", "/work/shared/conformance"))
    if not specs.is_dir():
        pytest.skip("no conformance cases")
    rt = tmp_path / "rt"
    proc = start(rt, delay=0.02)  # a case takes a few tenths of a second
    report = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "nnhal.cli", "conformance", "--specs", str(specs),
           "--device", f"remote:{rt.parent / 'svc.sock'}", "--filter", "sub*", "--mode",
           "general", "--mode", "runtime", "--quiet", "--no-ops", "--show-failures",
           "--json", str(report)]
    t0 = time.monotonic()
    cli = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Kill once cases run: the service then holds the CLI's connection and memories.
        fds = Path(f"/proc/{proc.pid}/fd")
        idle = len(list(fds.iterdir()))
        end = time.monotonic() + 60
        while len(list(fds.iterdir())) < idle + 3:
            assert cli.poll() is None and time.monotonic() < end, "no case ran"
            time.sleep(0.02)
        time.sleep(2.0)  # some cases pass, most are left
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        out, err = cli.communicate(timeout=120)
    finally:
        if cli.poll() is None:
            cli.kill()
        if proc.poll() is None:
            proc.kill()
    seconds = time.monotonic() - t0
    assert cli.returncode == 1, (out, err)
    assert "Traceback" not in out + err
    assert "became unavailable (it died)" in err
    data = json.loads(report.read_text())
    cases = data["cases"]
    assert len(cases) == 2 * 180
    [died] = data["died"]
    at = next(k for k, c in enumerate(cases) if c["mode"] == died["mode"] and
              c["name"] == died["case"])
    left = cases[at + 1:]
    assert len(left) == died["not_run"] > 0
    assert all(c["result"] == "failed" and c["message"] == "device unavailable: the device "
               "died before this case (not run)" for c in left)
    assert any(c["result"] == "passed" for c in cases[:at])  # killed half-way
    # The case running at the kill failed as device unavailable (or it had just passed).
    assert cases[at]["result"] == "passed" or (cases[at]["result"] == "failed" and cases[at][
        "message"].startswith("device unavailable: the device died during this case"))
    assert f"during [{died['mode']}] {died['case']}" in out
    assert seconds < 60  # a hang guard, not a timing goal
