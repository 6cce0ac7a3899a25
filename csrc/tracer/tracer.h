/*
** The frame hook of torchneuron_jit.jit (PEP 523) and the registry of
** compiled code objects.
**
** _C.JitFunction(fn, tracer, limit) wraps a Python function. Calling it
** installs our frame-evaluation function for the duration of the call (the
** interpreter-wide hook is added and removed by count; a thread-local stack
** says which code object the call is for) and calls fn: CPython binds the
** arguments into a frame and hands it to the hook before running a single
** instruction of it.
**
** Each JitFunction keeps its entries, most recently used first: a guard
** set (csrc/guards) and a runner (on a module, jit makes one JitFunction
** per instance, so each instance has its own variants, and the entries are
** freed with it: they are visible to the cycle collector). A code object's
** extra slot (_PyCode_SetExtra) holds what is true of the code wherever it
** runs: torchneuron_jit.disable's mark, read by the hook in O(1). The
** hook runs the guards on the frame's arguments (localsplus, before the
** frame starts); on a hit it calls the runner with the values the guards
** loaded and returns its result without evaluating the frame (CPython 3.11
** clears and pops it). A runner may answer _C.SIDE_EXIT (a value guard on a
** scalar read from a tensor failed): the next entry is tried. An entry
** whose runner is None runs the frame as Python does.
**
** A miss first asks the tracer (a Python object) for entries made from the
** persistent cache, once per call, while fewer than the limit are held:
**   tracer.load(fn, args, jitfunction) -> [(spec, inputs, runner), ...]
**       entries whose records match args and that the JitFunction does not
**       hold yet (often none); they are added and tried before anything is
**       traced
** and otherwise evaluates the frame under the tracer:
**   tracer.begin(fn, args, codes, reason, jitfunction) -> token or None
**       before the frame runs; codes is a list the hook fills with
**       (code, globals) of every nested frame while the frame runs; None:
**       no trace now (the frame runs as Python does, no entry is added)
**   tracer.end(token, result) -> None or (spec, inputs, runner)
**       after it returned result: the new entry (guards.h spec, the slots
**       passed to the runner, the runner or None). A build finished later,
**       off the calling thread, takes the place of an entry by
**       JitFunction.publish(spec, entry)
**   tracer.abort(token)           the frame raised (its exception stays)
**   tracer.explain(fn, args, fails, jitfunction) -> str
**       why no entry took args; fails lists (spec, index of its first
**       failing guard, or -1 for one that passed but side-exited) per entry
**   tracer.give_up(fn, reason, jf) the code reached its entry limit
**   tracer.fork_build()           at the start of an outermost jitted call,
**       on its thread and before its frame, once after build_fork_wanted(True)
**       asked for it: a background build's child is forked there
**   tracer.rebind(jitfunction, module) -> JitFunction
**       a call of a module's jitted forward whose self is not the module
**       it was made for (its owner): a copy (copy.deepcopy keeps the bound
**       forward); the answer, the copy's own, is called instead
** Generator, coroutine and throw evaluations, frames of other code and
** frames on other threads pass through to the previous hook untouched.
** While a thread traces, jitted functions it calls run as plain Python (so
** the outer trace records their operations).
*/
#ifndef TN_TRACER_H
#define TN_TRACER_H

#include "../tn_py.h"

/* Adds JitFunction, SIDE_EXIT and the jit functions to module m. */
int tn_py_tracer_init(PyObject *m);

extern PyMethodDef tn_py_tracer_methods[];

/* build_yield and build_pauses (yield_py.c): a background build pauses
** while jitted calls are in flight. */
extern PyMethodDef tn_py_yield_methods[];

#endif /* TN_TRACER_H */
