import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nnhal.drivers.reference import ReferenceDevice  # noqa: E402
from nnhal.service.client import RemoteDevice  # noqa: E402
from nnhal.service.server import Service  # noqa: E402


@contextmanager
def served(path: Path, **kw) -> Iterator[Service]:
    """A reference driver served at ``path`` in a thread of this process, stopped after."""
    svc = Service(ReferenceDevice(), path, **kw)
    t = threading.Thread(target=svc.serve_forever, daemon=True)
    t.start()
    try:
        yield svc
    finally:
        svc.stop()
        t.join(5)
        svc.device.close()


@pytest.fixture
def remote(service):
    """A RemoteDevice on the module's ``service`` fixture."""
    dev = RemoteDevice(service.path)
    yield dev
    dev.close()
