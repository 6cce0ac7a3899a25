/*
** The frame hook, the per-code registry and JitFunction (tracer.h).
*/
#include "tracer.h"

#include "../guards/guards.h"
#include "../tn_config.h"
#include "../tn_stats.h"

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define TN_JIT_SUPPORTED 1
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#else
#define TN_JIT_SUPPORTED 0
#endif

/* -- Per-code state ------------------------------------------------------------ */

typedef struct tn_entry {
  tn_gset *en_gs;
  PyObject *en_spec;     /* the spec, for explanations */
  Py_ssize_t *en_inputs; /* slots passed to the runner */
  Py_ssize_t en_ninputs;
  PyObject *en_runner;   /* None: run the frame as Python does */
} tn_entry;

/* The entries of one JitFunction, most recently used first. */
typedef struct tn_entries {
  tn_entry *es_v;
  int es_n, es_cap;
  int es_gave_up;        /* reached its limit: runs as Python does */
  PyObject *es_code;     /* the code they were traced for (a function's __code__ may be replaced) */
} tn_entries;

/* What a code object keeps in its extra slot. */
typedef struct tn_codestate {
  int cs_disabled;       /* torchneuron_jit.disable */
} tn_codestate;

static Py_ssize_t code_extra_index = -1;
static PyObject *side_exit;  /* _C.SIDE_EXIT */

static void entry_clear(tn_entry *e)
{
  tn_guards_free(e->en_gs);
  Py_XDECREF(e->en_spec);
  Py_XDECREF(e->en_runner);
  PyMem_Free(e->en_inputs);
  memset(e, 0, sizeof *e);
}

/* The extra slot's destructor: runs with the GIL when the code object dies. */
static void codestate_free(void *p)
{
  PyMem_Free(p);
}

/* Empties es (the limit's mark too). The entries are detached before they
** are freed: freeing may run Python that uses es again. */
static void entries_clear(tn_entries *es)
{
  tn_entries old = *es;
  memset(es, 0, sizeof *es);
  for (int i = 0; i < old.es_n; i++)
    entry_clear(&old.es_v[i]);
  PyMem_Free(old.es_v);
  Py_XDECREF(old.es_code);
}

/* The state of code (created when create is set), or NULL (with an
** exception set only when creating failed). */
static tn_codestate *codestate_get(PyObject *code, int create)
{
  void *p = NULL;
  if (_PyCode_GetExtra(code, code_extra_index, &p) < 0)
    return NULL;
  if (p || !create)
    return p;
  tn_codestate *cs = PyMem_Calloc(1, sizeof *cs);
  if (!cs) {
    PyErr_NoMemory();
    return NULL;
  }
  if (_PyCode_SetExtra(code, code_extra_index, cs) < 0) {
    PyMem_Free(cs);
    return NULL;
  }
  return cs;
}

/* Adds an entry at the front from the tracer's (spec, inputs, runner). */
static int entries_add(tn_entries *cs, PyObject *entry)
{
  tn_entry e = {0};
  PyObject *spec, *inputs, *runner;
  if (!PyTuple_Check(entry) || !PyArg_ParseTuple(entry, "O!O!O", &PyList_Type, &spec, &PyTuple_Type, &inputs, &runner))
    goto error;
  if (!(e.en_gs = tn_guards_build(spec)))
    goto error;
  e.en_ninputs = PyTuple_GET_SIZE(inputs);
  if (!(e.en_inputs = PyMem_Malloc(sizeof(Py_ssize_t) * (size_t)(e.en_ninputs + 1)))) {
    PyErr_NoMemory();
    goto error;
  }
  for (Py_ssize_t k = 0; k < e.en_ninputs; k++) {
    e.en_inputs[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(inputs, k));
    if (e.en_inputs[k] < 0 || e.en_inputs[k] >= tn_guards_nslots(e.en_gs)) {
      if (!PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "an entry input names no guard slot");
      goto error;
    }
  }
  if (runner != Py_None && !PyCallable_Check(runner)) {
    PyErr_SetString(PyExc_TypeError, "an entry's runner must be callable or None");
    goto error;
  }
  e.en_spec = Py_NewRef(spec);
  e.en_runner = Py_NewRef(runner);
  if (cs->es_n == cs->es_cap) {
    int cap = cs->es_cap ? 2 * cs->es_cap : 4;
    tn_entry *p = PyMem_Realloc(cs->es_v, sizeof(tn_entry) * (size_t)cap);
    if (!p) {
      PyErr_NoMemory();
      goto error;
    }
    cs->es_v = p;
    cs->es_cap = cap;
  }
  memmove(cs->es_v + 1, cs->es_v, sizeof(tn_entry) * (size_t)cs->es_n);
  cs->es_v[0] = e;
  cs->es_n++;
  return 0;
error:
  entry_clear(&e);
  return -1;
}

/* Removes the entries whose guards lost a weakly held object (a module
** argument that is gone): they can never pass, and would keep its
** parameters and a place under the limit. The removed ones are freed once
** the list is consistent again, since freeing may run Python. */
static void entries_purge(tn_entries *cs)
{
  int dead = 0, kept = 0, n = 0;
  for (int i = 0; i < cs->es_n; i++)
    dead += tn_guards_dead(cs->es_v[i].en_gs);
  tn_entry *gone = dead ? PyMem_Malloc(sizeof(tn_entry) * (size_t)dead) : NULL;
  if (!gone)
    return;  /* none, or no memory: they stay until the next miss */
  for (int i = 0; i < cs->es_n; i++) {
    if (n < dead && tn_guards_dead(cs->es_v[i].en_gs))
      gone[n++] = cs->es_v[i];
    else
      cs->es_v[kept++] = cs->es_v[i];
  }
  cs->es_n = kept;
  for (int k = 0; k < n; k++)
    entry_clear(&gone[k]);
  PyMem_Free(gone);
}

/* Moves entry i to the front (most recently used first). */
static void entries_touch(tn_entries *cs, int i)
{
  if (i > 0) {
    tn_entry hit = cs->es_v[i];
    memmove(cs->es_v + 1, cs->es_v, sizeof(tn_entry) * (size_t)i);
    cs->es_v[0] = hit;
  }
}

/* -- The hook ------------------------------------------------------------------ */

typedef struct JitFunctionObject JitFunctionObject;

/* One jit call in progress on this thread. */
typedef struct tn_active {
  struct tn_active *ac_prev;
  JitFunctionObject *ac_jf;
  PyCodeObject *ac_code;
  int ac_consumed;       /* the call's own frame was seen */
  PyObject *ac_codes;    /* while its frame is traced: (code, globals) of nested frames */
} tn_active;

static _Thread_local tn_active *t_active;
static _Thread_local int t_tracing;

struct JitFunctionObject {
  PyObject_HEAD
  vectorcallfunc jf_vectorcall;
  PyObject *jf_fn;        /* the function */
  PyObject *jf_tracer;
  int jf_limit;           /* entries kept (0: config.jit_cache_limit) */
  tn_entries jf_entries;  /* its traced variants, with the guards that select them */
  PyObject *jf_dict;
  PyObject *jf_weakrefs;
  PyObject *jf_owner;     /* jit(module): a weak reference to the module whose forward this is, or NULL */
};

#if TN_JIT_SUPPORTED
static _PyFrameEvalFunction prev_eval;
static long hook_users;

static PyObject *jit_eval_frame(PyThreadState *ts, _PyInterpreterFrame *f, int throwflag);

static void hook_add(void)
{
  if (hook_users++ == 0) {
    PyInterpreterState *interp = PyInterpreterState_Get();
    prev_eval = _PyInterpreterState_GetEvalFrameFunc(interp);
    if (prev_eval == jit_eval_frame)
      prev_eval = _PyEval_EvalFrameDefault;
    _PyInterpreterState_SetEvalFrameFunc(interp, jit_eval_frame);
  }
}

static void hook_remove(void)
{
  if (--hook_users == 0) {
    PyInterpreterState *interp = PyInterpreterState_Get();
    /* a hook set after ours (a debugger's) stays; it chains to ours no more */
    if (_PyInterpreterState_GetEvalFrameFunc(interp) == jit_eval_frame)
      _PyInterpreterState_SetEvalFrameFunc(interp, prev_eval);
  }
}

static Py_ssize_t frame_nargs(PyCodeObject *co)
{
  return co->co_argcount + co->co_kwonlyargcount + !!(co->co_flags & CO_VARARGS) +
         !!(co->co_flags & CO_VARKEYWORDS);
}

/* Appends (code, globals) of frame f to list codes. */
static int note_frame_into(PyObject *codes, _PyInterpreterFrame *f)
{
  PyObject *t = PyTuple_Pack(2, (PyObject *)f->f_code, f->f_globals);
  int rc = t ? PyList_Append(codes, t) : -1;
  Py_XDECREF(t);
  return rc;
}

/* Runs a hit: the runner on the slots its entry names. */
static PyObject *run_entry(tn_entry *e, PyObject **slots)
{
  PyObject *small[8], **argv = small;
  if (e->en_ninputs > 8 && !(argv = PyMem_Malloc(sizeof(PyObject *) * (size_t)e->en_ninputs)))
    return PyErr_NoMemory();
  for (Py_ssize_t k = 0; k < e->en_ninputs; k++)
    argv[k] = slots[e->en_inputs[k]];
  PyObject *runner = Py_NewRef(e->en_runner);  /* a trace on another thread may drop the entry */
  PyObject *res = PyObject_Vectorcall(runner, argv, (size_t)e->en_ninputs, NULL);
  Py_DECREF(runner);
  if (argv != small)
    PyMem_Free(argv);
  return res;
}

/* Calls tracer.name(*args); a new reference or NULL. */
static PyObject *tracer_call(JitFunctionObject *jf, const char *name, PyObject *args)
{
  PyObject *m = args ? PyObject_GetAttrString(jf->jf_tracer, name) : NULL;
  PyObject *r = m ? PyObject_Call(m, args, NULL) : NULL;
  Py_XDECREF(m);
  Py_XDECREF(args);
  return r;
}

/* A failure of ours in the tracer (the exception set): one RuntimeWarning
** naming it and what the call does instead; the call goes on. With warnings
** made errors, the report goes to sys.unraisablehook instead. */
static void tracer_failed(JitFunctionObject *jf, const char *what)
{
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "torchneuron_jit: %S: %s (%S: %S)", jf->jf_fn, what,
                       type ? type : Py_None, value ? value : Py_None) < 0)
    PyErr_WriteUnraisable(jf->jf_fn);
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
}

/* The arguments of frame f as a new tuple, or NULL. */
static PyObject *frame_args(_PyInterpreterFrame *f)
{
  Py_ssize_t nargs = frame_nargs(f->f_code);
  PyObject *args = PyTuple_New(nargs);
  for (Py_ssize_t k = 0; args && k < nargs; k++)
    PyTuple_SET_ITEM(args, k, Py_NewRef(f->localsplus[k] ? f->localsplus[k] : Py_None));
  return args;
}

/* The traced path of a miss: evaluates f under the tracer and adds the entry it makes. */
static PyObject *trace_frame(PyThreadState *ts, _PyInterpreterFrame *f, tn_active *a, tn_entries *cs,
                             PyObject *reason)
{
  PyObject *args = frame_args(f), *codes = PyList_New(0), *token = NULL, *res = NULL;
  if (!args || !codes)
    goto done;
  if (note_frame_into(codes, f) < 0)
    goto done;
  token = tracer_call(a->ac_jf, "begin", PyTuple_Pack(4, a->ac_jf->jf_fn, args, codes, reason));
  if (!token) {
    tracer_failed(a->ac_jf, "tracing failed, the call runs eagerly");
    res = prev_eval(ts, f, 0);
    goto done;
  }
  tn_stat_add(TN_STAT_traces, 1);
  a->ac_codes = codes;
  t_tracing++;
  res = prev_eval(ts, f, 0);
  t_tracing--;
  a->ac_codes = NULL;
  if (!res) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *r = tracer_call(a->ac_jf, "abort", PyTuple_Pack(1, token));
    if (!r)
      tracer_failed(a->ac_jf, "ending a trace the call aborted failed");
    Py_XDECREF(r);
    PyErr_Restore(type, value, tb);
    goto done;
  }
  PyObject *entry = tracer_call(a->ac_jf, "end", PyTuple_Pack(2, token, res));
  if (!entry || (entry != Py_None && entries_add(cs, entry) < 0))
    tracer_failed(a->ac_jf, "making an entry of a trace failed (the call's eager result stands; no variant added)");
  Py_XDECREF(entry);
done:
  Py_XDECREF(args);
  Py_XDECREF(codes);
  Py_XDECREF(token);
  return res;
}

/* Asks tracer.load for entries made from the persistent cache's trace
** records for f's arguments and adds them while fewer than limit are held.
** Returns how many it added (0 after a failure of the tracer: a warning). */
static int load_entries(_PyInterpreterFrame *f, JitFunctionObject *jf, tn_entries *cs, int limit)
{
  int rc = 0;
  PyObject *args = frame_args(f);
  PyObject *loaded = args ? tracer_call(jf, "load", PyTuple_Pack(3, jf->jf_fn, args, (PyObject *)jf)) : NULL;
  if (loaded && !PyList_Check(loaded)) {
    PyErr_Format(PyExc_TypeError, "tracer.load returned %s, not a list", Py_TYPE(loaded)->tp_name);
    Py_CLEAR(loaded);
  }
  for (Py_ssize_t k = 0; loaded && k < PyList_GET_SIZE(loaded) && cs->es_n < limit; k++) {
    if (entries_add(cs, PyList_GET_ITEM(loaded, k)) < 0)
      Py_CLEAR(loaded);
    else
      rc++;
  }
  if (!loaded)
    tracer_failed(jf, "loading trace records from the persistent cache failed (the call traces instead)");
  Py_XDECREF(loaded);
  Py_XDECREF(args);
  return rc;
}

/* The jit call's own frame: entries, else a trace. */
static PyObject *jit_frame(PyThreadState *ts, _PyInterpreterFrame *f, tn_active *a)
{
  PyObject *small[64], **slots = small, *res = NULL, *reason = NULL;
  tn_codestate *code_state = codestate_get((PyObject *)f->f_code, 0);
  tn_entries *cs = &a->ac_jf->jf_entries;
  if (!code_state && PyErr_Occurred())
    return NULL;
  if ((code_state && code_state->cs_disabled) || cs->es_gave_up)
    return prev_eval(ts, f, 0);
  if (cs->es_code != (PyObject *)f->f_code) {
    entries_clear(cs);  /* none, or traced for code the function no longer has */
    Py_XSETREF(cs->es_code, Py_NewRef(f->f_code));
  }
  Py_ssize_t nargs = frame_nargs(f->f_code);
  JitFunctionObject *jf = a->ac_jf;
  int limit = jf->jf_limit > 0 ? jf->jf_limit : (int)tn_config_int(TN_CFG_jit_cache_limit);
  int looked_up = 0;
retry:
  for (int i = 0; i < cs->es_n; i++) {
    tn_entry *e = &cs->es_v[i];
    Py_ssize_t n = tn_guards_nslots(e->en_gs);
    if (slots != small)
      PyMem_Free(slots);
    slots = small;
    if (n > 64 && !(slots = PyMem_Malloc(sizeof(PyObject *) * (size_t)n)))
      return PyErr_NoMemory();
    Py_ssize_t r = tn_guards_check(e->en_gs, f->localsplus, nargs, slots);
    if (r == -2)
      goto done;
    if (r >= 0)
      continue;
    PyObject *runner = e->en_runner;
    if (runner == Py_None) {
      entries_touch(cs, i);
      res = prev_eval(ts, f, 0);
      goto done;
    }
    res = run_entry(e, slots);
    if (res != side_exit) {
      /* the runner ran Python: another thread may have added entries meanwhile */
      for (int j = 0; res && j < cs->es_n; j++)
        if (cs->es_v[j].en_runner == runner) {
          entries_touch(cs, j);
          break;
        }
      goto done;
    }
    /* a value read from a tensor differs: the next entries may take it */
    Py_CLEAR(res);
  }
  /* a miss: the persistent cache's trace records first, once */
  if (!looked_up) {
    entries_purge(cs);
    looked_up = 1;
    if (cs->es_n > 0)
      tn_stat_add(TN_STAT_guard_failures, 1);
    if (cs->es_n < limit) {
      if (load_entries(f, jf, cs, limit) > 0)
        goto retry;
    }
  }
  if (cs->es_n > 0) {
    PyObject *args = frame_args(f);
    if (!args)
      goto done;
    /* every entry's first failing guard, for the tracer to find the nearest */
    PyObject *fails = PyList_New(cs->es_n);
    for (int i = 0; fails && i < cs->es_n; i++) {
      tn_entry *e = &cs->es_v[i];
      Py_ssize_t n = tn_guards_nslots(e->en_gs);
      PyObject **sl = PyMem_Malloc(sizeof(PyObject *) * (size_t)(n + 1));
      Py_ssize_t r = sl ? tn_guards_check(e->en_gs, f->localsplus, nargs, sl) : -2;
      PyMem_Free(sl);
      PyObject *item = r == -2 ? NULL : Py_BuildValue("(On)", e->en_spec, r);
      if (!item)
        Py_CLEAR(fails);
      else
        PyList_SET_ITEM(fails, i, item);
    }
    reason = fails ? tracer_call(jf, "explain", Py_BuildValue("(OON)", jf->jf_fn, args, fails)) : NULL;
    Py_DECREF(args);
    if (!reason) {
      tracer_failed(jf, "explaining a guard failure failed (traced without a reason)");
      reason = Py_NewRef(Py_None);
    }
  } else {
    reason = Py_NewRef(Py_None);
  }
  if (cs->es_n >= limit) {
    cs->es_gave_up = 1;
    PyObject *r = tracer_call(jf, "give_up", PyTuple_Pack(2, jf->jf_fn, reason));
    if (!r)
      tracer_failed(jf, "warning of the entry limit failed (it runs eagerly from now on)");
    Py_XDECREF(r);
    res = prev_eval(ts, f, 0);
    goto done;
  }
  if (cs->es_n > 0)
    tn_stat_add(TN_STAT_recompiles, 1);
  res = trace_frame(ts, f, a, cs, reason);
done:
  if (slots != small)
    PyMem_Free(slots);
  Py_XDECREF(reason);
  return res;
}

static PyObject *jit_eval_frame(PyThreadState *ts, _PyInterpreterFrame *f, int throwflag)
{
  tn_active *a = t_active;
  if (!a || throwflag)
    return prev_eval(ts, f, throwflag);
  if (a->ac_codes && note_frame_into(a->ac_codes, f) < 0)
    return NULL;
  if (a->ac_consumed || f->f_code != a->ac_code ||
      (f->f_code->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR)))
    return prev_eval(ts, f, throwflag);
  a->ac_consumed = 1;
  return jit_frame(ts, f, a);
}
#endif /* TN_JIT_SUPPORTED */

/* -- JitFunction ------------------------------------------------------------ */

static PyObject *JitFunction_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
  JitFunctionObject *jf = (JitFunctionObject *)self;
#if TN_JIT_SUPPORTED
  if (jf->jf_owner && PyVectorcall_NARGS(nargsf) >= 1 && args[0] != PyWeakref_GET_OBJECT(jf->jf_owner)) {
    /* a copy of the module (copy.deepcopy keeps its bound forward): it gets its own variants */
    PyObject *own = tracer_call(jf, "rebind", PyTuple_Pack(2, self, args[0]));
    if (!own)
      tracer_failed(jf, "giving a copy of the module its own variants failed (it shares the original's)");
    else if (own != self) {
      PyObject *res = PyObject_Vectorcall(own, args, nargsf, kwnames);
      Py_DECREF(own);
      return res;
    }
    Py_XDECREF(own);
  }
  if (t_tracing == 0) {
    tn_active a = {t_active, jf, (PyCodeObject *)PyFunction_GET_CODE(jf->jf_fn), 0, NULL};
    t_active = &a;
    hook_add();
    PyObject *res = PyObject_Vectorcall(jf->jf_fn, args, nargsf, kwnames);
    hook_remove();
    t_active = a.ac_prev;
    return res;
  }
#endif
  return PyObject_Vectorcall(jf->jf_fn, args, nargsf, kwnames);
}

static PyObject *JitFunction_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
  static char *kwlist[] = {"fn", "tracer", "limit", NULL};
  PyObject *fn, *tracer;
  int limit = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|i:JitFunction", kwlist, &fn, &tracer, &limit))
    return NULL;
  if (!PyFunction_Check(fn)) {
    PyErr_Format(PyExc_TypeError, "JitFunction needs a Python function, not %s", Py_TYPE(fn)->tp_name);
    return NULL;
  }
  JitFunctionObject *jf = (JitFunctionObject *)type->tp_alloc(type, 0);
  if (!jf)
    return NULL;
  jf->jf_vectorcall = JitFunction_vectorcall;
  jf->jf_fn = Py_NewRef(fn);
  jf->jf_tracer = Py_NewRef(tracer);
  jf->jf_limit = limit;
  return (PyObject *)jf;
}

/* The entries take part in the collector's view: their guards hold the
** module's dicts, and the module holds this JitFunction (as its forward),
** so a jitted module nobody else holds is freed with its entries. */
static int JitFunction_traverse(PyObject *o, visitproc visit, void *arg)
{
  JitFunctionObject *jf = (JitFunctionObject *)o;
  Py_VISIT(jf->jf_fn);
  Py_VISIT(jf->jf_tracer);
  Py_VISIT(jf->jf_dict);
  Py_VISIT(jf->jf_owner);
  for (int i = 0; i < jf->jf_entries.es_n; i++) {
    tn_entry *e = &jf->jf_entries.es_v[i];
    Py_VISIT(e->en_spec);
    Py_VISIT(e->en_runner);
    int rc = tn_guards_traverse(e->en_gs, visit, arg);
    if (rc)
      return rc;
  }
  return 0;
}

static int JitFunction_clear(PyObject *o)
{
  JitFunctionObject *jf = (JitFunctionObject *)o;
  entries_clear(&jf->jf_entries);
  Py_CLEAR(jf->jf_fn);
  Py_CLEAR(jf->jf_tracer);
  Py_CLEAR(jf->jf_dict);
  Py_CLEAR(jf->jf_owner);
  return 0;
}

/* entries() -> [(spec, runner)], most recently used first */
static PyObject *JitFunction_entries(PyObject *o, PyObject *unused)
{
  tn_entries *es = &((JitFunctionObject *)o)->jf_entries;
  (void)unused;
  PyObject *list = PyList_New(es->es_n);
  for (int i = 0; list && i < es->es_n; i++) {
    PyObject *t = PyTuple_Pack(2, es->es_v[i].en_spec, es->es_v[i].en_runner);
    if (!t)
      Py_CLEAR(list);
    else
      PyList_SET_ITEM(list, i, t);
  }
  return list;
}

/* reset(): drops the entries and the reached-the-limit mark */
static PyObject *JitFunction_reset(PyObject *o, PyObject *unused)
{
  (void)unused;
  entries_clear(&((JitFunctionObject *)o)->jf_entries);
  Py_RETURN_NONE;
}

static PyObject *JitFunction_get_gave_up(PyObject *o, void *c)
{
  (void)c;
  return PyBool_FromLong(((JitFunctionObject *)o)->jf_entries.es_gave_up);
}

/* __reduce__(): pickled by reference, as the function it wraps is: its
** qualified name (pickle finds it in its module: the decorated function) */
static PyObject *JitFunction_reduce(PyObject *o, PyObject *unused)
{
  (void)unused;
  return PyObject_GetAttrString(((JitFunctionObject *)o)->jf_fn, "__qualname__");
}

static PyMethodDef JitFunction_methods[] = {
  {"__reduce__", JitFunction_reduce, METH_NOARGS, "pickled by reference, by its function's qualified name"},
  {"entries", JitFunction_entries, METH_NOARGS, "entries() -> [(guard spec, runner)], most recently used first"},
  {"reset", JitFunction_reset, METH_NOARGS, "reset(): drops the entries and the reached-the-limit mark"},
  {NULL, NULL, 0, NULL},
};

static void JitFunction_dealloc(PyObject *o)
{
  PyObject_GC_UnTrack(o);
  if (((JitFunctionObject *)o)->jf_weakrefs)
    PyObject_ClearWeakRefs(o);
  JitFunction_clear(o);
  Py_TYPE(o)->tp_free(o);
}

/* A JitFunction in a class body binds like the function it wraps. */
static PyObject *JitFunction_get(PyObject *self, PyObject *obj, PyObject *type)
{
  (void)type;
  if (!obj || obj == Py_None)
    return Py_NewRef(self);
  return PyMethod_New(self, obj);
}

static PyObject *JitFunction_call(PyObject *self, PyObject *args, PyObject *kwargs)
{
  return PyVectorcall_Call(self, args, kwargs);
}

static PyObject *JitFunction_get_fn(PyObject *o, void *c)
{
  (void)c;
  return Py_NewRef(((JitFunctionObject *)o)->jf_fn);
}

static PyObject *JitFunction_get_limit(PyObject *o, void *c)
{
  (void)c;
  return PyLong_FromLong(((JitFunctionObject *)o)->jf_limit);
}

static PyObject *JitFunction_get_owner(PyObject *o, void *c)
{
  (void)c;
  PyObject *ref = ((JitFunctionObject *)o)->jf_owner;
  return Py_NewRef(ref ? PyWeakref_GET_OBJECT(ref) : Py_None);
}

static int JitFunction_set_owner(PyObject *o, PyObject *value, void *c)
{
  (void)c;
  PyObject *ref = value && value != Py_None ? PyWeakref_NewRef(value, NULL) : NULL;
  if (!ref && value && value != Py_None)
    return -1;
  Py_XSETREF(((JitFunctionObject *)o)->jf_owner, ref);
  return 0;
}

static PyGetSetDef JitFunction_getset[] = {
  {"owner", JitFunction_get_owner, JitFunction_set_owner,
   "jit(module): the module whose forward this is (held weakly); a call through a copy of it gives the copy "
   "its own JitFunction (tracer.rebind)", NULL},
  {"fn", JitFunction_get_fn, NULL, "the function this calls", NULL},
  {"limit", JitFunction_get_limit, NULL, "entries kept (0: config.jit_cache_limit)", NULL},
  {"gave_up", JitFunction_get_gave_up, NULL, "whether it reached its limit and runs eagerly", NULL},
  {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject JitFunctionType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "torchneuron_jit._C.JitFunction",
  .tp_basicsize = sizeof(JitFunctionObject),
  .tp_dealloc = JitFunction_dealloc,
  .tp_vectorcall_offset = offsetof(JitFunctionObject, jf_vectorcall),
  .tp_call = JitFunction_call,
  .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL |
              Py_TPFLAGS_METHOD_DESCRIPTOR,
  .tp_doc = "JitFunction(fn, tracer, limit=0): fn, run through the frame hook (csrc/tracer/tracer.h)",
  .tp_traverse = JitFunction_traverse,
  .tp_clear = JitFunction_clear,
  .tp_getset = JitFunction_getset,
  .tp_methods = JitFunction_methods,
  .tp_descr_get = JitFunction_get,
  .tp_dictoffset = offsetof(JitFunctionObject, jf_dict),
  .tp_weaklistoffset = offsetof(JitFunctionObject, jf_weakrefs),
  .tp_new = JitFunction_new,
};

/* -- DirectRunner ------------------------------------------------------------ */

/* An entry's runner for the common case, in C: it calls the compiled
** plan on the entry's inputs (plan.call) and returns item `index` of its
** result, skipping the Python runner (value checks, write-backs and result
** rebuilding it has none of). A failure is the plan's to settle (csrc/
** fallback: ours runs eagerly, the user's propagates), so whatever forward
** raises propagates. Other attributes are the Python runner's. */
typedef struct {
  PyObject_HEAD
  vectorcallfunc dr_vectorcall;
  PyObject *dr_forward;
  Py_ssize_t dr_index;
  PyObject *dr_runner;
} DirectRunnerObject;

static PyObject *DirectRunner_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
  DirectRunnerObject *dr = (DirectRunnerObject *)self;
  if (!dr->dr_forward)
    return PyErr_Format(PyExc_RuntimeError, "DirectRunner: called after it was cleared");
  PyObject *res, *forward = Py_NewRef(dr->dr_forward);
  PyObject *out = PyObject_Vectorcall(forward, args, PyVectorcall_NARGS(nargsf), kwnames);
  Py_DECREF(forward);
  if (!out)
    return NULL;
  if (PyTuple_Check(out) && dr->dr_index < PyTuple_GET_SIZE(out))
    res = Py_NewRef(PyTuple_GET_ITEM(out, dr->dr_index));
  else
    res = PySequence_GetItem(out, dr->dr_index);
  Py_DECREF(out);
  return res;
}

static PyObject *DirectRunner_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
  static char *kwlist[] = {"forward", "index", "runner", NULL};
  PyObject *forward, *runner;
  Py_ssize_t index;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OnO:DirectRunner", kwlist, &forward, &index, &runner))
    return NULL;
  if (!PyCallable_Check(forward) || !PyCallable_Check(runner) || index < 0) {
    PyErr_SetString(PyExc_TypeError, "DirectRunner(forward, index, runner): two callables and an index >= 0");
    return NULL;
  }
  DirectRunnerObject *dr = (DirectRunnerObject *)type->tp_alloc(type, 0);
  if (!dr)
    return NULL;
  dr->dr_vectorcall = DirectRunner_vectorcall;
  dr->dr_forward = Py_NewRef(forward);
  dr->dr_index = index;
  dr->dr_runner = Py_NewRef(runner);
  return (PyObject *)dr;
}

static int DirectRunner_traverse(PyObject *o, visitproc visit, void *arg)
{
  Py_VISIT(((DirectRunnerObject *)o)->dr_forward);
  Py_VISIT(((DirectRunnerObject *)o)->dr_runner);
  return 0;
}

static int DirectRunner_clear(PyObject *o)
{
  Py_CLEAR(((DirectRunnerObject *)o)->dr_forward);
  Py_CLEAR(((DirectRunnerObject *)o)->dr_runner);
  return 0;
}

static void DirectRunner_dealloc(PyObject *o)
{
  PyObject_GC_UnTrack(o);
  DirectRunner_clear(o);
  Py_TYPE(o)->tp_free(o);
}

/* Attributes it has not are the Python runner's (record, compiled, ...). */
static PyObject *DirectRunner_getattro(PyObject *o, PyObject *name)
{
  PyObject *r = PyObject_GenericGetAttr(o, name);
  if (!r && PyErr_ExceptionMatches(PyExc_AttributeError) && ((DirectRunnerObject *)o)->dr_runner) {
    PyErr_Clear();
    r = PyObject_GetAttr(((DirectRunnerObject *)o)->dr_runner, name);
  }
  return r;
}

static int DirectRunner_setattro(PyObject *o, PyObject *name, PyObject *value)
{
  return PyObject_SetAttr(((DirectRunnerObject *)o)->dr_runner, name, value);
}

static PyObject *DirectRunner_get_runner(PyObject *o, void *c)
{
  (void)c;
  return Py_NewRef(((DirectRunnerObject *)o)->dr_runner);
}

static PyGetSetDef DirectRunner_getset[] = {
  {"runner", DirectRunner_get_runner, NULL, "the Python runner it stands for", NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject DirectRunnerType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "torchneuron_jit._C.DirectRunner",
  .tp_basicsize = sizeof(DirectRunnerObject),
  .tp_dealloc = DirectRunner_dealloc,
  .tp_vectorcall_offset = offsetof(DirectRunnerObject, dr_vectorcall),
  .tp_call = PyVectorcall_Call,
  .tp_getattro = DirectRunner_getattro,
  .tp_setattro = DirectRunner_setattro,
  .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
  .tp_doc = "DirectRunner(forward, index, runner): an entry's runner calling its compiled graph directly",
  .tp_traverse = DirectRunner_traverse,
  .tp_clear = DirectRunner_clear,
  .tp_getset = DirectRunner_getset,
  .tp_new = DirectRunner_new,
};

/* -- Module functions ------------------------------------------------------------ */

static PyObject *code_of(PyObject *arg)
{
  if (PyCode_Check(arg))
    return arg;
  if (PyFunction_Check(arg))
    return PyFunction_GET_CODE(arg);
  PyErr_Format(PyExc_TypeError, "expected a function or code object, not %s", Py_TYPE(arg)->tp_name);
  return NULL;
}

/* jit_disable(fn_or_code, on=True): never trace it (torchneuron_jit.disable) */
static PyObject *py_jit_disable(PyObject *self, PyObject *args)
{
  PyObject *arg;
  int on = 1;
  (void)self;
  if (!PyArg_ParseTuple(args, "O|p:jit_disable", &arg, &on))
    return NULL;
  PyObject *code = code_of(arg);
  tn_codestate *cs = code ? codestate_get(code, 1) : NULL;
  if (!cs)
    return NULL;
  cs->cs_disabled = on;
  Py_RETURN_NONE;
}

/* jit_disabled(fn_or_code) -> whether jit_disable marked it */
static PyObject *py_jit_disabled(PyObject *self, PyObject *arg)
{
  (void)self;
  PyObject *code = code_of(arg);
  if (!code)
    return NULL;
  tn_codestate *cs = codestate_get(code, 0);
  if (!cs && PyErr_Occurred())
    return NULL;
  return PyBool_FromLong(cs && cs->cs_disabled);
}

/* jit_tracing() -> whether this thread is tracing a jit call */
static PyObject *py_jit_tracing(PyObject *self, PyObject *unused)
{
  (void)self;
  (void)unused;
  return PyBool_FromLong(t_tracing > 0);
}

/* class_dict(type) -> the dict behind type.__dict__ (a mappingproxy), for
** a guard to snapshot: only read, never written */
static PyObject *py_class_dict(PyObject *self, PyObject *arg)
{
  (void)self;
  if (!PyType_Check(arg) || !((PyTypeObject *)arg)->tp_dict) {
    PyErr_Format(PyExc_TypeError, "class_dict needs a ready type, not %s", Py_TYPE(arg)->tp_name);
    return NULL;
  }
  return Py_NewRef(((PyTypeObject *)arg)->tp_dict);
}

PyMethodDef tn_py_tracer_methods[] = {
  {"class_dict", py_class_dict, METH_O, "class_dict(type) -> the dict behind type.__dict__, for a guard to snapshot"},
  {"jit_disable", py_jit_disable, METH_VARARGS, "jit_disable(fn_or_code, on=True): never trace it"},
  {"jit_disabled", py_jit_disabled, METH_O, "jit_disabled(fn_or_code) -> whether jit_disable marked it"},
  {"jit_tracing", py_jit_tracing, METH_NOARGS, "whether this thread is tracing a jit call"},
  {NULL, NULL, 0, NULL},
};

extern PyTypeObject tn_py_GuardSetType;

int tn_py_tracer_init(PyObject *m)
{
  code_extra_index = _PyEval_RequestCodeExtraIndex(codestate_free);
  if (code_extra_index < 0) {
    PyErr_SetString(PyExc_RuntimeError, "no code-object extra slot is left");
    return -1;
  }
  if (PyType_Ready(&JitFunctionType) < 0 || PyType_Ready(&tn_py_GuardSetType) < 0 ||
      PyType_Ready(&DirectRunnerType) < 0)
    return -1;
  if (!(side_exit = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type)))
    return -1;
  if (PyModule_AddObjectRef(m, "JitFunction", (PyObject *)&JitFunctionType) < 0 ||
      PyModule_AddObjectRef(m, "GuardSet", (PyObject *)&tn_py_GuardSetType) < 0 ||
      PyModule_AddObjectRef(m, "DirectRunner", (PyObject *)&DirectRunnerType) < 0 ||
      PyModule_AddObjectRef(m, "SIDE_EXIT", side_exit) < 0 ||
      PyModule_AddIntConstant(m, "JIT_SUPPORTED", TN_JIT_SUPPORTED) < 0)
    return -1;
  return 0;
}
