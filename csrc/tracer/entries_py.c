/*
** The registry of compiled variants (tracer_internal.h): a JitFunction's
** entries, most recently used first, the limit on them, and what a code
** object keeps in its extra slot.
*/
#include "tracer_internal.h"

#include "../tn_config.h"

/* -- Entries ------------------------------------------------------------------ */

static Py_ssize_t code_extra_index = -1;

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

int tn_codestate_init(void)
{
  code_extra_index = _PyEval_RequestCodeExtraIndex(codestate_free);
  if (code_extra_index < 0) {
    PyErr_SetString(PyExc_RuntimeError, "no code-object extra slot is left");
    return -1;
  }
  return 0;
}

void tn_entries_clear(tn_entries *es)
{
  tn_entries old = *es;
  memset(es, 0, sizeof *es);
  es->es_gen = old.es_gen + 1;
  for (int i = 0; i < old.es_n; i++)
    entry_clear(&old.es_v[i]);
  PyMem_Free(old.es_v);
  Py_XDECREF(old.es_code);
}

tn_codestate *tn_codestate_get(PyObject *code, int create)
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

/* Makes *out from the tracer's (spec, inputs, runner). 0, or -1 with an
** exception set (*out cleared). */
static int entry_make(PyObject *entry, tn_entry *out)
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
  *out = e;
  return 0;
error:
  entry_clear(&e);
  *out = e;
  return -1;
}

int tn_entries_add(tn_entries *cs, PyObject *entry)
{
  tn_entry e;
  if (entry_make(entry, &e) < 0)
    return -1;
  e.en_last = cs->es_clock;
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
  cs->es_gen++;
  return 0;
error:
  entry_clear(&e);
  return -1;
}

int tn_entries_replace(tn_entries *cs, PyObject *spec, PyObject *entry)
{
  int i = 0;
  while (i < cs->es_n && cs->es_v[i].en_spec != spec)
    i++;
  if (i == cs->es_n)
    return 0;
  tn_entry e = {0}, old = cs->es_v[i];
  if (entry == Py_None) {  /* removed: the later entries move up */
    memmove(cs->es_v + i, cs->es_v + i + 1, sizeof(tn_entry) * (size_t)(cs->es_n - i - 1));
    cs->es_n--;
  } else {
    if (entry_make(entry, &e) < 0)
      return -1;
    e.en_last = cs->es_clock;
    cs->es_v[i] = e;
  }
  cs->es_gen++;
  entry_clear(&old);  /* may run Python: the list is consistent again */
  return 1;
}

void tn_entries_purge(tn_entries *cs)
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
  cs->es_gen++;
  for (int k = 0; k < n; k++)
    entry_clear(&gone[k]);
  PyMem_Free(gone);
}

void tn_entries_touch(tn_entries *cs, int i)
{
  cs->es_v[i].en_last = cs->es_clock;
  if (i > 0) {
    tn_entry hit = cs->es_v[i];
    memmove(cs->es_v + 1, cs->es_v, sizeof(tn_entry) * (size_t)i);
    cs->es_v[0] = hit;
    cs->es_gen++;
  }
}

/* -- The limit ---------------------------------------------------------------- */

int tn_entries_cold(const tn_entries *cs, int limit, int64_t idle)
{
  if (idle <= 0 || limit <= 0)
    return -1;
  int shift = cs->es_evicted / limit;
  uint64_t wait = shift >= 32 ? UINT64_MAX : (uint64_t)idle << shift;
  int i = cs->es_n - 1;
  while (i >= 0 && cs->es_v[i].en_runner == Py_None)
    i--;
  return i >= 0 && cs->es_clock - cs->es_v[i].en_last >= wait ? i : -1;
}

void tn_entries_evict(tn_entries *cs, int i, uint64_t *unused, uint64_t *hits)
{
  assert(i >= 0 && i < cs->es_n);
  tn_entry gone = cs->es_v[i];
  memmove(cs->es_v + i, cs->es_v + i + 1, sizeof(tn_entry) * (size_t)(cs->es_n - i - 1));
  cs->es_n--;
  cs->es_evicted++;
  cs->es_gen++;
  *unused = cs->es_clock - gone.en_last;
  *hits = gone.en_hits;
  entry_clear(&gone);  /* may run Python: the list is consistent again */
}

int tn_entries_limit(const JitFunctionObject *jf)
{
  return jf->jf_limit > 0 ? jf->jf_limit : (int)tn_config_int(TN_CFG_jit_cache_limit);
}

/* -- Persistent entries ------------------------------------------------------- */

#if TN_JIT_SUPPORTED

int tn_entries_load(_PyInterpreterFrame *f, JitFunctionObject *jf, tn_entries *cs, int limit)
{
  int rc = 0;
  PyObject *args = tn_hook_frame_args(f);
  PyObject *loaded = args ? tn_tracer_call(jf, "load", PyTuple_Pack(3, jf->jf_fn, args, (PyObject *)jf)) : NULL;
  if (loaded && !PyList_Check(loaded)) {
    PyErr_Format(PyExc_TypeError, "tracer.load returned %s, not a list", Py_TYPE(loaded)->tp_name);
    Py_CLEAR(loaded);
  }
  for (Py_ssize_t k = 0; loaded && k < PyList_GET_SIZE(loaded) && cs->es_n < limit; k++) {
    if (tn_entries_add(cs, PyList_GET_ITEM(loaded, k)) < 0)
      Py_CLEAR(loaded);
    else
      rc++;
  }
  if (!loaded &&
      tn_tracer_failed(jf, "loading trace records from the persistent cache failed (the call traces instead)") < 0)
    rc = -1;
  Py_XDECREF(loaded);
  Py_XDECREF(args);
  return rc;
}
#endif /* TN_JIT_SUPPORTED */
