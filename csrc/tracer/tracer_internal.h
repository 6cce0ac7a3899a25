/*
** What the tracer's files share: the entries of a JitFunction and the
** registry that keeps them (entries_py.c), the frame hook (hook_py.c), the
** JitFunction type (jitfunction_py.c), the ItemRunner (runner_py.c) and
** the module's functions (tracer_py.c). tracer.h says how they work
** together.
*/
#ifndef TN_TRACER_INTERNAL_H
#define TN_TRACER_INTERNAL_H

#include "tracer.h"

#include "../guards/guards.h"

#if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000
#define TN_JIT_SUPPORTED 1
#define Py_BUILD_CORE 1
#include <internal/pycore_frame.h>
#undef Py_BUILD_CORE
#else
#define TN_JIT_SUPPORTED 0
#endif

/* -- Entries ------------------------------------------------------------------- */

/* One traced variant: the guards that select it and what runs it. */
typedef struct tn_entry {
  tn_gset *en_gs;
  PyObject *en_spec;     /* the spec, for explanations */
  Py_ssize_t *en_inputs; /* slots passed to the runner */
  Py_ssize_t en_ninputs;
  PyObject *en_runner;   /* None: run the frame as Python does */
  uint64_t en_hits;      /* calls it took */
  uint64_t en_last;      /* es_clock when it last took a call, or was added */
} tn_entry;

/* The entries of one JitFunction, most recently used first. */
typedef struct tn_entries {
  tn_entry *es_v;
  int es_n, es_cap;
  int es_gave_up;        /* blacklisted (the recompilation manager): runs as Python does */
  int es_full;           /* warned of its limit: a call no entry takes runs as Python does */
  int es_evicted;        /* entries evicted to make room (tn_entries_evict) */
  uint64_t es_clock;     /* the function's calls, as of the call looking its entries up */
  uint64_t es_gen;       /* changes of the list (added, replaced, moved, removed): a guard check that ran
                         ** Python (another thread may have changed the list) looks again when it moved */
  PyObject *es_code;     /* the code they were traced for (a function's __code__ may be replaced) */
} tn_entries;

/* What a code object keeps in its extra slot. */
typedef struct tn_codestate {
  int cs_disabled;       /* torchneuron_jit.disable */
} tn_codestate;

/* A jitted function (jitfunction_py.c). */
typedef struct JitFunctionObject JitFunctionObject;

/* One jit call in progress on this thread. */
typedef struct tn_active {
  struct tn_active *ac_prev;
  JitFunctionObject *ac_jf;
  PyCodeObject *ac_code;
  int ac_consumed;       /* the call's own frame was seen */
  PyObject *ac_codes;    /* while its frame is traced: (code, globals) of nested frames */
} tn_active;

struct JitFunctionObject {
  PyObject_HEAD
  vectorcallfunc jf_vectorcall;
  PyObject *jf_fn;        /* the function */
  PyObject *jf_tracer;
  int jf_limit;           /* entries kept (0: config.jit_cache_limit) */
  tn_entries jf_entries;  /* its traced variants, with the guards that select them */
  uint64_t jf_calls;      /* calls made through it (not while tracing another call) */
  PyObject *jf_dict;
  PyObject *jf_weakrefs;
  PyObject *jf_owner;     /* jit(module): a weak reference to the module whose forward this is, or NULL */
};

/* -- The registry (entries_py.c) ---------------------------------------------- */

/* Requests the code-object extra slot for tn_codestate. 0, or -1 with an
** exception set. Call once, at module init. */
int tn_codestate_init(void);

/* The state of code (created when create is set), or NULL (with an
** exception set only when creating failed). */
tn_codestate *tn_codestate_get(PyObject *code, int create);

/* Empties es (the limit's mark too). The entries are detached before they
** are freed: freeing may run Python that uses es again. */
void tn_entries_clear(tn_entries *es);

/* Adds an entry at the front from the tracer's (spec, inputs, runner).
** 0, or -1 with an exception set (cs unchanged). */
int tn_entries_add(tn_entries *cs, PyObject *entry);

/* Replaces the entry whose spec is spec (by identity: a build published
** in the background takes the place of the entry that ran eagerly while it
** was made) with a new one from the tracer's (spec, inputs, runner), in
** place; entry None removes it. 1 when replaced, 0 when no entry has that spec (it was dropped),
** -1 with an exception set (cs unchanged). */
int tn_entries_replace(tn_entries *cs, PyObject *spec, PyObject *entry);

/* Removes the entries whose guards lost a weakly held object (a module
** argument that is gone): they can never pass, and would keep its
** parameters and a place under the limit. The removed ones are freed once
** the list is consistent again, since freeing may run Python. */
void tn_entries_purge(tn_entries *cs);

/* Moves entry i to the front (most recently used first), used now. */
void tn_entries_touch(tn_entries *cs, int i);

/* The index of the least recently used compiled entry when it has taken
** no call in the last idle << (es_evicted / limit) calls (the wait doubles
** each time limit entries were evicted, so a working set larger than the
** limit cannot trace on every call); -1 when none is that cold, or idle
** is 0. Entries running eagerly (a build in flight, a trace that failed)
** are never the one. */
int tn_entries_cold(const tn_entries *cs, int limit, int64_t idle);

/* Removes entry i (tn_entries_cold's) and counts the eviction; *unused is
** how long it went without a call, *hits the calls it took. It is freed
** once the list is consistent again, since freeing may run Python. */
void tn_entries_evict(tn_entries *cs, int i, uint64_t *unused, uint64_t *hits);

/* How many entries jf keeps before it gives up (runs as Python does). */
int tn_entries_limit(const JitFunctionObject *jf);

#if TN_JIT_SUPPORTED
/* Asks tracer.load for entries made from the persistent cache's trace
** records for f's arguments and adds them while fewer than limit are held.
** Returns how many it added (0 after a failure of the tracer: a warning),
** or -1 with a warning a filter made an error pending (tn_tracer_failed). */
int tn_entries_load(_PyInterpreterFrame *f, JitFunctionObject *jf, tn_entries *cs, int limit);
#endif

/* -- The hook (hook_py.c) ----------------------------------------------------- */

/* This thread's jit calls in progress (innermost first), and how deep it
** is in traces (jitted functions run as plain Python while it is). */
extern _Thread_local tn_active *tn_hook_active;
extern _Thread_local int tn_hook_tracing;

/* _C.SIDE_EXIT: a runner's answer when a value guard failed (made at
** module init). */
extern PyObject *tn_hook_side_exit;

#if TN_JIT_SUPPORTED
/* Installs our frame-evaluation function for one more jit call in
** progress (chaining to the one installed before, once, by count). */
void tn_hook_add(void);

/* One jit call less: the last one puts back the function installed before
** ours (unless a later one, a debugger's, replaced ours). */
void tn_hook_remove(void);

/* The arguments of frame f as a new tuple, or NULL. */
PyObject *tn_hook_frame_args(_PyInterpreterFrame *f);

/* Calls jf's tracer.name(*args) (args: a new reference, consumed; NULL
** passes an exception on); a new reference or NULL. */
PyObject *tn_tracer_call(JitFunctionObject *jf, const char *name, PyObject *args);

/* A failure of ours in the tracer (the exception set): one RuntimeWarning
** naming it and what the call does instead, the exception cleared; 0, and
** the call goes on. Where a warnings filter makes warnings errors (the
** exception set is a Warning: one of ours raised inside, or this one
** raises), the Warning stays set: -1, and the caller's call raises it, as
** Python raises a warning a filter makes an error where it is warned. */
int tn_tracer_failed(JitFunctionObject *jf, const char *what);
#endif

/* build_fork_wanted(on) (jitfunction_py.c): whether the next outermost
** jitted call calls tracer.fork_build() first (tracer.h). */
PyObject *tn_py_build_fork_wanted(PyObject *self, PyObject *on);

/* -- The types ---------------------------------------------------------------- */

extern PyTypeObject tn_py_JitFunctionType;  /* jitfunction_py.c */
extern PyTypeObject tn_py_ItemRunnerType; /* runner_py.c */

#endif /* TN_TRACER_INTERNAL_H */
