"""A batch's answers: each request's response written and posted to its requester, several
requests of one frontend in one ``AnswerBatch``.

Imported by ``workers.worker`` (``Worker`` owns one ``Answers`` and calls ``answer`` after each
batch, ``post`` for each response a decoupled model sends itself). Several untraced requests
of one frontend get one ``AnswerBatch`` with one output block (``workers.tensors.answer_batch``,
written by its C writer where it is built and ``send_answer`` is given); the others one
``InferResponse`` and one block each. Writing and posting is serialised by the worker's post
lock: the arena allocator and each ring have one producer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

from triton_mp.backends.base import (
    RESCHEDULED,
    Rescheduled,
    Responded,
    Result,
    ReturnedError,
    response_parameters,
)
from triton_mp.common.errors import ErrorCode, TritonMPError, flatten_exception
from triton_mp.ipc import ArenaAllocator, Sender
from triton_mp.ipc.memory.ring import RecordTooLarge
from triton_mp.ipc.output_holds import OutputArenas
from triton_mp.ipc.protocol.messages import (
    BlockRef,
    DecoupledDone,
    ErrorInfo,
    InferRequest,
    InferResponse,
    ReplyTo,
    Requester,
)
from triton_mp.workers.tensors.answer_batch import alloc_block, write_answer_batch
from triton_mp.workers.tensors.answer_size import fit_answer
from triton_mp.workers.tensors.tensor_io import (
    WIRE_OF,
    ClientRegions,
    free_own_block,
    write_outputs,
)
from triton_mp.workers.traces import Traces

try:
    # NOTE: mypy sees the extension only where it is built: either ignore may be unused.
    from triton_mp.workers import _answer_writer as native_writer  # type: ignore[attr-defined,unused-ignore]
except ImportError:  # NOTE: not built (setup.py): the Python path answers every batch
    native_writer = None  # type: ignore[assignment,unused-ignore]

log = logging.getLogger(__name__)

_NOT_ANSWERED = (Responded, Rescheduled)
"""Results the worker sends no answer for after the batch (a tuple: ``isinstance`` takes a
tuple faster than a union)."""


def _one_frontend(reqs: tuple[InferRequest, ...], final: list[Result]) -> int | None:
    """The frontend of a batch whose requests all answer it (the same ``ReplyTo`` object:
    the record decoder interns them), untraced, each with outputs to write (a plain
    ``dict``), so that one ``AnswerBatch`` answers them all: the common batch, told
    without ``Answers._answer_groups``' grouping; None for any other batch."""
    to = reqs[0].reply_to
    if to.kind is not Requester.FRONTEND:
        return None
    for r, res in zip(reqs, final, strict=True):
        if r.reply_to is not to or r.trace is not None or type(res) is not dict:
            return None
    return to.id


class Answers:
    """Writes and posts one worker's responses (module docstring).

    Args:
        instance_id: the worker's instance (``DecoupledDone.instance_id``).
        arena: this worker's output arena allocator.
        regions: the clients' mapped regions (outputs a request asked to go there).
        origin: the ``ErrorInfo.origin`` of errors raised here (``worker <instance>``).
        decoupled: the model is decoupled (each final response is reported to the scheduler,
            and batches are never grouped).
        post_lock: the worker's lock around arena allocations and ring pushes.
        traces: the worker's traced requests (their trace records join the final response).
        cancelled: the worker's (reply address, request id) of cancelled requests; a final
            decoupled response forgets its key.
        send_reply: ``send_reply(reply_to, message)``: to a request's frontend or BLS client.
        send_scheduler: ``send_scheduler(message)``.
        send_answer: ``send_answer(frontend_id, data)``: an ``AnswerBatch`` already encoded;
            None: every answer goes to ``send_reply`` as a message.
        frontends: the senders to each frontend (by id), with ``send_answer``: a batch of
            one frontend's plain requests is then written and pushed into its ring in one C
            call (``_answer_writer.answer_plain``), and only the wake-up is posted here.
        input_buf: ``input_buf(segment)``: this worker's mapping of a frontend's input arena
            (``SegmentCache.get(segment).buf``); given, ``answer_plain`` answers an output of
            64 KiB or more that lies inside its request's own input (a model that returns
            its input, or a view of it) from the input block, without copying it
            (``TensorRef``'s rule in ``ipc.protocol.messages``). None: every output is
            copied into this worker's arena.
    """

    def __init__(
        self,
        instance_id: int,
        arena: ArenaAllocator,
        regions: ClientRegions,
        origin: str,
        decoupled: bool,
        post_lock: threading.RLock,
        traces: Traces,
        cancelled: set[tuple[ReplyTo, int]],
        send_reply: Callable[[ReplyTo, object], None],
        send_scheduler: Callable[[object], None],
        send_answer: Callable[[int, bytes], None] | None,
        frontends: Mapping[int, Sender] | None = None,
        input_buf: Callable[[str], Any] | None = None,
    ) -> None:
        self._instance_id = instance_id
        self._input_buf = input_buf
        self._arena = arena
        self._regions = regions
        self._origin = origin
        self._decoupled = decoupled
        self._post_lock = post_lock
        self._traces = traces
        self._cancelled = cancelled
        self._send_reply = send_reply
        self._send_scheduler = send_scheduler
        self._send_answer = send_answer
        self._window = regions.window
        self._alloc: Callable[[Any, int], tuple[Any, int, BlockRef]] = (
            OutputArenas.alloc_block if isinstance(arena, OutputArenas) else alloc_block
        )
        """What ``answer_plain`` allocates the batch's block with (``alloc(arena, total)``):
        a worker's ``OutputArenas``' own fast path, ``alloc_block`` for any other arena."""
        self._rings: dict[int, Any] | None = None
        """frontend id -> its answer ring's writable mapping (``answer_plain`` pushes there);
        None: no native path."""
        self._wakes: dict[int, Callable[[], None]] = {}
        if frontends and send_answer is not None and native_writer is not None:
            self._rings = {i: s.ring.segment.buf for i, s in frontends.items()}
            self._wakes = {i: s.wake for i, s in frontends.items()}

    def post(self, req: InferRequest, msg: InferResponse) -> bool:
        """Send a response to its frontend (lock held); False when it could not be sent
        (its output block is freed then)."""
        ok = True
        try:
            try:
                self._send_reply(req.reply_to, msg)
            except RecordTooLarge:
                # NOTE: an answer record must fit half the answer ring; a huge error text or
                # parameters would otherwise leave the client without any answer.
                small = fit_answer(msg, self._origin)
                if msg.block is not None and small.block is None:
                    free_own_block(self._arena, msg.block)
                msg = small
                try:
                    self._send_reply(req.reply_to, msg)
                except RecordTooLarge:  # a small --answer-ring-bytes: 512 bytes fit any
                    msg = fit_answer(msg, self._origin, 512)
                    self._send_reply(req.reply_to, msg)
        except Exception:  # noqa: BLE001 - one unreachable frontend must not stall the others
            log.exception(
                "could not answer request %d of %s %d",
                req.request_id,
                req.reply_to.kind.name.lower(),
                req.reply_to.id,
            )
            if msg.block is not None:
                free_own_block(self._arena, msg.block)
            ok = False
        if self._decoupled and msg.final:
            key = (req.reply_to, req.request_id)
            self._cancelled.discard(key)
            try:
                self._send_scheduler(
                    DecoupledDone(
                        instance_id=self._instance_id,
                        reply_to=key[0],
                        request_id=key[1],
                    )
                )
            except Exception:  # noqa: BLE001 - the scheduler's death stops the server anyway
                log.exception("could not report the end of request %d", req.request_id)
        return ok

    def answer(
        self, reqs: tuple[InferRequest, ...], results: list[Result | None]
    ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Write and post each request's response (those the backend answered itself,
        ``Responded``, and those it rescheduled, ``Rescheduled``, are skipped). Several
        untraced requests of one frontend get one ``AnswerBatch``
        (``workers.tensors.answer_batch``); the others one ``InferResponse`` each.

        Returns:
            ``(failed, rescheduled)``: the indices of the requests that failed (not those
            the model answered with its own error, a ``ReturnedError``: executed, as
            python_be.cc counts them), and of those rescheduled (``BatchDone``'s fields).
        """
        if (
            not self._decoupled
            and self._rings is not None
            and type(reqs) is tuple
            and type(results) is list
        ):
            # NOTE: a single request too (an AnswerBatch of one), and one answered into
            # a client's region: at identity_py 1 MiB c=4 with shm, the Python path
            # (write_outputs, post) was most of the worker's time besides the copy. Before
            # the scans for a missing or rescheduled result (~0.5 and ~0.4 µs per batch of
            # 12 hot): a batch the C call takes has a plain dict for each request.
            plain = self._answer_plain(reqs, results)  # type: ignore[arg-type]
            if plain is not None:
                return plain, ()
        rescheduled = (
            tuple(i for i, r in enumerate(results) if r is RESCHEDULED)
            if RESCHEDULED in results  # NOTE: the one Rescheduled value (backends.base)
            else ()
        )
        return self._answer_rest(reqs, results), rescheduled

    def _answer_rest(
        self, reqs: tuple[InferRequest, ...], results: list[Result | None]
    ) -> tuple[int, ...]:
        """``answer`` for a batch the C writer did not take; returns the failed indices."""
        failed: list[int] = []
        final: list[Result] = results  # type: ignore[assignment]
        if None in results:
            missing = ErrorInfo(ErrorCode.INTERNAL, "no result for the request", self._origin)
            final = [missing if r is None else r for r in results]
        single: range | list[int] = range(len(reqs))
        if not self._decoupled and len(reqs) > 1:
            one = _one_frontend(reqs, final)
            if one is not None:
                if self._answer_group(one, reqs, final, list(single), failed):
                    return _executed_failures(failed, final)
            else:
                grouped = self._answer_groups(reqs, final, failed)
                if grouped:
                    single = [i for i in single if i not in grouped]
        for i in single:
            self._answer_one(i, reqs[i], final[i], failed)
        return _executed_failures(failed, final)

    def _answer_plain(
        self, reqs: tuple[InferRequest, ...], final: list[Result]
    ) -> tuple[int, ...] | None:
        """A batch of one frontend's plain requests (``_one_frontend``'s; outputs asked into
        client regions are copied there, as ``write_region`` copies them) written, encoded
        and pushed into the frontend's ring in one C call, then its wake-up posted; returns
        the failed indices (none, or every one when the send failed), or None when the C
        call declined the batch or could not answer it (nothing sent: ``answer`` goes on as
        before, and meets the same condition there: no room for the block, a record too
        large for the ring)."""
        assert self._rings is not None
        assert self._send_answer is not None
        with self._post_lock:
            try:
                got = native_writer.answer_plain(
                    reqs,
                    final,
                    Requester.FRONTEND,
                    self._rings,
                    WIRE_OF,
                    response_parameters,
                    self._alloc,
                    self._arena,
                    self._window,
                    self._input_buf,
                )
            except TritonMPError:
                return None  # NOTE: e.g. no room for one block; per-request blocks may fit
            if got is None:
                return None
            frontend_id, data, block = got
            if data is None:
                self._wakes[frontend_id]()
                return ()
            # NOTE: a full ring (Sender's wait) or a record too large for it.
            sent = self._post_or_free(self._send_answer, frontend_id, data, block, len(reqs))
        if sent is None:
            return None
        return () if sent else tuple(range(len(reqs)))

    def _answer_groups(
        self, reqs: tuple[InferRequest, ...], final: list[Result], failed: list[int]
    ) -> set[int]:
        """Answer each frontend's untraced requests of the batch (two or more) in one
        ``AnswerBatch`` each; returns the indices answered so."""
        groups: dict[int, list[int]] = {}
        for i, req in enumerate(reqs):
            if (
                req.reply_to.kind is Requester.FRONTEND
                and req.trace is None
                and not isinstance(final[i], _NOT_ANSWERED)
            ):
                groups.setdefault(req.reply_to.id, []).append(i)
        grouped: set[int] = set()
        for frontend_id, idx in groups.items():
            if len(idx) > 1 and self._answer_group(frontend_id, reqs, final, idx, failed):
                grouped.update(idx)
        return grouped

    def _answer_group(
        self,
        frontend_id: int,
        reqs: tuple[InferRequest, ...],
        final: list[Result],
        idx: list[int],
        failed: list[int],
    ) -> bool:
        """Answer the requests ``idx`` of one frontend in one ``AnswerBatch``; False when it
        could not be written or was too large for a ring record (nothing was sent: the
        caller answers them one by one)."""
        members = [(reqs[i], final[i]) for i in idx]
        send_answer = self._send_answer
        with self._post_lock:
            try:
                msg, block, errors = write_answer_batch(
                    self._arena,
                    self._regions,
                    members,  # type: ignore[arg-type]
                    self._origin,
                    send_answer is not None,
                )
            except TritonMPError:
                return False  # NOTE: e.g. no room for one block; per-request blocks may fit
            if isinstance(msg, bytes):
                assert send_answer is not None
                sent = self._post_or_free(send_answer, frontend_id, msg, block, len(idx))
            else:
                to = ReplyTo(Requester.FRONTEND, frontend_id)
                sent = self._post_or_free(self._send_reply, to, msg, block, len(idx))
        if sent is None:
            return False
        failed.extend(idx if not sent else (idx[k] for k in errors))
        return True

    def _post_or_free(
        self, send: Callable[[Any, Any], None], to: Any, msg: Any, block: BlockRef | None, n: int
    ) -> bool | None:
        """``send(to, msg)``: one frontend's answer to ``n`` requests, naming ``block`` (this
        worker's, None: none). Returns True when sent; None when the record is too large
        for the ring (``RecordTooLarge``: the block is freed, nothing was sent, the caller
        answers another way); False when the send failed otherwise (logged, the block freed:
        the requests failed)."""
        try:
            send(to, msg)
        except RecordTooLarge:
            if block is not None:
                free_own_block(self._arena, block)
            return None
        except Exception:  # noqa: BLE001 - one unreachable frontend must not stall the others
            frontend_id = to.id if isinstance(to, ReplyTo) else to
            log.exception("could not answer %d requests of frontend %d", n, frontend_id)
            if block is not None:
                free_own_block(self._arena, block)
            return False
        return True

    def _answer_one(self, i: int, req: InferRequest, res: Result, failed: list[int]) -> None:
        """Write and post the response of request ``i`` of the batch on its own."""
        if isinstance(res, _NOT_ANSWERED):
            return
        with self._post_lock:
            if isinstance(res, dict):
                try:
                    msg = write_outputs(self._arena, self._regions, req, res)
                except TritonMPError as exc:
                    res = ErrorInfo(exc.code, exc.message, self._origin)
                except Exception as exc:  # noqa: BLE001
                    res = ErrorInfo(ErrorCode.INTERNAL, flatten_exception(exc), self._origin)
            if not isinstance(res, dict):
                failed.append(i)
                msg = InferResponse(request_id=req.request_id, version=req.version, error=res)
            if req.trace is not None:
                msg = self._traces.record(msg, req, [], res if isinstance(res, dict) else None)
            if not self.post(req, msg) and i not in failed:
                failed.append(i)


def _executed_failures(failed: list[int], final: list[Result]) -> tuple[int, ...]:
    """The indices of ``failed`` whose request failed to execute, sorted: a request answered
    with the model's own error (``ReturnedError``) is not one of them."""
    if not failed:
        return ()
    return tuple(sorted(i for i in failed if type(final[i]) is not ReturnedError))
