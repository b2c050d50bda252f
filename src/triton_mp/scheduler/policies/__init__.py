"""The batching policies, one per module: ``default``, ``dynamic``, ``sequence``.

Each implements ``scheduler.policy.Policy`` and is pure (no ipc, no clock, no I/O); which
model gets which is ``scheduler.registry.POLICIES``. A new policy (an ensemble scheduler) is
a new module here plus one entry there.
"""
