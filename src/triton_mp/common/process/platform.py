"""The one place a triton-mp process talks to the OS about itself: prctl, malloc, its title.

Called by every role, never bypassed (no other module calls ``prctl`` through ctypes or
``setproctitle``):

- ``die_with_parent``: a child asks the kernel to SIGKILL it when the supervisor dies
  (``prctl(PR_SET_PDEATHSIG)``); the supervisor's spawn target calls it first thing.
- ``set_timer_slack_ns`` / ``timer_slack_ns``: the calling thread's timer slack
  (``prctl(PR_SET_TIMERSLACK)``); the scheduler sets 1 µs (see there).
- ``set_process_title``: ``triton-mp: <role> <name>`` in ``ps`` and ``/proc/<pid>/cmdline``.
- ``tune_malloc``: glibc malloc settings for processes that move large tensors.
- ``tune_gc``: the collector told that start-up's objects live for good (``gc.freeze``).
- ``pin_process`` / ``bind_memory_to_node`` / ``lower_priority``: a worker's host policy
  (``sched_setaffinity`` on every thread, ``set_mempolicy(MPOL_BIND)``) and its
  ``optimization.priority`` (``nice``).

Each does nothing where the platform lacks it (not Linux, not glibc) and never raises, but
for the host policy ones: a policy the kernel refuses fails the instance's load, as in Triton.

glibc malloc: every request with a 1 MiB tensor makes several 1 MiB Python ``bytes`` objects
on its way through grpcio, protobuf and numpy. With glibc's defaults each of them is a fresh
``mmap`` (above the dynamic mmap threshold, 128 KiB at start) or memory that ``free`` trims
back to the kernel at once, so every request page-faults its buffers in again: measured here,
an echo of 1 MiB over grpc.aio took ~1,300 page faults per request and ran at ~190 infer/s;
with the settings below, ~10 and ~290-450 infer/s (perf_analyzer, concurrency 4, same
minutes). The cost is memory: freed memory up to ``TRIM_THRESHOLD_BYTES`` stays with the
process instead of going back to the kernel, so a process's RSS stays near its high-water
mark.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import gc
import logging
import os
import platform
import signal
from collections.abc import Iterable

from triton_mp.common.errors import ErrorCode, TritonMPError

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_PR_SET_TIMERSLACK = 29
_PR_GET_TIMERSLACK = 30
"""prctl options from <linux/prctl.h>."""

# mallopt parameter numbers from glibc's <malloc.h>
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3

MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
"""Allocations below this come from the heap, not a fresh mmap (glibc's maximum, 64-bit)."""
TRIM_THRESHOLD_BYTES = 256 * 1024 * 1024
"""Free memory at the top of the heap kept before ``free`` gives it back to the kernel."""
TOP_PAD_BYTES = 16 * 1024 * 1024
"""Extra heap requested with every ``brk``, so growth costs fewer system calls."""

_ENV_OVERRIDES = (
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "GLIBC_TUNABLES",
)


def tune_malloc() -> bool:
    """Apply the thresholds above to this process's glibc allocator.

    Does nothing where libc is not glibc (``mallopt`` missing) or where the operator set any
    of glibc's own malloc environment variables (theirs win). Never raises.

    Returns:
        True when all three settings were applied.
    """
    if any(name in os.environ for name in _ENV_OVERRIDES):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    ok = all(
        mallopt(param, value) == 1
        for param, value in (
            (_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES),
            (_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES),
            (_M_TOP_PAD, TOP_PAD_BYTES),
        )
    )
    if not ok:
        log.debug("mallopt refused a setting; glibc defaults stay in part")
    return ok


def tune_gc() -> None:
    """Collect once, then freeze what start-up made (``gc.freeze``), before serving: the
    frontend calls it just before it reports ready.

    The grpc, protobuf, numpy and aiohttp modules and the model table are ~10^5 objects that
    live as long as the process; every full collection walked them all. Measured with
    ``gc.callbacks`` in the frontend at add_sub_py c=16 (perf_analyzer, ~18 s, ~2,200
    infer/s): 5 full collections of ~60 ms each (314 ms, and a 60 ms stall of every request
    in flight), plus 107 ms of young ones; frozen, the full ones take ~0.3 ms and the total
    is 78 ms, ~9 us less per inference. The thresholds stay Python's: what is collected does
    not change.

    NOTE: the scheduler and the workers do not call it. Measured (bench_vs_triton.py, 2e563ac
    against 13f2082, alternating rounds): add_sub_py c=16 343 against 336 us per inference,
    no gain; ocr_cls c=32 served fewer images per second in all 5 rounds (602-977 against
    863-1,122), at the same serving CPU per image outside onnxruntime (475 against 474 us).
    """
    gc.collect()
    gc.freeze()


def _prctl(option: int, arg: int) -> int | None:
    """``prctl(option, arg)``'s result, or None where there is no prctl (not Linux)."""
    try:
        # NOTE: the process's own libc (``CDLL(None)``): the symbol is in it on Linux.
        return int(ctypes.CDLL(None, use_errno=True).prctl(option, ctypes.c_ulong(arg), 0, 0, 0))
    except (OSError, AttributeError):
        return None


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when its parent dies (``PR_SET_PDEATHSIG``).

    Exits at once (status 1) when the parent ``parent_pid`` is already gone, since the
    kernel then never sends the signal. Does nothing where prctl is missing (not Linux).

    NOTE: without it, a ``kill -9`` of the supervisor leaves the tree serving as orphans,
    and the next server's stale-object sweep would pull shared memory from under them.
    """
    if _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL) is None:
        return  # not Linux: no such guarantee
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def set_timer_slack_ns(slack_ns: int) -> bool:
    """Set this thread's timer slack (Linux ``prctl(PR_SET_TIMERSLACK)``), in nanoseconds.

    The kernel may end a timed sleep up to the slack after its deadline, to coalesce
    wake-ups; the default is 50 µs. The scheduler sleeps until the next batch deadline
    (``max_queue_delay_microseconds``), so the default slack added ~50 µs to the queue time
    of every request of a model with a delay at low load (measured with add_sub_py at
    concurrency 1: queue 658-694 µs with the default, 607-640 µs with 1 µs, for a 500 µs
    delay). Called once, by the scheduler's main thread, before its loop.

    Returns:
        True when set; False where prctl is missing or refuses (non-Linux): nothing changes.
    """
    ok = _prctl(_PR_SET_TIMERSLACK, slack_ns) == 0
    if not ok:
        log.debug("timer slack not set; timed waits keep the default slack")
    return ok


def timer_slack_ns() -> int | None:
    """This thread's timer slack in nanoseconds (``prctl(PR_GET_TIMERSLACK)``), or None
    where it cannot be read."""
    value = _prctl(_PR_GET_TIMERSLACK, 0)
    return value if value is not None and value >= 0 else None


def process_title(role: str, name: str) -> str:
    """``"triton-mp: <role> <name>"``, or ``"triton-mp: <role>"`` when the name is the role's
    (the scheduler); tests and operators find a server's processes by it."""
    return f"triton-mp: {role} {name}" if role != name else f"triton-mp: {role}"


def set_process_title(role: str, name: str) -> None:
    """Show this process as ``process_title(role, name)`` in ``ps`` and ``/proc``."""
    # NOTE: imported here: only processes that name themselves load the extension.
    import setproctitle

    setproctitle.setproctitle(process_title(role, name))


def _threads() -> list[int]:
    """This process's thread ids (just the calling thread where ``/proc`` is missing)."""
    try:
        return [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        return [0]


def pin_process(cpus: Iterable[int]) -> None:
    """Pin every thread of this process, and so every thread it starts later, to ``cpus``.

    Raises:
        TritonMPError (INTERNAL): the kernel refused (a CPU that does not exist or is not
            in this process's cpuset), in Triton's words.
    """
    wanted = set(cpus)
    if not hasattr(os, "sched_setaffinity"):
        log.warning("this platform cannot pin processes; host policy cpu-cores ignored")
        return
    for tid in _threads():
        try:
            os.sched_setaffinity(tid, wanted)
        except ProcessLookupError:
            continue  # NOTE: a thread that ended since the listing
        except OSError as e:
            raise TritonMPError(
                f"Unable to set NUMA thread affinity: {os.strerror(e.errno or 0)}",
                ErrorCode.INTERNAL,
            ) from None


_SYS_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}
"""``set_mempolicy``'s system call number per machine."""
_MPOL_BIND = 2


def numa_nodes() -> tuple[int, ...]:
    """The host's NUMA node ids (``/sys/devices/system/node``); empty where it has none."""
    try:
        names = os.listdir("/sys/devices/system/node")
    except OSError:
        return ()
    return tuple(sorted(int(n[4:]) for n in names if n.startswith("node") and n[4:].isdigit()))


def bind_memory_to_node(node: int) -> bool:
    """Bind future memory allocations to NUMA node ``node`` (``set_mempolicy(MPOL_BIND)``),
    as Triton's ``SetNumaMemoryPolicy`` does.

    The policy is the calling thread's and every thread it starts later inherits it: the
    worker calls this from its main thread before the backend starts its pools.

    Returns:
        True when bound; False where the host shows no NUMA topology or the system call is
        unknown here (a warning is logged): there is nothing to bind to.

    Raises:
        TritonMPError (INTERNAL): the node does not exist or the kernel refused, in
            Triton's words.
    """
    nodes = numa_nodes()
    number = _SYS_SET_MEMPOLICY.get(platform.machine())
    if not nodes or number is None:
        log.warning("no NUMA topology on this host; host policy numa-node %d not bound", node)
        return False
    if node not in nodes:
        raise TritonMPError(
            f"Unable to set NUMA memory policy: {os.strerror(errno.EINVAL)} (this host's "
            f"NUMA nodes are {', '.join(map(str, nodes))})",
            ErrorCode.INTERNAL,
        )
    mask = ctypes.c_ulong(1 << node)
    libc = ctypes.CDLL(None, use_errno=True)
    # NOTE: maxnode counts bits of the mask, plus one as Triton passes it.
    if libc.syscall(number, _MPOL_BIND, ctypes.byref(mask), max(nodes) + 2) != 0:
        raise TritonMPError(
            f"Unable to set NUMA memory policy: {os.strerror(ctypes.get_errno())}",
            ErrorCode.INTERNAL,
        )
    return True


def lower_priority(increment: int) -> None:
    """Raise this process's nice value by ``increment`` (0: leave it). Never raises."""
    if increment <= 0:
        return
    try:
        os.nice(increment)
    except OSError as e:
        log.warning("could not change the nice value by %d: %s", increment, e)
