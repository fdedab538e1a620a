"""The model commands: ``nnhal run``, ``bench``, ``info`` and ``view``."""
