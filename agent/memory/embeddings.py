"""Embeddings for semantic memory search: an OpenAI-compatible model, called outside any transaction.

LangGraph's stores call `embed_documents` inside their `batch`, that is while
they hold a connection (and on SQLite the one connection's lock). A network
call there would hold the database across a model call. So the agent wraps the
model in `PrecomputedEmbeddings`: the memory tools and the retrieval before a
turn embed their texts first (`prime`), with no connection held, and the
store's own call inside the commit then finds every vector in the cache.

`OpenAIEmbeddings` is built with `check_embedding_ctx_length=False`: the
default counts tokens with tiktoken, which downloads its encodings on first
use and fails on machines without internet access.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence

from langchain_core.embeddings import Embeddings

from agent.errors import ConfigurationError, ModelError

#: Texts whose vectors are kept (each a few KB); enough for the saves and searches of many concurrent turns.
CACHE_SIZE = 4096


def make_embeddings(model: str) -> PrecomputedEmbeddings:
    """The embeddings model `model` (OpenAI-compatible, from `OPENAI_BASE_URL` / `OPENAI_API_KEY`), cached.

    Raises:
        ConfigurationError: `langchain-openai` refuses the configuration (for example no API key).
    """
    from langchain_openai import OpenAIEmbeddings

    extra = {}
    if os.environ.get("OPENAI_BASE_URL") and not os.environ.get("OPENAI_API_KEY"):
        extra["api_key"] = "unused"  # local OpenAI-compatible servers ignore it; the client requires one
    try:
        model_ = OpenAIEmbeddings(model=model, check_embedding_ctx_length=False, **extra)
    except Exception as exc:  # openai.OpenAIError without a key; pydantic errors for bad values
        raise ConfigurationError(f"Cannot configure embeddings model {model!r}: {exc}", model=model) from None
    return PrecomputedEmbeddings(model_)


class PrecomputedEmbeddings(Embeddings):
    """`model` behind a bounded cache of text -> vector, so vectors can be computed before they are stored.

    Thread-safe. `embed_documents` computes only the texts not cached, in one call.

    Raises (from every method): ModelError when the model fails.
    """

    def __init__(self, model: Embeddings, *, cache_size: int = CACHE_SIZE) -> None:
        self.model = model
        self.cache_size = cache_size
        self._cache: OrderedDict[str, list[float]] = OrderedDict()
        self._lock = threading.Lock()

    def prime(self, texts: Sequence[str]) -> None:
        """Compute and cache the vectors of `texts` now (call it with no connection held)."""
        self.embed_documents(list(texts))

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        with self._lock:
            found = {text: self._cache[text] for text in texts if text in self._cache}
            for text in found:
                self._cache.move_to_end(text)
        missing = list(dict.fromkeys(text for text in texts if text not in found))
        if missing:
            try:
                vectors = self.model.embed_documents(missing)
            except Exception as exc:
                raise ModelError(f"The embeddings model failed: {type(exc).__name__}: {exc}; nothing was written.") from exc
            with self._lock:
                for text, vector in zip(missing, vectors, strict=True):
                    found[text] = self._cache[text] = list(vector)
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
        return [found[text] for text in texts]

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


class OpenedEmbeddings(Embeddings):
    """`model` given the plaintext of sealed texts (`open_text`, a keyring's): LangGraph's store embeds a
    memory's stored content, which is sealed when encryption is on (`agent.encryption`)."""

    def __init__(self, model: Embeddings, open_text: Callable[[str], str]) -> None:
        self.model = model
        self.open_text = open_text

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.model.embed_documents([self.open_text(text) for text in texts])

    def embed_query(self, text: str) -> list[float]:
        return self.model.embed_query(self.open_text(text))
