"""GPU benchmark of issue #20: a TorchScript MLP on KIND_GPU through triton-mp, against the same
module run directly by torch at its best batch size, in one run.

Run by ``scripts/gpu_check.sh`` on a machine with an NVIDIA GPU. Prints one JSON line:
``{"direct_best": {...}, "served": [{"concurrency": c, "infer_per_s": ..., "ratio": ...}]}``,
where ``ratio`` is triton-mp's throughput (requests of batch 1 per second, tritonclient gRPC
from ``c`` threads, dynamic batching up to 64) over torch's own throughput (rows per second)
at the batch size where torch is fastest. Both are measured here, in the same run.

Usage: ``python bench/gpu_bench.py [--seconds 8] [--width 1024] [--depth 4]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402
import tritonclient.grpc as grpcclient  # noqa: E402

from tests.helpers.server import ServerProcess  # noqa: E402
from tests.helpers.torch_models import Mlp, save  # noqa: E402

CONCURRENCIES = (1, 8, 64)
DIRECT_BATCHES = (1, 8, 16, 32, 64, 128, 256)


def direct_best(width: int, depth: int, seconds: float) -> dict[str, float]:
    """Rows per second of the module on cuda:0 per batch size; the best one."""
    module = torch.jit.script(Mlp(width=width, depth=depth, seed=1)).cuda()
    results = {}
    with torch.inference_mode():
        for b in DIRECT_BATCHES:
            x = torch.randn(b, width)
            for _ in range(10):
                module(x.cuda()).cpu()
            torch.cuda.synchronize()
            n, t0 = 0, time.perf_counter()
            # NOTE: host in, host out, as a server must: the copies are part of the work.
            while time.perf_counter() - t0 < seconds / len(DIRECT_BATCHES):
                module(x.cuda()).cpu()
                n += b
            results[b] = n / (time.perf_counter() - t0)
    best = max(results, key=lambda k: results[k])
    return {"batch": best, "rows_per_s": results[best], **{f"b{k}": v for k, v in results.items()}}


def _client_process(url: str, width: int, threads: int, seconds: float) -> int:
    """Requests done by ``threads`` gRPC client threads of one process in ``seconds``."""
    stop = time.perf_counter() + seconds
    counts = [0] * threads
    x = np.random.default_rng(0).standard_normal((1, width), dtype=np.float32)

    def loop(i: int) -> None:
        with grpcclient.InferenceServerClient(url) as client:
            inp = grpcclient.InferInput("INPUT__0", [1, width], "FP32")
            inp.set_data_from_numpy(x)
            while time.perf_counter() < stop:
                client.infer("mlp_gpu", [inp])
                counts[i] += 1

    pool = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(counts)


def served(url: str, width: int, concurrency: int, seconds: float) -> float:
    """Requests (batch 1) per second from ``concurrency`` gRPC clients, spread over up to 8
    client processes (one Python process cannot keep 64 requests in flight alone)."""
    procs = min(concurrency, 8)
    per = [concurrency // procs + (1 if i < concurrency % procs else 0) for i in range(procs)]
    _client_process(url, width, 1, 0.5)  # warm the model
    ctx = mp.get_context("spawn")
    t0 = time.perf_counter()
    with ctx.Pool(procs) as pool:
        done = pool.starmap(_client_process, [(url, width, n, seconds) for n in per])
    return sum(done) / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=8.0, help="per concurrency level")
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--depth", type=int, default=4)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "no CUDA device"}))
        return 0
    best = direct_best(args.width, args.depth, args.seconds)
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        save(Mlp(width=args.width, depth=args.depth, seed=1), repo / "mlp_gpu" / "1" / "model.pt")
        (repo / "mlp_gpu" / "config.pbtxt").write_text(
            textwrap.dedent(
                f"""
                platform: "pytorch_libtorch"
                max_batch_size: 64
                input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [ {args.width} ] }} ]
                output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {args.width} ] }} ]
                dynamic_batching {{ max_queue_delay_microseconds: 100 }}
                instance_group [ {{ kind: KIND_GPU count: 2 }} ]
                """
            )
        )
        server = ServerProcess(repo, Path(tmp) / "server.log", "--frontend-processes", "2")
        try:
            server.wait_live()
            rows = []
            for c in CONCURRENCIES:
                rate = served(server.url, args.width, c, args.seconds)
                rows.append(
                    {"concurrency": c, "infer_per_s": rate, "ratio": rate / best["rows_per_s"]}
                )
        finally:
            server.stop()
    print(
        json.dumps({"device": torch.cuda.get_device_name(0), "direct_best": best, "served": rows})
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
