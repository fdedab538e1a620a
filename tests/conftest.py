import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from nnhal.driver import ReferenceDevice  # noqa: E402


@pytest.fixture
def device():
    dev = ReferenceDevice()
    yield dev
    dev.close()
