"""An ensemble's statistics when a model it calls is reloaded, in the scheduler core
(process-free; tests/e2e/test_r15_reload_stats.py holds both servers to it).

2.51's repository manager reloads the ensembles that depend on a loaded model after it: when
the model is reloaded as a new model (``scheduler.model_reloads``), the statistics of every
ensemble calling it, directly or through another ensemble, start again at 0 as its own do;
the totals (the Prometheus counters) go on. An in-place update (``instance_group`` alone)
reloads no one.
"""

from __future__ import annotations

import msgspec

from tests.unit.scheduler_harness import DYNAMIC, Harness
from tests.unit.test_scheduler_ensembles import ENS, OUTER, _answer
from triton_mp.ipc.memory.notify import Wakeup
from triton_mp.ipc.protocol.messages import InstancesAdded, InstanceWiring, VersionsActivated
from triton_mp.ipc.protocol.specs import ModelVersionSpec
from triton_mp.ipc.recordio.codec import encode


def _reload(h: Harness, spec: ModelVersionSpec, ids: tuple[int, ...], **config: object) -> None:
    """What the supervisor sends when ``spec``'s version is replaced by a generation on
    instances ``ids`` whose effective config is ``config``."""
    new = msgspec.structs.replace(
        spec, instance_ids=ids, config_json=msgspec.json.encode(config).decode()
    )
    wiring = tuple(
        InstanceWiring(
            instance_id=i,
            name=f"{spec.model}_{i}",
            model=spec.model,
            version=1,
            to_worker_ring=f"/r_s_w{i}",
            to_worker_wakeup=Wakeup("semaphore", f"/w{i}_sem"),
            from_worker_ring=f"/r_w{i}_s",
        )
        for i in ids
    )
    h.handle(InstancesAdded(instances=wiring))
    h.ready(*ids)
    h.handle(VersionsActivated(specs=(encode(new),)))


def _successes(h: Harness, since_load: bool) -> list[int]:
    counts = []
    for model in ("outer", "ens", "add_sub"):
        (st,) = h.core.stats.snapshot(model, 1, since_load=since_load)
        counts.append(st.success.count)
    return counts


def _one_outer_request(h: Harness) -> None:
    h.request("outer", client_id="n")
    h.clock.advance_us(200)
    ((i1, b1),) = h.dispatch()
    _answer(h, i1, b1, "/triton_mp_0_w0_a0")
    h.clock.advance_us(200)
    ((i2, b2),) = h.dispatch()
    _answer(h, i2, b2, "/triton_mp_0_w1_a0")


def test_a_reload_as_a_new_model_restarts_the_statistics_of_the_ensembles_calling_it() -> None:
    base = {"name": "add_sub", "max_batch_size": 8}
    h = Harness(
        models=(
            msgspec.structs.replace(DYNAMIC, config_json=msgspec.json.encode(base).decode()),
            ENS,
            OUTER,
        )
    )
    h.ready(0, 1)
    _one_outer_request(h)
    assert _successes(h, since_load=True) == [1, 1, 2]
    # NOTE: instance_group alone: updated in place, no one restarts.
    _reload(h, DYNAMIC, (2, 3), **base, instance_group=[{"count": 2}])
    assert _successes(h, since_load=True) == [1, 1, 2]
    _reload(h, DYNAMIC, (4, 5), **base, parameters={"note": {"string_value": "changed"}})
    assert _successes(h, since_load=True) == [0, 0, 0]
    assert _successes(h, since_load=False) == [1, 1, 2]
