"""Measuring instruments for timetravel-agent: the benchmarks, one module each, and what they share.

* `load`         the load benchmark: one `tt-agent serve` process under hundreds of slow
                 conversations, tracing cost, several processes and workers on one database
* `traffic`      what `load` sends over HTTP and how it judges the answers (errors, chains)
* `turn_growth`  in-process turn time as a thread grows, run by `load` as a child process
* `report`       what every benchmark prints and saves: the figures table, the machine, versions, JSON
* `databases`    scratch Postgres databases, dropped whatever happens
* `processes`    server processes in their own process group: start, wait until healthy, CPU time, stop

This package is not installed with the project (`pyproject.toml` packages `agent*` only); run it
from a checkout, e.g. `python -m bench.load --quick`. The model stand-in of `load` and `memory` is
the tests' OpenAI-compatible stub (`tests.helpers.openai_stub`): one stub, owned by the tests, whose
answers both the tests and the benchmarks rely on. Nothing else of `tests` is imported.
"""
