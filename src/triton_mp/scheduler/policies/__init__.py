"""The pure batching core: the policy contract (``policy``), Triton's priority queue with its
queue policies (``queues``), the clocks (``clock``) and the batching policies, one per
module: ``default``, ``dynamic``, ``sequence``, ``ensemble``.

Each policy implements ``scheduler.policies.policy.Policy`` and is pure (no ipc, no I/O; time
only through ``clock``); which model gets which is ``scheduler.registry.POLICIES``. A new
policy is a new module here plus one entry there.
"""
