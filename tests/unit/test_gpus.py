"""Device discovery (common.process.gpus): CUDA_VISIBLE_DEVICES as CUDA parses it, the minimum
compute capability, instance-group expansion over the GPUs found, and each GPU worker's
environment. Process-free: NVML is the test-only fake."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.model_config_builders import load_err, load_ok, python_model
from triton_mp._proto.model_config_pb2 import ModelInstanceGroup
from triton_mp.common.process.gpus import (
    FAKE_GPUS_ENV,
    Devices,
    FakeNvml,
    Gpu,
    NvmlUnavailable,
    PhysicalGpu,
    discover,
    supports,
    visible_order,
    worker_env,
)
from triton_mp.model_config.plan import instance_names

GPU, CPU = ModelInstanceGroup.KIND_GPU, ModelInstanceGroup.KIND_CPU

UUIDS = (
    "GPU-11111111-aaaa-bbbb-cccc-000000000000",
    "GPU-22222222-aaaa-bbbb-cccc-000000000000",
    "GPU-23333333-aaaa-bbbb-cccc-000000000000",
)
PHYSICAL = [PhysicalGpu(i, u, "H200", (9, 0), 141 << 30) for i, u in enumerate(UUIDS)]


def _fake(*ccs: str) -> str:
    return json.dumps(
        [
            {"uuid": UUIDS[i], "name": f"GPU{i}", "compute_capability": cc}
            for i, cc in enumerate(ccs)
        ]
    )


@pytest.mark.parametrize(
    ("value", "want"),
    [
        (None, [0, 1, 2]),
        ("", []),
        ("-1", []),
        ("2,0", [2, 0]),
        (" 1 , 2 ", [1, 2]),
        ("0,7,1", [0]),  # NOTE: CUDA stops at the first invalid entry
        ("1,1,2", [1]),  # a repeated device ends the list too
        ("GPU-22222222-aaaa-bbbb-cccc-000000000000", [1]),
        ("GPU-1,GPU-22", [0, 1]),  # unique UUID prefixes are enough
        ("GPU-2", []),  # ambiguous: GPU-22... and GPU-23...
        ("0,MIG-abcd", [0]),  # MIG devices are not pinned as GPUs
        ("GPU-", []),
        ("abc,0", []),
    ],
)
def test_visible_order_parses_as_cuda_does(value: str | None, want: list[int]) -> None:
    assert [d.index for d in visible_order(value, PHYSICAL)] == want


def test_discover_numbers_visible_gpus_from_zero() -> None:
    env = {FAKE_GPUS_ENV: _fake("8.0", "9.0", "7.5"), "CUDA_VISIBLE_DEVICES": "2,1"}
    devices = discover(env=env)
    assert devices.fake
    assert [(g.cuda_id, g.uuid) for g in devices.gpus] == [(0, UUIDS[2]), (1, UUIDS[1])]
    assert devices.uuid(1) == UUIDS[1]
    with pytest.raises(KeyError):
        devices.uuid(2)


def test_min_compute_capability_filters_but_keeps_ordinals() -> None:
    devices = discover(8.0, env={FAKE_GPUS_ENV: _fake("7.5", "8.0", "9.0")})
    assert [g.cuda_id for g in devices.gpus] == [0, 1, 2]
    assert devices.supported_ids == (1, 2)
    # NOTE: Triton's tolerance: within 0.01 of the minimum counts as enough.
    assert supports(Gpu(0, UUIDS[0], "x", (7, 5), 0), 7.495)
    assert not supports(Gpu(0, UUIDS[0], "x", (7, 5), 0), 7.6)


def test_no_nvml_means_no_gpus() -> None:
    class Broken:
        def devices(self) -> list[PhysicalGpu]:
            raise NvmlUnavailable("driver not loaded")

        def sample(self, uuid: str) -> object:
            raise NvmlUnavailable(uuid)

    devices = discover(env={}, nvml=Broken())  # type: ignore[arg-type]
    assert devices.gpus == ()
    assert devices.supported_ids == ()
    assert not devices.fake


def test_real_nvml_on_a_host_without_a_driver_finds_nothing() -> None:
    # NOTE: this machine has nvidia-ml-py but no driver: NVML must fail softly.
    pytest.importorskip("pynvml")
    devices = discover(env={})
    assert all(g.uuid.startswith("GPU-") for g in devices.gpus)


@pytest.mark.parametrize(
    "text", ["not json", "{}", '[{"name": "no uuid"}]', "[1]"], ids=["text", "obj", "nouuid", "int"]
)
def test_bad_fake_list_is_no_gpu(text: str) -> None:
    with pytest.raises(NvmlUnavailable):
        FakeNvml.from_json(text)
    assert discover(env={FAKE_GPUS_ENV: text}).gpus == ()


def test_fake_samples_by_uuid() -> None:
    nvml = FakeNvml(
        [
            {
                "uuid": UUIDS[0],
                "utilization": 0.25,
                "memory_total_bytes": 1000,
                "memory_used_bytes": 10,
                "power_usage_w": 120.5,
                "power_limit_w": 700,
                "energy_mj": 5000,
            }
        ]
    )
    s = nvml.sample(UUIDS[0])
    assert (s.utilization, s.memory_used_bytes, s.power_limit_w, s.energy_mj) == (
        0.25,
        10,
        700.0,
        5000,
    )
    with pytest.raises(NvmlUnavailable):
        nvml.sample(UUIDS[1])


def test_worker_env_pins_gpu_instances_by_uuid() -> None:
    devices = discover(env={FAKE_GPUS_ENV: _fake("9.0", "9.0"), "CUDA_VISIBLE_DEVICES": "1,0"})
    assert worker_env("KIND_GPU", 0, devices) == {"CUDA_VISIBLE_DEVICES": UUIDS[1]}
    assert worker_env("KIND_GPU", 1, devices) == {"CUDA_VISIBLE_DEVICES": UUIDS[0]}
    assert worker_env("KIND_CPU", -1, devices) == {}
    assert worker_env("KIND_MODEL", -1, devices) == {}
    with pytest.raises(KeyError):
        worker_env("KIND_GPU", 5, devices)


def test_devices_round_trip_as_spec_fields() -> None:
    import msgspec

    devices = discover(env={FAKE_GPUS_ENV: _fake("9.0")})
    back = msgspec.msgpack.decode(msgspec.msgpack.encode(devices), type=Devices)
    assert back == devices


GROUPS = """
name: "m"
backend: "python"
instance_group [
  { count: 2 kind: KIND_GPU },
  { count: 1 kind: KIND_GPU gpus: [ 1 ] },
  { kind: KIND_AUTO },
  { count: 3 kind: KIND_CPU }
]
"""


def test_instance_groups_expand_per_gpu_as_triton(tmp_path: Path) -> None:
    d = python_model(tmp_path, "m", GROUPS)
    devices = discover(env={FAKE_GPUS_ENV: _fake("9.0", "9.0")})
    config = load_ok(d, gpu_ids=devices.supported_ids).config
    assert instance_names(config) == [
        ("m_0_0", GPU, 0),
        ("m_0_0", GPU, 1),
        ("m_0_1", GPU, 0),
        ("m_0_1", GPU, 1),
        ("m_1_0", GPU, 1),
        ("m_2_0", GPU, 0),  # KIND_AUTO with GPUs: KIND_GPU on every GPU
        ("m_2_0", GPU, 1),
        ("m_3_0", CPU, -1),
        ("m_3_1", CPU, -1),
        ("m_3_2", CPU, -1),
    ]


def test_kind_gpu_without_gpus_fails_and_auto_falls_back(tmp_path: Path) -> None:
    d = python_model(tmp_path, "m", GROUPS)
    assert load_err(d, gpu_ids=()) == (
        "instance group m_0 of model m has kind KIND_GPU but no GPUs are available"
    )
    auto = python_model(tmp_path, "a", 'name: "a"\nbackend: "python"\n')
    config = load_ok(auto, gpu_ids=()).config
    assert instance_names(config) == [("a_0", CPU, -1)]


def test_gpu_below_min_capability_is_refused_with_tritons_message(tmp_path: Path) -> None:
    d = python_model(
        tmp_path,
        "m",
        'name: "m"\nbackend: "python"\ninstance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]\n',
    )
    devices = discover(8.0, env={FAKE_GPUS_ENV: _fake("7.5", "9.0")})
    assert load_err(d, gpu_ids=devices.supported_ids, min_compute_capability=8.0) == (
        "instance group m_0 of model m specifies invalid or unsupported gpu id 0. GPUs with "
        "at least the minimum required CUDA compute compatibility of 8.000000 are: 1"
    )
