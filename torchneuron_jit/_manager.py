"""The recompilation manager of the jit door: what keeps missing, in words.

Each jitted function (each JitFunction: a jitted module's instance has its
own) gets a Site: its misses counted by the guard that failed, the last
changes each guard saw, the events of its life (traces, dynamic sizes,
dropped builds, failures) by call number, and the manager's decisions. The
policy is data, in the tunables table, as LuaJIT keeps its own
(hotcount, backoff, blacklist):

- ``storm_misses``: misses one guard causes before one warning says what
  changes and what to do (a global read at file:line that changes on every
  call, a dimension that takes many sizes and why it stays static, a module
  attribute set between calls);
- ``trace_backoff``: after a function's k-th trace that fails (runs
  eagerly) or whose build is dropped, its next ``trace_backoff**k - 1``
  misses run eagerly without tracing;
- ``blacklist_after``: such traces after which the function runs eagerly
  for good, with one warning;
- ``dynamic_after`` (_dynamic.py) and ``jit_cache_limit`` (the C registry).

``torchneuron_jit.explain(fn)`` renders a Site with the variants: guards in
words, the graph's lowered and fallback ops, hits, misses by reason and
decisions; as text, and as HTML in a notebook.
"""
import collections
import dis
import html
import inspect
import re
import types

from . import _C, _log, config

_HISTORY = 256  # events kept per site


class Site:
    """What the manager knows of one jitted function."""

    def __init__(self, where):
        self.where = where
        self.misses = collections.Counter()    # guard (in words) -> misses it caused
        self.changes = {}                       # guard -> its last changes ("128 → 130")
        self.distinct = {}                      # guard -> the different changes it saw (a storm needs many)
        self.first_miss = {}                    # guard -> call number of its first miss
        self.events = collections.deque(maxlen=_HISTORY)  # (call number, kind, words)
        self.decisions = []                     # (call number, words)
        self.failures = 0                       # traces that failed or whose builds were dropped
        self.skip = 0                           # misses left to run untraced (backoff)
        self.warned = set()
        self.static = {}                        # (argument, dimension) -> why it stays static
        self.dynamic = set()                    # (argument, dimension) made dynamic


def where(fn):
    """How the words name function (or code object) fn: its qualified name
    and where it is defined. A decorator's wrapper (functools.wraps) is
    named by the function it wraps: Hugging Face models' forward is
    merge_with_config_defaults' wrapper."""
    if not isinstance(fn, types.CodeType):
        try:
            fn = inspect.unwrap(fn)
        except ValueError:  # a __wrapped__ cycle: the wrapper's own name
            pass
    code = fn if isinstance(fn, types.CodeType) else getattr(fn, "__code__", None)
    if code is None:
        return repr(fn)
    return f"{code.co_qualname} ({code.co_filename}:{code.co_firstlineno})"


def site(jf):
    """The Site of JitFunction jf (made on first use)."""
    s = jf.__dict__.get("_tn_site")
    if s is None:
        s = jf.__dict__["_tn_site"] = Site(where(jf.fn))
    return s


def _subject(words):
    """The guard a miss's words name, without its values: "x: size[1] 128
    → 130" -> "x: size[1]", "global STEP: 3 → 4" -> "global STEP"."""
    if " → " not in words:
        return words.split(" (")[0]
    head = words.rsplit(" → ", 1)[0]
    if ": " in head:
        name, rest = head.split(": ", 1)
        kind = rest.split(" ", 1)[0] if " " in rest else ""
        return f"{name}: {kind}" if kind else name
    return head


def miss(jf, words):
    """Counts a miss of jf, for the reason words (the nearest entry's first
    failing guard); warns once per guard that causes storm_misses of them."""
    s = site(jf)
    calls = jf.calls
    key = _subject(words)
    s.misses[key] += 1
    s.first_miss.setdefault(key, calls)
    if " → " in words:
        change = words.rsplit(": ", 1)[-1]
    else:  # "sizes: x.size(1) >= 2 fails (x.size(1) is 1)": what the values were
        change = words.rsplit(" (", 1)[1].rstrip(")") if words.endswith(")") and " (" in words else words
    _note_change(s, key, change)
    s.events.append((calls, "miss", words))
    limit = config.storm_misses
    if limit > 0 and len(s.distinct[key]) >= limit and key not in s.warned:
        s.warned.add(key)
        text = storm_words(jf, s, key)
        s.decisions.append((calls, text))
        _log.warn_once(text, stacklevel=4)


def _note_change(s, key, change):
    """Notes a miss's change for guard key: the last ones, and how many
    differ. A storm is a guard that keeps seeing new values, not one change
    met many times (one size change seen by each of twelve layers whose
    frames share a code object, in the Dynamo door)."""
    s.changes.setdefault(key, collections.deque(maxlen=8)).append(change)
    seen = s.distinct.setdefault(key, set())
    if len(seen) < 64:
        seen.add(change)


def storm_words(jf, s, key):
    """The warning for guard key that keeps failing: what changes, and what to do."""
    n = s.misses[key]
    span = max(1, jf.calls - s.first_miss[key] + 1)
    often = "on every call" if n >= 0.8 * span else f"{n} times in {span} calls"
    seen = ", ".join(list(s.changes[key])[-4:])
    from ._dynamic import FLOAT_PLACE, INT_PLACE, history
    hist = history(jf.fn)
    number = next((place for place in (INT_PLACE, FLOAT_PLACE) if (key, place, None) in hist), None)
    if ": size[" in key or number:
        # a dimension of a tensor argument, or an int or float argument (dim None)
        name, dim = (key.split(": size[")[0], int(key.split("size[")[1].rstrip("]"))) if ": size[" in key \
            else (key, None)
        values = [v for (arg, rank, d), v in hist.items() if arg == name and d == dim
                  and (rank == number if dim is None else rank not in (INT_PLACE, FLOAT_PLACE))]
        took = len(values[0]) if values else n + 1
        why = s.static.get((name, dim))
        each = "size" if dim is not None else "value"
        if config.dynamic_after <= 0:
            what = "it stays static (config.dynamic_after = 0); set dynamic_after to make it dynamic"
        elif (name, dim) in s.dynamic:
            what = "it is dynamic now"
        elif why:
            what = f"it stays static because {why}; " + (
                "pad it to a few sizes, or remove what keeps it static" if dim is not None else
                "pass it as a tensor, or keep it to a few values")
        elif s.failures:
            last = next((w for _, k, w in reversed(s.events) if k == "failed"), "")
            what = f"its traces run eagerly ({last}), so every {each} is a variant of its own"
        elif took >= config.dynamic_after:  # the misses came while a variant was built
            what = "its next trace makes it dynamic (calls ran eagerly while a variant was being built)"
        else:
            what = f"every {each} is a variant of its own so far"
        return f"{s.where}: {name}{'' if dim is None else f' dim {dim}'} took {took} values in {jf.calls} calls; {what}"
    if key.startswith("global ") or key.startswith("closure "):
        where = _read_at(jf.fn, key.split(" ", 1)[1].split("[")[0].split(".")[0])
        return (f"{s.where}: {key} changes {often} ({seen}){where}; pass it as an argument (a tensor, if it "
                "changes on every call) instead of reading it from the enclosing scope")
    if key.startswith("sizes"):
        return f"{s.where}: a relation of sizes keeps failing ({seen}); each side traces its own variant"
    if key.endswith(": dtype") or key.endswith(": rank") or key.endswith(": strides"):
        return f"{s.where}: {key.replace(':', '')} changes {often} ({seen}); each one is a variant of its own"
    if "." in key.split(":")[0]:
        return (f"{s.where}: {key} changes {often}, set from outside between calls ({seen}); pass it as an "
                "argument, or keep it fixed while serving")
    return f"{s.where}: {key} changes {often} ({seen}); each value is a variant of its own"


def _read_at(fn, name):
    """ " (read at file:line)" where fn's code (or code nested in it) loads name."""
    todo = [fn.__code__]
    while todo:
        code = todo.pop()
        for ins in dis.get_instructions(code):
            if ins.opname in ("LOAD_GLOBAL", "LOAD_DEREF", "LOAD_NAME", "LOAD_CLASSDEREF") and ins.argval == name:
                line = ins.positions.lineno if ins.positions else None
                return f" (read at {code.co_filename}:{line})"
        todo.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return ""


def may_trace(jf):
    """False while jf backs off (a miss runs eagerly untraced): its recent
    traces failed or were dropped."""
    s = site(jf)
    if s.skip > 0:
        s.skip -= 1
        s.events.append((jf.calls, "backoff", "ran eagerly untraced (backing off)"))
        _C.stat_add("calls_backing_off")
        return False
    return True


def traced(jf, ok, words):
    """Notes a trace of jf: ok, or failed / dropped (words: why). A failure
    backs off exponentially; blacklist_after of them run jf eagerly for
    good, with one warning."""
    s = site(jf)
    s.events.append((jf.calls, "trace" if ok else "failed", words))
    if ok:
        return
    s.failures += 1
    if 0 < config.blacklist_after <= s.failures:
        jf.gave_up = True
        text = (f"{s.where} runs eagerly from now on: {s.failures} of its traces failed or were dropped "
                f"(config.blacklist_after = {config.blacklist_after}); the last: {words}")
        s.decisions.append((jf.calls, text))
        _log.warn_once(text, stacklevel=4)
        return
    base = config.trace_backoff
    if base > 1:
        s.skip = base ** s.failures - 1
        s.decisions.append((jf.calls, f"backs off: the next {s.skip} misses run eagerly untraced ({words})"))


def decided(jf, words, dynamic=()):
    """A decision of the manager's (dimensions made dynamic: dynamic lists
    them as (argument, dimension)), for explain()."""
    if jf is None:
        return
    s = site(jf)
    s.dynamic.update(dynamic)
    s.decisions.append((jf.calls, words))
    _log.event("recompiles", f"{s.where}: {words}")


# -- explain --------------------------------------------------------------------------

def _guard_words(spec):
    """The checks of a guard program, one line each (loads left out; the
    snapshots of modules' and classes' dicts counted in one line)."""
    out, snapshots = [], 0
    for inst, name in zip(spec, spec.names):
        kind = inst[0]
        if kind == "dict" and name == "globals":
            out.append(f"globals {', '.join(map(str, inst[2]))} as traced")
            continue
        if kind == "dict":
            snapshots += 1
            continue
        if kind == "tensor":
            sizes = "(" + ", ".join("*" if n is None else str(n) for n in inst[3]) + (",)" if len(inst[3]) == 1
                                                                                          else ")")
            layout = "row-major" if inst[4] is None else f"strides {inst[4]}"
            out.append(f"{name}: {str(inst[2]).removeprefix('torch.')} {sizes} {layout}"
                       + (" requires_grad" if inst[5] else ""))
        elif kind == "sizes":
            out.append(f"sizes: {name}")
        elif kind == "eq":
            out.append(f"{name} == {inst[2]!r}")
        elif kind == "is" and (inst[2] is None or isinstance(inst[2], bool)):
            out.append(f"{name} is {inst[2]!r}")
        elif kind == "call":
            out.append(f"{name}: {inst[2]}")
        elif kind == "isweak":
            out.append(f"{name}: the same module")
        elif kind == "len":
            out.append(f"{name}: length {inst[2]}")
    if snapshots:
        out.append(f"{snapshots} modules' and classes' attribute dicts as traced (hooks, parameters, buffers)")
    return out


# ops through PyTorch that a variant's line names (the others are counted)
_OPS_SHOWN = 8


def _graph_words(runner):
    """What the variant's compiled graph runs in ours and through PyTorch."""
    if runner is None:
        return "runs eagerly (no compiled graph)"
    compiled = getattr(runner, "compiled", None)
    if compiled is None and hasattr(runner, "__self__"):
        compiled = getattr(runner.__self__, "compiled", None)
    report = (getattr(compiled, "form", None) or {}).get("report") if compiled is not None else None
    if not report:
        return "a compiled graph"
    fallback = sum(n for _, _, n in report["ops"])
    by_nodes = sorted(report["ops"], key=lambda op: (-op[2], op[0]))  # the most nodes first
    shown, rest = by_nodes[:_OPS_SHOWN], by_nodes[_OPS_SHOWN:]
    ops = ", ".join(f"{name} ({reason}, {n})" for name, reason, n in shown)
    if rest:
        nodes = sum(n for _, _, n in rest)
        ops += f", and {len(rest)} more op{'s' if len(rest) > 1 else ''} ({nodes} node{'s' if nodes > 1 else ''})"
    return f"{report['lowered']} nodes lowered, {fallback} through PyTorch" + (f": {ops}" if ops else "")


class Explanation:
    """torchneuron_jit.explain's answer: str() is the text, and a notebook shows it as HTML."""

    def __init__(self, jf):
        self.jf = jf
        self.site = site(jf)
        self.variants = []
        hits = jf.hits()
        for (spec, runner), n in zip(jf.entries(), hits):
            inner = getattr(runner, "__self__", runner)
            kind = "eager" if runner is None else "compiled"
            dynamic = any(inst[0] == "sizes" for inst in spec)
            self.variants.append({"kind": kind + (", dynamic sizes" if dynamic else ""), "hits": n,
                                  "guards": _guard_words(spec), "graph": _graph_words(inner)})

    def lines(self):
        s, jf = self.site, self.jf
        out = [f"{s.where}: {jf.calls} calls, {len(self.variants)} variants"
               + (", runs eagerly for good" if jf.gave_up else "")]
        for k, v in enumerate(self.variants):
            out.append(f"  variant {k} ({v['kind']}): {v['hits']} hits; {v['graph']}")
            out.extend(f"    guard {g}" for g in v["guards"])
        if s.misses:
            out.append("  misses by reason:")
            out.extend(f"    {n} × {key}: last {', '.join(list(s.changes[key])[-3:])}"
                       for key, n in s.misses.most_common())
        if s.decisions:
            out.append("  decisions:")
            out.extend(f"    call {c}: {words}" for c, words in s.decisions)
        return out

    def __str__(self):
        return "\n".join(self.lines())

    __repr__ = __str__

    def _repr_html_(self):
        s, jf = self.site, self.jf
        rows = "".join(
            f"<tr><td>{k}</td><td>{html.escape(v['kind'])}</td><td>{v['hits']}</td><td>{html.escape(v['graph'])}</td>"
            f"<td><ul>{''.join(f'<li>{html.escape(g)}</li>' for g in v['guards'])}</ul></td></tr>"
            for k, v in enumerate(self.variants))
        misses = "".join(f"<li>{n} × {html.escape(key)}</li>" for key, n in s.misses.most_common())
        decisions = "".join(f"<li>call {c}: {html.escape(w)}</li>" for c, w in s.decisions)
        return (f"<div><b>{html.escape(s.where)}</b>: {jf.calls} calls, {len(self.variants)} variants"
                f"<table><tr><th>#</th><th>kind</th><th>hits</th><th>graph</th><th>guards</th></tr>{rows}</table>"
                + (f"<p>misses by reason</p><ul>{misses}</ul>" if misses else "")
                + (f"<p>decisions</p><ul>{decisions}</ul>" if decisions else "")
                + self._timeline() + "</div>")

    def _timeline(self):
        """A small plot of the site's events by call number (matplotlib, when installed), as an <img>."""
        try:
            import matplotlib
            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return ""
        import base64
        import io
        kinds = ["miss", "trace", "failed", "backoff"]
        fig, ax = plt.subplots(figsize=(6, 1.6))
        for row, kind in enumerate(kinds):
            xs = [c for c, k, _ in self.site.events if k == kind]
            ax.scatter(xs, [row] * len(xs), s=12, label=kind)
        ax.set_yticks(range(len(kinds)), kinds)
        ax.set_xlabel("call")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=80)
        plt.close(fig)
        return f'<img src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}"/>'


# -- the Dynamo door -------------------------------------------------------------------

_dynamo_sites = {}  # code object -> Site of its recompiles through our back end


def _dynamo_subject(reason):
    """The guard a Dynamo recompile reason names, without values: "tensor
    'x' size mismatch at index 1. expected 73, actual 128" -> "tensor 'x'
    size at index 1"; "G['STEP'] == 3" -> "G['STEP']"."""
    if " mismatch at index " in reason:
        head, rest = reason.split(" mismatch at index ", 1)
        return f"{_dynamo_name(head.replace(' size', '').replace(' stride', ''))} dim {rest.split('.')[0]}"
    for op in (" == ", " is ", " != "):
        if op in reason:
            return _dynamo_name(reason.split(op)[0].strip("( "))
    return reason.split(".")[0]


def _dynamo_name(source):
    """Dynamo's source in the user's words: G['STEP'] -> global STEP, L['self'].scale -> self.scale."""
    source = re.sub(r"^G\['([^']+)'\]", r"global \1", source)
    return re.sub(r"L\['([^']+)'\]", r"\1", source)


def dynamo_recompile(code, reasons):
    """Counts a recompile of code through torch.compile(backend="neuron"),
    for Dynamo's reasons; one warning per guard that causes storm_misses of
    them, in the words the jit door uses."""
    if not reasons:
        return
    # the guard, without Dynamo's comment and its "frame/entry:" prefix
    reasons = [re.sub(r"^\d+/\d+: ", "", r.splitlines()[0].split("  #")[0].strip()) for r in reasons]
    s = _dynamo_sites.get(code)
    if s is None:
        s = _dynamo_sites[code] = Site(where(code))
    key = _dynamo_subject(reasons[0])
    s.misses[key] += 1
    _note_change(s, key, reasons[0])
    limit = config.storm_misses
    if limit <= 0 or len(s.distinct[key]) < limit or key in s.warned:
        return
    s.warned.add(key)
    n, last = s.misses[key], s.changes[key][-1]
    if " dim " in key:
        advice = ("Dynamo makes a dimension dynamic after its second size unless automatic dynamic shapes are off "
                  "or it is marked static: torch._dynamo.mark_dynamic(x, dim) makes it dynamic from the start")
    elif key.startswith("global "):
        advice = "a global the code reads changes between calls: pass it as an argument (a tensor, if it changes on every call)"
    elif "." in key:
        advice = "an attribute the code reads is set between calls: pass it as an argument, or keep it fixed while serving"
    else:
        advice = "each value is a graph of its own"
    text = f"{s.where} under torch.compile(backend='neuron'): {key} changed {n} times ({last}); {advice}"
    s.decisions.append((n, text))
    _log.warn_once(text, stacklevel=2)


def watch_dynamo(ours):
    """Wraps Dynamo's recompile reasons (convert_frame's
    get_and_maybe_log_recompilation_reasons) to count those of back end
    ours (dynamo_recompile); nothing when this torch has no such hook."""
    try:
        from torch._dynamo import convert_frame
    except ImportError:
        return
    original = getattr(convert_frame, "get_and_maybe_log_recompilation_reasons", None)
    if original is None or getattr(original, "_tn_watched", False):
        return

    def watched(cache_entries, frame, backend, *args, **kwargs):
        reasons = original(cache_entries, frame, backend, *args, **kwargs)
        inner = backend
        for _ in range(4):  # torch.compile's wrapper keeps the back end it was given as compiler_fn
            inner = getattr(inner, "compiler_fn", inner)
        if inner is ours:
            try:
                dynamo_recompile(frame.f_code, list(reasons))
            except Exception as exc:  # ours: Dynamo's recompile goes on, uncounted
                _log.warn_once(f"counting a recompile failed ({type(exc).__name__}: {exc})")
        return reasons

    watched._tn_watched = True
    convert_frame.get_and_maybe_log_recompilation_reasons = watched
