"""``clearformer serve``'s settings as the command and ``ServeConfig`` take them: where the API
key comes from, and the values refused in one line before anything starts (an empty key, a
key a client cannot send, a timeout that is not a finite number of seconds)."""

from __future__ import annotations

import pytest

pytest.importorskip("uvicorn")
pytest.importorskip("starlette")
pytest.importorskip("prometheus_client")

from clearformer.cli import main  # noqa: E402
from clearformer.commands.serve import API_KEY_VARIABLE  # noqa: E402
from clearformer.serve import ServeConfig  # noqa: E402


@pytest.fixture
def started(monkeypatch):
    """The configs the command would have served with; no server starts."""
    import clearformer.serve.server as server

    configs: list[ServeConfig] = []

    def run_server(config, specs, **kwargs) -> int:
        configs.append(config)
        return 0

    monkeypatch.setattr(server, "run_server", run_server)
    return configs


def _serve(tmp_path, *flags: str) -> int:
    return main(["serve", "--model", str(tmp_path), "--port", "0", *flags])


def test_the_key_comes_from_the_flag_else_from_the_environment(tmp_path, monkeypatch, started):
    monkeypatch.setenv(API_KEY_VARIABLE, "from-env")
    assert _serve(tmp_path) == 0
    assert _serve(tmp_path, "--api-key", "from-flag") == 0
    monkeypatch.delenv(API_KEY_VARIABLE)
    assert _serve(tmp_path) == 0
    assert [config.api_key for config in started] == ["from-env", "from-flag", None]


def test_an_empty_key_is_refused_not_taken_for_no_key(tmp_path, monkeypatch, capsys, started):
    monkeypatch.setenv(API_KEY_VARIABLE, "from-env")
    assert _serve(tmp_path, "--api-key", "") == 2
    assert capsys.readouterr().err == (
        "clearformer serve: error: --api-key: expected a key, got an empty value (leave the "
        "flag out to serve without a key)\n"
    )
    monkeypatch.setenv(API_KEY_VARIABLE, "")
    assert _serve(tmp_path) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"clearformer serve: error: {API_KEY_VARIABLE} is set but empty")
    assert started == []  # no server started without its key


@pytest.mark.parametrize("flag", ["--request-timeout", "--graceful-timeout"])
@pytest.mark.parametrize("value", ["inf", "nan", "-inf"])
def test_a_timeout_that_is_not_a_finite_number_is_refused(tmp_path, capsys, started, flag, value):
    with pytest.raises(SystemExit) as stopped:
        _serve(tmp_path, f"{flag}={value}")  # "-inf" alone would read as a flag
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {flag}: expected a positive finite number, got {value}" in err
    assert started == []


@pytest.mark.parametrize("field", ["request_timeout", "graceful_timeout"])
def test_the_config_refuses_an_infinite_timeout(field):
    with pytest.raises(ValueError, match=f"{field} must be a finite number of seconds, got inf"):
        ServeConfig(**{field: float("inf")})
    with pytest.raises(ValueError, match=f"{field} must be a float > 0, got nan"):
        ServeConfig(**{field: float("nan")})


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("clé-secrète", "must be printable ASCII"),
        ("s3cret\n", "must be printable ASCII"),
        (" s3cret", "must not start or end with a space"),
    ],
)
def test_a_key_no_client_could_send_is_refused(tmp_path, monkeypatch, capsys, started, key, says):
    with pytest.raises(ValueError, match=f"api_key {says}") as refused:
        ServeConfig(api_key=key)
    assert key not in str(refused.value)
    assert _serve(tmp_path, "--api-key", key) == 2
    assert capsys.readouterr().err.startswith(f"clearformer serve: error: --api-key {says}")
    monkeypatch.setenv(API_KEY_VARIABLE, key)
    assert _serve(tmp_path) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"clearformer serve: error: {API_KEY_VARIABLE} {says}")
    assert key not in err
    assert started == []
