/*
** Python binding of the cache: torchneuron_jit._C.Cache. Every call into
** the store runs with the GIL released. close() while another thread is
** inside a call defers the close to the end of that call.
*/
#include "../tn_py.h"

#include <stdlib.h>

#include "cache.h"

typedef struct {
  PyObject_HEAD
  tn_cache *ca;
  int in_use;   /* calls in flight with the GIL released */
  int closing;  /* close() was asked while in_use > 0 */
} CacheObject;

static PyObject *cache_raise(int rc, const char *msg)
{
  if (rc == TN_ENOMEM)
    return PyErr_NoMemory();
  PyObject *code = PyLong_FromLong(rc);
  PyObject *exc = code ? PyObject_CallFunction(tn_py_CacheError, "s", msg) : NULL;
  if (exc && PyObject_SetAttrString(exc, "code", code) == 0)
    PyErr_SetObject(tn_py_CacheError, exc);
  Py_XDECREF(exc);
  Py_XDECREF(code);
  return NULL;
}

static PyObject *cache_raise_handle(CacheObject *self, int rc)
{
  if (rc == TN_EPOISONED || !tn_cache_errmsg(self->ca)[0])
    return cache_raise(rc, rc == TN_EPOISONED ? tn_cache_errmsg(self->ca) : tn_strerror(rc));
  return cache_raise(rc, tn_cache_errmsg(self->ca));
}

/* Starts a call: returns the handle, or NULL with ValueError if closed. */
static tn_cache *cache_begin(CacheObject *self)
{
  if (!self->ca || self->closing) {
    PyErr_SetString(PyExc_ValueError, "operation on a closed cache");
    return NULL;
  }
  self->in_use++;
  return self->ca;
}

/* Ends a call (GIL held); performs a deferred close. */
static void cache_end(CacheObject *self)
{
  if (--self->in_use == 0 && self->closing && self->ca) {
    tn_cache *c = self->ca;
    self->ca = NULL;
    Py_BEGIN_ALLOW_THREADS
    tn_cache_close(c);
    Py_END_ALLOW_THREADS
  }
}

static PyObject *Cache_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
  static char *kwlist[] = {"path", "initial_map_bytes", "max_bytes", "verify", NULL};
  PyObject *pathobj;
  unsigned long long initial = 0, max = 0;
  int verify = 1;
  char err[3 * 4096];
  tn_cache *c = NULL;
  int rc;

  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O&|KKp:Cache", kwlist, PyUnicode_FSConverter, &pathobj,
                                   &initial, &max, &verify))
    return NULL;
  tn_cache_options opt = {initial, max, verify};
  const char *path = PyBytes_AS_STRING(pathobj);
  Py_BEGIN_ALLOW_THREADS
  rc = tn_cache_open(path, &opt, &c, err, sizeof err);
  Py_END_ALLOW_THREADS
  Py_DECREF(pathobj);
  if (rc != TN_OK)
    return cache_raise(rc, err);
  CacheObject *self = (CacheObject *)type->tp_alloc(type, 0);
  if (!self) {
    tn_cache_close(c);
    return NULL;
  }
  self->ca = c;
  return (PyObject *)self;
}

static void Cache_dealloc(PyObject *o)
{
  CacheObject *self = (CacheObject *)o;
  PyTypeObject *tp = Py_TYPE(o);
  if (self->ca) {
    tn_cache *c = self->ca;
    self->ca = NULL;
    Py_BEGIN_ALLOW_THREADS
    tn_cache_close(c);
    Py_END_ALLOW_THREADS
  }
  tp->tp_free(o);
  Py_DECREF(tp);
}

/* Checks a table number and a key from Python: ValueError naming the argument
** when either is out of range (the store is not touched, nor poisoned). */
static int parse_key(int table, Py_buffer *key)
{
  if (table < 0 || table >= TN_CACHE__TABLES) {
    PyErr_Format(PyExc_ValueError, "table must be ARTIFACTS (%d) or TRACES (%d), got %d",
                 TN_CACHE_ARTIFACTS, TN_CACHE_TRACES, table);
    return -1;
  }
  if (key->len != TN_CACHE_KEY_LEN) {
    PyErr_Format(PyExc_ValueError, "key must be %d bytes, got %zd", TN_CACHE_KEY_LEN, key->len);
    return -1;
  }
  return 0;
}

static PyObject *Cache_get(PyObject *o, PyObject *args)
{
  CacheObject *self = (CacheObject *)o;
  int table, rc;
  Py_buffer key;
  void *val = NULL;
  size_t len = 0;
  tn_cache *c;
  if (!PyArg_ParseTuple(args, "iy*:get", &table, &key))
    return NULL;
  if (parse_key(table, &key) < 0 || !(c = cache_begin(self))) {
    PyBuffer_Release(&key);
    return NULL;
  }
  Py_BEGIN_ALLOW_THREADS
  rc = tn_cache_get(c, table, key.buf, &val, &len);
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&key);
  PyObject *res;
  if (rc == TN_OK)
    res = PyBytes_FromStringAndSize(val, (Py_ssize_t)len);
  else if (rc == TN_ENOTFOUND)
    res = Py_NewRef(Py_None);
  else
    res = cache_raise_handle(self, rc);
  free(val);
  cache_end(self);
  return res;
}

static PyObject *Cache_put(PyObject *o, PyObject *args)
{
  CacheObject *self = (CacheObject *)o;
  int table, rc;
  Py_buffer key, val;
  tn_cache *c;
  if (!PyArg_ParseTuple(args, "iy*y*:put", &table, &key, &val))
    return NULL;
  if (parse_key(table, &key) < 0 || !(c = cache_begin(self))) {
    PyBuffer_Release(&key);
    PyBuffer_Release(&val);
    return NULL;
  }
  Py_BEGIN_ALLOW_THREADS
  rc = tn_cache_put(c, table, key.buf, val.buf, (size_t)val.len);
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&key);
  PyBuffer_Release(&val);
  PyObject *res = rc == TN_OK ? Py_NewRef(Py_None) : cache_raise_handle(self, rc);
  cache_end(self);
  return res;
}

static PyObject *Cache_replace(PyObject *o, PyObject *args)
{
  CacheObject *self = (CacheObject *)o;
  int table, rc;
  Py_buffer key, old = {0}, val;
  PyObject *oldobj, *res = NULL;
  tn_cache *c;
  if (!PyArg_ParseTuple(args, "iy*Oy*:replace", &table, &key, &oldobj, &val))
    return NULL;
  if (oldobj != Py_None && PyObject_GetBuffer(oldobj, &old, PyBUF_SIMPLE) < 0) {
    PyErr_Format(PyExc_TypeError, "old must be bytes or None, not %.100s", Py_TYPE(oldobj)->tp_name);
    goto done;
  }
  if (parse_key(table, &key) < 0 || !(c = cache_begin(self)))
    goto done;
  Py_BEGIN_ALLOW_THREADS
  rc = tn_cache_replace(c, table, key.buf, old.obj ? old.buf : NULL, old.obj ? (size_t)old.len : 0,
                        val.buf, (size_t)val.len);
  Py_END_ALLOW_THREADS
  res = rc == TN_OK ? Py_NewRef(Py_True) : rc == TN_ECHANGED ? Py_NewRef(Py_False) : cache_raise_handle(self, rc);
  cache_end(self);
done:
  PyBuffer_Release(&key);
  PyBuffer_Release(&val);
  if (old.obj)
    PyBuffer_Release(&old);
  return res;
}

static PyObject *Cache_delete(PyObject *o, PyObject *args)
{
  CacheObject *self = (CacheObject *)o;
  int table, rc;
  Py_buffer key;
  tn_cache *c;
  if (!PyArg_ParseTuple(args, "iy*:delete", &table, &key))
    return NULL;
  if (parse_key(table, &key) < 0 || !(c = cache_begin(self))) {
    PyBuffer_Release(&key);
    return NULL;
  }
  Py_BEGIN_ALLOW_THREADS
  rc = tn_cache_delete(c, table, key.buf);
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&key);
  PyObject *res = rc == TN_OK ? Py_NewRef(Py_True)
                  : rc == TN_ENOTFOUND ? Py_NewRef(Py_False) : cache_raise_handle(self, rc);
  cache_end(self);
  return res;
}

/* clear() and flush(): no arguments, no result. */
static PyObject *cache_simple(CacheObject *self, int (*fn)(tn_cache *))
{
  tn_cache *c = cache_begin(self);
  int rc;
  if (!c)
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  rc = fn(c);
  Py_END_ALLOW_THREADS
  PyObject *res = rc == TN_OK ? Py_NewRef(Py_None) : cache_raise_handle(self, rc);
  cache_end(self);
  return res;
}

static PyObject *Cache_clear(PyObject *o, PyObject *unused)
{
  (void)unused;
  return cache_simple((CacheObject *)o, tn_cache_clear);
}

static PyObject *Cache_flush(PyObject *o, PyObject *unused)
{
  (void)unused;
  return cache_simple((CacheObject *)o, tn_cache_flush);
}

static PyObject *Cache_stats(PyObject *o, PyObject *unused)
{
  CacheObject *self = (CacheObject *)o;
  tn_cache_info st;
  tn_cache *c = cache_begin(self);
  int rc;
  (void)unused;
  if (!c)
    return NULL;
  Py_BEGIN_ALLOW_THREADS
  rc = tn_cache_stats(c, &st);
  Py_END_ALLOW_THREADS
  PyObject *res = rc != TN_OK ? cache_raise_handle(self, rc) : Py_BuildValue(
      "{s:s,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K,s:K}",
      "path", tn_cache_path(c),
      "entries", (unsigned long long)st.cs_entries, "bytes", (unsigned long long)st.cs_bytes,
      "map_bytes", (unsigned long long)st.cs_map_bytes, "file_bytes", (unsigned long long)st.cs_file_bytes,
      "max_bytes", (unsigned long long)st.cs_max_bytes, "hits", (unsigned long long)st.cs_hits,
      "misses", (unsigned long long)st.cs_misses, "puts", (unsigned long long)st.cs_puts,
      "evictions", (unsigned long long)st.cs_evictions, "corrupt_dropped", (unsigned long long)st.cs_corrupt,
      "map_grows", (unsigned long long)st.cs_map_grows, "probes", (unsigned long long)st.cs_probes);
  cache_end(self);
  return res;
}

static PyObject *Cache_close(PyObject *o, PyObject *unused)
{
  CacheObject *self = (CacheObject *)o;
  (void)unused;
  if (self->ca && self->in_use > 0) {
    self->closing = 1;
  } else if (self->ca) {
    tn_cache *c = self->ca;
    self->ca = NULL;
    Py_BEGIN_ALLOW_THREADS
    tn_cache_close(c);
    Py_END_ALLOW_THREADS
  }
  Py_RETURN_NONE;
}

static PyObject *Cache_take_notice(PyObject *o, PyObject *unused)
{
  CacheObject *self = (CacheObject *)o;
  char buf[3 * 4096];
  (void)unused;
  if (!self->ca)
    return PyUnicode_FromString("");
  tn_cache_take_notice(self->ca, buf, sizeof buf);
  return PyUnicode_DecodeFSDefault(buf);
}

static PyObject *Cache_get_path(PyObject *o, void *closure)
{
  CacheObject *self = (CacheObject *)o;
  (void)closure;
  if (!self->ca)
    Py_RETURN_NONE;
  return PyUnicode_DecodeFSDefault(tn_cache_path(self->ca));
}

static PyObject *Cache_get_closed(PyObject *o, void *closure)
{
  (void)closure;
  return PyBool_FromLong(((CacheObject *)o)->ca == NULL);
}

static PyMethodDef Cache_methods[] = {
  {"get", Cache_get, METH_VARARGS, "get(table, key) -> bytes or None."},
  {"put", Cache_put, METH_VARARGS, "put(table, key, value): store (replace)."},
  {"replace", Cache_replace, METH_VARARGS,
   "replace(table, key, old, value) -> whether value was stored: only if the payload there is "
   "old (None: none), compared in the write transaction."},
  {"delete", Cache_delete, METH_VARARGS, "delete(table, key) -> whether it was there."},
  {"clear", Cache_clear, METH_NOARGS, "Delete every record."},
  {"flush", Cache_flush, METH_NOARGS, "Write pending last-used times and hit counts."},
  {"stats", Cache_stats, METH_NOARGS, "Counters and sizes as a dict."},
  {"close", Cache_close, METH_NOARGS, "Close (idempotent)."},
  {"take_notice", Cache_take_notice, METH_NOARGS, "One-time notice from open (e.g. damaged file moved aside)."},
  {NULL, NULL, 0, NULL},
};

static PyGetSetDef Cache_getset[] = {
  {"path", Cache_get_path, NULL, "path of the data file", NULL},
  {"closed", Cache_get_closed, NULL, "whether close() ran", NULL},
  {NULL, NULL, NULL, NULL, NULL},
};

static PyType_Slot Cache_slots[] = {
  {Py_tp_new, Cache_new},
  {Py_tp_dealloc, Cache_dealloc},
  {Py_tp_methods, Cache_methods},
  {Py_tp_getset, Cache_getset},
  {Py_tp_doc, "Cache(path, initial_map_bytes=0, max_bytes=0, verify=True): the LMDB compile cache in "
              "directory path; verify walks an existing file in a child process before trusting it."},
  {0, NULL},
};

static PyType_Spec Cache_spec = {"torchneuron_jit._C.Cache", sizeof(CacheObject), 0, Py_TPFLAGS_DEFAULT,
                                 Cache_slots};

int tn_py_cache_init(PyObject *m)
{
  PyObject *t = PyType_FromSpec(&Cache_spec);
  if (!t)
    return -1;
  int rc = PyModule_AddObjectRef(m, "Cache", t);
  Py_DECREF(t);
  if (rc < 0 || PyModule_AddIntConstant(m, "CACHE_ARTIFACTS", TN_CACHE_ARTIFACTS) < 0 ||
      PyModule_AddIntConstant(m, "CACHE_TRACES", TN_CACHE_TRACES) < 0 ||
      PyModule_AddIntConstant(m, "CACHE_FORMAT_VERSION", TN_CACHE_FORMAT_VERSION) < 0)
    return -1;
  return 0;
}
