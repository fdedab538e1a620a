"""``python -m nnhal.conformance.mutations``: the same as ``nnhal mutations``."""

from nnhal.conformance.mutations.cli import main

raise SystemExit(main())
