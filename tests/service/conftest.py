import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from nnhal.service.client import RemoteDevice  # noqa: E402


@pytest.fixture
def remote(service):
    """A RemoteDevice on the module's ``service`` fixture."""
    dev = RemoteDevice(service.path)
    yield dev
    dev.close()
