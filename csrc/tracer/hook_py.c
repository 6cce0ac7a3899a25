/*
** The frame hook (PEP 523, tracer.h): a jit call's own frame is run by
** its entries' runners when their guards pass, else traced into a new
** entry, else evaluated as Python does.
*/
#include "tracer_internal.h"

#include "../tn_config.h"
#include "../tn_stats.h"

_Thread_local tn_active *tn_hook_active;
_Thread_local int tn_hook_tracing;
PyObject *tn_hook_side_exit;

#if TN_JIT_SUPPORTED
/* The hook ours replaced, put back when the last jit call ends. Frames are
** evaluated by CPython's own function, not by it: a hook installed while
** ours was (Dynamo's, in torch.compile of a jitted function) chains to ours,
** and ours chaining back to it recursed until the stack overflowed. */
static _PyFrameEvalFunction prev_eval;
static long hook_users;

static PyObject *jit_eval_frame(PyThreadState *ts, _PyInterpreterFrame *f, int throwflag);

void tn_hook_add(void)
{
  if (hook_users++ == 0) {
    PyInterpreterState *interp = PyInterpreterState_Get();
    prev_eval = _PyInterpreterState_GetEvalFrameFunc(interp);
    if (prev_eval == jit_eval_frame)
      prev_eval = _PyEval_EvalFrameDefault;
    _PyInterpreterState_SetEvalFrameFunc(interp, jit_eval_frame);
  }
}

void tn_hook_remove(void)
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

PyObject *tn_tracer_call(JitFunctionObject *jf, const char *name, PyObject *args)
{
  PyObject *m = args ? PyObject_GetAttrString(jf->jf_tracer, name) : NULL;
  PyObject *r = m ? PyObject_Call(m, args, NULL) : NULL;
  Py_XDECREF(m);
  Py_XDECREF(args);
  return r;
}

int tn_tracer_failed(JitFunctionObject *jf, const char *what)
{
  int rc = 0;
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (type && PyErr_GivenExceptionMatches(type, PyExc_Warning)) {
    PyErr_Restore(type, value, tb);  /* a filter's error: the call raises it as it is */
    return -1;
  }
  if (PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "torchneuron_jit: %S: %s (%S: %S)", jf->jf_fn, what,
                       type ? type : Py_None, value ? value : Py_None) < 0)
    rc = -1;
  Py_XDECREF(type);
  Py_XDECREF(value);
  Py_XDECREF(tb);
  return rc;
}

PyObject *tn_hook_frame_args(_PyInterpreterFrame *f)
{
  Py_ssize_t nargs = frame_nargs(f->f_code);
  PyObject *args = PyTuple_New(nargs);
  for (Py_ssize_t k = 0; args && k < nargs; k++)
    PyTuple_SET_ITEM(args, k, Py_NewRef(f->localsplus[k] ? f->localsplus[k] : Py_None));
  return args;
}

/* The traced path of a miss: evaluates f under the tracer and adds the entry it makes. */
/* Evicts jf's entry i (a cold one) to make room, counted and told to the tracer: 0, or -1 with a warning a
** filter made an error set (tn_tracer_failed). */
static int evict(JitFunctionObject *jf, tn_entries *cs, int i)
{
  uint64_t unused, hits;
  tn_entries_evict(cs, i, &unused, &hits);
  tn_stat_add(TN_STAT_variants_evicted, 1);
  PyObject *r = tn_tracer_call(jf, "evicted", Py_BuildValue("(OKK)", (PyObject *)jf, (unsigned long long)unused,
                                                            (unsigned long long)hits));
  int rc = r ? 0 : tn_tracer_failed(jf, "noting an evicted variant failed");
  Py_XDECREF(r);
  return rc;
}

static PyObject *trace_frame(PyThreadState *ts, _PyInterpreterFrame *f, tn_active *a, tn_entries *cs,
                             PyObject *reason)
{
  PyObject *args = tn_hook_frame_args(f), *codes = PyList_New(0), *token = NULL, *res = NULL;
  int again = cs->es_n > 0;  /* a recompile: the function had a variant (one evicted below included) */
  if (!args || !codes)
    goto done;
  if (note_frame_into(codes, f) < 0)
    goto done;
  token = tn_tracer_call(a->ac_jf, "begin", PyTuple_Pack(5, a->ac_jf->jf_fn, args, codes, reason, a->ac_jf));
  if (!token || token == Py_None) {  /* None: not now (a build is in flight); the call runs as Python does */
    if (!token && tn_tracer_failed(a->ac_jf, "tracing failed, the call runs eagerly") < 0)
      goto done;
    res = _PyEval_EvalFrameDefault(ts, f, 0);
    goto done;
  }
  int limit = tn_entries_limit(a->ac_jf), cold;
  /* the miss found one cold (jit_frame), and it traces: the cold one makes room (a failure that raises ends
  ** the trace unrun) */
  if (cs->es_n < limit || (cold = tn_entries_cold(cs, limit, tn_config_int(TN_CFG_jit_evict_after))) < 0 ||
      evict(a->ac_jf, cs, cold) == 0) {
    tn_stat_add(TN_STAT_traces, 1);
    if (again)  /* not a call that ran eagerly untraced (a build in flight, a backoff) */
      tn_stat_add(TN_STAT_recompiles, 1);
    a->ac_codes = codes;
    tn_hook_tracing++;
    res = _PyEval_EvalFrameDefault(ts, f, 0);
    tn_hook_tracing--;
    a->ac_codes = NULL;
  }
  if (!res) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *r = tn_tracer_call(a->ac_jf, "abort", PyTuple_Pack(1, token));
    if (!r && tn_tracer_failed(a->ac_jf, "ending a trace the call aborted failed") < 0)
      PyErr_Clear();  /* the call's own exception comes out */
    Py_XDECREF(r);
    PyErr_Restore(type, value, tb);
    goto done;
  }
  PyObject *entry = tn_tracer_call(a->ac_jf, "end", PyTuple_Pack(2, token, res));
  if ((!entry || (entry != Py_None && tn_entries_add(cs, entry) < 0)) &&
      tn_tracer_failed(a->ac_jf, "making an entry of a trace failed (the call's eager result stands; no variant added)") <
          0)
    Py_CLEAR(res);
  Py_XDECREF(entry);
done:
  Py_XDECREF(args);
  Py_XDECREF(codes);
  Py_XDECREF(token);
  return res;
}

/* The jit call's own frame: entries, else a trace. */
static PyObject *jit_frame(PyThreadState *ts, _PyInterpreterFrame *f, tn_active *a)
{
  PyObject *small[64], **slots = small, *res = NULL, *reason = NULL;
  tn_codestate *code_state = tn_codestate_get((PyObject *)f->f_code, 0);
  tn_entries *cs = &a->ac_jf->jf_entries;
  if (!code_state && PyErr_Occurred())
    return NULL;
  if ((code_state && code_state->cs_disabled) || cs->es_gave_up)
    return _PyEval_EvalFrameDefault(ts, f, 0);
  if (cs->es_code != (PyObject *)f->f_code) {
    tn_entries_clear(cs);  /* none, or traced for code the function no longer has */
    Py_XSETREF(cs->es_code, Py_NewRef(f->f_code));
  }
  Py_ssize_t nargs = frame_nargs(f->f_code);
  JitFunctionObject *jf = a->ac_jf;
  int limit = tn_entries_limit(jf);
  cs->es_clock = jf->jf_calls;
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
    /* a guard that runs Python (G_CALL, an __eq__) may let another thread publish, evict or add entries:
    ** the set is held through its check, and a list that changed meanwhile is looked up again */
    tn_gset *gs = e->en_gs;
    uint64_t gen = cs->es_gen;
    tn_guards_hold(gs);
    Py_ssize_t r = tn_guards_check(gs, f->localsplus, nargs, slots);
    tn_guards_free(gs);
    if (r == -2)
      goto done;
    if (cs->es_gen != gen)
      goto retry;
    if (r >= 0)
      continue;
    PyObject *runner = e->en_runner;
    if (runner == Py_None) {
      e->en_hits++;
      tn_entries_touch(cs, i);
      res = _PyEval_EvalFrameDefault(ts, f, 0);
      goto done;
    }
    res = run_entry(e, slots);
    if (!res && PyErr_ExceptionMatches(PyExc_Exception)) {
      /* the compiled call raised (bad input: an index out of range): the frame runs as eager runs it, for
      ** eager's exception, the writes eager makes before it, or the code's own except clause that catches
      ** it. The graph wrote nothing: its write-backs follow its success. */
      PyErr_Clear();
      tn_stat_add(TN_STAT_eager_reruns, 1);
      e->en_hits++;
      tn_entries_touch(cs, i);
      res = _PyEval_EvalFrameDefault(ts, f, 0);
      goto done;
    }
    if (res != tn_hook_side_exit) {
      /* the runner ran Python: another thread may have added entries meanwhile (a side exit is no hit) */
      for (int j = 0; res && j < cs->es_n; j++)
        if (cs->es_v[j].en_runner == runner) {
          cs->es_v[j].en_hits++;
          tn_entries_touch(cs, j);
          break;
        }
      goto done;
    }
    /* a value read from a tensor differs: the next entries may take it */
    Py_CLEAR(res);
  }
  /* a miss: the persistent cache's trace records first, once */
  if (!looked_up) {
    tn_entries_purge(cs);
    looked_up = 1;
    if (cs->es_n > 0)
      tn_stat_add(TN_STAT_guard_failures, 1);
    int loaded = 0;
    if (cs->es_n < limit) {
      if ((loaded = tn_entries_load(f, jf, cs, limit)) > 0)
        goto retry;
    } else if (tn_entries_cold(cs, limit, tn_config_int(TN_CFG_jit_evict_after)) >= 0 &&
               (loaded = tn_entries_load(f, jf, cs, cs->es_n + 1)) > 0) {
      /* at the limit, a record for this call (a warm process) takes the place of a variant gone cold, as the
      ** call's trace would have: it was traced and stored again in every new process */
      int c = tn_entries_cold(cs, limit, tn_config_int(TN_CFG_jit_evict_after));
      if (c >= 0 && cs->es_n > limit && evict(jf, cs, c) < 0)
        goto done;
      goto retry;
    }
    if (loaded < 0)
      goto done;
  }
  /* at the limit, a variant no call took for a while (a narrower one a dynamic variant superseded) makes room
  ** for this call's, once the tracer traces it */
  int cold = cs->es_n >= limit ? tn_entries_cold(cs, limit, tn_config_int(TN_CFG_jit_evict_after)) : -1;
  if (cs->es_full && cs->es_n >= limit && cold < 0) {
    /* at the limit, warned: the entries keep serving what they take, the rest runs as Python does,
    ** unexplained (a miss's words cost more than the call) */
    res = _PyEval_EvalFrameDefault(ts, f, 0);
    goto done;
  }
  if (cs->es_n > 0) {
    PyObject *args = tn_hook_frame_args(f);
    if (!args)
      goto done;
    /* every entry's first failing guard, for the tracer to find the nearest */
    PyObject *fails = PyList_New(0);
    for (int i = 0; fails && i < cs->es_n; i++) {
      /* held as the lookup above holds them: a check that runs Python may let the list change, whose
      ** entries are explained as they were */
      tn_gset *gs = cs->es_v[i].en_gs;
      PyObject *spec = Py_NewRef(cs->es_v[i].en_spec);
      uint64_t gen = cs->es_gen;
      Py_ssize_t n = tn_guards_nslots(gs);
      PyObject **sl = PyMem_Malloc(sizeof(PyObject *) * (size_t)(n + 1));
      tn_guards_hold(gs);
      Py_ssize_t r = sl ? tn_guards_check(gs, f->localsplus, nargs, sl) : (PyErr_NoMemory(), -2);
      tn_guards_free(gs);
      PyMem_Free(sl);
      PyObject *item = r == -2 ? NULL : Py_BuildValue("(On)", spec, r);
      Py_DECREF(spec);
      if (!item || PyList_Append(fails, item) < 0)
        Py_CLEAR(fails);
      Py_XDECREF(item);
      if (fails && cs->es_gen != gen)
        break;  /* the entries changed: those explained so far stand for them */
    }
    reason = fails ? tn_tracer_call(jf, "explain", Py_BuildValue("(OONO)", jf->jf_fn, args, fails, (PyObject *)jf))
                   : NULL;
    Py_DECREF(args);
    if (!reason) {
      if (tn_tracer_failed(jf, "explaining a guard failure failed (traced without a reason)") < 0)
        goto done;
      reason = Py_NewRef(Py_None);
    }
  } else {
    reason = Py_NewRef(Py_None);
  }
  if (cs->es_gave_up) { /* the manager's answer to this miss (a value read from a tensor keeps changing) */
    res = _PyEval_EvalFrameDefault(ts, f, 0);
    goto done;
  }
  if (cold >= 0) {
    /* the manager's say: not for a miss of a storm it warned of (each variant would take one call) */
    PyObject *r = tn_tracer_call(jf, "may_evict", PyTuple_Pack(2, (PyObject *)jf, reason));
    int may = r ? PyObject_IsTrue(r) : -1;
    Py_XDECREF(r);
    if (may < 0 && tn_tracer_failed(jf, "asking whether to evict a variant failed (none is)") < 0)
      goto done;
    if (may != 1) {
      /* the cold one counts as used now: the next miss is explained and asked about after the same wait, not
      ** on every call of the storm (Python ran: the entries may have changed, so it is looked up again) */
      cold = tn_entries_cold(cs, limit, tn_config_int(TN_CFG_jit_evict_after));
      if (cold >= 0)
        cs->es_v[cold].en_last = cs->es_clock;
      cold = -1;
    }
  }
  if (cs->es_n >= limit && cold < 0) {
    if (!cs->es_full) {
      cs->es_full = 1;
      PyObject *r = tn_tracer_call(jf, "give_up", PyTuple_Pack(3, jf->jf_fn, reason, (PyObject *)jf));
      int failed = !r && tn_tracer_failed(jf, "warning of the entry limit failed (calls no variant takes run "
                                               "eagerly)") < 0;
      Py_XDECREF(r);
      if (failed)
        goto done;
    }
    res = _PyEval_EvalFrameDefault(ts, f, 0);
    goto done;
  }
  res = trace_frame(ts, f, a, cs, reason);
done:
  if (slots != small)
    PyMem_Free(slots);
  Py_XDECREF(reason);
  return res;
}

static PyObject *jit_eval_frame(PyThreadState *ts, _PyInterpreterFrame *f, int throwflag)
{
  tn_active *a = tn_hook_active;
  if (!a || throwflag)
    return _PyEval_EvalFrameDefault(ts, f, throwflag);
  if (a->ac_codes && note_frame_into(a->ac_codes, f) < 0)
    return NULL;
  if (a->ac_consumed || f->f_code != a->ac_code ||
      (f->f_code->co_flags & (CO_GENERATOR | CO_COROUTINE | CO_ASYNC_GENERATOR)))
    return _PyEval_EvalFrameDefault(ts, f, throwflag);
  a->ac_consumed = 1;
  return jit_frame(ts, f, a);
}
#endif /* TN_JIT_SUPPORTED */
