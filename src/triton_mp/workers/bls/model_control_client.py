"""A python worker's end of model control: ``pb_utils.load_model`` / ``unload_model``.

Imported by ``workers.main``, which installs ``ModelControlClient.load`` / ``unload`` into
``pb_utils`` (``set_model_control``). Each call connects once (lazily) to the supervisor's
listener (``supervisor.models.bls_control``; address and key from the worker's ``BlsSpec``), sends
a ``ModelLoadCall`` / ``ModelUnloadCall`` and blocks until its ``ControlReply``; calls from
several threads of the model go one at a time. A load answers when the model is loaded (or
failed), an unload when it began, as the core's ``TRITONSERVER_ServerLoadModel
WithParameters`` / ``TRITONSERVER_ServerUnloadModel`` do.
"""

from __future__ import annotations

import itertools
import threading
from multiprocessing.connection import Client, Connection

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.ipc import encode
from triton_mp.ipc.protocol.control_messages import ControlReply, ModelLoadCall, ModelUnloadCall
from triton_mp.ipc.recordio.codec import Decoder


class ModelControlClient:
    """Model control calls from one python worker (see the module docstring).

    Args:
        address: the supervisor's listener (``BlsSpec.control_address``).
        authkey: its key (``BlsSpec.control_key``).
    """

    def __init__(self, address: str, authkey: bytes) -> None:
        self._address = address
        self._authkey = authkey
        self._conn: Connection | None = None
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._decoder: Decoder[ControlReply] = Decoder(ControlReply)

    def load(self, name: str, config: str, files: dict[str, bytes]) -> None:
        """Load (or reload) model ``name``; ``config``: a JSON ModelConfig ("" = none),
        ``files``: ``file:<path>`` -> content, as ``pb_utils.load_model`` takes them.

        Raises:
            TritonMPError: the load failed (the client API's status and message).
        """
        self._call(
            lambda cid: ModelLoadCall(
                call_id=cid, model=name, config_json=config or None, files=files
            )
        )

    def unload(self, name: str, unload_dependents: bool) -> None:
        """Begin unloading model ``name``.

        Raises:
            TritonMPError: the unload was refused (not in explicit model control mode).
        """
        self._call(
            lambda cid: ModelUnloadCall(
                call_id=cid, model=name, unload_dependents=unload_dependents
            )
        )

    def _call(self, make: object) -> None:
        with self._lock:
            call_id = next(self._ids)
            try:
                conn = self._connect()
                conn.send_bytes(encode(make(call_id)))  # type: ignore[operator]
                while True:
                    reply = self._decoder.decode(conn.recv_bytes())
                    if reply.call_id == call_id:
                        break
            except (OSError, EOFError) as e:
                self._conn = None
                raise TritonMPError(
                    f"the server's model control is not reachable: {e}", ErrorCode.UNAVAILABLE
                ) from None
        if reply.error is not None:
            raise TritonMPError(reply.error.message, reply.error.code)

    def _connect(self) -> Connection:
        if self._conn is None:
            if not self._address:
                raise OSError("no model control address")
            self._conn = Client(self._address, family="AF_UNIX", authkey=self._authkey)
        return self._conn
