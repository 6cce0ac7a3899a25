/*
** _C.JitFunction (tracer.h): a function whose calls go through the frame
** hook, holding its entries.
*/
#include "tracer_internal.h"
#include "../tn_yield.h"
#include <stdatomic.h>

#if TN_JIT_SUPPORTED
/* Set by build_fork_wanted (a background build that is to be made by a
** forked child, _jit._Builds): the next outermost jitted call, on whichever
** thread, first calls tracer.fork_build(), before its frame runs. */
static atomic_int jf_fork_wanted;

/* The call's tracer.fork_build(), once per request: a fork between the
** PyTorch ops of the thread that calls (no thread of ours is inside MKL,
** whose allocator lock a fork elsewhere can catch held). A failure warns;
** the call goes on: 0, or -1 with a warning a filter made an error set. */
static int jf_fork_if_wanted(JitFunctionObject *jf)
{
  if (!atomic_load_explicit(&jf_fork_wanted, memory_order_relaxed) || !atomic_exchange(&jf_fork_wanted, 0))
    return 0;
  PyObject *r = tn_tracer_call(jf, "fork_build", PyTuple_New(0));
  int rc = r ? 0 : tn_tracer_failed(jf, "forking a background build's child failed (the build thread builds the "
                                        "variant)");
  Py_XDECREF(r);
  return rc;
}
#endif

PyObject *tn_py_build_fork_wanted(PyObject *self, PyObject *on)
{
  (void)self;
  int want = PyObject_IsTrue(on);
  if (want < 0)
    return NULL;
#if TN_JIT_SUPPORTED
  atomic_store(&jf_fork_wanted, want);
#endif
  Py_RETURN_NONE;
}

static PyObject *JitFunction_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
  JitFunctionObject *jf = (JitFunctionObject *)self;
#if TN_JIT_SUPPORTED
  if (jf->jf_owner && PyVectorcall_NARGS(nargsf) >= 1 && args[0] != PyWeakref_GET_OBJECT(jf->jf_owner)) {
    /* a copy of the module (copy.deepcopy keeps its bound forward): it gets its own variants */
    PyObject *own = tn_tracer_call(jf, "rebind", PyTuple_Pack(2, self, args[0]));
    if (!own) {
      if (tn_tracer_failed(jf, "giving a copy of the module its own variants failed (it shares the original's)") <
          0)
        return NULL;
    } else if (own != self) {
      PyObject *res = PyObject_Vectorcall(own, args, nargsf, kwnames);
      Py_DECREF(own);
      return res;
    }
    Py_XDECREF(own);
  }
  if (tn_hook_tracing == 0) {
    if (!tn_hook_active && jf_fork_if_wanted(jf) < 0)
      return NULL;
    jf->jf_calls++;
    tn_active a = {tn_hook_active, jf, (PyCodeObject *)PyFunction_GET_CODE(jf->jf_fn), 0, NULL};
    tn_hook_active = &a;
    tn_hook_add();
    tn_yield_call_begin();
    PyObject *res = PyObject_Vectorcall(jf->jf_fn, args, nargsf, kwnames);
    tn_yield_call_end();
    tn_hook_remove();
    tn_hook_active = a.ac_prev;
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
  tn_entries_clear(&jf->jf_entries);
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

/* publish(spec, entry) -> bool: the entry whose spec is spec replaced by
** entry (spec, inputs, runner), or removed (entry None); False when none
** has it any more */
static PyObject *JitFunction_publish(PyObject *o, PyObject *args)
{
  PyObject *spec, *entry;
  if (!PyArg_ParseTuple(args, "OO:publish", &spec, &entry))
    return NULL;
  if (entry != Py_None && !PyTuple_Check(entry)) {
    PyErr_SetString(PyExc_TypeError, "publish: entry must be a tuple (spec, inputs, runner) or None");
    return NULL;
  }
  int r = tn_entries_replace(&((JitFunctionObject *)o)->jf_entries, spec, entry);
  return r < 0 ? NULL : PyBool_FromLong(r);
}

/* hits() -> [calls each entry took], in the order of entries() */
static PyObject *JitFunction_hits(PyObject *o, PyObject *unused)
{
  tn_entries *es = &((JitFunctionObject *)o)->jf_entries;
  (void)unused;
  PyObject *list = PyList_New(es->es_n);
  for (int i = 0; list && i < es->es_n; i++) {
    PyObject *n = PyLong_FromUnsignedLongLong(es->es_v[i].en_hits);
    if (!n)
      Py_CLEAR(list);
    else
      PyList_SET_ITEM(list, i, n);
  }
  return list;
}

/* reset(): drops the entries and the reached-the-limit mark */
static PyObject *JitFunction_reset(PyObject *o, PyObject *unused)
{
  (void)unused;
  tn_entries_clear(&((JitFunctionObject *)o)->jf_entries);
  Py_RETURN_NONE;
}

static PyObject *JitFunction_get_gave_up(PyObject *o, void *c)
{
  (void)c;
  return PyBool_FromLong(((JitFunctionObject *)o)->jf_entries.es_gave_up);
}

static PyObject *JitFunction_get_full(PyObject *o, void *c)
{
  (void)c;
  return PyBool_FromLong(((JitFunctionObject *)o)->jf_entries.es_full);
}

/* gave_up = True: runs eagerly from now on (the recompilation manager's blacklist); False: traces again */
static int JitFunction_set_gave_up(PyObject *o, PyObject *value, void *c)
{
  (void)c;
  int on = value ? PyObject_IsTrue(value) : 0;
  if (on < 0)
    return -1;
  ((JitFunctionObject *)o)->jf_entries.es_gave_up = on;
  return 0;
}

static PyObject *JitFunction_get_calls(PyObject *o, void *c)
{
  (void)c;
  return PyLong_FromUnsignedLongLong(((JitFunctionObject *)o)->jf_calls);
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
  {"publish", JitFunction_publish, METH_VARARGS,
   "publish(spec, entry) -> whether the entry whose spec is spec was replaced by entry (spec, inputs, runner) "
   "or removed (None)"},
  {"hits", JitFunction_hits, METH_NOARGS, "hits() -> [calls each entry took], in the order of entries()"},
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
  {"gave_up", JitFunction_get_gave_up, JitFunction_set_gave_up,
   "whether it runs eagerly for good (the manager's blacklist); settable", NULL},
  {"full", JitFunction_get_full, NULL,
   "whether it reached its limit of entries (warned): they keep serving, calls none takes run eagerly", NULL},
  {"calls", JitFunction_get_calls, NULL, "calls made through it", NULL},
  {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

/* <torchneuron_jit.jit of <function f at 0x...>>: what a notebook shows of a jitted function (the type's
** default named no function). */
static PyObject *JitFunction_repr(PyObject *o)
{
  PyObject *fn = ((JitFunctionObject *)o)->jf_fn;
  return fn ? PyUnicode_FromFormat("<torchneuron_jit.jit of %R>", fn) : PyUnicode_FromString("<torchneuron_jit.jit>");
}

PyTypeObject tn_py_JitFunctionType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "torchneuron_jit._C.JitFunction",
  .tp_basicsize = sizeof(JitFunctionObject),
  .tp_dealloc = JitFunction_dealloc,
  .tp_repr = JitFunction_repr,
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
