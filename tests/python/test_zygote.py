"""The fresh processes of the tests (conftest.run_python, forked by
zygote.py): each is what `python args` would be where the tests depend on
it, or the cross-process tests would pass where real processes fail."""
import json
import subprocess

import pytest

PROBE = """
import atexit, json, os, sys, threading, time
def late():
    time.sleep(0.2)
    print("thread done", flush=True)
threading.Thread(target=late).start()  # not a daemon: the interpreter's shutdown joins it
atexit.register(lambda: print("atexit ran", flush=True))
print(json.dumps({"hash": hash("a fixed string"), "ours": "torchneuron_jit" in sys.modules, "argv": sys.argv,
                  "cwd": os.getcwd(), "path0": sys.path[0], "cache": os.environ["TORCHNEURON_CACHE_DIR"],
                  "extra": os.environ.get("TN_EXTRA"), "main": __name__, "pid": os.getpid()}), flush=True)
"""


def _probe(r):
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    return json.loads(lines[0]), lines[1:]


def test_a_fresh_process_has_its_own_arguments_environment_and_shutdown(run_python, tmp_path, cache_dir):
    (tmp_path / "probe.py").write_text(PROBE)
    first, tail = _probe(run_python("probe.py", "a", "b", env={"TN_EXTRA": "1"}))
    assert first["argv"] == ["probe.py", "a", "b"] and first["main"] == "__main__"
    assert first["cwd"] == str(tmp_path) and first["path0"] == str(tmp_path)
    assert first["cache"] == str(cache_dir) and first["extra"] == "1"
    assert not first["ours"]  # the package is imported by the child, never inherited
    assert tail == ["thread done", "atexit ran"]
    second, _ = _probe(run_python("-c", PROBE, "x"))
    assert second["argv"] == ["-c", "x"] and second["path0"] == "" and second["extra"] is None
    # two processes in a row hash strings differently, as two interpreters do
    assert second["hash"] != first["hash"] and second["pid"] != first["pid"]


def test_a_fresh_process_exits_fails_and_times_out_as_a_real_one(run_python):
    assert run_python("-c", "import sys; sys.exit(3)").returncode == 3
    r = run_python("-c", "raise ValueError('boom')")
    assert r.returncode == 1 and "ValueError: boom" in r.stderr
    with pytest.raises(subprocess.TimeoutExpired):
        run_python("-c", "import time; time.sleep(30)", timeout=1)
    assert run_python("-c", "print('after')").stdout == "after\n"  # the zygote serves on
    r = run_python("-m", "json.tool", "--help")
    assert r.returncode == 0 and "usage:" in r.stdout
