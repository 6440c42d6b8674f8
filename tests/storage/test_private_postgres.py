"""The private Postgres cluster (tests/helpers/private_postgres.py) that the soak restarts: it starts on a port
of its own, keeps what was committed through a crash-like restart, and is gone afterwards."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import psycopg
import pytest

from tests.helpers.private_postgres import postgres_bindir, private_cluster

try:
    postgres_bindir()
except RuntimeError as exc:  # pragma: no cover - a machine without the server binaries
    pytest.skip(str(exc), allow_module_level=True)


@pytest.fixture
def cluster_root():
    # Not tmp_path: as root the cluster runs as the postgres OS user, who must be able to reach it.
    root = Path(tempfile.mkdtemp(prefix="tt-cluster-"))
    root.chmod(0o711)
    yield root / "pg"
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.slow
def test_a_commit_survives_an_immediate_restart_and_the_cluster_is_stopped_afterwards(cluster_root):
    with private_cluster(cluster_root) as cluster:
        url = cluster.create_database("kept")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (v int)")
            conn.execute("INSERT INTO t VALUES (42)")
        idle = psycopg.connect(url, autocommit=True)

        cluster.restart("immediate")  # no shutdown checkpoint: the start recovers from the WAL

        with pytest.raises(psycopg.OperationalError):
            idle.execute("SELECT 1")  # the restart ended every connection
        with psycopg.connect(url) as conn:
            assert conn.execute("SELECT v FROM t").fetchall() == [(42,)]
        cluster.stop("fast")
        with pytest.raises(psycopg.OperationalError):
            psycopg.connect(url, connect_timeout=2)
        cluster.start()
        port = cluster.port
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(f"postgresql://postgres@127.0.0.1:{port}/kept", connect_timeout=2)
