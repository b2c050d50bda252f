"""Hand-built rich Triton protocol messages, built with tritonclient's classes (``service_pb2``,
``model_config_pb2``): every scheduler's ModelConfig, inference requests and responses, stream
errors, metadata, statistics and the smaller messages. tests/unit/test_proto_compat.py sends each
across to our generated classes and back; nothing here asserts.
"""

from __future__ import annotations

from google.protobuf import text_format
from google.protobuf.message import Message
from tritonclient.grpc import model_config_pb2 as tc_config
from tritonclient.grpc import service_pb2 as tc_service


def infer_request() -> Message:
    req = tc_service.ModelInferRequest(model_name="simple", model_version="3", id="req-7")
    req.parameters["sequence_id"].int64_param = -(2**63)
    req.parameters["sequence_start"].bool_param = True
    req.parameters["label"].string_param = "héllo"
    req.parameters["scale"].double_param = 0.125
    req.parameters["big"].uint64_param = 2**64 - 1

    typed = req.inputs.add(name="INT", datatype="INT32", shape=[2, 3])
    typed.contents.int_contents.extend([-1, 0, 1, 2**31 - 1, -(2**31), 7])
    typed.parameters["shared_memory_region"].string_param = "region0"
    typed.parameters["shared_memory_byte_size"].int64_param = 24
    typed.parameters["shared_memory_offset"].int64_param = 0
    contents_by_dtype = {
        "BOOL": ("bool_contents", [True, False]),
        "INT64": ("int64_contents", [2**62, -3]),
        "UINT32": ("uint_contents", [0, 2**32 - 1]),
        "UINT64": ("uint64_contents", [2**64 - 1, 1]),
        "FP32": ("fp32_contents", [1.5, -0.25]),
        "FP64": ("fp64_contents", [3.141592653589793, -1e300]),
        "BYTES": ("bytes_contents", [b"\x00\xff", b""]),
    }
    for dtype, (field, values) in contents_by_dtype.items():
        tensor = req.inputs.add(name=f"IN_{dtype}", datatype=dtype, shape=[1, len(values)])
        getattr(tensor.contents, field).extend(values)
    req.inputs.add(name="RAW_FP16", datatype="FP16", shape=[1, 2])
    req.raw_input_contents.extend([b"\x00\x3c\x00\xc0", b"", b"\x01" * 1024])

    out = req.outputs.add(name="OUT0")
    out.parameters["classification"].int64_param = 3
    req.outputs.add(name="OUT1").parameters["binary_data"].bool_param = True
    return req


def infer_response() -> Message:
    resp = tc_service.ModelInferResponse(model_name="simple", model_version="1", id="req-7")
    resp.parameters["triton_final_response"].bool_param = True
    resp.parameters["sequence_id"].string_param = "corr-1"
    out = resp.outputs.add(name="OUT0", datatype="FP32", shape=[1, 16])
    out.parameters["shared_memory_region"].string_param = "out_region"
    resp.outputs.add(name="OUT1", datatype="BYTES", shape=[2]).contents.bytes_contents.extend(
        [b"a", b"bc"]
    )
    resp.raw_output_contents.extend([b"\x00" * 64, b""])
    return resp


def stream_response() -> Message:
    resp = tc_service.ModelStreamInferResponse(error_message="")
    resp.infer_response.CopyFrom(infer_response())
    return resp


def stream_error() -> Message:
    return tc_service.ModelStreamInferResponse(
        error_message="in ensemble 'e', inference request for unknown model 'x'"
    )


CONFIG_COMMON = """
name: "rich"
platform: "onnxruntime_onnx"
backend: "onnxruntime"
runtime: "libtriton_onnxruntime.so"
version_policy { specific { versions: [1, 3, 9223372036854775807] } }
max_batch_size: 16
input [
  {
    name: "INPUT0" data_type: TYPE_FP32 format: FORMAT_NCHW dims: [3, -1, -1]
    reshape { shape: [] } allow_ragged_batch: true optional: true
  },
  { name: "SHAPE" data_type: TYPE_INT32 dims: [2] is_shape_tensor: true },
  { name: "NLF" data_type: TYPE_BF16 dims: [4] is_non_linear_format_io: true }
]
output [
  {
    name: "OUTPUT0" data_type: TYPE_STRING dims: [-1] label_filename: "labels.txt"
    reshape { shape: [1, -1] } is_shape_tensor: false is_non_linear_format_io: true
  }
]
batch_input [
  {
    kind: BATCH_ITEM_SHAPE_FLATTEN target_name: ["B0", "B1"] data_type: TYPE_INT32
    source_input: ["INPUT0"]
  }
]
batch_output [
  { target_name: ["OUTPUT0"] kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: ["INPUT0"] }
]
optimization {
  graph { level: -1 }
  priority: PRIORITY_MIN
  cuda {
    graphs: true busy_wait_events: true output_copy_stream: true
    graph_spec [
      {
        batch_size: 4
        input { key: "INPUT0" value { dim: [3, 224, 224] } }
        graph_lower_bound {
          batch_size: 1
          input { key: "INPUT0" value { dim: [3, 100, 100] } }
        }
      }
    ]
  }
  execution_accelerators {
    gpu_execution_accelerator [
      {
        name: "tensorrt"
        parameters { key: "precision_mode" value: "FP16" }
        parameters { key: "max_workspace_size_bytes" value: "1073741824" }
      }
    ]
    cpu_execution_accelerator [ { name: "openvino" } ]
  }
  input_pinned_memory { enable: true }
  output_pinned_memory { enable: false }
  gather_kernel_buffer_threshold: 4294967295
  eager_batching: true
}
instance_group [
  {
    name: "gpu_group" count: 2 gpus: [0, 1] kind: KIND_GPU profile: ["0", "1"]
    rate_limiter {
      resources [ { name: "R1" global: true count: 4 }, { name: "R2" count: 1 } ]
      priority: 2
    }
    passive: true
    secondary_devices [ { kind: KIND_NVDLA device_id: 7 } ]
    host_policy: "numa0"
  },
  { kind: KIND_CPU count: 1 },
  { kind: KIND_MODEL }
]
default_model_filename: "model.onnx"
cc_model_filenames { key: "7.5" value: "model_t4.plan" }
cc_model_filenames { key: "8.0" value: "model_a100.plan" }
metric_tags { key: "team" value: "vision" }
parameters { key: "EXECUTION_ENV_PATH" value { string_value: "$$TRITON_MODEL_DIRECTORY/env" } }
parameters { key: "empty" value { } }
model_warmup [
  {
    name: "zeros" batch_size: 4 count: 3
    inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [3, 8, 8] zero_data: true } }
    inputs { key: "SHAPE" value { data_type: TYPE_INT32 dims: [2] random_data: true } }
  },
  {
    name: "file"
    inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [3] input_data_file: "in0" } }
  }
]
model_operations { op_library_filename: ["libcustom.so", "libother.so"] }
model_transaction_policy { decoupled: true }
model_repository_agents {
  agents [ { name: "checksum" parameters { key: "MD5:1/model.onnx" value: "abc" } } ]
}
response_cache { enable: true }
model_metrics {
  metric_control [
    {
      metric_identifier { family: "nv_inference_first_response_histogram_ms" }
      histogram_options { buckets: [0.5, 1, 2.5, 1e6] }
    }
  ]
}
"""

SCHEDULER_DYNAMIC = """
dynamic_batching {
  preferred_batch_size: [4, 8]
  max_queue_delay_microseconds: 100
  preserve_ordering: true
  priority_levels: 18446744073709551615
  default_priority_level: 2
  default_queue_policy {
    timeout_action: DELAY default_timeout_microseconds: 18446744073709551615
    allow_timeout_override: true max_queue_size: 4294967295
  }
  priority_queue_policy { key: 1 value { timeout_action: REJECT max_queue_size: 8 } }
  priority_queue_policy { key: 4294967296 value { default_timeout_microseconds: 5 } }
}
"""

SCHEDULER_SEQUENCE_OLDEST = """
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  control_input [
    {
      name: "START"
      control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [0, 1] } ]
    },
    {
      name: "READY"
      control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [0.0, 1.0] } ]
    },
    {
      name: "END"
      control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [false, true] } ]
    },
    {
      name: "CORRID"
      control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_STRING } ]
    }
  ]
  oldest {
    max_candidate_sequences: 4 preferred_batch_size: [2, 4]
    max_queue_delay_microseconds: 100 preserve_ordering: true
  }
  state [
    {
      input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [-1]
      initial_state [
        { data_type: TYPE_INT32 dims: [1] zero_data: true name: "zeros" },
        { data_type: TYPE_INT32 dims: [1] data_file: "state.bin" name: "from_file" }
      ]
      use_same_buffer_for_input_output: true
      use_growable_memory: true
    }
  ]
  iterative_sequence: true
}
"""

SCHEDULER_SEQUENCE_DIRECT = """
sequence_batching {
  direct { max_queue_delay_microseconds: 10 minimum_slot_utilization: 0.5 }
}
"""

SCHEDULER_ENSEMBLE = """
ensemble_scheduling {
  step [
    {
      model_name: "preprocess" model_version: -1
      input_map { key: "RAW" value: "IMAGE" }
      output_map { key: "TENSOR" value: "preprocessed" }
      output_map { key: "SIZE" value: "size" }
    },
    {
      model_name: "classifier" model_version: 3 model_namespace: "ns"
      input_map { key: "INPUT0" value: "preprocessed" }
      output_map { key: "OUTPUT0" value: "CLASSES" }
    }
  ]
  max_inflight_requests: 16
}
"""

CONFIG_SCHEDULERS = {
    "dynamic": SCHEDULER_DYNAMIC,
    "sequence_oldest": SCHEDULER_SEQUENCE_OLDEST,
    "sequence_direct": SCHEDULER_SEQUENCE_DIRECT,
    "ensemble": SCHEDULER_ENSEMBLE,
}


def rich_config(scheduler: str) -> Message:
    return text_format.Parse(CONFIG_COMMON + CONFIG_SCHEDULERS[scheduler], tc_config.ModelConfig())


def metadata_response() -> Message:
    resp = tc_service.ModelMetadataResponse(
        name="densenet", versions=["1", "2"], platform="onnxruntime_onnx"
    )
    resp.inputs.add(name="data_0", datatype="FP32", shape=[-1, 3, 224, 224])
    resp.outputs.add(name="fc6_1", datatype="BYTES", shape=[-1, 1000])
    return resp


def statistics_response() -> Message:
    resp = tc_service.ModelStatisticsResponse()
    stats = resp.model_stats.add(
        name="simple",
        version="1",
        last_inference=1_764_000_000_000,
        inference_count=2**64 - 1,
        execution_count=12,
    )
    for i, name in enumerate(
        (
            "success",
            "fail",
            "queue",
            "compute_input",
            "compute_infer",
            "compute_output",
            "cache_hit",
            "cache_miss",
        )
    ):
        getattr(stats.inference_stats, name).CopyFrom(
            tc_service.StatisticDuration(count=i + 1, ns=(i + 1) * 1000)
        )
    for batch_size in (1, 4, 8):
        batch = stats.batch_stats.add(batch_size=batch_size)
        batch.compute_input.count = batch_size
        batch.compute_infer.ns = batch_size * 10
        batch.compute_output.count = 1
    stats.memory_usage.add(type="GPU", id=1, byte_size=2**40)
    stats.memory_usage.add(type="CPU_PINNED", id=-1, byte_size=0)
    for index in ("0", "1"):
        response_stats = stats.response_stats[index]
        response_stats.compute_infer.count = 1
        response_stats.success.ns = 99
        response_stats.empty_response.count = 2
        response_stats.cancel.count = 3
    resp.model_stats.add(name="other")
    return resp


def misc_messages() -> list[Message]:
    load = tc_service.RepositoryModelLoadRequest(repository_name="", model_name="m")
    load.parameters["config"].string_param = '{"backend": "python"}'
    load.parameters["file:1/model.py"].bytes_param = b"\x00print()\xff"
    unload = tc_service.RepositoryModelUnloadRequest(model_name="m")
    unload.parameters["unload_dependents"].bool_param = True
    index = tc_service.RepositoryIndexResponse()
    index.models.add(name="m", version="1", state="UNAVAILABLE", reason="unloaded")
    sys_status = tc_service.SystemSharedMemoryStatusResponse()
    sys_status.regions["r"].CopyFrom(
        tc_service.SystemSharedMemoryStatusResponse.RegionStatus(
            name="r", key="/shm_key", offset=16, byte_size=2**33
        )
    )
    cuda_status = tc_service.CudaSharedMemoryStatusResponse()
    cuda_status.regions["c"].device_id = 3
    trace = tc_service.TraceSettingRequest(model_name="m")
    trace.settings["trace_level"].value.extend(["TIMESTAMPS", "TENSORS"])
    trace.settings["trace_rate"].value.append("1000")
    trace.settings["clear_me"].SetInParent()
    log = tc_service.LogSettingsResponse()
    log.settings["log_info"].bool_param = True
    log.settings["log_verbose_level"].uint32_param = 2**32 - 1
    log.settings["log_format"].string_param = "ISO8601"
    return [
        tc_service.ServerMetadataResponse(
            name="triton", version="2.73.0", extensions=["classification", "sequence"]
        ),
        tc_service.ModelReadyRequest(name="m", version="2"),
        tc_service.ServerLiveResponse(live=True),
        tc_service.ModelConfigResponse(config=rich_config("dynamic")),
        load,
        unload,
        tc_service.RepositoryIndexRequest(repository_name="r", ready=True),
        index,
        tc_service.SystemSharedMemoryRegisterRequest(name="r", key="/k", offset=8, byte_size=2**40),
        sys_status,
        tc_service.CudaSharedMemoryRegisterRequest(
            name="c", raw_handle=bytes(range(64)), device_id=-1, byte_size=1
        ),
        cuda_status,
        trace,
        log,
    ]
