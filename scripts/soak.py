#!/usr/bin/env python
"""The chaos soak: several `tt-agent serve` replicas on one Postgres, many clients, faults, and a verdict.

Usage::

    python scripts/soak.py [--minutes 10] [--servers 3] [--clients 8] [--fault-interval 2.5]
                           [--model-latency 0.3] [--ttl-strategy keep_latest|delete] [--seed N]
                           [--min-faults N] [--keep]

For `--minutes`, clients take turns (plain, streamed, edits, regenerations, memory turns, turns on
threads shared under every double-texting strategy), update state, switch heads, fork, import
and give threads a ttl that the servers' sweepers act on, with idempotency keys and retries;
meanwhile a fault every `--fault-interval` seconds on average: a server killed with `kill -9`
(and started again), the Postgres cluster restarted (fast or immediate), the servers' database
connections cut, terminated or stalled, client connections dropped mid-request. Then it checks
the database against what every client was told and prints a summary (docs/reliability.md,
"The chaos soak", describes it line by line).

Postgres: a private cluster of its own (initdb into a temporary directory, a free port, trust
auth; as root, run as the `postgres` OS user), never the server other tests share. Everything
it starts is stopped and the directory removed at the end, also on failure and Ctrl-C
(`--keep` keeps the directory, with the cluster and the servers' logs).

Exit code: 0 when every check passed (nothing lost or duplicated, no 5xx other than 503, every op
answered, at least `--min-faults` faults), 1 when one failed, 2 when the soak could not run.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

# Runnable as `python scripts/soak.py` from a checkout without installing the package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers.soak.runner import Options, format_summary, run  # noqa: E402


def parse(argv: list[str] | None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long clients and faults run (default 10)")
    parser.add_argument("--servers", type=int, default=3, help="tt-agent serve processes (default 3)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients, four per user (default 8)")
    parser.add_argument("--fault-interval", type=float, default=2.5, help="mean seconds between faults (default 2.5)")
    parser.add_argument("--model-latency", type=float, default=0.3, help="seconds the model stub takes per reply")
    parser.add_argument("--ttl-strategy", choices=["keep_latest", "delete"], default="keep_latest",
                        help="the servers' thread_ttl_strategy (default keep_latest)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: the time)")
    parser.add_argument("--min-faults", type=int, default=0, help="fail unless at least this many faults were injected")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (cluster, logs)")
    args = parser.parse_args(argv)
    if args.servers < 2:
        parser.error("--servers must be at least 2 (a kill never takes the last one)")
    return Options(
        minutes=args.minutes, servers=args.servers, clients=max(1, args.clients), fault_interval=args.fault_interval,
        model_latency=args.model_latency, ttl_strategy=args.ttl_strategy, seed=args.seed, min_faults=args.min_faults,
        keep=args.keep,
    )  # fmt: skip


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    options = parse(argv)
    # SIGTERM and SIGHUP unwind like Ctrl-C, so every process is stopped and the directory removed.
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupt)
    try:
        report = run(options)
    except KeyboardInterrupt:
        print("soak: interrupted; everything it started was stopped", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"soak: could not run: {exc}", file=sys.stderr)
        return 2
    print(format_summary(report), flush=True)
    return 0 if report.passed else 1


if __name__ == "__main__":
    sys.exit(main())
