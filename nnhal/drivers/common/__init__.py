"""What every driver shares, one concern per module.

* :mod:`~nnhal.drivers.common.callbacks`: notifying client callbacks (once, never raising).
* :mod:`~nnhal.drivers.common.workers`: one worker pool per priority.
* :mod:`~nnhal.drivers.common.tokens`: the memory-domain token registry of a device.
* :mod:`~nnhal.drivers.common.request_checks`: checking a request against a prepared model.
* :mod:`~nnhal.drivers.common.runs`: what the shared machinery needs of a prepared model, and
  one-execution-at-a-time runs (bursts, reusable executions).
* :mod:`~nnhal.drivers.common.fenced`: fenced execution (``executeFenced``, ``computeFenced``).
* :mod:`~nnhal.drivers.common.prepared_model`: the IPreparedModel every driver subclasses
  (checking, recent-request recognition, sync / async / fenced paths, timing) around one
  engine hook, ``execute_checked``.
* :mod:`~nnhal.drivers.common.burst`, :mod:`~nnhal.drivers.common.execution`: IBurst and
  reusable IExecution over any such prepared model.
* :mod:`~nnhal.drivers.common.buffer`: memory domains (IDevice.allocate, the IBuffer).
* :mod:`~nnhal.drivers.common.compilation_cache`: the compilation-cache container (files, key,
  HMAC, framing, live plans), around a driver's own encoding of what it prepared.

Nothing here imports a driver: drivers pass in what the machinery needs.
"""
