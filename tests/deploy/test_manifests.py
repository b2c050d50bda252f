"""deploy/ rendered and validated offline: schemas (strict), then the rules the manifests
exist for (probes, non-root, resources, image tags, the drain budget, /dev/shm, wiring of
Service, ServiceMonitor, HPA, PDB and the KServe runtime). Issue 22.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.deploy.manifests import (
    DEPLOY,
    KUSTOMIZATIONS,
    PLAIN_MANIFESTS,
    all_resources,
    by_kind,
    crd_schema,
    flag_value,
    render,
    schema_errors,
)

KSERVE_TRITON_ARGS = [
    "--model-store=/mnt/models",
    "--grpc-port=9000",
    "--http-port=8080",
    "--allow-grpc=true",
    "--allow-http=true",
]
"""The argv KServe's own Triton runtime passes (kserve config/runtimes/kserve-tritonserver.yaml)."""


@pytest.fixture(scope="module")
def resources() -> dict[str, list[dict[str, Any]]]:
    return all_resources()


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return render(DEPLOY / "kubernetes/base")


@pytest.fixture(scope="module")
def gpu() -> list[dict[str, Any]]:
    return render(DEPLOY / "kubernetes/overlays/gpu")


def _deployment(resources: list[dict[str, Any]]) -> dict[str, Any]:
    (d,) = by_kind(resources, "Deployment")
    return d


def _container(deployment: dict[str, Any]) -> dict[str, Any]:
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    return c


def _memory_bytes(quantity: str) -> int:
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}
    for suffix, scale in units.items():
        if quantity.endswith(suffix):
            return int(quantity[: -len(suffix)]) * scale
    return int(quantity)


def test_every_kustomization_and_manifest_under_deploy_is_checked() -> None:
    found = {str(p.parent.relative_to(DEPLOY)) for p in DEPLOY.rglob("kustomization.yaml")}
    assert found == set(KUSTOMIZATIONS)
    in_kustomizations = set()
    for k in KUSTOMIZATIONS:
        spec = yaml.safe_load((DEPLOY / k / "kustomization.yaml").read_text())
        for entry in spec.get("resources", []) + [p["path"] for p in spec.get("patches", [])]:
            in_kustomizations.add((DEPLOY / k / entry).resolve())
    for path in DEPLOY.rglob("*.yaml"):
        if path.name == "kustomization.yaml" or path.resolve() in in_kustomizations:
            continue
        assert str(path.relative_to(DEPLOY)) in PLAIN_MANIFESTS, f"{path} is never validated"


@pytest.mark.parametrize("name", [*KUSTOMIZATIONS, *PLAIN_MANIFESTS])
def test_every_resource_validates_strictly(
    name: str, resources: dict[str, list[dict[str, Any]]]
) -> None:
    assert resources[name], f"{name} renders to nothing"
    for resource in resources[name]:
        assert schema_errors(resource) == [], resource["metadata"]["name"]


def test_a_misspelt_field_fails_validation(base: list[dict[str, Any]]) -> None:
    deployment = copy.deepcopy(_deployment(base))
    _container(deployment)["livenesProbe"] = _container(deployment)["livenessProbe"]
    assert any("livenesProbe" in e for e in schema_errors(deployment))
    runtime = yaml.safe_load((DEPLOY / "kserve/servingruntime.yaml").read_text())
    runtime["spec"]["protocolVersion"] = ["v2"]  # the real field is protocolVersions
    assert any("protocolVersion" in e for e in schema_errors(runtime))
    runtime["spec"].pop("protocolVersion")
    runtime["spec"]["protocolVersions"] = "v2"
    assert schema_errors(runtime), "a string where a list belongs must fail"


def test_every_custom_resource_kind_has_a_vendored_schema(
    resources: dict[str, list[dict[str, Any]]],
) -> None:
    custom = {
        (r["apiVersion"], r["kind"])
        for rs in resources.values()
        for r in rs
        if "." in r["apiVersion"].split("/")[0]  # core and built-in groups have no dot
    }
    assert custom == {
        ("monitoring.coreos.com/v1", "ServiceMonitor"),
        ("serving.kserve.io/v1alpha1", "ClusterServingRuntime"),
        ("serving.kserve.io/v1alpha1", "ServingRuntime"),
        ("serving.kserve.io/v1beta1", "InferenceService"),
    }
    for api_version, kind in custom:
        assert crd_schema(api_version, kind) is not None


def test_images_are_pinned_never_latest(resources: dict[str, list[dict[str, Any]]]) -> None:
    images = []
    for rs in resources.values():
        for r in rs:
            spec = r.get("spec", {})
            pod = spec.get("template", {}).get("spec", spec)
            images += [c["image"] for c in pod.get("containers", []) if "image" in c]
    assert images
    for image in images:
        name, _, tag = image.rpartition(":")
        assert "/" in name, f"{image}: no registry/repository, or no tag"
        assert tag not in {"", "latest"}, image


@pytest.mark.parametrize("overlay", ["base", "gpu"])
def test_probes_security_and_resources(
    overlay: str, base: list[dict[str, Any]], gpu: list[dict[str, Any]]
) -> None:
    deployment = _deployment(base if overlay == "base" else gpu)
    pod = deployment["spec"]["template"]["spec"]
    c = _container(deployment)
    assert c["livenessProbe"]["httpGet"]["path"] == "/v2/health/live"
    assert c["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    startup = c["startupProbe"]
    assert startup["httpGet"]["path"] == "/v2/health/ready"
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300, "model loading time"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 1000
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert {"cpu", "memory"} <= set(c["resources"]["requests"])
    assert "memory" in c["resources"]["limits"]
    if overlay == "gpu":
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
        assert c["image"].endswith("-gpu")


def test_the_grace_period_covers_the_prestop_sleep_and_the_drain(
    base: list[dict[str, Any]],
) -> None:
    deployment = _deployment(base)
    c = _container(deployment)
    exit_timeout = int(flag_value(c["args"], "--exit-timeout-secs") or 30)
    pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"]
    grace = deployment["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace > pre_stop + exit_timeout
    strategy = deployment["spec"]["strategy"]
    assert strategy["rollingUpdate"]["maxUnavailable"] == 0, "a rollout never drops capacity"


def test_dev_shm_is_a_memory_backed_emptydir_within_the_memory_limit(
    base: list[dict[str, Any]],
) -> None:
    deployment = _deployment(base)
    pod = deployment["spec"]["template"]["spec"]
    (mount,) = [m for m in _container(deployment)["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["emptyDir"]["medium"] == "Memory"
    limit = _memory_bytes(_container(deployment)["resources"]["limits"]["memory"])
    assert _memory_bytes(volume["emptyDir"]["sizeLimit"]) < limit


def test_service_servicemonitor_pdb_and_hpa_select_the_deployment(
    base: list[dict[str, Any]], resources: dict[str, list[dict[str, Any]]]
) -> None:
    deployment = _deployment(base)
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    c = _container(deployment)
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert ports == {
        "http": int(flag_value(c["args"], "--http-port") or 0),
        "grpc": int(flag_value(c["args"], "--grpc-port") or 0),
        "metrics": int(flag_value(c["args"], "--metrics-port") or 0),
    }
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (service,) = by_kind(base, "Service")
    assert service["spec"]["selector"].items() <= labels.items()
    assert {p["name"]: p["targetPort"] for p in service["spec"]["ports"]} == {n: n for n in ports}
    (monitor,) = by_kind(base, "ServiceMonitor")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert [e["port"] for e in monitor["spec"]["endpoints"]] == ["metrics"]
    (pdb,) = by_kind(base, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert pdb["spec"]["minAvailable"] < deployment["spec"]["replicas"]
    (hpa,) = by_kind(base, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert hpa["spec"]["minReplicas"] > pdb["spec"]["minAvailable"]
    served = {r["name"]["as"] for r in adapter_rules(resources)}
    for metric in hpa["spec"]["metrics"]:
        assert metric["type"] == "Pods"
        assert metric["pods"]["metric"]["name"] in served


def adapter_rules(resources: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """prometheus-adapter's rules, from the monitoring kustomization's ConfigMap."""
    (config_map,) = by_kind(resources["kubernetes/monitoring"], "ConfigMap")
    rules: list[dict[str, Any]] = yaml.safe_load(config_map["data"]["config.yaml"])["rules"]
    return rules


def test_adapter_rules_are_well_formed(resources: dict[str, list[dict[str, Any]]]) -> None:
    rules = adapter_rules(resources)
    assert rules
    for rule in rules:
        assert rule["resources"]["overrides"]["pod"] == {"resource": "pod"}
        assert "<<.LabelMatchers>>" in rule["metricsQuery"]
        assert "<<.GroupBy>>" in rule["metricsQuery"]


@pytest.mark.parametrize(
    "name", ["kserve/clusterservingruntime.yaml", "kserve/servingruntime.yaml"]
)
def test_kserve_runtime_selects_triton_and_onnx_models_over_v2(
    name: str, resources: dict[str, list[dict[str, Any]]]
) -> None:
    (runtime,) = resources[name]
    spec = runtime["spec"]
    assert spec["protocolVersions"] == ["v2", "grpc-v2"]
    formats = {f["name"]: f for f in spec["supportedModelFormats"]}
    assert {"triton", "onnx"} <= set(formats)
    assert all(f["autoSelect"] for f in formats.values())
    (container,) = spec["containers"]
    assert container["name"] == "kserve-container", "KServe injects its storage mount here"
    assert container["command"] == ["triton-mp-tritonserver"]
    assert container["args"][: len(KSERVE_TRITON_ARGS)] == KSERVE_TRITON_ARGS
    assert spec["annotations"]["prometheus.kserve.io/port"] == "8002"
    assert container["securityContext"]["runAsNonRoot"] is True
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])


def test_the_example_inferenceservice_names_the_runtime(
    resources: dict[str, list[dict[str, Any]]],
) -> None:
    (isvc,) = resources["kserve/inferenceservice.yaml"]
    model = isvc["spec"]["predictor"]["model"]
    (runtime,) = resources["kserve/clusterservingruntime.yaml"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {
        f["name"] for f in runtime["spec"]["supportedModelFormats"]
    }


def test_deploy_paths_are_the_ones_docs_name() -> None:
    docs = (Path(__file__).resolve().parents[2] / "docs/deploy.md").read_text()
    for name in [*KUSTOMIZATIONS, *PLAIN_MANIFESTS]:
        assert f"deploy/{name}" in docs, f"docs/deploy.md never mentions deploy/{name}"
