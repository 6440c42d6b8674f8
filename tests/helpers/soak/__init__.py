"""The chaos soak (`scripts/soak.py`): replicas of `tt-agent serve` on one Postgres, many clients, faults, and a verdict.

Modules, in the order a run uses them: `fleet` (the processes: the model stub, the servers and
the TCP proxies), `workload` (the clients, with `calls`, one HTTP attempt), `ledger` (what the
clients were told), `faults` (the injector), `snapshot` and `checks` (the end checks), `runner`
(one run and its summary). The private Postgres cluster it restarts is `tests.helpers.private_postgres`.
What it checks and how to run it: docs/reliability.md, "The chaos soak".
"""
