"""The rate limiter (``scheduler.limits.rate_limiter``) and the core's use of it: no processes.

Pure decisions first (pool sizes, Triton's errors, who goes first), then a ``SchedulerCore``
with a limiter in the recording harness: batches that share a resource of count 1 never
run at the same time, a model without resources is not held back, priority 2 gets half the
executions of priority 1, a dead worker gives its resources back, and a batch waiting for
resources counts as pending.
"""

from __future__ import annotations

import msgspec
import pytest

from tests.unit.scheduler_harness import Harness, model_spec
from triton_mp.ipc.protocol.messages import WorkerDied
from triton_mp.ipc.protocol.specs import BatchingSpec, ModelVersionSpec, RateLimitSpec, ResourceSpec
from triton_mp.scheduler.core import SchedulerCore
from triton_mp.scheduler.limits.rate_limiter import (
    GLOBAL,
    PER_DEVICE,
    Limits,
    RateLimiter,
    check_resources,
    pool_sizes,
)


def _lim(*resources: tuple[str, bool, int], priority: int = 0, device: int = 0) -> Limits:
    return Limits(tuple(resources), priority, device)


def test_pools_default_to_the_largest_need_per_device_and_globally() -> None:
    sizes = pool_sizes(
        [
            {(0, "R"): 1, (GLOBAL, "G"): 2},
            {(0, "R"): 3},
            {(1, "R"): 2},
        ],
        [],
    )
    assert sizes == {(0, "R"): 3, (GLOBAL, "G"): 2, (1, "R"): 2}


def test_explicit_counts_per_device_and_for_every_device() -> None:
    demands = [{(0, "R"): 1}, {(1, "R"): 1}, {(GLOBAL, "G"): 1}]
    sizes = pool_sizes(demands, [("R", 4, PER_DEVICE), ("R", 2, 1), ("G", 5, 3)])
    assert sizes == {(0, "R"): 4, (1, "R"): 4, (GLOBAL, "G"): 5}


def test_triton_s_errors() -> None:
    assert check_resources([_lim(("R", False, 2))], [("R", 1, PER_DEVICE)]) == (
        'Resource count for "R" is limited to 1 which will prevent scheduling of one or more '
        "model instances, the minimum required count is 2"
    )
    # Once any count is given, an unlisted resource has none.
    assert "limited to 0" in str(check_resources([_lim(("S", False, 1))], [("R", 1, -1)]))
    assert check_resources([_lim(("R", True, 1)), _lim(("R", False, 1))], []) == (
        'Resource "R" is present as both global and device-specific resource in the model '
        "configuration."
    )
    assert check_resources([_lim(("R", False, 1))], [("R", 1, 0)]) is None


def test_a_shared_resource_is_held_by_one_instance_at_a_time() -> None:
    rl = RateLimiter()
    rl.register(1, _lim(("R", False, 1)))
    rl.register(2, _lim(("R", False, 1)))
    rl.register(3, _lim())
    rl.stage(1)
    rl.stage(2)
    assert rl.allocate() == [1]
    rl.stage(3)
    assert rl.allocate() == [], "strict head: 2 waits for R, and 3 after it"
    rl.release(1)
    assert rl.allocate() == [2, 3], "staging order breaks the tie; 3 fits beside 2"
    assert rl.executions == {1: 1, 2: 0, 3: 0}


def test_lowest_executions_times_priority_goes_first() -> None:
    rl = RateLimiter()
    rl.register(1, _lim(("R", True, 1), priority=1))
    rl.register(2, _lim(("R", True, 1), priority=2))
    order = []
    for _ in range(30):
        for i in (1, 2):
            if not rl.staged(i) and i not in order[-1:]:
                rl.stage(i)
        (started,) = rl.allocate()
        order.append(started)
        rl.release(started)
        rl.stage(started)
    assert order.count(1) == 20
    assert order.count(2) == 10


def test_a_forgotten_instance_gives_its_resources_back() -> None:
    rl = RateLimiter()
    rl.register(1, _lim(("R", False, 1)))
    rl.register(2, _lim(("R", False, 1)))
    rl.stage(1)
    assert rl.allocate() == [1]
    rl.stage(2)
    rl.forget(1)
    assert rl.allocate() == [2]
    assert rl.executions[1] == 0


# ------------------------------------------------------------------ in the scheduler core
def _spec(name: str, iid: int, *resources: ResourceSpec, priority: int = 0) -> ModelVersionSpec:
    spec = model_spec(name, (iid,), max_batch_size=0, batching=BatchingSpec())
    return msgspec.structs.replace(
        spec, rate_limits=(RateLimitSpec(resources=resources, priority=priority),)
    )


R1 = ResourceSpec("R", False, 1)


def _harness(*specs: ModelVersionSpec) -> Harness:
    h = Harness(models=specs)
    h.core = SchedulerCore(specs, RateLimiter())
    h.ready(*(s.instance_ids[0] for s in specs))
    return h


def test_two_models_sharing_a_resource_never_run_together_and_a_free_one_does() -> None:
    h = _harness(_spec("a", 0, R1), _spec("b", 1, R1), _spec("c", 2))
    for m in ("a", "b", "c"):
        h.request(m)
    ((first, batch),) = h.dispatch()
    assert first == 0, "a holds R; b waits for it, and c (staged after b) behind b"
    (q,) = h.core.queue_status("b", h.now)
    assert q.instances[0].waiting_requests == 1, "a batch waiting for resources is pending"
    before = len(h.to_workers)
    h.done(0, batch)
    h.dispatch()
    started = [i for i, _ in h.to_workers[before:]]
    assert started == [1, 2], "R goes to b, and c (no resources) starts beside it"
    assert h.core.limiter is not None
    assert h.core.limiter.in_use() == {(0, "R"): 1}


def test_priority_two_gets_half_the_executions_under_contention() -> None:
    h = _harness(_spec("p1", 0, R1, priority=1), _spec("p2", 1, R1, priority=2))
    runs = {0: 0, 1: 0}
    h.request("p1")
    h.request("p2")
    pending = dict(h.dispatch())
    for _ in range(60):
        (iid, batch) = next(iter(pending.items()))
        runs[iid] += 1
        del pending[iid]
        h.request("p1" if iid == 0 else "p2")
        before = len(h.to_workers)
        h.done(iid, batch)
        h.dispatch()
        pending.update((i, m) for i, m in h.to_workers[before:] if hasattr(m, "batch_id"))
    assert runs[0] == pytest.approx(2 * runs[1], abs=2)


def test_a_worker_dying_with_the_resource_releases_it() -> None:
    h = _harness(_spec("a", 0, R1), _spec("b", 1, R1))
    h.request("a")
    h.request("b")
    ((runner, _),) = h.dispatch()
    before = len(h.to_workers)
    h.handle(WorkerDied(instance_id=runner, exitcode=9))
    h.dispatch()
    assert [i for i, _ in h.to_workers[before:]] == [1 - runner]


def test_the_plan_gives_each_instance_its_group_s_limits() -> None:
    from google.protobuf import text_format

    from triton_mp._proto import model_config_pb2 as mc
    from triton_mp.model_config.plan import instance_names, rate_limits

    cfg = text_format.Parse(
        """
        name: "m"
        instance_group [
          { name: "g" count: 2 kind: KIND_GPU gpus: [ 0, 1 ]
            rate_limiter { resources [ { name: "R" count: 2 }, { name: "G" global: true count: 1 } ]
                           priority: 3 } },
          { name: "c" count: 1 kind: KIND_CPU }
        ]
        """,
        mc.ModelConfig(),
    )
    limits = rate_limits(cfg)
    assert len(limits) == len(instance_names(cfg)) == 5
    assert [lim.device for lim in limits] == [0, 1, 0, 1, 0]
    assert limits[0].resources == (ResourceSpec("R", False, 2), ResourceSpec("G", True, 1))
    assert limits[0].priority == 3
    assert limits[4] == RateLimitSpec()
