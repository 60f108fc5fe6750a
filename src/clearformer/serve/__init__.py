"""``clearformer serve``: an HTTP server for embedding and reranker models (``pip install
'clearformer[serve]'``), compatible with OpenAI's ``/v1/embeddings`` and with Hugging Face
text-embeddings-inference's ``/embed``, ``/rerank``, ``/tokenize``, ``/health`` and ``/info``.

* :mod:`.config` -- :class:`ServeConfig`: every limit and setting, validated once;
* :mod:`.models` -- the models served (``TextEncoder`` or ``CrossEncoder``), their tokenizers
  and input limit;
* :mod:`.batcher` -- the dynamic batcher: requests' inputs merged into forward passes under a
  token budget, on batch workers like ``encode``'s;
* :mod:`.state` -- a server's life (loading, ready, draining) and its admission count;
* :mod:`.schemas` and :mod:`.errors` -- request bodies and error answers, in the shapes of the
  APIs copied; :mod:`.render` -- answers as bytes (embeddings as exact JSON numbers);
* :mod:`.guards` -- the checks before any work: the API key, the body's size, the input count;
* :mod:`.waiting` -- a request waiting for its rows, its client's disconnection or its timeout;
* :mod:`.metrics` -- the Prometheus metrics;
* :mod:`.handlers` -- each route's handler; :mod:`.app` -- the Starlette app: the route table and
  the wrapper every route goes through;
* :mod:`.server` -- :func:`run_server`: the app on uvicorn, drained on SIGTERM and SIGINT.

How to run and deploy it: docs/serving.md.
"""

from __future__ import annotations

from ..lazy_exports import lazy_exports as _lazy_exports
from .config import ServeConfig
from .models import ModelSpec

# The app and the server import Starlette and uvicorn (the serve extra): on first use.
_EXPORTS = {"create_app": ".app", "run_server": ".server"}
__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, globals())

__all__ = ["ModelSpec", "ServeConfig", "create_app", "run_server"]
