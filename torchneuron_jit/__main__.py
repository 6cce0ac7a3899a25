"""Command line: ``python -m torchneuron_jit cache stats|clear``, ``config``."""
import argparse
import json
import sys


def _human(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _cache_stats(args):
    from torchneuron_jit import cache
    st = cache.stats()
    if args.json:
        print(json.dumps(st, indent=2, sort_keys=True))
        return 0
    print(f"path      {st['path']}")
    if not st["enabled"]:
        print(f"enabled   no: {st['reason']}")
        return 1
    print(f"entries   {st['entries']}")
    print(f"size      {_human(st['bytes'])} in use, file {_human(st['file_bytes'])}, "
          f"limit {_human(st['max_bytes'])}")
    return 0


def _cache_clear(args):
    from torchneuron_jit import cache
    st = cache.stats()
    if not st["enabled"]:
        print(f"cache at {st['path']} is not usable: {st['reason']}", file=sys.stderr)
        return 1
    n = cache.clear()
    print(f"cleared {n} entries from {st['path']}")
    return 0


def _config(args):
    from torchneuron_jit import config
    print(config.describe())
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m torchneuron_jit",
                                     description="torchneuron_jit command line")
    sub = parser.add_subparsers(dest="command", required=True)
    cache_p = sub.add_parser("cache", help="the persistent compile cache")
    cache_sub = cache_p.add_subparsers(dest="action", required=True)
    stats_p = cache_sub.add_parser("stats", help="entries, size and location")
    stats_p.add_argument("--json", action="store_true", help="print JSON")
    stats_p.set_defaults(func=_cache_stats)
    clear_p = cache_sub.add_parser("clear", help="delete every entry")
    clear_p.set_defaults(func=_cache_clear)
    config_p = sub.add_parser("config", help="list the tunables with their values")
    config_p.set_defaults(func=_config)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
