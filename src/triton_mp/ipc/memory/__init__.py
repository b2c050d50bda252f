"""Shared memory and wake-ups, the bottom of ``ipc``: segment names (``topology``), POSIX
segments (``shm``), eventfd/FIFO/semaphore wake-ups (``notify``), the single-producer rings
(``ring``), CUDA IPC handles (``cuda_ipc``), and the boards that live in one segment each
(``heartbeat``, ``metric_board``, ``response_cache``). Imports nothing else of ``ipc``.
"""
