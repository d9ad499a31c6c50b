"""The one URL rule (core.checks.url_fault / http_url) that every endpoint argument uses: an
OpenAI-compatible base_url (eval --base-url, ChatPolicy, LLMUser, JudgeRubric), OpenEnv's
base_url, an MCP server's url and Wikipedia's api_url."""

import pytest

from benchmax_gym.core.checks import ENDPOINT_SHAPE, endpoint_url, http_url, url_fault


@pytest.mark.parametrize("url", [
    "http://localhost:8000/v1", "https://api.openai.com/v1", "http://127.0.0.1:1/v1", "http://127.0.0.1:65535",
    "http://[::1]:8000/v1", "HTTPS://Example.COM/v1", "http://user:pw@host:80/v1",
])
def test_a_url_a_client_can_connect_to_passes_as_given(url):
    assert url_fault(url) is None
    assert endpoint_url("base_url", url) == url


@pytest.mark.parametrize("url, says", [
    ("http://127.0.0.1:abc/v1", "not a valid URL (its port is not a number)"),
    ("http://127.0.0.1:99999/v1", "not a valid URL (Port out of range 0-65535)"),
    ("http://127.0.0.1:0/v1", "not a valid URL (port 0: a port is 1-65535)"),
    ("http://127.0.0.1:-1/v1", "not a valid URL (its port is not a number)"),
    ("http://[::1/v1", "not a valid URL (Invalid IPv6 URL)"),
    ("http://1.2.3.999/v1", "not a valid URL (Octet 999"),
    ("ftp://127.0.0.1/v1", f"expected {ENDPOINT_SHAPE}"),
    ("not a url", f"expected {ENDPOINT_SHAPE}"),
    ("http:///v1", f"expected {ENDPOINT_SHAPE}"),
    ("http://a b/v1", f"expected {ENDPOINT_SHAPE}"),
    ("", f"expected {ENDPOINT_SHAPE}"),
    (5, f"expected {ENDPOINT_SHAPE}"),
    (None, f"expected {ENDPOINT_SHAPE}"),
])
def test_a_url_no_client_can_connect_to_is_refused_naming_the_argument(url, says):
    """A bad port or host passed a check of the scheme alone, and failed at the first request
    (httpx's InvalidURL, ``connect(): port must be 0-65535``) naming no argument."""
    assert url_fault(url, shape=ENDPOINT_SHAPE).startswith(says)
    with pytest.raises(ValueError) as refused:
        endpoint_url("base_url", url)
    assert str(refused.value) == f"base_url {url!r}: {url_fault(url, shape=ENDPOINT_SHAPE)}"


def test_a_port_that_is_no_number_is_not_quoted():
    """``http://user:secret/`` (a credential URL missing its ``@host``) reads ``secret`` as the
    port: Python's message quotes it, the rule's never does (an MCP server's URL is shown with its
    credentials hidden by its caller)."""
    assert "s3cret" not in url_fault("http://user:pw-s3cret-1/mcp")


def test_other_schemes_and_the_default_shape():
    assert url_fault("ws://127.0.0.1:8000", ("http", "https", "ws", "wss")) is None
    assert url_fault("ws://127.0.0.1:8000") == "expected http(s)://HOST[:PORT]"
    assert url_fault("ftp://h", ("ws", "wss")) == "expected ws/wss://HOST[:PORT]"
    with pytest.raises(ValueError, match=r"^api_url 'gopher://h': expected http\(s\)://HOST\[:PORT\]$"):
        http_url()("api_url", "gopher://h")
