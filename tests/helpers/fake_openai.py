"""The OpenAI-compatible stub server under its test name; it lives in `bench.openai_stub`.

Tests and benchmarks share one stub, so it moved to the `bench` package;
this module keeps the names the tests import.

    with fake_openai_server() as base_url:
        ChatOpenAI(base_url=base_url, api_key="test", model="fake").invoke("hi")
"""

import json
import urllib.request

from bench.openai_stub import MARKER, configure_stub, free_port
from bench.openai_stub import openai_stub_server as fake_openai_server

__all__ = ["MARKER", "configure_stub", "fake_openai_server", "free_port", "received", "reset_stub"]


def reset_stub(base_url: str) -> None:
    """Make the stub forget the request bodies it recorded (`POST /_reset`; its configuration stays)."""
    request = urllib.request.Request(base_url.removesuffix("/v1") + "/_reset", data=b"{}", method="POST")
    urllib.request.urlopen(request, timeout=10).close()


def received(base_url: str) -> list[dict]:
    """The chat completions request bodies the stub received, oldest first (`GET /_requests`)."""
    with urllib.request.urlopen(base_url.removesuffix("/v1") + "/_requests", timeout=30) as response:
        return json.load(response)
