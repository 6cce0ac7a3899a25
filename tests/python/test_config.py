"""torchneuron_jit.config: the tunables table (csrc/tn_config.h)."""
import json
import warnings

import pytest

from torchneuron_jit import _C, config

NAMES = ["cache", "cache_dir", "cache_max_bytes", "cache_initial_map_bytes", "cache_verify", "kernel_threads", "row_fusion", "row_fusion_min_row",
         "gemm_fusion", "onednn_linear", "conv_channels_last", "flash_attention", "flash_attention_min_scores",
         "onednn_packed_weights", "compile_tier2", "tier2_after_calls", "tier2_jobs",
         "tier2_cc", "jit_cache_limit", "jit_evict_after", "compile_blocking", "build_worker", "build_child_busy_pct", "build_worker_timeout_s", "build_gc_off", "build_pause_ms", "build_resume_us", "dynamic_after", "storm_misses",
         "trace_backoff",
         "blacklist_after", "jit_trace_records", "cpu_isa", "log"]
DEFAULTS = {
    "cache": True,
    "cache_dir": "",
    "cache_max_bytes": 1 << 30,
    "cache_initial_map_bytes": 32 << 20,
    "cache_verify": True,
    "kernel_threads": 0,
    "row_fusion": "auto",
    "row_fusion_min_row": 256,
    "gemm_fusion": "off",
    "onednn_linear": True,
    "conv_channels_last": True,
    "flash_attention": "auto",
    "flash_attention_min_scores": 1 << 21,
    "onednn_packed_weights": False,
    "compile_tier2": "background",
    "tier2_after_calls": 2,
    "tier2_jobs": 1,
    "tier2_cc": "cc",
    "jit_cache_limit": 8,
    "jit_evict_after": 32,
    "compile_blocking": False,
    "build_worker": "auto",
    "build_child_busy_pct": 90,
    "build_worker_timeout_s": 300,
    "build_gc_off": True,
    "build_pause_ms": 200,
    "build_resume_us": 1000,
    "dynamic_after": 2,
    "storm_misses": 4,
    "trace_backoff": 2,
    "blacklist_after": 4,
    "jit_trace_records": True,
    "cpu_isa": "auto",
    "log": "",
}
TYPES = {"cache": "bool", "cache_dir": "str", "cache_max_bytes": "bytes",
         "cache_initial_map_bytes": "bytes", "cache_verify": "bool", "kernel_threads": "int", "row_fusion": "choice", "row_fusion_min_row": "int",
         "gemm_fusion": "choice", "onednn_linear": "bool", "conv_channels_last": "bool", "flash_attention": "choice",
         "flash_attention_min_scores": "int", "onednn_packed_weights": "bool", "compile_tier2": "choice",
         "tier2_after_calls": "int", "tier2_jobs": "int", "tier2_cc": "str",
         "jit_cache_limit": "int", "jit_evict_after": "int", "compile_blocking": "bool", "build_worker": "choice", "build_child_busy_pct": "int", "build_worker_timeout_s": "int", "build_gc_off": "bool", "build_pause_ms": "int", "build_resume_us": "int", "dynamic_after": "int", "storm_misses": "int",
         "trace_backoff": "int", "blacklist_after": "int", "jit_trace_records": "bool", "cpu_isa": "choice", "log": "str"}


def parse_default(setting):
    if setting.type == "bool":
        return bool(int(setting.default))
    if setting.type in ("int", "bytes"):
        return int(setting.default)
    return setting.default


def test_names_and_table_shape():
    assert config.names() == NAMES
    rows = config.table()
    assert [s.name for s in rows] == NAMES
    for s in rows:
        assert s.type == TYPES[s.name]
        assert isinstance(s.doc, str) and s.doc
        assert s.value == getattr(config, s.name)


def test_defaults_match_table():
    config.reset()  # the fixture removed every TORCHNEURON_* variable
    for s in config.table():
        assert parse_default(s) == DEFAULTS[s.name]
        assert s.value == DEFAULTS[s.name]
        assert getattr(config, s.name) == DEFAULTS[s.name]
        assert type(getattr(config, s.name)) is type(DEFAULTS[s.name])


@pytest.mark.parametrize("name, value, expected", [
    ("cache", False, False),
    ("cache", True, True),
    ("cache", 0, False),
    ("cache", 1, True),
    ("cache", "off", False),
    ("cache", "YES", True),
    ("cache", "true", True),
    ("cache", " no", False),
    ("cache_max_bytes", 12345, 12345),
    ("cache_max_bytes", 0, 0),
    ("cache_max_bytes", "2G", 2 * 2**30),
    ("cache_max_bytes", "2g", 2 * 2**30),
    ("cache_max_bytes", "512M", 512 * 2**20),
    ("cache_max_bytes", "3k", 3 * 1024),
    ("cache_max_bytes", "7T", 7 * 2**40),
    ("cache_max_bytes", "4096", 4096),
    ("cache_initial_map_bytes", "1M", 2**20),
    ("cache_dir", "/some/where", "/some/where"),
    ("cache_dir", "", ""),
    ("log", "cache,compile", "cache,compile"),
    ("cpu_isa", "avx2", "avx2"),
    ("cpu_isa", "AVX512", "avx512"),
    ("cpu_isa", " default", "default"),
    ("cpu_isa", "auto", "auto"),
])
def test_set_and_read_back(name, value, expected):
    setattr(config, name, value)
    got = getattr(config, name)
    assert got == expected
    assert type(got) is type(expected)
    assert _C.config_get(name) == expected
    assert {s.name: s.value for s in config.table()}[name] == expected


def test_size_suffix_variants():
    config.cache_max_bytes = "2GB"
    assert config.cache_max_bytes == 2 << 30
    config.cache_max_bytes = "2Gi"
    assert config.cache_max_bytes == 2 << 30
    config.cache_max_bytes = " 2G "
    assert config.cache_max_bytes == 2 << 30


def test_trailing_whitespace_is_accepted_without_a_suffix_too():
    # " 2G " is accepted (leading and trailing blanks skipped); a plain number
    # with the same blanks must be as well.
    config.cache_max_bytes = " 100"
    assert config.cache_max_bytes == 100
    config.cache_max_bytes = " 100 "
    assert config.cache_max_bytes == 100


def test_set_survives_other_settings():
    config.cache_max_bytes = "2G"
    config.cache_initial_map_bytes = "1M"
    config.cache = False
    assert config.cache_max_bytes == 2 << 30
    assert config.cache_initial_map_bytes == 1 << 20
    assert config.cache is False


@pytest.mark.parametrize("name, value, exc", [
    ("cache", 2, ValueError),
    ("cache", -1, ValueError),
    ("cache", "maybe", ValueError),
    ("cache", "", ValueError),
    ("cache", 1.5, TypeError),
    ("cache", None, TypeError),
    ("cache_max_bytes", -1, ValueError),
    ("cache_max_bytes", "-5", ValueError),
    ("cache_max_bytes", "2X", ValueError),
    ("cache_max_bytes", "lots", ValueError),
    ("cache_max_bytes", "", ValueError),
    ("cache_max_bytes", "12 34", ValueError),
    ("cache_max_bytes", "99999999999T", ValueError),
    ("cache_max_bytes", 1.5, TypeError),
    ("cache_max_bytes", None, TypeError),
    ("cache_max_bytes", b"2G", TypeError),
    ("cache_initial_map_bytes", "1Q", ValueError),
    ("cache_dir", 5, TypeError),
    ("cache_dir", None, TypeError),
    ("log", b"cache", TypeError),
    ("cpu_isa", "sse9", ValueError),
    ("cpu_isa", "", ValueError),
    ("cpu_isa", "avx", ValueError),
    ("cpu_isa", 2, TypeError),
    ("cpu_isa", None, TypeError),
])
def test_bad_values_raise_naming_the_setting(name, value, exc):
    before = getattr(config, name)
    with pytest.raises(exc) as info:
        setattr(config, name, value)
    assert name in str(info.value)
    assert getattr(config, name) == before  # unchanged


def test_int_out_of_range_names_the_setting():
    with pytest.raises(OverflowError, match="cache_max_bytes"):
        config.cache_max_bytes = 2**70
    assert config.cache_max_bytes == DEFAULTS["cache_max_bytes"]


def test_unknown_attribute():
    with pytest.raises(AttributeError):
        config.no_such_setting
    with pytest.raises(AttributeError, match="no_such_setting"):
        config.no_such_setting = 1
    assert not hasattr(config, "no_such_setting")
    with pytest.raises(AttributeError):
        _C.config_get("no_such_setting")
    with pytest.raises(AttributeError):
        _C.config_set("no_such_setting", 1)
    with pytest.raises(AttributeError):
        config._private_thing


def test_patch_sets_and_restores():
    before = {s.name: s.value for s in config.table()}
    with config.patch(cache=False, cache_max_bytes="2G", log="all"):
        assert config.cache is False
        assert config.cache_max_bytes == 2 * 2**30
        assert config.log == "all"
    assert {s.name: s.value for s in config.table()} == before


def test_patch_restores_after_exception():
    before = config.cache_max_bytes
    with pytest.raises(RuntimeError, match="boom"):
        with config.patch(cache_max_bytes="3M"):
            assert config.cache_max_bytes == 3 << 20
            raise RuntimeError("boom")
    assert config.cache_max_bytes == before


def test_patch_with_a_bad_value_changes_nothing():
    before = {s.name: s.value for s in config.table()}
    with pytest.raises(ValueError, match="cache_max_bytes"):
        with config.patch(cache=False, cache_max_bytes="bad"):
            pytest.fail("the body must not run")
    assert {s.name: s.value for s in config.table()} == before
    with pytest.raises(AttributeError):
        with config.patch(cache=False, nonsense=1):
            pytest.fail("the body must not run")
    assert {s.name: s.value for s in config.table()} == before


def test_describe_and_dir_list_every_setting():
    text = config.describe()
    listing = dir(config)
    for name in config.names():
        assert name in text
        assert f"TORCHNEURON_{name.upper()}" in text
        assert name in listing
    config.cache_max_bytes = "5M"
    assert f"cache_max_bytes = {5 << 20}" in config.describe()


def test_reset_applies_environment(monkeypatch):
    config.cache_max_bytes = 12345
    monkeypatch.setenv("TORCHNEURON_CACHE_MAX_BYTES", "3M")
    monkeypatch.setenv("TORCHNEURON_CACHE", "off")
    monkeypatch.setenv("TORCHNEURON_LOG", "fallback")
    monkeypatch.setenv("TORCHNEURON_CPU_ISA", "AVX2")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config.reset()
    assert config.cpu_isa == "avx2"
    assert config.cache_max_bytes == 3 << 20
    assert config.cache is False
    assert config.log == "fallback"
    assert config.cache_initial_map_bytes == DEFAULTS["cache_initial_map_bytes"]


def test_reset_warns_about_a_bad_variable(monkeypatch):
    monkeypatch.setenv("TORCHNEURON_CACHE_MAX_BYTES", "many")
    monkeypatch.setenv("TORCHNEURON_CACHE_INITIAL_MAP_BYTES", "2M")
    with pytest.warns(RuntimeWarning, match="TORCHNEURON_CACHE_MAX_BYTES") as record:
        config.reset()
    assert len([w for w in record if "TORCHNEURON_" in str(w.message)]) == 1
    assert config.cache_max_bytes == DEFAULTS["cache_max_bytes"]
    assert config.cache_initial_map_bytes == 2 << 20


def test_a_choice_not_offered_warns_naming_the_choices(monkeypatch):
    monkeypatch.setenv("TORCHNEURON_CPU_ISA", "neon")
    with pytest.warns(RuntimeWarning, match=r"TORCHNEURON_CPU_ISA: .*auto\|avx512\|avx2\|default.*'neon'"):
        config.reset()
    assert config.cpu_isa == "auto"


@pytest.mark.parametrize("name, bad, words", [
    ("jit_cache_limit", -1, "an integer >= 0"), ("dynamic_after", -2, "an integer >= 0"),
    ("storm_misses", -1, "an integer >= 0"), ("trace_backoff", -3, "an integer >= 0"),
    ("blacklist_after", -1, "an integer >= 0"), ("jit_evict_after", -1, "an integer >= 0"),
    ("build_pause_ms", -5, "an integer >= 0"), ("kernel_threads", -1, "an integer >= 0"),
    ("tier2_jobs", 0, "an integer >= 1"), ("tier2_after_calls", 0, "an integer >= 1"),
    ("build_worker_timeout_s", 0, "an integer >= 1"), ("build_child_busy_pct", 150, "an integer from 0 to 100"),
])
def test_an_integer_outside_its_range_is_refused_naming_the_setting(monkeypatch, name, bad, words):
    """jit_cache_limit = -1 quietly turned jit off; a negative dynamic_after,
    storm_misses or build_pause_ms was taken as it was."""
    default = getattr(config, name)
    with pytest.raises(ValueError, match=f"config {name}: expected {words}, got {bad}"):
        setattr(config, name, bad)
    assert getattr(config, name) == default
    monkeypatch.setenv(f"TORCHNEURON_{name.upper()}", str(bad))
    with pytest.warns(RuntimeWarning, match=f"TORCHNEURON_{name.upper()}: .*expected {words}.*using the default"):
        config.reset()
    assert getattr(config, name) == default


def test_a_variable_that_names_no_setting_warns_with_the_nearest_name(monkeypatch):
    monkeypatch.setenv("TORCHNEURON_JIT_CACHE_LIMT", "3")
    monkeypatch.setenv("TORCHNEURON_TCC_DIR", "/opt/tcc")  # setup.py's: no warning
    with pytest.warns(RuntimeWarning, match=r"TORCHNEURON_JIT_CACHE_LIMT names no setting and is ignored "
                                            r"\(did you mean TORCHNEURON_JIT_CACHE_LIMIT\?\)") as record:
        config.reset()
    assert len([w for w in record if "TORCHNEURON_" in str(w.message)]) == 1
    assert config.jit_cache_limit == DEFAULTS["jit_cache_limit"]


def test_a_log_kind_that_is_none_warns_once():
    from torchneuron_jit import _log
    with config.patch(log="recompile,cache"):
        with pytest.warns(RuntimeWarning, match="names no event kind recompile; the kinds are cache, compile, "
                                                "fallback, recompiles and all") as record:
            assert _log.enabled("cache") and not _log.enabled("recompiles")
    assert len(record) == 1


# -- Environment at import, in a fresh interpreter -----------------------------

CHILD = r"""
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torchneuron_jit
    from torchneuron_jit import config
print(json.dumps({
    "values": {s.name: s.value for s in config.table()},
    "warnings": [[w.category.__name__, str(w.message)] for w in caught],
}))
"""


def run_child(run_python, **env):
    proc = run_python("-c", CHILD, env=env)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    ours = [w for w in out["warnings"] if "TORCHNEURON_" in w[1]]
    return out["values"], ours


def test_env_value_applied_at_import(run_python, tmp_path):
    values, warned = run_child(run_python, TORCHNEURON_CACHE_MAX_BYTES="512M", TORCHNEURON_CACHE="0",
                               TORCHNEURON_CACHE_DIR=str(tmp_path / "elsewhere"))
    assert values["cache_max_bytes"] == 512 * 2**20
    assert values["cache"] is False
    assert values["cache_dir"] == str(tmp_path / "elsewhere")
    assert warned == []


def test_bad_env_value_warns_and_keeps_default(run_python):
    values, warned = run_child(run_python, TORCHNEURON_CACHE_MAX_BYTES="lots")
    assert len(warned) == 1, warned
    category, message = warned[0]
    assert category == "RuntimeWarning"
    assert "TORCHNEURON_CACHE_MAX_BYTES" in message
    assert "lots" in message
    assert values["cache_max_bytes"] == DEFAULTS["cache_max_bytes"]


def test_each_bad_env_variable_is_named_once(run_python):
    values, warned = run_child(run_python, TORCHNEURON_CACHE="perhaps", TORCHNEURON_CACHE_MAX_BYTES="-1",
                               TORCHNEURON_CACHE_INITIAL_MAP_BYTES="8M")
    messages = [m for _, m in warned]
    assert len(messages) == 2, messages
    assert sum("TORCHNEURON_CACHE:" in m for m in messages) == 1
    assert sum("TORCHNEURON_CACHE_MAX_BYTES" in m for m in messages) == 1
    assert values["cache"] is True
    assert values["cache_max_bytes"] == DEFAULTS["cache_max_bytes"]
    assert values["cache_initial_map_bytes"] == 8 << 20


def test_a_choice_of_on_and_off_takes_a_bool():
    config.row_fusion = True
    assert config.row_fusion == "on"
    config.row_fusion = False
    assert config.row_fusion == "off"
    config.row_fusion = "1"  # a boolean's text too, as TORCHNEURON_ROW_FUSION=1 was when the setting was one
    assert config.row_fusion == "on"
    config.gemm_fusion = "no"
    assert config.gemm_fusion == "off"
    with pytest.raises(ValueError, match="expected one of auto"):
        config.cpu_isa = True  # no on/off among its choices: a bool is no choice of it
