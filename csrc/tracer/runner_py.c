/*
** _C.ItemRunner (tracer.h): an entry's runner that calls its compiled
** plan and returns one item of the result, in C.
*/
#include "tracer_internal.h"

/* An entry's runner for the common case, in C: it calls the compiled
** plan on the entry's inputs (plan.call) and returns item `index` of its
** result, skipping the Python runner (value checks, write-backs and result
** rebuilding it has none of). A failure is the plan's to settle (csrc/
** fallback: ours runs eagerly, the user's propagates), so whatever forward
** raises propagates. Other attributes are the Python runner's. */
typedef struct {
  PyObject_HEAD
  vectorcallfunc ir_vectorcall;
  PyObject *ir_forward;
  Py_ssize_t ir_index;
  PyObject *ir_runner;
} ItemRunnerObject;

static PyObject *ItemRunner_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
  ItemRunnerObject *ir = (ItemRunnerObject *)self;
  if (!ir->ir_forward)
    return PyErr_Format(PyExc_RuntimeError, "ItemRunner: called after it was cleared");
  PyObject *res, *forward = Py_NewRef(ir->ir_forward);
  PyObject *out = PyObject_Vectorcall(forward, args, PyVectorcall_NARGS(nargsf), kwnames);
  Py_DECREF(forward);
  if (!out)
    return NULL;
  if (PyTuple_Check(out) && ir->ir_index < PyTuple_GET_SIZE(out))
    res = Py_NewRef(PyTuple_GET_ITEM(out, ir->ir_index));
  else
    res = PySequence_GetItem(out, ir->ir_index);
  Py_DECREF(out);
  return res;
}

static PyObject *ItemRunner_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
  static char *kwlist[] = {"forward", "index", "runner", NULL};
  PyObject *forward, *runner;
  Py_ssize_t index;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "OnO:ItemRunner", kwlist, &forward, &index, &runner))
    return NULL;
  if (!PyCallable_Check(forward) || !PyCallable_Check(runner) || index < 0) {
    PyErr_SetString(PyExc_TypeError, "ItemRunner(forward, index, runner): two callables and an index >= 0");
    return NULL;
  }
  ItemRunnerObject *ir = (ItemRunnerObject *)type->tp_alloc(type, 0);
  if (!ir)
    return NULL;
  ir->ir_vectorcall = ItemRunner_vectorcall;
  ir->ir_forward = Py_NewRef(forward);
  ir->ir_index = index;
  ir->ir_runner = Py_NewRef(runner);
  return (PyObject *)ir;
}

static int ItemRunner_traverse(PyObject *o, visitproc visit, void *arg)
{
  Py_VISIT(((ItemRunnerObject *)o)->ir_forward);
  Py_VISIT(((ItemRunnerObject *)o)->ir_runner);
  return 0;
}

static int ItemRunner_clear(PyObject *o)
{
  Py_CLEAR(((ItemRunnerObject *)o)->ir_forward);
  Py_CLEAR(((ItemRunnerObject *)o)->ir_runner);
  return 0;
}

static void ItemRunner_dealloc(PyObject *o)
{
  PyObject_GC_UnTrack(o);
  ItemRunner_clear(o);
  Py_TYPE(o)->tp_free(o);
}

/* Attributes it has not are the Python runner's (record, compiled, ...). */
static PyObject *ItemRunner_getattro(PyObject *o, PyObject *name)
{
  PyObject *r = PyObject_GenericGetAttr(o, name);
  if (!r && PyErr_ExceptionMatches(PyExc_AttributeError) && ((ItemRunnerObject *)o)->ir_runner) {
    PyErr_Clear();
    r = PyObject_GetAttr(((ItemRunnerObject *)o)->ir_runner, name);
  }
  return r;
}

static int ItemRunner_setattro(PyObject *o, PyObject *name, PyObject *value)
{
  return PyObject_SetAttr(((ItemRunnerObject *)o)->ir_runner, name, value);
}

static PyObject *ItemRunner_get_runner(PyObject *o, void *c)
{
  (void)c;
  return Py_NewRef(((ItemRunnerObject *)o)->ir_runner);
}

static PyGetSetDef ItemRunner_getset[] = {
  {"runner", ItemRunner_get_runner, NULL, "the Python runner it stands for", NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject tn_py_ItemRunnerType = {
  PyVarObject_HEAD_INIT(NULL, 0)
  .tp_name = "torchneuron_jit._C.ItemRunner",
  .tp_basicsize = sizeof(ItemRunnerObject),
  .tp_dealloc = ItemRunner_dealloc,
  .tp_vectorcall_offset = offsetof(ItemRunnerObject, ir_vectorcall),
  .tp_call = PyVectorcall_Call,
  .tp_getattro = ItemRunner_getattro,
  .tp_setattro = ItemRunner_setattro,
  .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
  .tp_doc = "ItemRunner(forward, index, runner): an entry's runner calling its compiled graph directly",
  .tp_traverse = ItemRunner_traverse,
  .tp_clear = ItemRunner_clear,
  .tp_getset = ItemRunner_getset,
  .tp_new = ItemRunner_new,
};
