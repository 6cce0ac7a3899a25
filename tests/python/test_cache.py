"""The persistent compile cache: torchneuron_jit.cache and _C.Cache."""
import glob
import json
import os
import stat
import threading
import warnings

import pytest

from torchneuron_jit import _C, cache, config

STATS_KEYS = {"path", "enabled", "entries", "bytes", "file_bytes", "map_bytes", "max_bytes", "hits",
              "misses", "puts", "evictions", "corrupt_dropped", "map_grows", "probes"}


def key(n, prefix=b""):
    """A distinct 16-byte key."""
    return (prefix + n.to_bytes(16, "little"))[:16]


def mode_of(path):
    return stat.S_IMODE(os.stat(path).st_mode)


# -- torchneuron_jit.cache: basic use --------------------------------------------

@pytest.mark.parametrize("size", [0, 1, 1 << 20])
def test_round_trip_payload_sizes(size):
    payload = os.urandom(size)
    k = key(size, b"rt")
    assert cache.put(cache.ARTIFACTS, k, payload) is True
    got = cache.get(cache.ARTIFACTS, k)
    assert isinstance(got, bytes)
    assert got == payload
    st = cache.stats()
    assert st["enabled"] is True
    assert st["entries"] == 1
    assert st["puts"] == 1
    assert st["hits"] == 1


def test_tables_are_separate_and_put_replaces():
    k = key(7)
    assert cache.put(cache.ARTIFACTS, k, b"artifact")
    assert cache.get(cache.TRACES, k) is None
    assert cache.put(cache.TRACES, k, b"trace")
    assert cache.get(cache.ARTIFACTS, k) == b"artifact"
    assert cache.get(cache.TRACES, k) == b"trace"
    assert cache.put(cache.ARTIFACTS, k, b"newer")
    assert cache.get(cache.ARTIFACTS, k) == b"newer"
    assert cache.stats()["entries"] == 2


def test_miss_returns_none_and_counts():
    before = cache.stats()
    assert before["misses"] == 0
    assert cache.get(cache.ARTIFACTS, key(1)) is None
    assert cache.get(cache.TRACES, key(2)) is None
    st = cache.stats()
    assert st["misses"] == 2
    assert st["hits"] == 0
    assert st["entries"] == 0


def test_stats_counts_entries_hits_puts():
    for i in range(3):
        assert cache.put(cache.ARTIFACTS, key(i), b"v%d" % i)
    assert cache.get(cache.ARTIFACTS, key(0)) == b"v0"
    assert cache.get(cache.ARTIFACTS, key(2)) == b"v2"
    assert cache.get(cache.ARTIFACTS, key(9)) is None
    st = cache.stats()
    assert STATS_KEYS <= set(st)
    assert st["entries"] == 3
    assert st["hits"] == 2
    assert st["misses"] == 1
    assert st["puts"] == 3
    assert st["evictions"] == 0
    assert st["corrupt_dropped"] == 0
    assert st["max_bytes"] == config.cache_max_bytes
    assert st["file_bytes"] == os.path.getsize(st["path"])
    assert st["bytes"] > 0
    assert st["map_bytes"] >= st["file_bytes"]


def test_clear_returns_count_and_empties():
    for i in range(5):
        assert cache.put(cache.ARTIFACTS if i % 2 else cache.TRACES, key(i), b"x" * i)
    assert cache.clear() == 5
    assert cache.stats()["entries"] == 0
    for i in range(5):
        assert cache.get(cache.ARTIFACTS, key(i)) is None
        assert cache.get(cache.TRACES, key(i)) is None
    assert cache.clear() == 0
    assert cache.put(cache.ARTIFACTS, key(1), b"again")
    assert cache.get(cache.ARTIFACTS, key(1)) == b"again"


def test_directory_created_with_mode_0700(cache_dir):
    assert not cache_dir.exists()
    assert cache.directory() == str(cache_dir)
    st = cache.stats()
    assert st["enabled"] is True
    assert st["path"] == str(cache_dir / "cache.mdb")
    assert cache_dir.is_dir()
    assert mode_of(cache_dir) == 0o700
    assert os.path.exists(st["path"])


def test_nested_directories_created_private(tmp_path):
    nested = tmp_path / "a" / "b" / "c"
    config.cache_dir = str(nested)
    assert cache.put(cache.ARTIFACTS, key(1), b"x")
    for d in (tmp_path / "a", tmp_path / "a" / "b", nested):
        assert mode_of(d) == 0o700
    assert cache.stats()["path"] == str(nested / "cache.mdb")


def test_xdg_cache_home_used_when_cache_dir_is_empty(tmp_path, monkeypatch):
    xdg = tmp_path / "xdg_home"
    monkeypatch.setenv("XDG_CACHE_HOME", str(xdg))
    config.cache_dir = ""
    assert cache.directory() == str(xdg / "torchneuron_jit")
    assert cache.put(cache.ARTIFACTS, key(3), b"xdg")
    assert cache.stats()["path"] == str(xdg / "torchneuron_jit" / "cache.mdb")
    assert mode_of(xdg / "torchneuron_jit") == 0o700
    # a relative XDG_CACHE_HOME is ignored (computed only, nothing opened)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")
    assert cache.directory() == os.path.join(os.path.expanduser("~"), ".cache", "torchneuron_jit")


def test_switching_cache_dir_switches_store(tmp_path):
    assert cache.put(cache.ARTIFACTS, key(1), b"first")
    config.cache_dir = str(tmp_path / "second")
    assert cache.get(cache.ARTIFACTS, key(1)) is None
    assert cache.stats()["path"] == str(tmp_path / "second" / "cache.mdb")
    config.cache_dir = str(tmp_path / "tn_cache")
    assert cache.get(cache.ARTIFACTS, key(1)) == b"first"


def test_group_or_world_writable_directory_is_refused(cache_dir):
    cache_dir.mkdir()
    os.chmod(cache_dir, 0o777)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        st = cache.stats()
        assert cache.get(cache.ARTIFACTS, key(1)) is None
        assert cache.put(cache.ARTIFACTS, key(1), b"x") is False
        assert cache.clear() == 0
        st2 = cache.stats()
    ours = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert str(cache_dir) in str(ours[0].message)
    assert "writable" in str(ours[0].message)
    for s in (st, st2):
        assert s["enabled"] is False
        assert "writable by other users" in s["reason"]
        assert s["entries"] == 0
        assert STATS_KEYS <= set(s)
    assert not (cache_dir / "cache.mdb").exists()
    assert mode_of(cache_dir) == 0o777  # left as it was


def test_group_writable_directory_is_refused_by_low_level_handle(tmp_path):
    d = tmp_path / "group"
    d.mkdir()
    os.chmod(d, 0o770)
    with pytest.raises(_C.CacheError) as info:
        _C.Cache(str(d))
    assert info.value.code == _C.EPERM
    assert isinstance(info.value, OSError)
    assert str(d) in str(info.value)


def test_cache_disabled_by_config(cache_dir):
    config.cache = False
    assert cache.put(cache.ARTIFACTS, key(1), b"x") is False
    assert cache.get(cache.ARTIFACTS, key(1)) is None
    st = cache.stats()
    assert st["enabled"] is False
    assert "config.cache" in st["reason"]
    assert not cache_dir.exists()
    config.cache = True
    assert cache.put(cache.ARTIFACTS, key(1), b"x") is True


def test_invalid_size_limit_disables_with_one_warning():
    config.cache_max_bytes = 1000  # below the 256 KiB minimum
    with pytest.warns(RuntimeWarning, match="size limit") as record:
        assert cache.put(cache.ARTIFACTS, key(1), b"x") is False
        assert cache.get(cache.ARTIFACTS, key(1)) is None
        st = cache.stats()
    assert len([w for w in record if "size limit" in str(w.message)]) == 1
    assert st["enabled"] is False
    assert "size limit" in st["reason"]


def test_module_put_of_an_oversized_value_returns_false():
    config.cache_max_bytes = "1M"
    with pytest.warns(RuntimeWarning, match="1/8"):
        assert cache.put(cache.ARTIFACTS, key(1), b"x" * (200 << 10)) is False
    # the store stays usable
    assert cache.put(cache.ARTIFACTS, key(2), b"small") is True
    assert cache.get(cache.ARTIFACTS, key(2)) == b"small"
    assert cache.get(cache.ARTIFACTS, key(1)) is None


# -- Keys and arguments -----------------------------------------------------------

@pytest.mark.parametrize("bad", [b"", b"x" * 15, b"x" * 17, b"x" * 32])
def test_key_length_validated(tmp_path, bad):
    c = _C.Cache(str(tmp_path / "keys"))
    try:
        with pytest.raises(ValueError, match="16 bytes"):
            c.get(_C.CACHE_ARTIFACTS, bad)
        with pytest.raises(ValueError, match="16 bytes"):
            c.put(_C.CACHE_ARTIFACTS, bad, b"v")
        with pytest.raises(ValueError, match="16 bytes"):
            c.delete(_C.CACHE_ARTIFACTS, bad)
        with pytest.raises(ValueError, match="16 bytes"):
            cache.get(cache.ARTIFACTS, bad)
        with pytest.raises(ValueError, match="16 bytes"):
            cache.put(cache.ARTIFACTS, bad, b"v")
        assert c.stats()["entries"] == 0
    finally:
        c.close()


def test_key_types(tmp_path):
    c = _C.Cache(str(tmp_path / "keytypes"))
    try:
        k = bytearray(b"k" * 16)
        c.put(_C.CACHE_ARTIFACTS, k, memoryview(b"value"))
        assert c.get(_C.CACHE_ARTIFACTS, bytes(k)) == b"value"
        assert c.get(_C.CACHE_ARTIFACTS, memoryview(bytes(k))) == b"value"
        with pytest.raises(TypeError):
            c.get(_C.CACHE_ARTIFACTS, "k" * 16)
        with pytest.raises(TypeError):
            c.put(_C.CACHE_ARTIFACTS, b"k" * 16, "text")
    finally:
        c.close()


def test_bad_table_raises_value_error(tmp_path):
    c = _C.Cache(str(tmp_path / "tables"))
    try:
        for table in (-1, 2, 99):
            with pytest.raises(ValueError, match=f"table must be .*got {table}"):
                c.get(table, key(1))
            with pytest.raises(ValueError, match=f"table must be .*got {table}"):
                c.put(table, key(1), b"v")
            with pytest.raises(ValueError, match=f"table must be .*got {table}"):
                c.delete(table, key(1))
        c.put(_C.CACHE_TRACES, key(1), b"v")  # still usable
        assert c.get(_C.CACHE_TRACES, key(1)) == b"v"
    finally:
        c.close()


def test_module_functions_raise_value_error_for_a_bad_table():
    """A caller's mistake is an error, as a bad key is, not a store failure
    that warns and goes on uncached."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for call in (lambda: cache.get(5, key(1)), lambda: cache.put(5, key(1), b"v")):
            with pytest.raises(ValueError, match="table must be ARTIFACTS"):
                call()
    assert cache.put(cache.ARTIFACTS, key(1), b"v") and cache.get(cache.ARTIFACTS, key(1)) == b"v"


# -- _C.Cache handle -------------------------------------------------------------------

def test_low_level_handle_operations(tmp_path):
    c = _C.Cache(str(tmp_path / "ll"))
    assert c.closed is False
    assert c.path == str(tmp_path / "ll" / "cache.mdb")
    assert c.take_notice() == ""
    c.put(_C.CACHE_ARTIFACTS, key(1), b"one")
    c.put(_C.CACHE_TRACES, key(2), b"two")
    assert c.get(_C.CACHE_ARTIFACTS, key(1)) == b"one"
    assert c.delete(_C.CACHE_ARTIFACTS, key(1)) is True
    assert c.delete(_C.CACHE_ARTIFACTS, key(1)) is False
    assert c.get(_C.CACHE_ARTIFACTS, key(1)) is None
    assert c.flush() is None
    st = c.stats()
    assert st["entries"] == 1
    assert st["path"] == c.path
    assert set(st) == STATS_KEYS - {"enabled"}
    c.clear()
    assert c.stats()["entries"] == 0
    c.close()
    assert c.closed is True
    c.close()  # idempotent
    assert c.path is None
    assert c.take_notice() == ""


def test_closed_handle_raises_value_error(tmp_path):
    c = _C.Cache(str(tmp_path / "closed"))
    c.close()
    for call in (lambda: c.get(0, key(1)), lambda: c.put(0, key(1), b"v"), lambda: c.delete(0, key(1)),
                 c.clear, c.flush, c.stats):
        with pytest.raises(ValueError, match="closed"):
            call()


def test_same_path_shares_one_store(tmp_path):
    a = _C.Cache(str(tmp_path / "shared"))
    b = _C.Cache(str(tmp_path / "shared"))
    a.put(0, key(1), b"via a")
    assert b.get(0, key(1)) == b"via a"
    a.close()
    assert b.closed is False
    assert b.get(0, key(1)) == b"via a"  # b still works after a closed
    b.close()


def test_too_big_value(tmp_path):
    c = _C.Cache(str(tmp_path / "big"), max_bytes=1 << 20)
    try:
        with pytest.raises(_C.CacheError) as info:
            c.put(_C.CACHE_ARTIFACTS, key(1), b"x" * (200 << 10))
        assert info.value.code == _C.ETOOBIG
        assert isinstance(info.value, OSError)
        assert "1/8" in str(info.value)
        assert c.get(_C.CACHE_ARTIFACTS, key(1)) is None
        assert c.stats()["puts"] == 0
        # exactly 1/8 of the limit is allowed
        c.put(_C.CACHE_ARTIFACTS, key(2), b"y" * ((1 << 20) // 8))
        assert c.get(_C.CACHE_ARTIFACTS, key(2)) == b"y" * ((1 << 20) // 8)
    finally:
        c.close()


def test_invalid_options(tmp_path):
    with pytest.raises(_C.CacheError) as info:
        _C.Cache(str(tmp_path / "opts"), max_bytes=1000)
    assert info.value.code == _C.EINVAL
    with pytest.raises(_C.CacheError) as info:
        _C.Cache(str(tmp_path / "opts"), max_bytes=1 << 50)
    assert info.value.code == _C.EINVAL


def test_path_that_is_a_file_is_refused(tmp_path):
    f = tmp_path / "plainfile"
    f.write_bytes(b"not a directory")
    with pytest.raises(_C.CacheError) as info:
        _C.Cache(str(f))
    assert info.value.code == _C.EIO


# -- Size limit and eviction ----------------------------------------------------------

def test_eviction_keeps_file_under_limit(tmp_path):
    limit = 1 << 20
    c = _C.Cache(str(tmp_path / "evict"), initial_map_bytes=256 << 10, max_bytes=limit)
    try:
        keys = [key(i, b"ev") for i in range(600)]
        for i, k in enumerate(keys):
            c.put(_C.CACHE_ARTIFACTS, k, bytes([i % 251]) * 4096)
        st = c.stats()
        assert st["puts"] == 600
        assert st["evictions"] > 0
        assert st["entries"] < 600
        assert st["map_grows"] >= 1
        assert st["max_bytes"] == limit
        assert st["map_bytes"] <= limit * 17 // 16
        assert os.path.getsize(c.path) <= limit * 17 // 16
        assert st["file_bytes"] == os.path.getsize(c.path)
        for i in range(590, 600):
            assert c.get(_C.CACHE_ARTIFACTS, keys[i]) == bytes([i % 251]) * 4096
        assert c.get(_C.CACHE_ARTIFACTS, keys[0]) is None  # least recently used went first
        present = sum(c.get(_C.CACHE_ARTIFACTS, k) is not None for k in keys)
        assert present == c.stats()["entries"]
    finally:
        c.close()


def test_eviction_spares_recently_read_records(tmp_path):
    c = _C.Cache(str(tmp_path / "lru"), initial_map_bytes=256 << 10, max_bytes=1 << 20)
    try:
        hot = b"H" * 16
        c.put(_C.CACHE_ARTIFACTS, hot, b"hot" * 1000)
        c.put(_C.CACHE_ARTIFACTS, b"C" * 16, b"cold" * 1000)
        for i in range(500):
            c.put(_C.CACHE_ARTIFACTS, key(i, b"lr"), b"z" * 4096)
            assert c.get(_C.CACHE_ARTIFACTS, hot) == b"hot" * 1000, i
        assert c.stats()["evictions"] > 0
        assert c.get(_C.CACHE_ARTIFACTS, b"C" * 16) is None
        assert c.get(_C.CACHE_ARTIFACTS, hot) == b"hot" * 1000
    finally:
        c.close()


# -- Processes and threads ------------------------------------------------------------

def test_fork_child_writes_parent_reads(tmp_path, in_child):
    d = str(tmp_path / "fork")
    c = _C.Cache(d)
    c.put(_C.CACHE_ARTIFACTS, key(1), b"from parent")

    def child():
        ok = c.get(_C.CACHE_ARTIFACTS, key(1)) == b"from parent"
        c.put(_C.CACHE_ARTIFACTS, key(2), b"from child")
        return ok and c.get(_C.CACHE_ARTIFACTS, key(2)) == b"from child"

    in_child(child)
    try:
        assert c.get(_C.CACHE_ARTIFACTS, key(2)) == b"from child"  # same handle
        fresh = _C.Cache(d)
        assert fresh.get(_C.CACHE_ARTIFACTS, key(2)) == b"from child"
        fresh.close()
        c.put(_C.CACHE_ARTIFACTS, key(3), b"parent after fork")  # parent's env untouched
        assert c.get(_C.CACHE_ARTIFACTS, key(3)) == b"parent after fork"
        assert c.stats()["entries"] == 3
    finally:
        c.close()


def test_fork_child_uses_module_cache(in_child):
    assert cache.put(cache.ARTIFACTS, key(1), b"parent")
    in_child(lambda: cache.get(cache.ARTIFACTS, key(1)) == b"parent" and cache.put(cache.ARTIFACTS, key(2), b"child"))
    assert cache.get(cache.ARTIFACTS, key(2)) == b"child"


def test_concurrent_threads_one_handle(tmp_path, in_threads):
    c = _C.Cache(str(tmp_path / "threads"))
    start = threading.Barrier(4)

    def worker(n):
        start.wait()
        for i in range(200):
            k = bytes([n]) + i.to_bytes(15, "little")
            c.put(_C.CACHE_TRACES, k, b"%d:%d;" % (n, i) * 8)
            if i % 10 == 0:
                assert c.get(_C.CACHE_TRACES, k) == b"%d:%d;" % (n, i) * 8

    try:
        in_threads(worker)
        for n in range(4):
            for i in range(200):
                k = bytes([n]) + i.to_bytes(15, "little")
                assert c.get(_C.CACHE_TRACES, k) == b"%d:%d;" % (n, i) * 8
        st = c.stats()
        assert st["entries"] == 800
        assert st["puts"] == 800
    finally:
        c.close()


def test_close_while_other_threads_use_the_handle(tmp_path):
    c = _C.Cache(str(tmp_path / "closing"))
    outcomes = []
    go = threading.Event()

    def worker(n):
        go.wait()
        try:
            for i in range(100):
                c.put(_C.CACHE_ARTIFACTS, key(i, bytes([n])), b"v")
            outcomes.append("done")
        except ValueError:
            outcomes.append("closed")
        except BaseException as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    go.set()
    c.close()
    for t in threads:
        t.join(60)
    assert c.closed is True
    assert all(o in ("done", "closed") for o in outcomes), outcomes
    assert len(outcomes) == 3
    # the store was closed cleanly and reopens
    again = _C.Cache(str(tmp_path / "closing"))
    assert again.stats()["entries"] <= 300
    again.close()


def test_persistence_across_processes(run_python, cache_dir):
    assert cache.put(cache.ARTIFACTS, key(1), b"written by parent")
    cache.close()
    child = (
        "import json\n"
        "from torchneuron_jit import cache\n"
        "k1 = (1).to_bytes(16, 'little'); k2 = (2).to_bytes(16, 'little')\n"
        "seen = cache.get(cache.ARTIFACTS, k1)\n"
        "ok = cache.put(cache.TRACES, k2, b'written by child')\n"
        "print(json.dumps({'seen': seen.decode() if seen else None, 'ok': ok, 'path': cache.stats()['path']}))\n"
    )
    proc = run_python("-c", child)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out == {"seen": "written by parent", "ok": True, "path": str(cache_dir / "cache.mdb")}
    assert cache.get(cache.TRACES, key(2)) == b"written by child"
    assert cache.stats()["entries"] == 2


def test_concurrent_process_writes_are_visible_without_reopen(run_python):
    assert cache.put(cache.ARTIFACTS, key(1), b"open in parent")
    child = ("from torchneuron_jit import cache\n"
             "assert cache.put(cache.ARTIFACTS, (5).to_bytes(16, 'little'), b'child')\n")
    proc = run_python("-c", child)
    assert proc.returncode == 0, proc.stderr
    assert cache.get(cache.ARTIFACTS, key(5)) == b"child"  # the parent's store stayed open


def test_a_lock_file_removed_under_the_store_is_reopened_not_written_beside(cache_dir, run_python):
    """rm cache.mdb-lock while a process has the store open (a cleanup
    script): a process opening it next makes a new lock file, and the two
    wrote at once with lock tables of their own (records lost, a writer
    crashed). This process's handle now stops at its next operation, warns
    once, and opens the files at the path again: both processes share the
    new lock file, and no record is lost."""
    assert cache.put(cache.ARTIFACTS, key(1), b"before")
    os.remove(os.path.join(str(cache_dir), "cache.mdb-lock"))
    child = ("from torchneuron_jit import cache\n"
             "assert cache.put(cache.ARTIFACTS, (2).to_bytes(16, 'little'), b'other process')\n")
    proc = run_python("-c", child)
    assert proc.returncode == 0, proc.stderr
    with pytest.warns(RuntimeWarning, match="its lock file was removed or replaced"):
        assert cache.get(cache.ARTIFACTS, key(1)) is None  # this call: uncached
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.put(cache.ARTIFACTS, key(3), b"after")
        assert [cache.get(cache.ARTIFACTS, key(k)) for k in (1, 2, 3)] == [b"before", b"other process", b"after"]
    assert cache.stats()["entries"] == 3


# -- Damage ---------------------------------------------------------------------------

def test_damaged_file_is_moved_aside(cache_dir):
    c = _C.Cache(str(cache_dir))
    c.put(_C.CACHE_ARTIFACTS, key(1), b"doomed")
    data_file = c.path
    c.close()
    with open(data_file, "r+b") as f:
        f.write(b"\xa5\x5a" * 4096)  # the first 8192 bytes: both LMDB meta pages
    with pytest.warns(RuntimeWarning, match="moved it aside"):
        st = cache.stats()
    assert st["enabled"] is True
    assert st["entries"] == 0
    aside = glob.glob(os.path.join(str(cache_dir), "cache.mdb.corrupt-*"))
    assert len(aside) == 1
    with open(aside[0], "rb") as f:
        assert f.read(8192) == b"\xa5\x5a" * 4096  # the damaged file itself, kept for inspection
    assert cache.put(cache.ARTIFACTS, key(2), b"fresh")
    assert cache.get(cache.ARTIFACTS, key(2)) == b"fresh"
    assert cache.get(cache.ARTIFACTS, key(1)) is None


def test_corrupted_payload_is_dropped(cache_dir):
    payload = b"TNCORRUPTME" * 400
    k = key(42)
    assert cache.put(cache.ARTIFACTS, k, payload)
    assert cache.put(cache.ARTIFACTS, key(43), b"bystander")
    cache.close()
    data_file = cache_dir / "cache.mdb"
    data = data_file.read_bytes()
    at = data.find(payload)
    assert at >= 0
    assert data.count(payload) == 1
    with open(data_file, "r+b") as f:
        f.seek(at + len(payload) // 2)
        byte = f.read(1)
        f.seek(at + len(payload) // 2)
        f.write(bytes([byte[0] ^ 0x01]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a dropped record is a plain miss, no warning
        assert cache.get(cache.ARTIFACTS, k) is None
        st = cache.stats()
        assert st["corrupt_dropped"] == 1
        assert st["misses"] == 1
        assert st["entries"] == 1
        assert cache.get(cache.ARTIFACTS, k) is None  # dropped, not re-checked
        st = cache.stats()
        assert st["corrupt_dropped"] == 1
        assert st["misses"] == 2
        assert cache.get(cache.ARTIFACTS, key(43)) == b"bystander"
    assert cache.put(cache.ARTIFACTS, k, payload)  # can be stored again
    assert cache.get(cache.ARTIFACTS, k) == payload


def corrupt_leaf_holding(data_file, needle):
    """Clears the page-type flags of the one LMDB page that holds needle, so
    LMDB reports MDB_CORRUPTED ("wrong type") when a lookup reaches it."""
    data = bytearray(data_file.read_bytes())
    pages = [i for i in range(len(data) // 4096) if needle in data[i * 4096:(i + 1) * 4096]]
    assert len(pages) == 1, pages
    at = pages[0] * 4096
    assert int.from_bytes(data[at:at + 8], "little") == pages[0]  # LMDB 0.9 header: page number ...
    assert int.from_bytes(data[at + 10:at + 12], "little") == 0x02  # ... and P_LEAF flags
    data[at + 10:at + 12] = b"\0\0"
    data_file.write_bytes(bytes(data))


def test_damage_found_after_open_poisons_low_level_handle(tmp_path):
    d = tmp_path / "poison"
    c = _C.Cache(str(d))
    first, last = b"\xab" * 16, b"\xcd" * 16
    c.put(_C.CACHE_ARTIFACTS, first, b"one")
    c.put(_C.CACHE_ARTIFACTS, last, b"two")
    c.close()
    corrupt_leaf_holding(d / "cache.mdb", last)
    # without the open-time probe the damage is past the meta pages: open succeeds
    c = _C.Cache(str(d), verify=False)
    assert c.take_notice() == ""
    with pytest.raises(_C.CacheError) as info:
        c.get(_C.CACHE_ARTIFACTS, first)
    assert info.value.code == _C.ECORRUPT
    assert "damaged" in str(info.value)
    for call in (lambda: c.get(_C.CACHE_ARTIFACTS, first), lambda: c.put(_C.CACHE_ARTIFACTS, first, b"x"),
                 c.stats):
        with pytest.raises(_C.CacheError) as info:
            call()
        assert info.value.code == _C.EPOISONED
    c.close()
    assert len(glob.glob(str(d / "cache.mdb.corrupt-*"))) == 1
    fresh = _C.Cache(str(d))
    try:
        assert fresh.stats()["entries"] == 0
        fresh.put(_C.CACHE_ARTIFACTS, first, b"again")
        assert fresh.get(_C.CACHE_ARTIFACTS, first) == b"again"
    finally:
        fresh.close()


def test_damage_found_after_open_module_goes_on(cache_dir):
    first, last = b"\xab" * 16, b"\xcd" * 16
    assert cache.put(cache.ARTIFACTS, first, b"one")
    assert cache.put(cache.ARTIFACTS, last, b"two")
    cache.close()
    corrupt_leaf_holding(cache_dir / "cache.mdb", last)
    config.cache_verify = False  # let the damage through open, to meet it in get
    assert cache.stats()["enabled"] is True
    with pytest.warns(RuntimeWarning, match="damaged") as record:
        assert cache.get(cache.ARTIFACTS, first) is None
    assert len(record) == 1
    # the damaged store was closed and moved aside; the next call starts afresh
    assert len(glob.glob(str(cache_dir / "cache.mdb.corrupt-*"))) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert cache.get(cache.ARTIFACTS, first) is None
        assert cache.put(cache.ARTIFACTS, first, b"fresh") is True
        assert cache.get(cache.ARTIFACTS, first) == b"fresh"
        assert cache.stats()["entries"] == 1


def test_damage_caught_at_open_by_the_probe(cache_dir):
    first, last = b"\xab" * 16, b"\xcd" * 16
    assert cache.put(cache.ARTIFACTS, first, b"one")
    assert cache.put(cache.ARTIFACTS, last, b"two")
    cache.close()
    corrupt_leaf_holding(cache_dir / "cache.mdb", last)
    with pytest.warns(RuntimeWarning, match="moved it aside") as record:
        st = cache.stats()
    assert len(record) == 1
    assert st["enabled"] is True and st["entries"] == 0
    assert len(glob.glob(str(cache_dir / "cache.mdb.corrupt-*"))) == 1
    assert cache.put(cache.ARTIFACTS, first, b"fresh") is True
    assert cache.get(cache.ARTIFACTS, first) == b"fresh"


DAMAGE_CHILD = r"""
import random, sys, warnings
warnings.simplefilter("ignore")
from torchneuron_jit import cache
path, page, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(seed * 1000 + page)
with open(path, "r+b") as f:
    f.seek(page * 4096)
    f.write(bytes(rng.randrange(256) for _ in range(64)))
for i in range(300):
    cache.get(i % 2, i.to_bytes(16, "little"))
assert cache.put(0, b"n" * 16, b"new") in (True, False)
cache.get(0, b"n" * 16)
cache.stats()
cache.close()
print("survived")
"""


def test_damaged_btree_pages_never_crash_the_process(run_python, tmp_path):
    # "The cache is an accelerator, never a point of failure" (cache.py): a
    # damaged page anywhere in the file may cost the cached data, not the process.
    base = tmp_path / "base"
    c = _C.Cache(str(base))
    for i in range(300):
        c.put(i % 2, i.to_bytes(16, "little"), b"%d" % i * 20)
    c.close()
    original = (base / "cache.mdb").read_bytes()
    crashed = []
    for page in range(2, len(original) // 4096):
        for seed in (0, 1):
            d = tmp_path / f"p{page}_{seed}"
            d.mkdir(mode=0o700)
            (d / "cache.mdb").write_bytes(original)
            proc = run_python("-c", DAMAGE_CHILD, str(d / "cache.mdb"), str(page), str(seed),
                              env={"TORCHNEURON_CACHE_DIR": str(d)})
            if proc.returncode != 0 or "survived" not in proc.stdout:
                crashed.append((page, seed, proc.returncode, proc.stderr[-300:]))
    assert crashed == [], f"{len(crashed)} damaged files killed the process: {crashed[:6]}"
