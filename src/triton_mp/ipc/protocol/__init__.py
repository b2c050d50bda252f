"""What the processes say to each other: the msgspec message types (``messages`` and the
per-concern ``control_messages``, ``bls_messages``, ``log_messages``, ``ready_messages``,
``trace_messages``, ``reports``) and the runtime specs a child starts from (``specs``).
Uses ``ipc.memory`` (wake-up names); never the records or the shells over them.
"""
