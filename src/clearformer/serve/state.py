"""``ServerState``: what one server holds between requests, and its life from loading to drain.

``loading`` (listening, models loading in a thread; ``/health`` 503) -> ``ready`` (every model
loaded and warmed on every batch worker) -> ``draining`` (a signal came: no new work, requests
in flight finish) -> stopped. A model that fails to load leaves it ``failed``: the server stops
and ``clearformer serve`` reports the error.

Admission counts requests in flight on the event loop's thread only, so it needs no lock: a
request past ``max_concurrent_requests`` is refused at once (429), never queued.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from ..free_cpus import FreeCpus
from .batcher import Batcher
from .config import ServeConfig
from .errors import ApiError
from .metrics import ServerMetrics
from .models import ModelSpec, ServedModel
from .schemas import _shown
from .token_models import load_served_model

log = logging.getLogger(__name__)

STATUSES = ("loading", "ready", "draining", "failed")
_KIND_NAMES = {  # each with its article: "a model", "an embedding model"
    "embed": "an embedding",
    "rerank": "a cross-encoder (rerank)",
    "multivector": "a multi-vector (ColBERT)",
    "bge-m3": "a bge-m3",
    "sparse": "a sparse (SPLADE)",
}
_KIND_ROUTES = {
    "embed": "/embed or /v1/embeddings",
    "rerank": "/rerank",
    "multivector": "/embed_multivector",
    "bge-m3": "/embed, /embed_sparse or /embed_multivector",
    "sparse": "/embed_sparse",
}
# What a route needs when no model of its kind is served, and how to serve one
# (token_models.load_served_model tells the kinds apart by the directory's files).
_KIND_MISSING = {
    "embed": (
        "/embed and /v1/embeddings need an embedding model, and none is served here",
        "start the server with --model DIR for an embedding checkpoint (with no --model at "
        "all it serves the bundled all-MiniLM-L6-v2)",
    ),
    "rerank": (
        "/rerank needs a cross-encoder, and none is served here",
        "clearformer bundles none: start the server with --model DIR, DIR a cross-encoder "
        "checkpoint (config.json's architectures name a *ForSequenceClassification model with "
        "one label), such as cross-encoder/ms-marco-MiniLM-L-6-v2 from the Hugging Face Hub "
        "(hf download cross-encoder/ms-marco-MiniLM-L-6-v2 --local-dir DIR)",
    ),
    "multivector": (
        "/embed_multivector needs a multi-vector model, and none is served here",
        "start the server with --model DIR, DIR a sentence-transformers MultiVectorEncoder, "
        "PyLate ColBERT or bge-m3 directory",
    ),
    "sparse": (
        "/embed_sparse needs a sparse model, and none is served here",
        "start the server with --model DIR, DIR a sentence-transformers SparseEncoder or "
        "bge-m3 directory (clearformer splade-cassette --out DIR writes one)",
    ),
}


class ServerState:
    """The models, the batcher, the metrics and the admission count of one server."""

    def __init__(
        self,
        config: ServeConfig,
        specs: Sequence[ModelSpec],
        *,
        report: Callable[[str], None] | None = None,
    ) -> None:
        self.config = config
        self.specs = list(specs) or [ModelSpec()]
        self.metrics = ServerMetrics()
        self.report = report or (lambda message: None)
        self.models: list[ServedModel] = []
        self._by_name: dict[str, ServedModel] = {}
        self.batcher: Batcher | None = None
        self.status = "loading"
        self.load_error: BaseException | None = None
        self.in_flight = 0
        self.cut_off = 0  # requests the drain's time bound stopped unfinished (answered 503)
        self.forced = False  # a second signal stopped the server without waiting
        self.stopped = False  # the server has stopped: no batcher may take work any more
        self._loader: threading.Thread | None = None
        self.settled = threading.Event()  # set once loading has ended, ready or failed
        self.on_failure: Callable[[], None] = lambda: None  # set by the server: stop it

    # Life cycle -------------------------------------------------------------------------

    def start_loading(self) -> threading.Thread:
        """Load and warm the models on a thread of their own; the server listens meanwhile."""
        thread = threading.Thread(target=self._load, name="clearformer-serve-load", daemon=True)
        self._loader = thread
        thread.start()
        return thread

    def _load(self) -> None:
        import torch

        started = time.perf_counter()
        try:
            self._calibrate()
            models = [self._load_one(spec) for spec in self.specs]
            self._index(models)
            workers = self.config.workers or (2 if torch.get_num_threads() >= 2 else 1)
            batcher = Batcher(
                max_batch_tokens=self.config.max_batch_tokens,
                workers=workers,
                metrics=self.metrics,
                free_cpus=None if self.config.fixed_threads else FreeCpus(),
            )
            batcher.start(models)
            batcher.wait_ready()
            if batcher.warm_up_error is not None:
                raise batcher.warm_up_error
        except BaseException as exc:
            # Raised again by run_server (the CLI prints it); an app run otherwise shows it
            # as /health's "failed" and in load_error.
            log.info("loading failed: %s", exc)
            self.load_error = exc
            self.status = "failed"
            self.settled.set()
            self.on_failure()
            return
        self.models, self.batcher = models, batcher
        if self.stopped:  # the server stopped while the models loaded: nothing will come
            batcher.close()
        if self.status == "loading":  # not draining already
            self.status = "ready"
            self.metrics.ready.set(1)
        self.settled.set()
        names = ", ".join(f"{m.name} ({m.kind})" for m in models)
        seconds = time.perf_counter() - started
        log.info("ready in %.1f s: %s, %d batch workers", seconds, names, workers)
        self.report(f"ready in {seconds:.1f} s: {names}; {workers} batch workers")

    def _calibrate(self) -> None:
        """clearformer's own kernels measured on this CPU, once per machine, before any model
        loads (:func:`clearformer.calibration.kernels.measure_before_serving`), so that the
        server takes each where it is faster from its first request on."""
        from ..calibration.kernels import measure_before_serving
        from ..devices import check_device

        if check_device(self.config.device).type != "cpu":
            return  # the models run elsewhere: no CPU kernel serves them
        calibration = measure_before_serving()
        if calibration is not None and calibration.measured:
            taken = ", ".join(f"{k} {v.winner}" for k, v in calibration.verdicts.items())
            self.report(f"measured clearformer's kernels on this CPU: {taken} (cached)")

    def _load_one(self, spec: ModelSpec) -> ServedModel:
        return load_served_model(
            spec,
            max_input_tokens=self.config.max_input_tokens,
            precision=self.config.precision,
            backend=self.config.backend,
            device=self.config.device,
        )

    def _index(self, models: list[ServedModel]) -> None:
        for model in models:
            for name in (model.name, *model.aliases):
                if name in self._by_name:
                    raise ValueError(
                        f"two models are served as {name!r}; name them apart with --model NAME=DIR"
                    )
                self._by_name[name] = model

    def begin_drain(self) -> None:
        """A shutdown signal came: ``/health`` answers 503 and no new work is taken."""
        if self.status in ("loading", "ready"):
            self.status = "draining"
            self.metrics.ready.set(0)

    def finish(self) -> None:
        """After the listener has closed and requests in flight are answered (or cut off by
        the drain's bound): stop the batch workers. With nothing cut off the queue is empty
        and they stop at once; otherwise one may be in a batch, which is not waited for (the
        workers are daemon threads)."""
        self.begin_drain()
        if self.batcher is not None:
            self.batcher.close()
            if not self.cut_off:
                self.batcher.join(timeout=self.config.graceful_timeout)

    def stop_work(self) -> bool:
        """Once the server has stopped (the lifespan's end skipped, on a forced stop): drop the
        inputs still queued, so that each batch worker ends after the batch it is in, and let
        the idle ones end. Returns whether a thread still computes: a worker inside a forward
        pass (a forced stop, or a drain cut off by graceful_timeout, left it running) or the
        models still loading (a stop before they were ready)."""
        self.stopped = True
        self.begin_drain()
        busy = self._loader is not None and self._loader.is_alive()
        batcher = self.batcher
        if batcher is not None:
            batcher.abandon()
            # A worker in a batch is not waited for; idle ones end at once.
            if batcher.busy or not batcher.join(timeout=self.config.graceful_timeout):
                busy = True
        return busy

    # Requests ---------------------------------------------------------------------------

    def require_ready(self) -> Batcher:
        """The batcher, or a 503 saying why there is none to take work."""
        if self.status == "ready" and self.batcher is not None:
            return self.batcher
        why = {
            "loading": "the models are still loading",
            "draining": "the server is shutting down",
            "failed": "the models failed to load",
        }[self.status]
        raise ApiError("Unhealthy", f"not ready: {why}", headers={"Retry-After": "1"})

    def admit(self) -> None:
        """Take a slot for a request, or raise 429 at once when all are taken."""
        if self.in_flight >= self.config.max_concurrent_requests:
            batcher = self.batcher
            wait = batcher.retry_after() if batcher is not None else 1
            raise ApiError(
                "Overloaded",
                f"the server is at its limit of {self.config.max_concurrent_requests} "
                f"concurrent requests (max_concurrent_requests); retry after {wait} s",
                headers={"Retry-After": str(wait)},
            )
        self.in_flight += 1
        self.metrics.in_flight.set(self.in_flight)

    def release(self) -> None:
        self.in_flight -= 1
        self.metrics.in_flight.set(self.in_flight)

    def model_for(self, name: str | None, kind: str) -> ServedModel:
        """The model a request names (None: the first served model of ``kind``); 404 for an
        unknown name, 422 for a model of the other kind or for no model of ``kind`` at all."""
        if name is None:
            for model in self.models:
                if model.serves(kind):
                    return model
            # The route exists: a 404 would read as a wrong URL. The server as started cannot
            # do this, whatever the body says: 422, with how to start one that can.
            missing, remedy = _KIND_MISSING[kind]
            raise ApiError(
                "Validation", f"{missing} (served: {self._listing()}); {remedy}", param="model"
            )
        model = self._by_name.get(name)
        if model is None:
            raise ApiError(
                "NotFound",
                f"model {_shown(name)} is not served here; served: {self._listing()}",
                param="model",
            )
        if not model.serves(kind):
            raise ApiError(
                "Validation",
                f"model {name!r} is {_KIND_NAMES[model.kind]} model, which "
                f"{_KIND_ROUTES[kind]} does not serve: use {_KIND_ROUTES[model.kind]}",
                param="model",
            )
        return model

    def any_model(self, name: str | None) -> ServedModel:
        """The model a request names, of either kind (None: the first served)."""
        if name is None:
            return self.models[0]
        model = self._by_name.get(name)
        if model is None:
            raise ApiError(
                "NotFound",
                f"model {_shown(name)} is not served here; served: {self._listing()}",
                param="model",
            )
        return model

    def _listing(self) -> str:
        return (
            ", ".join(
                f"{m.name!r} ({m.kind}, on {_KIND_ROUTES.get(m.kind, 'its own routes')})"
                for m in self.models
            )
            or "none yet"
        )
