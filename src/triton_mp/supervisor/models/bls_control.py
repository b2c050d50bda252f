"""Model control for python models: ``pb_utils.load_model`` / ``unload_model`` from a worker.

Imported by ``supervisor.models.model_control``, which owns one ``BlsControl``. Upstream's python
backend sends these to its parent process, which calls ``TRITONSERVER_ServerLoadModel
WithParameters`` / ``TRITONSERVER_ServerUnloadModel`` (python_backend ``model_loader.cc``):
the same core path as the RepositoryModelLoad/Unload of the client API. Here a python worker
connects (``workers.bls.model_control_client``) to a ``multiprocessing`` listener on an
abstract Unix socket of the supervisor (the address and key travel in its ``BlsSpec``), sends
``ModelLoadCall`` / ``ModelUnloadCall`` and waits for the ``ControlReply``. A call is checked
as the core checks it (explicit model control only: UNAVAILABLE "explicit model load /
unload is not allowed if polling is enabled"; the load's parameters and model name as
``frontend.admin.repository.load_arguments``) and then queued with the frontends' calls on
model control's change thread, so its errors are the client API's.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import secrets
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection, Listener

import msgspec

from triton_mp.common.errors import ErrorCode, TritonMPError
from triton_mp.frontend.admin.repository import CONTROL_DISABLED_MESSAGE, load_arguments
from triton_mp.ipc import encode
from triton_mp.ipc.protocol.control_messages import ControlReply, ModelLoadCall, ModelUnloadCall
from triton_mp.ipc.protocol.messages import ErrorInfo
from triton_mp.ipc.recordio.codec import Decoder

log = logging.getLogger(__name__)

Call = ModelLoadCall | ModelUnloadCall
Reply = Callable[[ErrorInfo | None], None]
Handle = Callable[[Call, Reply], None]
"""Runs a checked call on the change thread; ``reply`` is called with its outcome."""


def _once(reply: Reply) -> Reply:
    """``reply`` answering the first time only (an unload is answered when it begins; the
    answer at the end of the change then goes nowhere)."""
    done = False

    def answer(error: ErrorInfo | None) -> None:
        nonlocal done
        if not done:
            done = True
            reply(error)

    return answer


def check_call(call: Call, model_control_mode: str) -> Call:
    """The call as model control runs it, checked as the core checks a load or unload.

    A load's ``files`` arrive keyed as ``pb_utils.load_model`` takes them (``file:<path>``);
    the result has them keyed by path, as a frontend's ``ModelLoadCall``.

    Raises:
        TritonMPError: UNAVAILABLE outside explicit mode; INVALID_ARG for a bad parameter
            or model name (``load_arguments``'s messages).
    """
    if model_control_mode != "explicit":
        raise TritonMPError(CONTROL_DISABLED_MESSAGE, ErrorCode.UNAVAILABLE)
    if isinstance(call, ModelUnloadCall):
        return call
    parameters: dict[str, object] = dict(call.files)
    if call.config_json:
        parameters["config"] = call.config_json
    config, files = load_arguments(call.model, parameters)
    return msgspec.structs.replace(call, config_json=config, files=files)


class BlsControl:
    """The listener python workers send model control calls to (see the module docstring).

    Checked calls wait in a queue that model control's change thread empties (``drain``)
    between changes and while a change waits for the workers it starts: a model's
    ``initialize`` may load the models it calls, as upstream's README shows.

    Args:
        model_control_mode: ``none``, ``poll`` or ``explicit``.
        wake: tells the change thread a call is waiting.
    """

    def __init__(self, model_control_mode: str, wake: Callable[[], None]) -> None:
        self._mode = model_control_mode
        self._wake = wake
        self._calls: queue.Queue[tuple[Call, Reply]] = queue.Queue()
        # NOTE: an abstract-namespace socket (Linux): no file, so a killed server leaves none.
        self.address = f"\0triton_mp_ctl_{os.getpid()}_{secrets.token_hex(8)}"
        """The listener's Unix socket address (``BlsSpec.control_address``)."""
        self.authkey = secrets.token_bytes(16)
        """The key a worker proves itself with (``BlsSpec.control_key``)."""
        self._listener = Listener(self.address, family="AF_UNIX", authkey=self.authkey)
        self._closed = False
        threading.Thread(target=self._accept, name="bls-control", daemon=True).start()

    def close(self) -> None:
        """Stop listening."""
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
            except (OSError, EOFError):
                if self._closed:
                    return
                continue
            except Exception:  # noqa: BLE001 - a failed handshake (wrong key) ends that one
                log.warning("a model control connection was refused", exc_info=True)
                continue
            threading.Thread(
                target=self._serve, args=(conn,), name="bls-control-conn", daemon=True
            ).start()

    def _serve(self, conn: Connection) -> None:
        """One worker's calls, one at a time (the worker waits for each reply)."""
        decoder: Decoder[Call] = Decoder(Call)
        lock = threading.Lock()
        while not self._closed:
            try:
                call = decoder.decode(conn.recv_bytes())
            except (EOFError, OSError):
                return
            except Exception:  # noqa: BLE001 - a bad message must not end the thread
                log.exception("bad model control message from a python model")
                continue

            def reply(error: ErrorInfo | None, call_id: int = call.call_id) -> None:
                with lock, contextlib.suppress(OSError):
                    conn.send_bytes(encode(ControlReply(call_id=call_id, error=error)))

            try:
                checked = check_call(call, self._mode)
            except TritonMPError as e:
                reply(ErrorInfo(e.code, e.message))
                continue
            self._calls.put((checked, _once(reply)))
            self._wake()

    def drain(self, handle: Handle) -> None:
        """Run every waiting call with ``handle`` (the change thread); a call that raises
        is answered INTERNAL with the exception's text."""
        while True:
            try:
                call, reply = self._calls.get_nowait()
            except queue.Empty:
                return
            try:
                handle(call, reply)
            except Exception as e:  # noqa: BLE001 - the change thread must go on
                log.exception("model control call from a python model failed")
                reply(ErrorInfo(ErrorCode.INTERNAL, str(e)))
