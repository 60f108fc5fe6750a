"""Paths and methods no route has: a path with a trailing slash is a 404 like any other
unknown path (not a redirect to the route), a route asked with another method is a 405 whose
``Allow`` header names the methods it takes, and both are counted in ``/metrics``. The app is
not started: these answers need no model."""

from __future__ import annotations

import pytest

pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")
pytest.importorskip("httpx")

from starlette.testclient import TestClient  # noqa: E402

from clearformer.serve import ServeConfig, create_app  # noqa: E402

KEY = "route-key"


def _counted(app, status: int) -> float:
    text = app.state.serve.metrics.render().decode()
    line = f'clearformer_requests_total{{endpoint="unknown",status="{status}"}} '
    found = [row for row in text.splitlines() if row.startswith(line)]
    return float(found[0].removeprefix(line)) if found else 0.0


@pytest.mark.parametrize("path", ["/embed/", "/v1/embeddings/", "/rerank/", "/tokenize/"])
def test_a_trailing_slash_is_a_counted_404_not_a_redirect(path):
    app = create_app(ServeConfig(api_key=KEY))
    client = TestClient(app)  # not entered: the models never load
    answer = client.post(path, json={"inputs": "a"}, follow_redirects=False)
    assert answer.status_code == 404, answer.headers
    assert "location" not in answer.headers
    message = answer.json()["error"]
    assert (message["message"] if isinstance(message, dict) else message) == f"no route {path}"
    assert _counted(app, 404) == 1


@pytest.mark.parametrize(
    ("method", "path", "allowed"),
    [("GET", "/embed", "POST"), ("PUT", "/rerank", "POST"), ("POST", "/health", "GET, HEAD")],
)
def test_a_wrong_method_is_405_naming_the_allowed_ones(method, path, allowed):
    app = create_app(ServeConfig())
    answer = TestClient(app).request(method, path)
    assert answer.status_code == 405
    assert answer.headers["allow"] == allowed
    assert answer.json() == {
        "error": f"{method} is not allowed on {path}: it takes {allowed}",
        "error_type": "NotFound",
    }
    assert _counted(app, 405) == 1


def test_a_wrong_method_on_an_openai_route_says_so_in_openais_shape():
    answer = TestClient(create_app(ServeConfig())).delete("/v1/models")
    assert answer.status_code == 405 and answer.headers["allow"] == "GET, HEAD"
    assert (
        answer.json()["error"]["message"]
        == "DELETE is not allowed on /v1/models: it takes GET, HEAD"
    )


def test_the_listening_socket_is_not_handed_to_child_processes():
    # A child (the compiler of a kernel build) that inherited it would keep the port after
    # the server is gone: a restart would find it taken.
    import subprocess
    import sys

    from clearformer.serve.server import _bind

    sock = _bind("127.0.0.1", 0)
    try:
        child = subprocess.run(
            [sys.executable, "-c", f"import os; os.fstat({sock.fileno()})"],
            close_fds=False,
            capture_output=True,
        )
        assert child.returncode != 0 and b"Bad file descriptor" in child.stderr
    finally:
        sock.close()
