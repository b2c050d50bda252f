"""Requests sent at chosen gaps, each on its own client and thread: the e2e tests of when a
batch forms (``test_dynamic_batch_timing``) and of requests pushed while an instance is busy
(``test_quiet_requests``). The model takes ``INPUT0`` FP32 [1, 1] and answers ``COUNT``
(the size of the batch the request ran in)."""

from __future__ import annotations

import threading
import time

import numpy as np
import tritonclient.grpc as grpcclient


def send_spaced(
    url: str, model: str, gaps_s: list[float], timeout_s: float
) -> list[tuple[int, float]]:
    """One request per entry of ``gaps_s``, each ``gap`` seconds after the one before (every
    client connected before the first is sent); returns per request (COUNT, seconds from the
    first send to its answer), or (-1, 0.0) when it failed (e.g. timed out after
    ``timeout_s``)."""
    out: list[tuple[int, float]] = [(-1, 0.0)] * len(gaps_s)
    clients = [grpcclient.InferenceServerClient(url) for _ in gaps_s]
    for client in clients:
        assert client.is_server_live()
    t0 = time.monotonic()

    def call(i: int) -> None:
        x = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
        x.set_data_from_numpy(np.array([[float(i)]], np.float32))
        res = clients[i].infer(model, [x], client_timeout=timeout_s)
        out[i] = (int(res.as_numpy("COUNT")[0, 0]), time.monotonic() - t0)

    threads = []
    for i, gap in enumerate(gaps_s):
        time.sleep(gap)
        t = threading.Thread(target=call, args=(i,), daemon=True)
        t.start()
        threads.append(t)
    for t in threads:
        t.join(timeout_s + 10)
    for client in clients:
        client.close()
    return out
