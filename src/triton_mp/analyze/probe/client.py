"""The analyzer's HTTP/REST client of a Triton-compatible server (standard library only).

KServe v2 plus Triton's extensions, as ``tritonclient.http`` speaks them: health,
``GET /v2/models/<m>/config`` (Triton's JSON form), ``GET /v2/models/<m>/stats``
(ModelStatistics as JSON), ``POST /v2/repository/models/<m>/load`` with a ``config``
parameter (the repository extension), and ``GET /metrics`` on the metrics port. Works
against triton-mp and NVIDIA's tritonserver alike.
"""

from __future__ import annotations

import http.client
import json
import time
from typing import Any
from urllib.parse import quote


class ServerError(Exception):
    """The server answered with an error, or could not be reached (the message says which)."""


class ServerClient:
    """Requests to one server's HTTP/REST endpoint.

    Args:
        url: ``host:port`` of the HTTP/REST endpoint.
        timeout_s: per-request timeout (a load of several instances can take a while).
    """

    def __init__(self, url: str, timeout_s: float = 300.0) -> None:
        self.url = url.removeprefix("http://").rstrip("/")
        self._timeout_s = timeout_s

    def _request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        host, _, port = self.url.rpartition(":")
        conn = http.client.HTTPConnection(host or "localhost", int(port), timeout=self._timeout_s)
        try:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            return resp.status, resp.read()
        except OSError as e:
            raise ServerError(f"{method} http://{self.url}{path}: {e}") from None
        finally:
            conn.close()

    def _json(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        status, raw = self._request(method, path, data)
        if status != 200:
            try:
                message = json.loads(raw).get("error", raw.decode(errors="replace"))
            except (ValueError, AttributeError):
                message = raw.decode(errors="replace")
            raise ServerError(f"{method} {path}: HTTP {status}: {message}")
        return json.loads(raw) if raw else None

    def live(self) -> bool:
        """``GET /v2/health/live`` answered 200."""
        try:
            return self._request("GET", "/v2/health/live")[0] == 200
        except ServerError:
            return False

    def wait_live(self, timeout_s: float, alive: Any = None) -> None:
        """Poll ``live()`` every 100 ms (the server starts its frontend last).

        Args:
            alive: optional callable; when it returns False the wait gives up at once
                (the server process exited).

        Raises:
            ServerError: not live within ``timeout_s``, or the process died.
        """
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.live():
                return
            if alive is not None and not alive():
                raise ServerError("the server exited while starting")
            time.sleep(0.1)
        raise ServerError(f"server at {self.url} not live after {timeout_s:g}s")

    def model_config(self, model: str) -> dict[str, Any]:
        """The model's effective config in Triton's JSON form."""
        return dict(self._json("GET", f"/v2/models/{quote(model)}/config"))

    def model_ready(self, model: str) -> bool:
        """``GET /v2/models/<m>/ready`` answered 200."""
        return self._request("GET", f"/v2/models/{quote(model)}/ready")[0] == 200

    def load(self, model: str, config: dict[str, Any] | None = None) -> None:
        """Load (or reload) ``model``, with ``config`` instead of its config.pbtxt if given.

        Raises:
            ServerError: the server refused or failed the load (its message).
        """
        body: dict[str, Any] = {}
        if config is not None:
            body = {"parameters": {"config": json.dumps(config)}}
        self._json("POST", f"/v2/repository/models/{quote(model)}/load", body)

    def statistics(self, model: str) -> dict[str, Any]:
        """The model's ModelStatistics summed over its versions: ``inference_stats`` fields
        as ``{name: {"count", "ns"}}`` plus ``inference_count`` and ``execution_count``."""
        reply = self._json("GET", f"/v2/models/{quote(model)}/stats")
        total: dict[str, Any] = {"inference_count": 0, "execution_count": 0}
        for stats in reply.get("model_stats", []):
            total["inference_count"] += int(stats.get("inference_count", 0))
            total["execution_count"] += int(stats.get("execution_count", 0))
            for name, d in stats.get("inference_stats", {}).items():
                slot = total.setdefault(name, {"count": 0, "ns": 0})
                slot["count"] += int(d.get("count", 0))
                slot["ns"] += int(d.get("ns", 0))
        return total


def fetch_metrics(url: str, timeout_s: float = 10.0) -> str:
    """The Prometheus text of ``host:port`` (``GET /metrics``), or "" when unreachable."""
    host, _, port = url.removeprefix("http://").removesuffix("/metrics").rpartition(":")
    conn = http.client.HTTPConnection(host or "localhost", int(port), timeout=timeout_s)
    try:
        conn.request("GET", "/metrics")
        resp = conn.getresponse()
        return resp.read().decode(errors="replace") if resp.status == 200 else ""
    except OSError:
        return ""
    finally:
        conn.close()
