"""What only HAL 1.x (HIDL) has, kept at the edge of the canonical core: the 1.2 burst's FMQ
packet (``fmq``), which the burst rings of a served driver and the driver's burst still carry.
The canonical interfaces themselves are HAL 1.3's calls plus AIDL v4's, in :mod:`nnhal.hal`."""
