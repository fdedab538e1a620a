"""Shared-memory pools (ashmem, mmap_fd, hardware_buffer_blob)."""

from nnhal.memory.pool import (
    ASHMEM,
    HARDWARE_BUFFER_BLOB,
    MMAP_FD,
    SUPPORTED_NAMES,
    MemoryError_,
    SharedMemory,
    shrunk_memory,
)

__all__ = ["ASHMEM", "HARDWARE_BUFFER_BLOB", "MMAP_FD", "SUPPORTED_NAMES", "MemoryError_",
           "SharedMemory", "shrunk_memory"]
