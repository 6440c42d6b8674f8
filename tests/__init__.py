"""The test suite, laid out like the `agent` package it tests.

A folder per subpackage or layer (`storage/`, `operations/`, `context/`, `memory/`, `models/`,
`serving/`, `cli/`), plus `docs/` (the documentation and notebooks run as tests), `bench/` (the
benchmarks run at their quick size) and `architecture/` (rules over the code itself). Modules that
test one top-level module of `agent` (`config`, `errors`, `tools`, `tracing`, the request parsing,
streaming) and the end-to-end trip sit at the top, as those modules do. Fixtures every folder
uses live in `conftest.py`, a folder's own in its `conftest.py`; shared builders and the services
the tests start (the OpenAI stub, PgBouncer, the fault-injection proxy) in `helpers/`.
"""
