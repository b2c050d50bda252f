"""Restricted-protocol flags and the client shared-memory policy (no processes)."""

from __future__ import annotations

import os

import pytest

from triton_mp.cli.main import config_from_flags, parse_flags
from triton_mp.common.errors import TritonMPError
from triton_mp.frontend.restricted import CATEGORIES, GRPC_METHOD_CATEGORIES, parse_restrictions
from triton_mp.ipc.memory.shm import client_object_refusal

FLAG = "--grpc-restricted-protocol"


def test_groups_parse_into_one_rule_per_category() -> None:
    rules = parse_restrictions(
        ["shared-memory,model-repository:admin-key=admin-value", "inference:k=v"], FLAG
    )
    assert rules == {
        "shared-memory": ("admin-key", "admin-value"),
        "model-repository": ("admin-key", "admin-value"),
        "inference": ("k", "v"),
    }


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("health", f"{FLAG} option format is '<config name>:<setting>=<value>'. Got health"),
        ("health:k", f"{FLAG} option format is '<config name>:<setting>=<value>'. Got health:k"),
        ("health:=v", f"{FLAG} option format is '<config name>:<setting>=<value>'. Got health:=v"),
        ("health:k=", f"{FLAG} option format is '<config name>:<setting>=<value>'. Got health:k="),
        ("bogus:k=v", "unknown restricted protocol 'bogus'"),
        ("Health:k=v", "unknown restricted protocol 'Health'"),
        (
            "health,health:k=v",
            "restricted protocol 'health' can not be specified in multiple config groups",
        ),
    ],
)
def test_bad_values_get_tritons_messages(text: str, message: str) -> None:
    with pytest.raises(TritonMPError) as e:
        parse_restrictions([text], FLAG)
    assert e.value.message == message


def test_http_says_api() -> None:
    with pytest.raises(TritonMPError, match="unknown restricted api 'x'"):
        parse_restrictions(["x:k=v"], "--http-restricted-api")
    with pytest.raises(TritonMPError, match="restricted api 'health' can not be specified"):
        parse_restrictions(["health:a=b", "health:c=d"], "--http-restricted-api")


def test_every_inference_service_rpc_has_a_category() -> None:
    from triton_mp._proto import grpc_service_pb2 as pb

    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for method in service.methods:
        assert f"/inference.GRPCInferenceService/{method.name}" in GRPC_METHOD_CATEGORIES
    assert set(GRPC_METHOD_CATEGORIES.values()) == set(CATEGORIES)


def test_the_cli_puts_them_in_the_config() -> None:
    parsed = parse_flags(
        [
            "--grpc-restricted-protocol=model-repository:a=b",
            "--http-restricted-api=health,metadata:c=d",
            "--client-shm-prefix=/mine_",
        ]
    )
    cfg = config_from_flags(parsed.values)
    assert cfg.grpc_restricted == {"model-repository": ("a", "b")}
    assert cfg.http_restricted == {"health": ("c", "d"), "metadata": ("c", "d")}
    assert cfg.client_shm_prefix == "/mine_"


def test_client_objects_policy() -> None:
    me = os.geteuid()
    assert client_object_refusal("/client_in", me, "123") is None
    assert client_object_refusal("client_in", me, "123", "/client_") is None
    assert "this server's own objects" in str(
        client_object_refusal("/triton_mp_123_f0_a0", me, "123")
    )
    # Another server's naming is only another key (the prefix and owner rules still apply).
    assert client_object_refusal("/triton_mp_999_test_x", me, "123") is None
    assert "allowed prefix '/client_'" in str(client_object_refusal("/other", me, "1", "client_"))
    assert f"owned by uid {me + 1}" in str(client_object_refusal("/client_in", me + 1, "1"))
