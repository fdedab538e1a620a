"""A reference device that supports one vendor extension and records the AIDL v4 configs the
runtime gives it (compilation hints at prepare, execution hints at every computation), for
the tests of feature level 8's extension attributes (runtime and C library)."""

from __future__ import annotations

import json
import os
from typing import Any

from nnhal.drivers.reference import ReferenceDevice
from nnhal.hal.interfaces import IBurst, IPreparedModel, IPreparedModelCallback
from nnhal.hal.types import ErrorStatus, Extension

EXTENSION = "com.example.hints"
#: Where :func:`logged` devices write what they are given (a C client's driver, in the
#: process the library started: the test reads the file).
LOG_ENV = "NNHAL_TEST_HINTS_LOG"


class _Seen(list):
    """A record that also appends each entry's hints to a file as a JSON line."""

    def __init__(self, path: str | None):
        super().__init__()
        self.path = path

    def append(self, entry: Any) -> None:
        super().append(entry)
        if self.path is not None:
            kind, config = entry
            hints = getattr(config, "compilation_hints", None)
            if hints is None:
                hints = getattr(config, "execution_hints", ())
            table = getattr(config, "extension_name_to_prefix", ())
            with open(self.path, "a") as f:
                f.write(json.dumps({"kind": kind,
                                    "hints": [[h.token, h.value.hex()] for h in hints],
                                    "table": [[e.name, e.prefix] for e in table]}) + "\n")


class _Burst(IBurst):
    def __init__(self, inner: IBurst, seen: list):
        self.inner, self.seen = inner, seen

    def cache_memory(self, memory: Any) -> Any:
        return self.inner.cache_memory(memory)

    def execute(self, *a: Any, **k: Any) -> Any:
        return self.inner.execute(*a, **k)

    def create_reusable_execution(self, *a: Any, **k: Any) -> Any:
        return self.inner.create_reusable_execution(*a, **k)

    def execute_with_config(self, request: Any, config: Any, deadline: Any = None) -> Any:
        self.seen.append(("burst", config))
        return self.inner.execute_with_config(request, config, deadline)


class _Prepared(IPreparedModel):
    """Forwards everything; records the config of each *_with_config call."""

    def __init__(self, inner: IPreparedModel, seen: list):
        self.inner, self.seen = inner, seen

    def execute_synchronously(self, *a: Any, **k: Any) -> Any:
        self.seen.append(("plain", None))
        return self.inner.execute_synchronously(*a, **k)

    def validate_request(self, *a: Any, **k: Any) -> Any:
        return self.inner.validate_request(*a, **k)

    def executor(self) -> Any:
        return self.inner.executor()

    def execute_fenced(self, *a: Any, **k: Any) -> Any:
        return self.inner.execute_fenced(*a, **k)

    def create_reusable_execution(self, *a: Any, **k: Any) -> Any:
        return self.inner.create_reusable_execution(*a, **k)

    def configure_execution_burst(self) -> Any:
        status, burst = self.inner.configure_execution_burst()
        return status, (_Burst(burst, self.seen) if burst is not None else None)

    def execute_synchronously_with_config(self, request: Any, config: Any,
                                          deadline: Any = None) -> Any:
        self.seen.append(("sync", config))
        return self.inner.execute_synchronously_with_config(request, config, deadline)

    def execute_fenced_with_config(self, request: Any, wait_for: Any, config: Any,
                                   deadline: Any = None, duration: Any = None) -> Any:
        self.seen.append(("fenced", config))
        return self.inner.execute_fenced_with_config(request, wait_for, config, deadline,
                                                     duration)

    def create_reusable_execution_with_config(self, request: Any, config: Any) -> Any:
        self.seen.append(("reusable", config))
        return self.inner.create_reusable_execution_with_config(request, config)


class HintDevice(ReferenceDevice):
    """The reference driver with extension :data:`EXTENSION`; ``prepared`` holds the
    PrepareModelConfig of each preparation, ``executed`` (kind, ExecutionConfig) per call."""

    def __init__(self, log: str | None = None) -> None:
        super().__init__()
        self.prepared: list[Any] = []
        self.executed: list[tuple[str, Any]] = _Seen(log)
        self._log = _Seen(log)

    def get_supported_extensions(self) -> tuple[ErrorStatus, list[Extension]]:
        return ErrorStatus.NONE, [Extension(EXTENSION)]

    def prepare_model_with_config(self, model: Any, config: Any,
                                  callback: IPreparedModelCallback) -> ErrorStatus:
        self.prepared.append(config)
        self._log.append(("prepare", config))
        seen = self.executed

        class Wrap(IPreparedModelCallback):
            def notify(self, status: Any, pm: Any) -> None:
                callback.notify(status, _Prepared(pm, seen) if pm is not None else None)

        return super().prepare_model_with_config(model, config, Wrap())


def logged() -> HintDevice:
    """A plug-in factory: a HintDevice writing to the file ``$NNHAL_TEST_HINTS_LOG`` names."""
    return HintDevice(os.environ.get(LOG_ENV))
