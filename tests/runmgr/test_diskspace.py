"""What a full disk raises, and the reserve a driver keeps to record an end on one."""

from __future__ import annotations

import errno
import sqlite3

import pytest

from runmgr.diskspace import RESERVE_BYTES, DiskReserve, is_disk_full


def test_sqlites_full_database_and_enospc_are_a_full_disk_and_other_failures_are_not(tmp_path):
    connection = sqlite3.connect(tmp_path / "small.sqlite")
    connection.execute("CREATE TABLE t (x BLOB)")
    connection.execute("PRAGMA max_page_count = 2")  # a database that cannot grow: SQLite's SQLITE_FULL
    with pytest.raises(sqlite3.OperationalError) as full:
        connection.execute("INSERT INTO t VALUES (zeroblob(100000))")
    assert is_disk_full(full.value)
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    with pytest.raises(sqlite3.OperationalError) as other:
        connection.execute("SELECT * FROM missing")
    assert not is_disk_full(other.value)


def test_the_reserve_takes_real_blocks_and_gives_them_back(tmp_path):
    run_dir = tmp_path / "run"
    with DiskReserve(run_dir) as reserve:
        stat = reserve.path.stat()
        assert stat.st_size == RESERVE_BYTES and stat.st_blocks * 512 >= RESERVE_BYTES  # not a sparse file
        reserve.hold()  # a reserve kept by a driver that was killed is taken over as it is
    assert not reserve.path.exists()
