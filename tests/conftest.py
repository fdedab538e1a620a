import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from nnhal.drivers.reference import ReferenceDevice  # noqa: E402


@pytest.fixture
def device():
    dev = ReferenceDevice()
    yield dev
    dev.close()


@pytest.fixture
def fresh_runtime(monkeypatch):
    """The runtime (and so the C library in this process) lists its devices anew, the registry
    keeps what the test registers (a ``NAME@aidl`` of mode capi) to the test, and the devices
    listed are closed after: nothing a test opens by name outlives it."""
    import importlib

    from nnhal.conformance import mode_capi
    from nnhal.drivers import registry

    rt_devices = importlib.import_module("nnhal.runtime.devices")
    monkeypatch.setattr(registry, "_DEVICES", dict(registry._DEVICES))
    monkeypatch.delenv(rt_devices.DEVICES_ENV, raising=False)
    monkeypatch.setattr(rt_devices, "_devices", None)
    monkeypatch.setattr(rt_devices, "_named_seen", None)
    monkeypatch.setattr(mode_capi, "_listed", {})
    yield
    for d in rt_devices._devices or []:
        close = getattr(d.hal, "close", None)
        if close is not None:
            close()


@pytest.fixture(params=["native", "python", "native-threading-lock"])
def fast_way(request, monkeypatch):
    """A Session's repeated runs the native way (``fastrun.c`` over ``direct.c``; skipped,
    saying why, where they cannot be built), their Python twins, or the native way over a
    ``threading.Lock`` (a Session opened before the module was built): each test using this
    runs all three."""
    import threading

    from nnhal.drivers.litert import direct
    from nnhal.session import bound, session

    if request.param == "python":
        for m in (bound.FASTRUN, direct.DIRECT):
            monkeypatch.setattr(m, "module", lambda build=True: None)
            monkeypatch.setattr(m, "soon", lambda: None)
    elif bound.FASTRUN.module() is None or direct.DIRECT.module() is None:
        # (built here and now: the Session's own builds run on a thread, its twins meanwhile)
        pytest.skip(f"native fast runs not built: {bound.FASTRUN.status()}; "
                    f"{direct.DIRECT.status()}")
    elif request.param == "native-threading-lock":
        monkeypatch.setattr(session, "session_lock", threading.Lock)
    return request.param


def pytest_terminal_summary(terminalreporter):
    """Print the conformance report per mode (collected by test_conformance) before pytest's
    own closing line."""
    try:
        import test_conformance
    except ImportError:
        return
    for summary in test_conformance.SUMMARIES:
        terminalreporter.section("conformance")
        terminalreporter.write_line(summary)
