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
import ast
import collections
import dis
import html
import inspect
import os
import re
import types
import weakref

from . import _C, _log, _spec, config

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
        self.settling = {}                      # warned guard -> (its value at the last may_evict, asks in a row)
        self.static = {}                        # (argument, dimension) -> why it stays static
        self.dynamic = set()                    # (argument, dimension) made dynamic
        self.pinned = set()                     # (argument, dimension) the code needs the value of
        self.set_by_call = set()                # argument objects' attributes the calls set ("s.name")
        self.while_building = 0                 # calls that ran eagerly untraced while a variant was built


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
        if words.startswith("sizes: ") and " fails (" in words:  # the relation whole: Ne(Mod(8 - (...)), 8), 0)
            return words.rsplit(" fails (", 1)[0]
        return words.split(" (")[0]
    head = words.rsplit(" → ", 1)[0]
    if ": " in head:
        name, rest = head.split(": ", 1)
        kind = rest.split(" ", 1)[0] if " " in rest else ""
        # what of the value changed (explain's words), not the first word of a value ("class int")
        return f"{name}: {kind}" if _KIND.fullmatch(kind) else name
    return head


_KIND = re.compile(r"size\[\d+\]|dtype|device|requires_grad|rank|strides|length|keys|type")


def miss(jf, words, building=False):
    """Counts a miss of jf, for the reason words (the nearest entry's first
    failing guard); warns once per guard that causes storm_misses of them,
    unless its dimension is dynamic, or is about to be, while a variant is
    built (building: the miss's call runs eagerly meanwhile)."""
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
    if key == VALUE_READ:  # a value with a few values (a flag) fits in the variants: a storm takes more
        limit = limit and max(limit, jf.limit or config.jit_cache_limit)
    if limit > 0 and len(s.distinct[key]) >= limit and key not in s.warned:
        text = storm_words(jf, s, key)
        s.warned.add(key)
        s.decisions.append((calls, text))
        if key == VALUE_READ:  # its variants side-exit on most calls, each after running its graph
            jf.gave_up = True
        # no storm where the next trace makes a dimension dynamic, or the build of its dynamic variant runs:
        # explain() tells, and a plain variable-length loop warns nothing
        if not (text.endswith(_WHILE_BUILDING) or (building and text.endswith(_DYNAMIC_NOW))):
            _log.warn_once(text)


# The subject (_subject) of a miss's words on a value read from a tensor
VALUE_READ = "a value read from a tensor"


def _note_change(s, key, change):
    """Notes a miss's change for guard key: the last ones, and how many
    differ. A storm is a guard that keeps seeing new values, not one change
    met many times (one size change seen by each of twelve layers whose
    frames share a code object, in the Dynamo door)."""
    s.changes.setdefault(key, collections.deque(maxlen=8)).append(change)
    seen = s.distinct.setdefault(key, set())
    if len(seen) < 64:
        seen.add(change)


# a dimension or number that changed while a variant was built: no storm, nothing for the user to do
_WHILE_BUILDING = "its next trace makes it dynamic (calls ran eagerly while a variant was being built)"
_DYNAMIC_NOW = "it is dynamic now"


def storm_words(jf, s, key):
    """The words for guard key that keeps failing: what changes, and what
    to do (a warning, unless they end in _WHILE_BUILDING)."""
    n = s.misses[key]
    span = max(1, jf.calls - s.first_miss[key] + 1)
    often = "on every call" if n >= 0.8 * span else f"{n} times in {span} calls"
    seen = ", ".join(list(s.changes[key])[-4:])
    from ._dynamic import FLOAT_PLACE, INT_PLACE, STRIDES_PLACE, history
    hist = history(jf)
    number = next((place for place in (INT_PLACE, FLOAT_PLACE) if (key, place, None) in hist), None)
    if ": size[" in key or number:
        # a dimension of a tensor argument, or an int or float argument (dim None)
        name, dim = (key.split(": size[")[0], int(key.split("size[")[1].rstrip("]"))) if ": size[" in key \
            else (key, None)
        values = [v for (arg, rank, d), v in hist.items() if arg == name and d == dim
                  and (rank == number if dim is None else rank not in (INT_PLACE, FLOAT_PLACE))]
        # the sizes traces have seen, and this miss's (noted in the history when its trace finishes)
        now = _number(s.changes[key][-1].rsplit(" → ", 1)[-1]) if s.changes.get(key) else None
        took = len(set(values[0]) | ({now} if now is not None else set())) if values else n + 1
        why = s.static.get((name, dim))
        each = "size" if dim is not None else "value"
        if config.dynamic_after <= 0:
            what = "it stays static (config.dynamic_after = 0); set dynamic_after to make it dynamic"
        elif (name, dim) in s.dynamic:
            what = _DYNAMIC_NOW
        elif why:
            what = f"it stays static because {why}; " + (
                "pad it to a few sizes, or remove what keeps it static" if dim is not None else
                "pass it as a tensor, or keep it to a few values")
        elif s.failures:
            last = next((w for _, k, w in reversed(s.events) if k == "failed"), "")
            what = f"its traces run eagerly ({last}), so every {each} is a variant of its own"
        elif took >= config.dynamic_after:  # the misses came while a variant was built
            what = _WHILE_BUILDING
        else:
            what = f"every {each} is a variant of its own so far"
        return f"{s.where}: {name}{'' if dim is None else f' dim {dim}'} took {took} values in {jf.calls} calls; {what}"
    if key == VALUE_READ:
        return (f"{s.where}: {key} (item(), bool(), tolist(), str()) took {len(s.distinct[key])} values in {span} "
                f"calls ({seen}), each a variant of "
                "its own, whose graphs run before the value shows they do not serve the call: it runs eagerly from "
                "now on; compute with the tensor rather than its value (x / x.abs().max(), not "
                "x / x.abs().max().item()), or pass the value in as an argument")
    if key.startswith("global ") or key.startswith("closure "):
        where = _read_at(jf.fn, key.split(" ", 1)[1].split("[")[0].split(".")[0])
        return (f"{s.where}: {key} changes {often} ({seen}){where}; pass it as an argument (a tensor, if it "
                "changes on every call) instead of reading it from the enclosing scope")
    if key.startswith("sizes"):
        # the relation itself: which comparison of which sizes, not only the values that took each side
        return (f"{s.where}: the relation of sizes {key.split(': ', 1)[-1]} keeps failing ({seen}); each side of it "
                "traces its own variant")
    place = (key.split(":")[0], STRIDES_PLACE)
    if key.endswith(": strides") and place in s.dynamic:
        return f"{s.where}: {key.replace(':', '')} changes {often} ({seen}); its variant copies it dense, " \
               + _DYNAMIC_NOW
    if key.endswith(": strides") and place in s.static:
        return (f"{s.where}: {key.replace(':', '')} changes {often} ({seen}); each one is a variant of its own "
                f"because {s.static[place]}; pass it row-major (.contiguous())")
    if key.endswith(": dtype") or key.endswith(": rank") or key.endswith(": strides"):
        return f"{s.where}: {key.replace(':', '')} changes {often} ({seen}); each one is a variant of its own"
    if key in s.set_by_call:
        return (f"{s.where}: {key} changes {often} ({seen}): each call sets it, and the next call's variant is "
                "chosen by it, so every value is a variant of its own; keep what the function carries from one "
                "call to the next in a tensor, or an int (a size, made dynamic), not in a value it branches on")
    if "." in key.split(":")[0]:
        return (f"{s.where}: {key} changes {often}, set between calls by the caller or code around the call "
                f"({seen}); pass it as an argument, or keep it fixed while serving (a value that stays put gets a "
                "variant again)")
    return f"{s.where}: {key} changes {often} ({seen}); each value is a variant of its own"


def _number(text):
    """The int or float a miss's words write as text, or None."""
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


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


def sets(jf, names):
    """Notes the argument objects' attributes (in words: "s.name") a traced
    call of jf set: a storm on one of them is the function's own doing."""
    site(jf).set_by_call.update(names)


def may_evict(jf, words):
    """Whether a miss of jf at its limit, for the reason words, may evict a
    variant that has gone unused and trace: not for a guard it warned of
    as a storm (a global that changes on every call: its variants take
    one call each, and evicting would trace on every call the wait
    allows), until the storm has settled: the guard's value the same at
    two asks in a row (jit_evict_after calls apart, at least). A value that
    grew for a while and then stayed (transformers' generate() sets
    model._previous_max_cache_length to the longest prompt so far) had
    every variant spent on its past values, and its calls ran eagerly for
    good."""
    s = site(jf)
    key = None if words is None else _subject(words)
    if key not in s.warned:
        return True
    value = words.rsplit(" → ", 1)[1] if " → " in words else None
    last, asks = s.settling.get(key, (None, 0))
    asks = asks + 1 if value is not None and value == last else 1
    s.settling[key] = (value, asks)
    if asks < 2:
        return False
    s.decisions.append((jf.calls, f"{key} has stayed {value}: a variant unused long enough is evicted for it"))
    return True


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
        _log.warn_once(text)
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
            layout = "row-major" if inst[4] is None else "any strides, copied dense" \
                if inst[4] and all(st is None for st in inst[4]) else f"strides {inst[4]}"
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
        elif kind == "same":
            out.append(f"{name}: the same {_spec.held_kind(spec, inst[1])} as {spec.names[inst[2]]}")
        elif kind == "distinct":
            out.append(f"{', '.join(spec.names[slot] for slot in inst[1])}: different objects")
        elif kind == "len":
            out.append(f"{name}: length {inst[2]}")
        elif kind == "order":
            out.append(f"{name}: strides in the order {inst[2]}, outermost first")
    if snapshots:
        out.append(f"{snapshots} modules' and classes' attribute dicts as traced (hooks, parameters, buffers)")
    return out


# ops through PyTorch that a variant's line names (the others are counted)
_OPS_SHOWN = 8


def graph_words(runner):
    """What the variant's compiled graph runs in ours and through PyTorch."""
    if runner is None:
        return "runs eagerly (no compiled graph)"
    compiled = runner if isinstance(runner, _C.Plan) else getattr(runner, "compiled", None)
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
    """torchneuron_jit.explain's answer: str() is the text, and a notebook
    shows it as HTML. Made by jit_explanation or dynamo_explanation: head
    (what and how many calls), variants (dicts of name, kind, hits, graph,
    guards), and the Site of its misses and decisions."""

    def __init__(self, head, variants, site):
        self.head, self.variants, self.site = head, variants, site

    def lines(self):
        s = self.site
        out = [self.head]
        for v in self.variants:
            hits = "" if v["hits"] is None else f"{v['hits']} hits; "
            out.append(f"  {v['name']} ({v['kind']}): {hits}{v['graph']}")
            out.extend(f"    guard {g}" for g in v["guards"])
        if s.misses:
            out.append("  misses by reason:")
            out.extend(f"    {n} × {key}: last {', '.join(list(s.changes[key])[-3:])}"
                       for key, n in s.misses.most_common())
        if s.decisions:
            out.append("  decisions:")
            out.extend(f"    {_when(c)}{words}" for c, words in s.decisions)
        return out

    def __str__(self):
        return "\n".join(self.lines())

    __repr__ = __str__

    def _repr_html_(self):
        s = self.site
        rows = "".join(
            f"<tr><td>{html.escape(v['name'])}</td><td>{html.escape(v['kind'])}</td><td>{_or_blank(v['hits'])}</td>"
            f"<td>{html.escape(v['graph'])}</td>"
            f"<td><ul>{''.join(f'<li>{html.escape(g)}</li>' for g in v['guards'])}</ul></td></tr>"
            for v in self.variants)
        misses = "".join(f"<li>{n} × {html.escape(key)}</li>" for key, n in s.misses.most_common())
        decisions = "".join(f"<li>{_when(c)}{html.escape(w)}</li>" for c, w in s.decisions)
        return (f"<div><b>{html.escape(self.head)}</b>"
                f"<table><tr><th></th><th>kind</th><th>hits</th><th>graph</th><th>guards</th></tr>{rows}</table>"
                + (f"<p>misses by reason</p><ul>{misses}</ul>" if misses else "")
                + (f"<p>decisions</p><ul>{decisions}</ul>" if decisions else "")
                + self._timeline() + "</div>")

    def _timeline(self):
        """A small plot of the site's events by call number (matplotlib, when installed), as an <img>."""
        if not self.site.events:
            return ""
        try:  # a Figure of its own, drawn by Agg: pyplot and the user's backend (a notebook's) stay as they are
            from matplotlib.figure import Figure
        except ImportError:
            return ""
        import base64
        import io
        kinds = ["miss", "trace", "failed", "backoff"]
        fig = Figure(figsize=(6, 1.6))
        ax = fig.add_subplot()
        for row, kind in enumerate(kinds):
            xs = [c for c, k, _ in self.site.events if k == kind]
            ax.scatter(xs, [row] * len(xs), s=12, label=kind)
        ax.set_yticks(range(len(kinds)), kinds)
        ax.set_xlabel("call")
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=80)
        return f'<img src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}"/>'


def _when(call):
    """A decision's call number in words ("" for the Dynamo door's, which counts no calls)."""
    return "" if call is None else f"call {call}: "


def _or_blank(hits):
    return "" if hits is None else hits


def jit_explanation(jf):
    """The Explanation of JitFunction jf: its variants (C registry entries)."""
    from . import _jit
    s = site(jf)
    variants = []
    building = _jit._builds.building(jf)
    for k, ((spec, runner), n) in enumerate(zip(jf.entries(), jf.hits())):
        inner = getattr(runner, "__self__", runner)
        kind = "eager" if runner is None else "compiled"
        graph = graph_words(inner)
        if runner is None and spec is building:
            kind, graph = "building", "runs eagerly while its graph is built in the background"
        dynamic = any(inst[0] == "sizes" for inst in spec)
        variants.append({"name": f"variant {k}", "kind": kind + (", dynamic sizes" if dynamic else ""), "hits": n,
                         "guards": _guard_words(spec), "graph": graph})
    head = (f"{s.where}: {jf.calls} calls, {len(variants)} variant{'' if len(variants) == 1 else 's'}"
            + (f", {s.while_building} of its calls ran eagerly while a variant was built in the background (one "
               "at a time)" if s.while_building else "")
            + (", runs eagerly for good" if jf.gave_up else
               ", at its limit of variants: calls none takes run eagerly" if jf.full else ""))
    return Explanation(head, variants, s)


# -- the Dynamo door -------------------------------------------------------------------

# code object, or (code object, id of the module it calls) -> Site of its recompiles through our back end
_dynamo_sites = {}


def _dynamo_site_key(code, frame_locals):
    """Where Dynamo's recompiles of a frame count: its code, and for the
    frame every torch.compile'd module runs through (Dynamo's wrap_inline,
    calling its module fn) that module too, and for a module's own method
    its self: five models compiled once each, or six layers of one class
    (each with its own layer index), are no recompile storm of the code
    they share."""
    import torch
    frame_locals = frame_locals if frame_locals is not None else {}
    for name in ("fn", "self"):
        module = frame_locals.get(name)
        if isinstance(module, torch.nn.Module) or (name == "fn" and module is not None and _is_wrap_inline(code)):
            return code, id(module)  # a module, or what else wrap_inline calls (a compiled functools.partial)
    return code


def _dynamo_subject(reason):
    """The guard a Dynamo recompile reason names, without values: "tensor
    'x' size mismatch at index 1. expected 73, actual 128" -> "tensor 'x'
    size at index 1"; "G['STEP'] == 3" -> "G['STEP']"."""
    if ".size()[" in reason:
        return _dynamo_sizes(reason)
    if " mismatch at index " in reason:
        head, rest = reason.split(" mismatch at index ", 1)
        return f"{_dynamo_name(head.replace(' size', '').replace(' stride', ''))} dim {rest.split('.')[0]}"
    for op in (" == ", " is ", " != "):
        if op in reason:
            return _dynamo_name(reason.split(op)[0].strip("( "))
    return reason.split(".")[0]


def _dynamo_name(source):
    """Dynamo's source in the user's words: G['STEP'] -> global STEP,
    L['self'].scale -> self.scale, L['self']._modules['l']._parameters['bias'] -> self.l.bias."""
    source = re.sub(r"^G\['([^']+)'\]", r"global \1", source)
    source = re.sub(r"\._(?:modules|parameters|buffers)\['([^']+)'\]", r".\1", source)
    return re.sub(r"[LG]\['([^']+)'\]", r"\1", source)


# a reason of a recompile of wrap_inline's code that names what it calls (fn): another compiled callable's entry
_OTHER_CALLABLE = re.compile(r"___check_(?:type|obj)_id\((?:L\['fn'\]|fn), ")


def dynamo_recompile(code, reasons, frame_locals=None):
    """Counts a recompile of code (its frame's locals frame_locals) through
    torch.compile(backend="neuron"), for Dynamo's reasons; one warning per
    guard that causes storm_misses of them, in the words the jit door uses."""
    if not reasons:
        return
    # the guard, without Dynamo's comment and its "frame/entry:" prefix
    reasons = [re.sub(r"^\d+/\d+: ", "", r.splitlines()[0].split("  #")[0].strip()) for r in reasons]
    if _is_wrap_inline(code) and _OTHER_CALLABLE.match(reasons[0]):
        return  # the entries of another module or partial torch.compile runs through the same wrapper: no miss of this one's
    key = _dynamo_site_key(code, frame_locals)
    s = _dynamo_sites.get(key)
    if s is None:
        s = _dynamo_sites[key] = Site(where(code))
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
    s.decisions.append((None, text))
    _log.warn_once(text)


def _backend_is(backend, ours):
    """Whether Dynamo's backend (torch.compile's wrapper of it) is ours."""
    for _ in range(4):  # torch.compile's wrapper keeps the back end it was given as compiler_fn
        backend = getattr(backend, "compiler_fn", backend)
    return backend is ours


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
        if _backend_is(backend, ours):
            try:
                dynamo_recompile(frame.f_code, list(reasons), frame.f_locals)
            except Exception as exc:  # ours: Dynamo's recompile goes on, uncounted
                _log.warn_once(f"counting a recompile failed ({type(exc).__name__}: {exc})")
        return reasons

    watched._tn_watched = True
    convert_frame.get_and_maybe_log_recompilation_reasons = watched


# -- explain() of the Dynamo door ------------------------------------------------------

_DYNAMO_GRAPHS = 4096  # Dynamo compiles whose graphs explain() remembers (the oldest go first)
# Dynamo compile id (str) -> (weakref to the CompileContext, [(weakref to what the back end returned, words)]).
# torch._dynamo.reset() starts the ids again: a compile under another context replaces the id's graphs.
_dynamo_graphs = collections.OrderedDict()


def dynamo_graph(compiled, words=None):
    """Notes a graph the back end compiled (compiled: its Plan; words
    None: its graph's words), or runs eagerly (compiled: the function it
    returned; words say why), under the Dynamo compile it came from, for
    explain(); nothing outside one (the jit door, whose builds pay for no
    words)."""
    try:
        from torch._guards import CompileContext
        ctx = CompileContext.try_get()
    except ImportError:
        return
    if ctx is None or ctx.compile_id is None:
        return
    cid = str(ctx.compile_id)
    held = _dynamo_graphs.get(cid)
    if held is None or held[0]() is not ctx:
        held = _dynamo_graphs[cid] = (weakref.ref(ctx), [])
    held[1].append((weakref.ref(compiled), graph_words(compiled) if words is None else words))
    while len(_dynamo_graphs) > _DYNAMO_GRAPHS:
        _dynamo_graphs.popitem(last=False)


def dynamo_codes(fn):
    """The code objects torch.compile's fn (a compiled module or function,
    or a module compiled in place with its compile()) may hold Dynamo's
    entries under: its forward's (or its function's), and
    those of the functions that one wraps (functools.wraps); None when fn
    is no torch.compile wrapper."""
    try:
        from torch._dynamo.eval_frame import OptimizedModule
    except ImportError:
        return None
    import torch
    codes = []
    if isinstance(fn, OptimizedModule):
        target = fn._orig_mod.forward
        inline = _wrap_inline_code(getattr(getattr(fn, "forward", None), "_torchdynamo_orig_callable", None))
        if inline is not None:  # a torch.nn module's own forward: Dynamo's entries sit on its wrapper's code
            codes.append(inline)
    elif isinstance(fn, torch.nn.Module) and getattr(fn, "_compiled_call_impl", None) is not None:
        target = fn.forward  # compiled in place: model.compile(backend="neuron")
    elif getattr(fn, "_torchdynamo_orig_callable", None) is not None:
        target = fn._torchdynamo_orig_callable
        callee = _wrap_inline_callee(target)
        if callee is not None:  # a functools.partial: the entries sit on the wrapper's code, and its function
            codes.append(target.__code__)  # names it
            target = getattr(callee, "func", callee)
        if isinstance(target, torch.nn.Module):
            target = target.forward
    else:
        return None
    for _ in range(8):
        target = getattr(target, "__func__", target)
        code = getattr(target, "__code__", None)
        if code is not None and code not in codes:
            codes.append(code)
        target = getattr(target, "__wrapped__", None)
        if target is None:
            break
    return codes


def _is_wrap_inline(code):
    """Whether code is Dynamo's wrap_inline wrapper's (the frame torch.compile
    of a torch.nn module's own class enters: one code for every such module)."""
    return code is not None and code.co_filename.replace(os.sep, "/").endswith("torch/_dynamo/external_utils.py")


def _wrap_inline_code(fn):
    """fn's code where fn is Dynamo's wrap_inline wrapper, else None."""
    code = getattr(fn, "__code__", None)
    return code if _is_wrap_inline(code) else None


def _wrap_inline_callee(fn):
    """What Dynamo's wrap_inline wrapper fn calls (the callable torch.compile
    runs through it: a functools.partial), else None."""
    inline = _wrap_inline_code(fn)
    return fn.__closure__[0].cell_contents if inline is not None and inline.co_freevars == ("fn",) else None


_MODULE_CHECK = re.compile(r"___check_(?P<kind>type|obj)_id\(L\['(?:fn|self)'\], (?P<id>\d+)\)")


def _dynamo_serves(entry, code, module):
    """Whether Dynamo's cache entry of code may serve module: on code that
    several compiled modules run (the wrap_inline wrapper of every torch.nn
    module, transformers' decorators around forward), not the entries whose
    guards want another module (self, or wrap_inline's fn) or another
    class; on the wrap_inline code, only those that want module's class
    (which then serve any module of it whose tensors have the sizes they
    check)."""
    if module is None:
        return True
    checks = [m for part in getattr(entry.guard_manager, "code_parts", ()) for m in _MODULE_CHECK.finditer(part)]
    if any(int(m["id"]) != (id(type(module)) if m["kind"] == "type" else id(module)) for m in checks):
        return False
    return not _is_wrap_inline(code) or any(m["kind"] == "type" for m in checks)


def _dynamo_entries(code, label, depth=0, seen=None):
    """[(label, cache entry)] of code, oldest first, then those of the
    functions Dynamo resumes code in after its graph breaks, each code
    once (a resume function is reached from each function that breaks
    into it: an entry was listed twice). seen: the codes listed."""
    from torch._C._dynamo.eval_frame import _debug_get_cache_entry_list
    seen = set() if seen is None else seen
    if code in seen:
        return []
    seen.add(code)
    out = [(label, e) for e in reversed(_debug_get_cache_entry_list(code))]
    try:
        from torch._dynamo.resume_execution import ContinueExecutionCache
        resumes = ContinueExecutionCache.cache.get(code) or {}
    except (ImportError, AttributeError):
        resumes = {}
    if depth < 8:
        for resume in resumes.values():
            line = resume.co_name.rsplit("_at_", 1)[-1]
            out += _dynamo_entries(resume, f"after the graph break at line {line}", depth + 1, seen)
    return out


_TENSOR_CHECK = re.compile(r"check_tensor\((?P<src>.+?), \w+, DispatchKeySet\([^)]*\), torch\.(?P<dtype>\w+), "
                           r"device=[^,]*, requires_grad=(?P<grad>\w+), size=\[(?P<size>[^\]]*)\]")
_GUARD_LINE = re.compile(r"^[\s|]*\+- (?P<kind>[A-Z_]+): (?P<text>.*?)(?:\s+#.*)?$")


def _dynamo_guard_words(tree):
    """The guards of Dynamo's tree (str() of a cache entry's guard manager)
    in the words of the jit door's: the arguments' and globals' tensors
    (dtype, sizes), relations of sizes, the values of globals and of the
    module's own attributes (self.scale); the module's tensors (self.l.weight)
    and its submodules' attribute values counted in one line (like the jit door's snapshots of
    modules' dicts), the other checks (object identities, types, global
    state) in another."""
    out, inner, values, others = [], 0, 0, 0
    for line in tree.splitlines():
        m = _GUARD_LINE.match(line)
        if m is None:
            continue
        kind, text = m["kind"], m["text"].strip()
        t = _TENSOR_CHECK.search(text) if kind == "TENSOR_MATCH" else None
        if t and "." in _dynamo_name(t["src"]):  # a module's parameter or buffer (self.l.weight)
            inner += 1
        elif t:
            sizes = [("*" if d.strip() == "None" else d.strip()) for d in t["size"].split(",") if d.strip()]
            out.append(f"{_dynamo_name(t['src'])}: {t['dtype']} ({', '.join(sizes)}{',' if len(sizes) == 1 else ''})"
                       + (" requires_grad" if t["grad"] == "True" else ""))
        elif kind == "LAMBDA_GUARD" and ".size()[" in text and ".stride()" not in text:
            out.append(_dynamo_sizes(text))
        elif kind == "EQUALS_MATCH" and re.match(r"^[LG]\[", text):
            name = _dynamo_name(text.split(" == ")[0])
            if re.fullmatch(r"(global )?\w+(\.\w+)?", name) and "__import_" not in name:  # x, self.scale, global STEP
                out.append(_dynamo_name(text))
            else:
                values += 1
        else:
            others += 1
    counted = [f"{n} {what}" for n, what in ((inner, "tensors"), (values, "attribute values")) if n]
    if counted:
        out.append(f"{' and '.join(counted)} of modules as traced (parameters, buffers, settings)")
    if others:
        out.append(f"{others} other checks (object identities, types, global state)")
    return out


def _dynamo_sizes(text):
    """A relation of sizes Dynamo guards, in our words: "2 <= L['x'].size()[0]" -> "sizes: 2 <= x.size(0)"."""
    return "sizes: " + re.sub(r"\.size\(\)\[(\d+)\]", r".size(\1)", _dynamo_name(text))


def dynamo_explanation(fn, ours):
    """The Explanation of torch.compile's fn through back end ours: each of
    Dynamo's cache entries (after graph breaks too), its graphs' words and
    hits (their plans' runs), its guards; recompiles by reason."""
    codes = dynamo_codes(fn)
    variants, site_, seen = [], Site(where(codes[-1]) if codes else repr(fn)), set()
    module = getattr(fn, "_orig_mod", None)
    if module is None:
        # a callable torch.compile runs through wrap_inline (a functools.partial): the entries that want it
        module = _wrap_inline_callee(getattr(fn, "_torchdynamo_orig_callable", None))
    for code in codes:
        s = _dynamo_sites.get(code) or _dynamo_sites.get(_dynamo_site_key(code, {"fn": module}))
        if s is not None:  # the recompiles counted for it (dynamo_recompile)
            site_.misses.update(s.misses)
            site_.changes.update(s.changes)
            site_.decisions.extend(s.decisions)
        for label, entry in _dynamo_entries(code, "", seen=seen):
            if not _dynamo_serves(entry, code, module):
                continue  # an entry of another module or class, on code several modules run
            cid = str(entry.compile_id)
            graphs = [(ref(), w) for ref, w in _dynamo_graphs.get(cid, (None, ()))[1]]
            name = f"compile {cid}" + (f", {label}" if label else "")
            guards = _dynamo_guard_words(str(entry.guard_manager))
            if not _backend_is(entry.backend, ours):
                kind, hits, words = "another back end", None, "not compiled by torchneuron_jit"
            elif all(p is None for p, _ in graphs):
                kind, hits, words = "no graph", None, "Dynamo found no tensor ops to compile here (or its graph is forgotten)"
            else:
                plans = [p for p, _ in graphs]
                kind = "compiled" if all(isinstance(p, _C.Plan) for p in plans) else "runs eagerly"
                if kind == "compiled" and any("*" in g for g in guards if "(" in g):
                    kind = "compiled, dynamic sizes"
                if any(isinstance(p, _C.Plan) and p.is_eager for p in plans):
                    kind = "runs eagerly since a step failed at run time"
                hits = plans[0].runs if isinstance(plans[0], _C.Plan) else None
                words = "; ".join(w for _, w in graphs)
                if len(graphs) > 1:
                    words = f"{len(graphs)} graphs: {words}"
            variants.append({"name": name, "kind": kind, "hits": hits, "graph": words, "guards": guards})
    door = "torch.compile(backend='neuron')" if all(v["kind"] != "another back end" for v in variants) else \
        "torch.compile"
    head = f"{site_.where} under {door}: {len(variants)} compiled entr{'y' if len(variants) == 1 else 'ies'}"
    return Explanation(head, variants, site_)
