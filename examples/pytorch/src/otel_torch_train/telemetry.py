"""TrainingTelemetry: spans for a training run, its epochs, its steps and their phases.

The span tree, one trace per run::

    training run                      training.model.name, pytorch.dataloader.*,
    │                                 pytorch.autocast.*, pytorch.compile.used
    └── epoch                         training.epoch, .steps, .samples, training.loss.mean,
        │                             training.samples_per_second, pytorch.cuda.memory.peak_*,
        │                             pytorch.dataloader.*, pytorch.autocast.*,
        │                             pytorch.compile.used
        └── step                      training.step (global), training.epoch, training.epoch.step,
            │                         training.batch.size, training.loss,
            │                         training.samples_per_second, training.phase.*.duration
            ├── data_wait             time blocked in the DataLoader iterator's __next__
            ├── forward / backward / optimizer / ...   (tel.phase(name))

A step span runs from the moment the loop asks for its batch to the moment it asks for the next
one, so consecutive steps tile the epoch and ``data_wait`` + phases + the gaps add up to the step.

Spans end even when the loop raises. The loop's generators cannot see the exception that closes
them (Python closes a suspended generator with GeneratorExit before any ``with`` around the loop
sees the error), so a step or epoch closed that way records its end time and waits: the enclosing
``tel.run()`` ends it with ERROR status and the exception when one reaches it, and it ends
normally at the next thing the telemetry does otherwise (a ``break`` out of the loop). An
exception raised inside ``tel.phase(...)`` is known at once and ends the step and epoch as errors
right away.

The ``pytorch.*`` facts (framework_facts.py) say how the loop is set up: the settings of the
loader given to ``tel.steps(...)``, whether autocast was active in a phase or ``record_step``
(sampled there: autocast is only visible inside its ``with`` block), and whether
``torch.compile`` compiled anything. gpulse's diagnosis quotes them in its advice.

CUDA is asynchronous: a phase span measures the time the host spent issuing work unless
``synchronize_phases=True``, which waits for the device at the end of each phase (exact phase
times, at the cost of the CPU/GPU overlap; for diagnosis, not for production runs).

Not thread-safe: one TrainingTelemetry per training loop, used from the thread that runs it.
"""

from __future__ import annotations

import logging
from time import time_ns
from typing import Any, Iterable, Iterator, List, Optional, Tuple, TypeVar

from opentelemetry import _logs as otel_logs
from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.trace import Span, set_span_in_context

from . import cuda_memory, distributed
from .cuda_memory import CudaMemory
from .framework_facts import PrecisionWatch, loader_attributes
from .live import LiveReporter, LiveState, live_settings
from .phases import _fail, _NoPhase, _Phase, _PhaseTimer
from .memory_summary import DEFAULT_MAX_CHARS, PeakGrowthWatch
from .providers import Providers, build_logger_provider, build_providers
from .resource import DEFAULT_SERVICE_NAME, build_resource

_log = logging.getLogger(__name__)

INSTRUMENTATION_NAME = "otel_torch_train"
INSTRUMENTATION_VERSION = "0.1.0"

RUN_SPAN = "training run"
EPOCH_SPAN = "epoch"
STEP_SPAN = "step"
DATA_WAIT_SPAN = "data_wait"

MODEL_NAME = "training.model.name"
EPOCH = "training.epoch"
STEP = "training.step"
EPOCH_STEP = "training.epoch.step"
BATCH_SIZE = "training.batch.size"
LOSS = "training.loss"
SAMPLES_PER_SECOND = "training.samples_per_second"
EPOCH_STEPS = "training.epoch.steps"
EPOCH_SAMPLES = "training.epoch.samples"
LOSS_MEAN = "training.loss.mean"

T = TypeVar("T")


def infer_batch_size(batch: Any) -> Optional[int]:
    """Leading dimension of the first tensor-like in a batch (tensor, tuple/list, dict)."""
    candidate = batch
    if isinstance(candidate, dict):
        candidate = next(iter(candidate.values()), None)
    elif isinstance(candidate, (tuple, list)):
        candidate = candidate[0] if candidate else None
    shape = getattr(candidate, "shape", None)
    if shape is None or len(shape) == 0:
        return None
    try:
        return int(shape[0])
    except (TypeError, ValueError):
        return None


def _is_proxy(provider: object) -> bool:
    # The API hands out proxies until someone installs a real provider.
    return type(provider).__name__ in (
        "ProxyTracerProvider",
        "_ProxyMeterProvider",
        "ProxyLoggerProvider",
    )


class _Step:
    __slots__ = ("span", "start", "batch_size", "loss", "phases")

    def __init__(self, span: Optional[Span], start: int) -> None:
        self.span = span
        self.start = start
        self.batch_size: Optional[int] = None
        self.loss: Optional[float] = None
        self.phases: dict = {}


class _Epoch:
    __slots__ = (
        "span",
        "number",
        "start",
        "steps",
        "samples",
        "loss_sum",
        "loss_count",
        "precision",
        "loader_described",
    )

    def __init__(self, span: Span, number: int, start: int) -> None:
        self.span = span
        self.number = number
        self.start = start
        self.steps = 0
        self.samples = 0
        self.loss_sum = 0.0
        self.loss_count = 0
        self.precision = PrecisionWatch()
        self.loader_described = False


class _Run:
    __slots__ = ("_telemetry", "_attributes", "_span", "_token")

    def __init__(self, telemetry: "TrainingTelemetry", attributes: dict) -> None:
        self._telemetry = telemetry
        self._attributes = attributes

    def __enter__(self) -> Span:
        attributes = dict(self._attributes)
        attributes.update(distributed.attributes())
        self._span = self._telemetry._tracer.start_span(RUN_SPAN, attributes=attributes)
        self._telemetry._run_span = self._span
        self._token = otel_context.attach(set_span_in_context(self._span))
        return self._span

    def __exit__(self, exc_type: Any, error: Optional[BaseException], _tb: Any) -> bool:
        telemetry = self._telemetry
        telemetry._settle(error)
        otel_context.detach(self._token)
        self._span.set_attributes(telemetry._run_precision.attributes())
        telemetry._run_span = None
        if error is not None:
            _fail(self._span, error)
        else:
            self._span.end()
        telemetry.flush()
        return False


class TrainingTelemetry:
    """Traces (and CUDA memory gauges) for one training loop; see the module docs for the tree.

    Providers: the ones given; else the global ones when the application (or
    ``opentelemetry-instrument``) installed real providers; else built here from the ``OTEL_*``
    environment with this package's Resource and installed as the global providers, so spans the
    application creates itself land in the same trace.

    :param model_name: ``training.model.name`` on the run span.
    :param service_name: ``service.name`` when ``OTEL_SERVICE_NAME`` does not set one.
    :param cuda: CUDA memory backend; ``torch.cuda`` (or nothing, without torch) by default.
    :param memory_gauges: register the ``pytorch.cuda.memory.*`` observable gauges.
    :param step_spans_every: trace one step in N (1 = all). Epoch figures still count every step.
    :param phase_spans: phases as child spans (default); False records them as
        ``training.phase.<name>.duration`` attributes of the step span instead, which costs a
        fraction of a span each (see bench_overhead.py).
    :param synchronize_phases: wait for the GPU at the end of each phase (exact, slower).
    :param memory_summary_after: send ``torch.cuda.memory_summary()`` as one log record when a
        device's per-epoch peak of allocated memory has risen this many epochs in a row
        (memory_summary.py); ``None`` (default) never sends it.
    :param memory_summary_max_chars: the longest summary sent; longer ones are cut, and say so.
    :param logger_provider: where that log record goes; by default the global one when the
        application installed a real one, else one built from ``OTEL_LOGS_EXPORTER``.
    :param live: report where the loop is while a step, phase or collective lasts far longer than
        a step should (live.py; what gpulse's ``distributed_hang`` names the stuck rank from), as
        log records from a thread of its own. Default: on in a torch.distributed job.
        ``OTEL_TORCH_TRAIN_LIVE_INTERVAL``, ``_REPORT_AFTER`` and ``_STACK_AFTER`` (seconds) tune it.
    :param collectives: time torch.distributed's collectives called in a step (distributed.py):
        ``pytorch.distributed.collective.wait`` on the step span and as a histogram. DDP's own
        all-reduces need ``watch_ddp(model)``. Only in a distributed job (torch.distributed
        initialised); nothing is wrapped without torch.distributed.
    """

    def __init__(
        self,
        model_name: Optional[str] = None,
        *,
        service_name: Optional[str] = None,
        tracer_provider: Optional[trace.TracerProvider] = None,
        meter_provider: Optional[metrics.MeterProvider] = None,
        cuda: Optional[CudaMemory] = None,
        memory_gauges: bool = True,
        step_spans_every: int = 1,
        phase_spans: bool = True,
        synchronize_phases: bool = False,
        memory_summary_after: Optional[int] = None,
        memory_summary_max_chars: int = DEFAULT_MAX_CHARS,
        logger_provider: Optional[otel_logs.LoggerProvider] = None,
        collectives: bool = True,
        live: Optional[bool] = None,
    ) -> None:
        if step_spans_every < 1:
            raise ValueError(f"step_spans_every must be 1 or more, got {step_spans_every}")
        self.model_name = model_name
        self._owned: Optional[Providers] = None
        if tracer_provider is None and _is_proxy(trace.get_tracer_provider()):
            tracer_provider = self._own(service_name).tracer_provider
            trace.set_tracer_provider(tracer_provider)
        if meter_provider is None and _is_proxy(metrics.get_meter_provider()):
            meter_provider = self._own(service_name).meter_provider
            metrics.set_meter_provider(meter_provider)
        self.tracer_provider = tracer_provider or trace.get_tracer_provider()
        self.meter_provider = meter_provider or metrics.get_meter_provider()
        self._tracer = self.tracer_provider.get_tracer(
            INSTRUMENTATION_NAME, INSTRUMENTATION_VERSION
        )
        self._cuda: CudaMemory = cuda if cuda is not None else cuda_memory.default_backend()
        self._gauges = None
        if memory_gauges:
            meter = self.meter_provider.get_meter(INSTRUMENTATION_NAME, INSTRUMENTATION_VERSION)
            self._gauges = cuda_memory.MemoryGauges(meter, self._cuda)
        self._memory_summary: Optional[PeakGrowthWatch] = None
        self._owned_logs = None
        self.logger_provider: Optional[otel_logs.LoggerProvider] = logger_provider
        self._service_name = service_name
        if memory_summary_after is not None:
            self._memory_summary = PeakGrowthWatch(
                self._cuda,
                self._logger(),
                memory_summary_after,
                memory_summary_max_chars,
            )
        self._every = step_spans_every
        self._phase_spans = phase_spans
        self._synchronize = synchronize_phases
        self._epoch: Optional[_Epoch] = None
        self._step: Optional[_Step] = None
        self._pending: List[Tuple[Span, int]] = []
        self._last_error: Optional[BaseException] = None
        self._global_step = 0
        self._epoch_counter = 0
        self._run_span: Optional[Span] = None
        self._run_precision = PrecisionWatch()
        self._run_loader_described = False
        self._warned_no_step = False
        self._shut_down = False
        self._collectives: Optional[distributed.CollectiveClock] = None
        self._collective_wait = None
        self._live = LiveState()
        self._live_reporter: Optional[LiveReporter] = None
        if live is None:
            live = collectives and distributed.install_available()
        if live:
            self._live_reporter = LiveReporter(self._live, self._logger, **live_settings())
        if collectives and distributed.install_available():
            torch_cuda = cuda_memory.torch_cuda_module()
            self._collectives = distributed.CollectiveClock(cuda=torch_cuda, live=self._live)
            distributed.install(self._collectives)
            meter = self.meter_provider.get_meter(INSTRUMENTATION_NAME, INSTRUMENTATION_VERSION)
            self._collective_wait = meter.create_histogram(
                distributed.COLLECTIVE_WAIT,
                unit="s",
                description="Time of a training step with a torch.distributed collective in "
                "flight (waiting for the other ranks, or transferring)",
            )

    def _logger(self) -> Any:
        """This package's logger: on the provider given, else the global one when the application
        installed a real one, else one built here from ``OTEL_LOGS_EXPORTER``."""
        if self.logger_provider is None:
            if _is_proxy(otel_logs.get_logger_provider()):
                resource = (
                    self._owned.tracer_provider.resource
                    if self._owned is not None
                    else build_resource(self._service_name or DEFAULT_SERVICE_NAME)
                )
                self._owned_logs = build_logger_provider(resource)
                otel_logs.set_logger_provider(self._owned_logs)
            self.logger_provider = self._owned_logs or otel_logs.get_logger_provider()
        return self.logger_provider.get_logger(INSTRUMENTATION_NAME, INSTRUMENTATION_VERSION)

    def _own(self, service_name: Optional[str]) -> Providers:
        if self._owned is None:
            resource = build_resource(service_name or DEFAULT_SERVICE_NAME)
            self._owned = build_providers(resource)
        return self._owned

    # -- the public surface -------------------------------------------------------------------

    def run(self, **attributes: Any) -> _Run:
        """Context manager for the ``training run`` span; extra keywords become attributes."""
        merged = {MODEL_NAME: self.model_name} if self.model_name else {}
        for key, value in attributes.items():
            merged[key if "." in key else f"training.{key}"] = value
        return _Run(self, merged)

    def epochs(self, epochs: Iterable[T]) -> Iterator[T]:
        """Yield each item of ``epochs`` inside an ``epoch`` span (an int item is its number)."""
        for item in epochs:
            self._settle(None)
            number = item if isinstance(item, int) and not isinstance(item, bool) else None
            if number is None:
                number = self._epoch_counter
            self._epoch_counter = number + 1
            cuda_memory.reset_peaks(self._cuda)
            start = time_ns()
            span = self._tracer.start_span(EPOCH_SPAN, start_time=start, attributes={EPOCH: number})
            state = _Epoch(span, number, start)
            self._epoch = state
            token = otel_context.attach(set_span_in_context(span))
            try:
                yield item
            except GeneratorExit:
                end = time_ns()
                otel_context.detach(token)
                self._finish_epoch(state, end)
                self._defer(span, end)
                raise
            except BaseException as error:  # thrown in with generator.throw()
                otel_context.detach(token)
                self._finish_epoch(state, time_ns())
                self._settle(error)
                _fail(span, error)
                raise
            end = time_ns()
            otel_context.detach(token)
            self._settle(None)
            self._finish_epoch(state, end)
            span.end(end_time=end)

    def steps(self, loader: Iterable[T]) -> Iterator[T]:
        """Yield each batch of ``loader`` inside a ``step`` span, timing ``data_wait``."""
        tracer = self._tracer
        self._describe_loader(loader)
        iterator = iter(loader)
        in_epoch = 0
        while True:
            if self._pending:
                self._settle(None)
            self._last_error = None
            if self._collectives is not None:
                self._collectives.reset()
            start = time_ns()
            traced = self._global_step % self._every == 0
            self._live.begin_step(self._global_step)
            try:
                batch = next(iterator)
            except StopIteration:
                self._live.end_step()
                return
            except BaseException as error:
                failed = tracer.start_span(
                    STEP_SPAN, start_time=start, attributes=self._step_attributes(in_epoch)
                )
                wait = tracer.start_span(
                    DATA_WAIT_SPAN, context=set_span_in_context(failed), start_time=start
                )
                now = time_ns()
                _fail(wait, error, now)
                _fail(failed, error, now)
                raise
            token = None
            self._live.got_batch()
            if traced:
                got = time_ns()
                span = tracer.start_span(
                    STEP_SPAN, start_time=start, attributes=self._step_attributes(in_epoch)
                )
                step_context = set_span_in_context(span)
                tracer.start_span(DATA_WAIT_SPAN, context=step_context, start_time=start).end(
                    end_time=got
                )
                token = otel_context.attach(step_context)
                state = _Step(span, start)
            else:
                state = _Step(None, start)
            self._step = state
            try:
                yield batch
            except GeneratorExit:
                end = time_ns()
                if token is not None:
                    otel_context.detach(token)
                self._finish_step(state, batch, end)
                if state.span is not None:
                    self._defer(state.span, end)
                raise
            except BaseException as error:  # thrown in with generator.throw()
                if token is not None:
                    otel_context.detach(token)
                self._finish_step(state, batch, time_ns())
                if state.span is not None:
                    _fail(state.span, error)
                raise
            end = time_ns()
            if token is not None:
                otel_context.detach(token)
            self._finish_step(state, batch, end)
            if state.span is not None:
                state.span.end(end_time=end)
            in_epoch += 1

    def phase(self, name: str):
        """Context manager for a child span of the current step (``forward``, ``backward``...)."""
        step = self._step
        if step is not None:
            if step.span is None:
                return _NoPhase(self._live, name)
            if not self._phase_spans:
                return _PhaseTimer(self, step, name)
        return _Phase(self, name)

    def watch_ddp(self, model: Any, hook: Any = None, state: Any = None) -> Any:
        """Times the gradient all-reduces of a ``DistributedDataParallel`` model.

        Registers a communication hook (DDP allows one per model) that runs ``hook`` with
        ``state`` (default: DDP's own all-reduce over the model's process group) and records how
        long each bucket's reduction takes. Call it once, before the first step. Returns the model.
        """
        if self._collectives is None:
            raise RuntimeError(
                "watch_ddp() needs torch.distributed and TrainingTelemetry(collectives=True)"
            )
        if hook is None and state is None:
            state = getattr(model, "process_group", None)
        model.register_comm_hook(state, distributed.ddp_hook(self._collectives, hook))
        return model

    def collective(self, op: str) -> distributed.ManualCollective:
        """Context manager around a collective that torch.distributed's wrappers and ``watch_ddp``
        do not see (a communication library of your own, a blocking wait on other ranks): while
        inside, the live state says this rank waits in ``op``, and the time counts in the step's
        ``pytorch.distributed.collective.wait``."""
        return distributed.ManualCollective(self._collectives, self._live, op)

    def record_step(
        self, loss: Optional[float] = None, batch_size: Optional[int] = None, **attributes: Any
    ) -> None:
        """Attach the step's figures to its span; keys without a dot get a ``training.`` prefix.

        Pass ``loss`` as a Python float (``loss.item()``): a CUDA tensor is converted here with
        ``float()``, which waits for the GPU.
        """
        self._sample_precision()
        step = self._step
        if step is None:
            if not self._warned_no_step:
                self._warned_no_step = True
                _log.warning(
                    "TrainingTelemetry.record_step() was called outside a step: iterate the "
                    "loader with `for batch in tel.steps(loader)` so the figures have a span"
                )
            return
        if loss is not None:
            step.loss = float(loss)
        if batch_size is not None:
            step.batch_size = int(batch_size)
        span = step.span
        if span is None:
            return
        if step.loss is not None:
            span.set_attribute(LOSS, step.loss)
        for key, value in attributes.items():
            span.set_attribute(key if "." in key else f"training.{key}", value)

    def flush(self, timeout_millis: int = 10_000) -> None:
        """Export what is buffered now (called at the end of ``run()``)."""
        for provider in (self.tracer_provider, self.meter_provider, self.logger_provider):
            force_flush = getattr(provider, "force_flush", None)
            if force_flush is not None:
                try:
                    force_flush(timeout_millis)
                except Exception as error:  # noqa: BLE001 - flushing is best effort
                    _log.warning("flushing telemetry failed: %s", error)

    def shutdown(self) -> None:
        """End what is still waiting and shut down the providers this object created."""
        self._settle(None)
        if not self._shut_down:
            self._shut_down = True
            if self._live_reporter is not None:
                self._live_reporter.stop()
            if self._collectives is not None:
                distributed.uninstall(self._collectives)
            if self._owned is not None:
                self._owned.shutdown()
            if self._owned_logs is not None:
                self._owned_logs.shutdown()

    # -- internals ----------------------------------------------------------------------------

    def _step_attributes(self, in_epoch: int) -> dict:
        attributes = {STEP: self._global_step, EPOCH_STEP: in_epoch}
        if self._epoch is not None:
            attributes[EPOCH] = self._epoch.number
        return attributes

    def _finish_step(self, state: _Step, batch: Any, end: int) -> None:
        size = state.batch_size if state.batch_size is not None else infer_batch_size(batch)
        span = state.span
        if span is not None and state.phases:
            span.set_attributes(state.phases)
        if self._collectives is not None and distributed.initialized():
            wait, count = self._collectives.take()
            self._collective_wait.record(wait)
            if span is not None:
                span.set_attribute(distributed.COLLECTIVE_WAIT, wait)
                span.set_attribute(distributed.COLLECTIVE_COUNT, count)
        if span is not None and size:
            span.set_attribute(BATCH_SIZE, size)
            elapsed = (end - state.start) / 1e9
            if elapsed > 0:
                span.set_attribute(SAMPLES_PER_SECOND, size / elapsed)
        epoch = self._epoch
        if epoch is not None:
            epoch.steps += 1
            epoch.samples += size or 0
            if state.loss is not None:
                epoch.loss_sum += state.loss
                epoch.loss_count += 1
        self._step = None
        self._live.end_step()
        self._global_step += 1

    def _finish_epoch(self, state: _Epoch, end: int) -> None:
        span = state.span
        span.set_attribute(EPOCH_STEPS, state.steps)
        span.set_attribute(EPOCH_SAMPLES, state.samples)
        if state.loss_count:
            span.set_attribute(LOSS_MEAN, state.loss_sum / state.loss_count)
        elapsed = (end - state.start) / 1e9
        if state.samples and elapsed > 0:
            span.set_attribute(SAMPLES_PER_SECOND, state.samples / elapsed)
        for key, value in cuda_memory.peak_attributes(self._cuda).items():
            span.set_attribute(key, value)
        span.set_attributes(state.precision.attributes())
        self._run_precision.merge(state.precision)
        if self._memory_summary is not None:
            self._memory_summary.epoch_ended(state.number, set_span_in_context(span))
        if self._epoch is state:
            self._epoch = None

    def _describe_loader(self, loader: Any) -> None:
        """The loader's settings on the epoch span and, the first time, on the run span."""
        epoch = self._epoch
        run_pending = self._run_span is not None and not self._run_loader_described
        if (epoch is None or epoch.loader_described) and not run_pending:
            return
        attributes = loader_attributes(loader)
        if not attributes:
            return
        if epoch is not None and not epoch.loader_described:
            epoch.loader_described = True
            epoch.span.set_attributes(attributes)
        if run_pending:
            self._run_loader_described = True
            self._run_span.set_attributes(attributes)

    def _sample_precision(self) -> None:
        epoch = self._epoch
        watch = epoch.precision if epoch is not None else self._run_precision
        # Once autocast was seen in this epoch there is nothing more to learn from asking again.
        if not watch.seen:
            watch.sample()

    def _defer(self, span: Span, end: int) -> None:
        if self._last_error is not None:
            # The phase that raised is the exception now closing the loop.
            _fail(span, self._last_error, end)
            return
        self._pending.append((span, end))

    def _settle(self, error: Optional[BaseException]) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        for span, end in pending:
            if error is not None:
                _fail(span, error, end)
            else:
                span.end(end_time=end)

    def _synchronize_devices(self) -> None:
        try:
            self._cuda.synchronize()
        except Exception as error:  # noqa: BLE001 - timing accuracy must not stop training
            _log.debug("torch.cuda.synchronize() failed: %s", error)
