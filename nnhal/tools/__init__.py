"""The model commands (``nnhal run``, ``nnhal bench``...): each module has
``add_arguments(parser)`` and ``main(args) -> int``, wired into :mod:`nnhal.cli`."""
