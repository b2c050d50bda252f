"""End to end: a python model's custom metrics (``pb_utils.MetricFamily``) on ``GET /metrics``.

One server (explicit model control) serves ``custom_metrics_py``, two instances of a model
written here the way Triton's custom_metrics example is: its ``initialize`` makes a counter,
two gauges and a histogram with labels (and counts itself in ``custom_instances_started``),
and each request's ``OP`` input says what ``execute`` does with its ``VALUE``: observe it,
set or add it to a gauge, break a counter's rules, drop a family, or increment a counter and
read ``/metrics`` back from inside ``execute`` as Triton's own test does. Each instance is a
process of its own: what the endpoint shows is their merge.
"""

from __future__ import annotations

import shutil
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.helpers.repos import write_python_model
from tests.helpers.server import ServerProcess, server_factory, wait_for
from triton_mp.ipc.memory.shm import list_objects

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

MODEL = "custom_metrics_py"
CONFIG = """
backend: "python"
max_batch_size: 0
input [
  { name: "OP" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "VALUE" data_type: TYPE_FP64 dims: [ 1 ] }
]
output [ { name: "OUT" data_type: TYPE_STRING dims: [ 1 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
"""
SOURCE = """
import urllib.request

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.started_family = pb_utils.MetricFamily(
            name="custom_instances_started",
            description="Instances that ran initialize",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.started_family.Metric(labels=labels).increment(1)
        self.requests_family = pb_utils.MetricFamily(
            name="custom_requests",
            description="Requests the model saw",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.requests = self.requests_family.Metric(labels=labels)
        self.gauges = pb_utils.MetricFamily(
            name="custom_gauge", description="Set or added", kind=pb_utils.MetricFamily.GAUGE
        )
        self.last = self.gauges.Metric(labels={**labels, "how": "set"})
        self.level = self.gauges.Metric(labels={**labels, "how": "added"})
        self.values_family = pb_utils.MetricFamily(
            name="custom_values",
            description="Values observed",
            kind=pb_utils.MetricFamily.HISTOGRAM,
        )
        self.values = self.values_family.Metric(
            labels=labels, buckets=[0.1, 1.0, 2.5, 5.0, 10.0]
        )
        self.temporary = pb_utils.MetricFamily(
            name="custom_temporary",
            description="One series per instance until it is dropped",
            kind=pb_utils.MetricFamily.GAUGE,
        )
        self.temporary.Metric(labels={"instance": args["model_instance_name"]}).set(1)

    def execute(self, requests):
        responses = []
        for request in requests:
            op = pb_utils.get_input_tensor_by_name(request, "OP").as_numpy()[0].decode()
            value = float(pb_utils.get_input_tensor_by_name(request, "VALUE").as_numpy()[0])
            try:
                out = self.run(op, value)
            except pb_utils.TritonModelException as e:
                responses.append(
                    pb_utils.InferenceResponse(error=pb_utils.TritonError(e.message()))
                )
                continue
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUT", np.array([out.encode()], dtype=np.object_))]
                )
            )
        return responses

    def run(self, op, value):
        if op == "count":
            self.requests.increment(value)
            return str(self.requests.value())
        if op == "observe":
            self.values.observe(value)
            return ""
        if op == "set":
            self.last.set(value)
            return str(self.last.value())
        if op == "add":
            self.level.increment(value)
            return ""
        if op == "set_a_counter":
            self.requests.set(value)
        if op == "decrement_a_counter":
            self.requests.increment(-value)
        if op == "drop":
            del self.temporary
            return ""
        if op.startswith("count_and_scrape "):
            self.requests.increment(value)
            url = op.split(" ", 1)[1]
            with urllib.request.urlopen(url, timeout=30) as response:
                return response.read().decode()
        raise pb_utils.TritonModelException("unknown op " + op)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    write_python_model(repo, MODEL, CONFIG, SOURCE)
    with server_factory(tmp_path_factory.mktemp("logs")) as start:
        yield start(repo, "--model-control-mode=explicit", f"--load-model={MODEL}")
    shutil.rmtree(repo, ignore_errors=True)


def _metrics(server: ServerProcess) -> str:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as response:
        return response.read().decode()


def _lines(text: str, prefix: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefix)]


def _call(server: ServerProcess, op: str, value: float = 0.0) -> str:
    client = server.client()
    try:
        inputs = [
            grpcclient.InferInput("OP", [1], "BYTES"),
            grpcclient.InferInput("VALUE", [1], "FP64"),
        ]
        inputs[0].set_data_from_numpy(np.array([op.encode()], dtype=np.object_))
        inputs[1].set_data_from_numpy(np.array([value], dtype=np.float64))
        out = client.infer(MODEL, inputs).as_numpy("OUT")
        return bytes(out[0]).decode()
    finally:
        client.close()


LABELS = f'model="{MODEL}",version="1"'


def test_both_instances_metrics_are_one_registry(server: ServerProcess) -> None:
    """Each instance incremented ``custom_instances_started`` once in its own process: the
    endpoint shows the one shared series, 2, with Triton's HELP and TYPE lines."""
    text = _metrics(server)
    assert "# HELP custom_instances_started Instances that ran initialize\n" in text
    assert "# TYPE custom_instances_started counter\n" in text
    assert f"custom_instances_started{{{LABELS}}} 2\n" in text
    # the text parses as Prometheus text (prometheus-client's own parser)
    names = {f.name for f in text_string_to_metric_families(text)}
    assert {"custom_instances_started", "custom_values", "custom_gauge"} <= names


def test_counter_counts_and_refuses_set_and_negative_increments(server: ServerProcess) -> None:
    before = float(_lines(_metrics(server), f"custom_requests{{{LABELS}}}")[0].split()[-1])
    for _ in range(5):
        _call(server, "count", 2)
    assert _lines(_metrics(server), "custom_requests{") == [
        f"custom_requests{{{LABELS}}} {before + 10:g}"
    ]
    with pytest.raises(InferenceServerException) as e:
        _call(server, "set_a_counter", 3)
    assert "TRITONSERVER_METRIC_KIND_COUNTER does not support Set" in e.value.message()
    with pytest.raises(InferenceServerException) as e:
        _call(server, "decrement_a_counter", 1)
    assert "can only be incremented monotonically by non-negative values" in e.value.message()


def test_gauges_set_and_add(server: ServerProcess) -> None:
    for value in (5.0, 7.5):
        assert _call(server, "set", value) == str(value)
    for value in (2.0, 3.0, -1.5):
        _call(server, "add", value)
    text = _metrics(server)
    assert f'custom_gauge{{how="set",{LABELS}}} 7.5\n' in text
    assert f'custom_gauge{{how="added",{LABELS}}} 3.5\n' in text


def test_histogram_buckets_sum_and_count(server: ServerProcess) -> None:
    for value in (0.05, 1.5, 6.0):
        _call(server, "observe", value)
    assert _lines(_metrics(server), "custom_values") == [
        f"custom_values_count{{{LABELS}}} 3",
        f"custom_values_sum{{{LABELS}}} {0.05 + 1.5 + 6.0}",
        f'custom_values_bucket{{{LABELS},le="0.1"}} 1',
        f'custom_values_bucket{{{LABELS},le="1"}} 1',
        f'custom_values_bucket{{{LABELS},le="2.5"}} 2',
        f'custom_values_bucket{{{LABELS},le="5"}} 2',
        f'custom_values_bucket{{{LABELS},le="10"}} 3',
        f'custom_values_bucket{{{LABELS},le="+Inf"}} 3',
    ]


def test_an_increment_is_on_the_endpoint_at_once_even_from_inside_execute(
    server: ServerProcess,
) -> None:
    url = f"http://127.0.0.1:{server.metrics_port}/metrics"
    before = float(_lines(_metrics(server), f"custom_requests{{{LABELS}}}")[0].split()[-1])
    seen = _call(server, f"count_and_scrape {url}", 1000)
    assert _lines(seen, "custom_requests{") == [f"custom_requests{{{LABELS}}} {before + 1000:g}"]


def test_a_dropped_family_leaves_and_an_unload_takes_every_series(server: ServerProcess) -> None:
    """Deleting a MetricFamily in one instance removes its series; unloading the model
    removes every series and every board from shared memory."""
    assert len(_lines(_metrics(server), "custom_temporary{")) == 2
    _call(server, "drop")
    assert len(_lines(_metrics(server), "custom_temporary{")) == 1
    client = server.client()
    try:
        client.unload_model(MODEL)
        wait_for(lambda: not client.is_model_ready(MODEL), 60, "the model to unload")
    finally:
        client.close()
    wait_for(lambda: "custom_" not in _metrics(server), 60, "the custom metrics to go")
    assert not [n for n in list_objects(str(server.pid)) if "_cm" in n]
