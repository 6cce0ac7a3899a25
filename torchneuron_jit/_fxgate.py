"""Who may trace now, across threads: an FX trace (make_fx, as a
background build of torchneuron_jit.jit makes on its thread) and a
TorchDynamo compile exclude each other, and FX's is-tracing questions
answer for the thread that asks. Light (torch.fx only): the package runs
serialise_fx_tracing when imported after torch, and jit at its first use
(the questions are changed in place: functions torch.compile wrapped
before then ask them too)."""
import contextlib
import os
import threading
import types

import torch


class FxGate:
    """Who may trace now: an FX trace (make_fx, on any thread; re-entrant)
    and a TorchDynamo compile (Dynamo serialises its own) exclude each
    other across threads. While FX traces, torch.nn.Module's __call__ and
    __getattr__ are patched for the whole process, and FX's is-tracing
    flags are globals."""

    def __init__(self):
        self.cond = threading.Condition()
        self.fx_owner, self.fx_depth = None, 0   # the thread whose FX trace is in flight
        self.dynamo_owner = None                 # the thread whose Dynamo compile is in flight

    def _free_for(self, me):
        return self.fx_owner in (None, me) and self.dynamo_owner in (None, me)

    @contextlib.contextmanager
    def fx(self):
        me = threading.get_ident()
        with self.cond:
            self.cond.wait_for(lambda: self._free_for(me))
            self.fx_owner, self.fx_depth = me, self.fx_depth + 1
        try:
            yield
        finally:
            with self.cond:
                self.fx_depth -= 1
                if self.fx_depth == 0:
                    self.fx_owner = None
                    self.cond.notify_all()

    def dynamo_start(self, _args=None):
        me = threading.get_ident()
        with self.cond:
            self.cond.wait_for(lambda: self._free_for(me))
            self.dynamo_owner = me

    def dynamo_end(self, _args=None):
        with self.cond:
            self.dynamo_owner = None
            self.cond.notify_all()

    def tracing_here(self):
        return self.fx_owner == threading.get_ident()

    def after_fork_in_child(self):
        """In a forked child only the forking thread lives: a trace or
        compile another thread owned will never end there (a build's child
        forked meanwhile waited for it until its timeout)."""
        me = threading.get_ident()
        self.cond = threading.Condition()
        if self.fx_owner != me:
            self.fx_owner, self.fx_depth = None, 0
        if self.dynamo_owner != me:
            self.dynamo_owner = None


fx_gate = FxGate()
os.register_at_fork(after_in_child=fx_gate.after_fork_in_child)


def gate_dynamo():
    """Makes TorchDynamo's compiles wait for an FX trace in flight on
    another thread (a background build's make_fx), and such traces for
    them: a module Dynamo traced meanwhile saw make_fx's patched
    Module.__call__ (a graph break, or Dynamo's "Guard failed on the same
    frame it was created" AssertionError in the user's call). Done before
    each background build; torch._dynamo.reset() clears the callbacks, and
    registers these again (a reset while a build was in flight left its
    make_fx unguarded: a compile on another thread saw the patched
    Module.__call__, and one Dynamo's state restore put back left it
    patched for the rest of the process)."""
    handler = torch._dynamo.callback_handler
    if fx_gate.dynamo_start not in handler.start_callbacks:
        handler.register_start_callback(fx_gate.dynamo_start)
        handler.register_end_callback(fx_gate.dynamo_end)
    clear = handler.clear
    if not getattr(clear, "_tn_gate", False):
        def clear_but_the_gate():
            clear()
            handler.register_start_callback(fx_gate.dynamo_start)
            handler.register_end_callback(fx_gate.dynamo_end)

        clear_but_the_gate._tn_gate = True
        handler.clear = clear_but_the_gate


def serialise_fx_tracing():
    """FX's symbolic tracer keeps its state in module globals, so a trace on
    the build thread is seen by every thread: a second trace breaks both
    (torch.fx._symbolic_trace.CURRENT_PATCHER), and a function compiled by
    TorchDynamo, called on another thread meanwhile, raises "Detected that
    you are using FX to symbolically trace a dynamo-optimized function"
    (is_fx_symbolic_tracing reads one flag). Made once, when jit is
    imported: every FX trace in the process passes fx_gate (a trace on
    another thread waits for the one in flight, and for a Dynamo compile:
    gate_dynamo), and the two is-tracing questions answer for the thread
    that asks. A function torch.compile wrapped before this keeps the
    question it captured (torch._dynamo reads it when it wraps one): so it
    is made when torchneuron_jit is imported after torch, and again when
    jit is first used. The questions are changed in place (their code), so
    a function torch.compile wrapped before either (torchneuron_jit
    imported before torch: `python -m torchneuron_jit.demo` raised it from
    its neuron door) asks the per-thread question too."""
    from torch.fx import _symbolic_trace as st
    original = getattr(st, "_new_patcher", None)
    if original is None or getattr(original, "_tn_locked", False):
        return

    @contextlib.contextmanager
    def locked():
        with fx_gate.fx(), original() as patcher:
            yield patcher

    locked._tn_locked = True
    st._new_patcher = locked
    for name in ("is_fx_tracing", "is_fx_symbolic_tracing"):
        question = getattr(st, name, None)
        if question is not None:
            _ask_on_this_thread(st, name, question)


def _ask_on_this_thread(module, name, question):
    """Makes module.name (question: FX's is-tracing question, a function of
    no arguments) answer for the thread that asks: FX traces through
    fx_gate, so only the thread that holds it is tracing. Its code is
    swapped in place, for every holder of the function; a question of
    another form is replaced in the module only."""
    if isinstance(question, types.FunctionType) and question.__globals__ is vars(module) and \
            not question.__closure__ and question.__code__.co_argcount == 0 and \
            not question.__code__.co_kwonlyargcount:
        was = types.FunctionType(question.__code__, question.__globals__, question.__name__)  # its own code
        vars(module)["_tn_fx_gate"], vars(module)[f"_tn_{name}"] = fx_gate, was
        made = {}
        exec(f"def {name}():\n    return _tn_{name}() and _tn_fx_gate.tracing_here()\n", vars(module), made)
        question.__code__ = made[name].__code__
        return

    def asked():
        return question() and fx_gate.tracing_here()
    setattr(module, name, asked)

