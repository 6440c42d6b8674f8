"""Measuring instruments for timetravel-agent: benchmarks and the model stub they and the tests share.

* `openai_stub`  an OpenAI-compatible chat completions and embeddings server (standard library
                 only), run as a child process, with a configurable reply latency, streamed chunks
                 and context window: the stand-in for a real model in tests and load benchmarks
* `load`         the load benchmark: one `tt-agent serve` process under hundreds of slow
                 conversations, tracing cost, several processes and workers on one database
* `traffic`      what `load` sends over HTTP and how it judges the answers (errors, chains)
* `turn_growth`  in-process turn time as a thread grows, run by `load` as a child process
* `report`       what every benchmark prints and saves: the figures table, the machine, versions, JSON
* `databases`    scratch Postgres databases, dropped whatever happens
* `processes`    server processes in their own process group: start, wait until healthy, CPU time, stop

This package is not installed with the project (`pyproject.toml` packages `agent*` only); run it
from a checkout, e.g. `python -m bench.load --quick`. It never imports `tests`.
"""
