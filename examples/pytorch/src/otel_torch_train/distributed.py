"""torch.distributed: who this process is in its job, and how long each step waits in collectives.

Identity (resource attributes, equal names on gpulse's side)::

    pytorch.distributed.rank         global rank          dist.get_rank(), else RANK / SLURM_PROCID
    pytorch.distributed.local_rank   rank on this node    LOCAL_RANK / SLURM_LOCALID
    pytorch.distributed.world_size   ranks in the job     dist.get_world_size(), else WORLD_SIZE / SLURM_NTASKS
    pytorch.distributed.backend      gloo, nccl, ...      dist.get_backend(), once initialised
    pytorch.distributed.job.id       the job, equal on every rank

The job id is ``TORCHELASTIC_RUN_ID`` (torchrun's ``--rdzv-id``; torchrun's placeholder ``none`` does
not count), else ``SLURM_JOB_ID``, else ``MASTER_ADDR:MASTER_PORT``, which every rank of one job
shares and two jobs running at once cannot. An OpenTelemetry Resource is fixed when the providers are
built, which is usually before ``init_process_group``: the launcher's variables give everything but
the backend then, and the backend is added to the run span once known.

Collective wait: the time a step spends with a collective in flight, as the union of the intervals
from each collective's issue to its completion within the step (so two buckets in flight at once
count once). Two sources, neither needing a change to the loop:

* DDP: ``TrainingTelemetry.watch_ddp(model)`` registers a communication hook that times each
  gradient bucket's all-reduce (and then runs the default all-reduce, or the hook given).
* Explicit calls: ``torch.distributed.all_reduce``, ``broadcast``, ``all_gather``, ... are wrapped
  while a ``CollectiveClock`` is installed (``TrainingTelemetry(collectives=True)``, the default when
  torch.distributed is initialised).

On gloo/CPU the time is host time (the call blocks the host, or its future completes on a gloo
thread). On CUDA (NCCL) the host does not block, so each collective is bracketed with CUDA events
on the current stream and the intervals are read when the step ends, which waits for the step's last
collective to finish on the GPU (it usually has: ``loss.item()`` already waited).

Callbacks on torch futures run on torch's threads (a gloo worker completes the all-reduce), and that
thread destroys the callback after running it, taking the GIL. When the main thread has already left
``main`` and the interpreter is finalizing, taking the GIL ends the worker thread inside a C++
destructor, and the process aborts ("terminate called without an active exception", SIGABRT) after a
run that succeeded. ``CallbackFence`` is how this module avoids it: one Python callback per
collective (the default all-reduce is issued here rather than through torch's hook, which chains a
second one), each marked when the worker lets go of it, ``settle`` (at ``shutdown`` and at exit)
waiting for those, and the futures held here so the worker never drops their last reference.

A wait that overlaps backward computation (an early bucket's all-reduce while later gradients are
still computed) is counted: with one bucket (small models) it is the exposed wait; with many it is an
upper bound of it.
"""

from __future__ import annotations

import atexit
import functools
import os
import sys
import threading
import weakref
from time import time_ns
from typing import Any, Callable, List, Mapping, Optional, Tuple

RANK = "pytorch.distributed.rank"
LOCAL_RANK = "pytorch.distributed.local_rank"
WORLD_SIZE = "pytorch.distributed.world_size"
BACKEND = "pytorch.distributed.backend"
JOB_ID = "pytorch.distributed.job.id"
#: On the step span: seconds of the step with a collective in flight.
COLLECTIVE_WAIT = "pytorch.distributed.collective.wait"
#: On the step span: collectives completed in the step.
COLLECTIVE_COUNT = "pytorch.distributed.collective.count"

#: The module-level functions of torch.distributed that are timed when called in a step.
WRAPPED_COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "gather",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
)


def _int(env: Mapping[str, str], *names: str) -> Optional[int]:
    for name in names:
        value = env.get(name, "").strip()
        if value:
            try:
                return int(value)
            except ValueError:
                continue
    return None


def job_id(env: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The job's identity, equal on every rank; ``None`` outside a launcher."""
    env = os.environ if env is None else env
    run_id = env.get("TORCHELASTIC_RUN_ID", "").strip()
    # torchrun without --rdzv-id sets the placeholder "none": shared by every such job.
    if run_id and run_id.lower() != "none":
        return run_id
    slurm = env.get("SLURM_JOB_ID", "").strip()
    if slurm:
        return f"slurm-{slurm}"
    addr = env.get("MASTER_ADDR", "").strip()
    port = env.get("MASTER_PORT", "").strip()
    if addr and port:
        return f"{addr}:{port}"
    return None


def _dist() -> Any:
    try:
        import torch.distributed as dist
    except ImportError:
        return None
    if not dist.is_available():
        return None
    return dist


def _initialized(dist: Any) -> bool:
    return dist is not None and dist.is_available() and dist.is_initialized()


def _dist_if_loaded() -> Any:
    """torch.distributed when the application imported torch; never imports torch itself."""
    if "torch" not in sys.modules:
        return None
    return _dist()


def initialized() -> bool:
    """Whether this process is in an initialised torch.distributed job."""
    return _initialized(_dist_if_loaded())


def install_available() -> bool:
    """Whether there is a torch.distributed to time (torch imported, distributed built in)."""
    return _dist_if_loaded() is not None


def attributes(env: Optional[Mapping[str, str]] = None, dist: Any = "auto") -> dict:
    """The ``pytorch.distributed.*`` attributes of this process; empty outside a job.

    A process is part of a job when torch.distributed is initialised or a launcher (torchrun,
    SLURM) set its rank and world size.
    """
    env = os.environ if env is None else env
    if dist == "auto":
        dist = _dist_if_loaded()
    found: dict = {}
    if _initialized(dist):
        found[RANK] = int(dist.get_rank())
        found[WORLD_SIZE] = int(dist.get_world_size())
        try:
            found[BACKEND] = str(dist.get_backend())
        except Exception:  # noqa: BLE001 - a backend-less group still has ranks
            pass
    else:
        rank = _int(env, "RANK", "SLURM_PROCID")
        world = _int(env, "WORLD_SIZE", "SLURM_NTASKS")
        if rank is None or world is None:
            return {}
        found[RANK] = rank
        found[WORLD_SIZE] = world
    local = _int(env, "LOCAL_RANK", "SLURM_LOCALID")
    if local is not None:
        found[LOCAL_RANK] = local
    job = job_id(env)
    if job is not None:
        found[JOB_ID] = job
    return found


def _union_seconds(intervals: List[Tuple[float, float]]) -> float:
    """Total length of the union of ``(start, end)`` intervals."""
    total = 0.0
    current_start = current_end = None
    for start, end in sorted(intervals):
        if end <= start:
            continue
        if current_end is None or start > current_end:
            if current_end is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None:
        total += current_end - current_start
    return total


class CallbackFence:
    """Python callbacks chained on torch futures, until torch's threads have let go of them.

    ``then`` chains ``callback`` on ``future`` with a token only the callback's closure holds, so
    the token dies when the thread that ran the callback destroys it. ``settle`` waits until every
    callback that has run was also released. The futures (the one given and the one ``then``
    returns, whose value is a Python object) stay referenced here until a step after their release,
    so the worker never drops the last reference to them, which would take the GIL again.
    """

    def __init__(self) -> None:
        self._lock = threading.Condition(threading.Lock())
        self._running = 0  # callbacks that ran and are not yet released
        self._held: List[list] = []  # [future, chained future, released?]
        self._released: List[list] = []
        self._at_exit = False

    def then(self, future: Any, callback: Callable[[Any], Any]) -> Any:
        """``future.then(callback)``, with the callback's release tracked."""
        entry: list = [future, None, False]
        token = _Token()

        def released() -> None:
            with self._lock:
                entry[2] = True
                if token_ran[0]:
                    self._running -= 1
                    self._lock.notify_all()

        token_ran = [False]
        # Not at exit: weakref's own exit hook would call it for a callback still held, and
        # settle (registered earlier, so run later) would stop waiting for it.
        weakref.finalize(token, released).atexit = False

        def run(fut: Any, _token: _Token = token) -> Any:
            with self._lock:
                token_ran[0] = True
                self._running += 1
            return callback(fut)

        del token  # the closure's default holds the only reference now
        entry[1] = future.then(run)
        with self._lock:
            self._held.append(entry)
        return entry[1]

    def prune(self) -> None:
        """Drops the futures released before the previous prune (called once a step)."""
        with self._lock:
            self._released = [e for e in self._held if e[2]]
            self._held = [e for e in self._held if not e[2]]

    def settle(self, timeout: float = 2.0) -> bool:
        """Waits until every callback that ran has been released; False after ``timeout``.

        A callback that never ran (its collective never completed) is not waited for.
        """
        with self._lock:
            return self._lock.wait_for(lambda: self._running == 0, timeout)

    def settle_at_exit(self) -> None:
        """Registers ``settle`` to run at interpreter exit, before finalization (once)."""
        if not self._at_exit:
            self._at_exit = True
            atexit.register(self.settle)


class _Token:
    """Lives exactly as long as the callback closure that holds it."""

    __slots__ = ("__weakref__",)


class CollectiveClock:
    """The collective intervals of the current step (host nanoseconds, or CUDA events).

    Callbacks of gloo futures run on gloo's threads, so appends take a lock.
    """

    def __init__(self, cuda: Any = None, live: Any = None) -> None:
        self._lock = threading.Lock()
        #: Where the loop is (live.LiveState): told of each collective issued and completed.
        self.live = live
        self._host: List[Tuple[int, int]] = []
        self._events: List[Tuple[Any, Any]] = []
        self._cuda = cuda
        self.fence = CallbackFence()
        self.fence.settle_at_exit()

    def reset(self) -> None:
        with self._lock:
            self._host.clear()
            self._events.clear()

    def add_host(self, start_ns: int, end_ns: int) -> None:
        with self._lock:
            self._host.append((start_ns, end_ns))

    def add_events(self, start_event: Any, end_event: Any) -> None:
        with self._lock:
            self._events.append((start_event, end_event))

    def take(self) -> Tuple[float, int]:
        """``(seconds with a collective in flight, collectives)`` of the step; then empty."""
        with self._lock:
            host, self._host = self._host, []
            events, self._events = self._events, []
        self.fence.prune()
        intervals = [(s / 1e9, e / 1e9) for s, e in host]
        if events:
            reference = events[0][0]
            for start, end in events:
                end.synchronize()
                # elapsed_time is in milliseconds, from the first event of the step.
                intervals.append(
                    (reference.elapsed_time(start) / 1e3, reference.elapsed_time(end) / 1e3)
                )
        return _union_seconds(intervals), len(host) + len(events)

    # -- timing one collective ----------------------------------------------------------------

    def on_cuda(self, tensor: Any) -> bool:
        return self._cuda is not None and getattr(tensor, "is_cuda", False)

    def event(self) -> Any:
        event = self._cuda.Event(enable_timing=True)
        event.record()
        return event

    def issued(self, op: str) -> int:
        """Tells the live state that collective ``op`` was issued; its number (0 without one)."""
        return self.live.collective_issued(op) if self.live is not None else 0

    def done(self, seq: int) -> None:
        """Tells the live state that collective ``seq`` completed (on the host)."""
        if self.live is not None:
            self.live.collective_done(seq)


class ManualCollective:
    """A collective the wrappers do not see, marked by the caller (``TrainingTelemetry.collective``):
    the live state says the rank waits in it while inside, and its host time counts in the step's
    collective wait."""

    __slots__ = ("_clock", "_live", "_op", "_seq", "_start")

    def __init__(self, clock: Optional[CollectiveClock], live: Any, op: str) -> None:
        self._clock = clock
        self._live = live
        self._op = op

    def __enter__(self) -> None:
        self._seq = self._live.collective_issued(self._op)
        self._start = time_ns()

    def __exit__(self, *_exc: object) -> bool:
        if self._clock is not None:
            self._clock.add_host(self._start, time_ns())
        self._live.collective_done(self._seq)
        return False


def _first_tensor(args: tuple, kwargs: dict) -> Any:
    for value in list(args) + list(kwargs.values()):
        if hasattr(value, "is_cuda"):
            return value
        if isinstance(value, (list, tuple)) and value and hasattr(value[0], "is_cuda"):
            return value[0]
    return None


def _timed(function: Callable, holder: "_ClockHolder") -> Callable:
    name = function.__name__
    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        clock = holder.clock
        if clock is None or holder.inside:
            return function(*args, **kwargs)
        holder.inside = True  # a collective built on another (all_gather on all_gather_into_tensor)
        seq = clock.issued(name)
        try:
            if clock.on_cuda(_first_tensor(args, kwargs)):
                start = clock.event()
                work = function(*args, **kwargs)
                clock.add_events(start, clock.event())
                # The host does not wait for it: known complete when its step is read.
                clock.done(seq)
                return work
            start_ns = time_ns()
            work = function(*args, **kwargs)
            if kwargs.get("async_op") and work is not None and hasattr(work, "get_future"):

                def completed(fut: Any) -> None:
                    clock.add_host(start_ns, time_ns())
                    clock.done(seq)

                clock.fence.then(work.get_future(), completed)
            else:
                clock.add_host(start_ns, time_ns())
                clock.done(seq)
            return work
        except BaseException:
            clock.done(seq)
            raise
        finally:
            holder.inside = False

    wrapper.__gpulse_timed__ = True  # type: ignore[attr-defined]
    return wrapper


class _ClockHolder(threading.local):
    clock: Optional[CollectiveClock] = None
    inside: bool = False


_HOLDER = _ClockHolder()
_WRAPPED = False


def install(clock: CollectiveClock, dist: Any = "auto") -> bool:
    """Times torch.distributed's collectives called from this thread into ``clock``.

    The module functions are wrapped once per process; a second TrainingTelemetry replaces the
    clock. Returns False without torch.distributed.
    """
    global _WRAPPED
    if dist == "auto":
        dist = _dist()
    if dist is None:
        return False
    if not _WRAPPED:
        for name in WRAPPED_COLLECTIVES:
            function = getattr(dist, name, None)
            if function is not None and not getattr(function, "__gpulse_timed__", False):
                setattr(dist, name, _timed(function, _HOLDER))
        _WRAPPED = True
    _HOLDER.clock = clock
    return True


def uninstall(clock: CollectiveClock) -> None:
    """Stops timing into ``clock`` (the wrappers stay, and pass calls straight through)."""
    if _HOLDER.clock is clock:
        _HOLDER.clock = None


def ddp_hook(clock: CollectiveClock, inner: Optional[Callable] = None) -> Callable:
    """A DDP communication hook timing each bucket's reduction, then running ``inner``.

    ``inner`` is the hook the model would have had; the state given to ``register_comm_hook`` goes
    to it. Without one, the bucket is averaged over the process group (the state) as DDP's own
    all-reduce does, issued here so that its future carries one Python callback, this module's (see
    ``CallbackFence``). A hook of your own that chains callbacks (``Future.then``) brings its own.
    """
    unwrap = inner is None
    if inner is None:
        inner = _allreduce_mean

    def run_inner(state: Any, bucket: Any) -> Any:
        # The all-reduce inside calls dist.all_reduce, which must not be timed a second time.
        outer = _HOLDER.inside
        _HOLDER.inside = True
        try:
            return inner(state, bucket)
        finally:
            _HOLDER.inside = outer

    def result(fut: Any) -> Any:
        # An all-reduce's future holds the list of its tensors; DDP wants the bucket's tensor.
        return fut.value()[0] if unwrap else fut.value()

    # No annotations: DDP rejects a hook whose bucket annotation is not dist.GradBucket, and
    # this module's annotations are strings (postponed evaluation).
    def timed_hook(state, bucket):  # type: ignore[no-untyped-def]
        buffer = bucket.buffer()
        seq = clock.issued("all_reduce")
        if clock.on_cuda(buffer):
            start = clock.event()

            def done_cuda(fut: Any) -> Any:
                clock.add_events(start, clock.event())
                clock.done(seq)
                return result(fut)

            return clock.fence.then(run_inner(state, bucket), done_cuda)
        start_ns = time_ns()

        def done(fut: Any) -> Any:
            clock.add_host(start_ns, time_ns())
            clock.done(seq)
            return result(fut)

        return clock.fence.then(run_inner(state, bucket), done)

    return timed_hook


def _allreduce_mean(process_group: Any, bucket: Any) -> Any:
    """The bucket summed over ``process_group`` (default: the world) and divided by its size, as
    ``default_hooks.allreduce_hook`` does, returning the all-reduce's own future."""
    import torch.distributed as dist

    group = process_group if process_group is not None else dist.group.WORLD
    tensor = bucket.buffer()
    tensor.div_(group.size())
    return dist.all_reduce(tensor, group=group, async_op=True).get_future()
