"""HAL drivers: what every driver shares (:mod:`nnhal.drivers.common`) and the drivers.

* :mod:`nnhal.drivers.reference`: the reference CPU driver (``ReferenceDevice``).
"""
