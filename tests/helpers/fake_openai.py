"""The OpenAI-compatible stub server under its test name; it lives in `bench.openai_stub`.

Tests and benchmarks share one stub, so it moved to the `bench` package;
this module keeps the names the tests import.

    with fake_openai_server() as base_url:
        ChatOpenAI(base_url=base_url, api_key="test", model="fake").invoke("hi")
"""

from bench.openai_stub import MARKER, configure_stub, free_port
from bench.openai_stub import openai_stub_server as fake_openai_server

__all__ = ["MARKER", "configure_stub", "fake_openai_server", "free_port"]
