"""The server's child processes and the IPC objects wired between them: the process table,
every child's spawn target, heartbeats, wiring, worker instances, BLS rings and the
frontends' control pipes and restarts.

Nothing is imported here: ``child_entry`` is every child process's spawn target, and a child
must not pay for the supervisor's own imports.
"""
