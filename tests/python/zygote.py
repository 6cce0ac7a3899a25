"""A process that has imported torch, Dynamo and transformers once and
forks a child per request: a fresh process of the tests (conftest.run_python)
without its 3-8 s of imports.

The child is a fresh process where it matters to these tests: it is the
zygote's child, not the test's, so none of torchneuron_jit's state (the
package is never imported here), no cache handle and no compiled code came
with it; it sets the requested environment, directory, sys.argv and
sys.path[0], runs the script (or -c code, or -m module) as __main__, and
exits as the interpreter's shutdown does up to its module teardown
(_exit).
conftest alternates between two zygotes, so consecutive runs differ in hash
seed and address layout as separate interpreters do.

Protocol, one JSON object per line: a request on stdin
{"argv", "env", "cwd", "out", "err"} (argv as python's after the
interpreter: a script, -c or -m, then arguments; out and err are files for
the child's fd 1 and 2); the zygote answers {"pid": N} when the child
runs and {"rc": N} when it ended (subprocess's returncode: -signal when
killed). End of stdin ends the zygote."""
import atexit
import json
import os
import runpy
import sys
import threading
import types


def _preload():
    """What most children import: loaded once here, shared with every
    child (copy on write). Nothing may start a thread or run a kernel."""
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401
    import torch.fx.experimental.proxy_tensor  # noqa: F401
    try:
        import transformers
        for name in ("GPT2LMHeadModel", "LlamaForCausalLM", "T5ForConditionalGeneration", "BertModel"):
            getattr(transformers, name)
    except Exception:  # none installed, or a model its dependencies refuse: the children import what they use
        pass


def _become(req, inbox, answers):
    """In the forked child: the process python would have started with
    req's arguments. Returns when the program ended normally; its
    SystemExit or exception propagates (the interpreter prints and exits)."""
    inbox.close()
    os.close(answers)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    for fd, path in ((1, req["out"]), (2, req["err"])):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(f, fd)
        os.close(f)
    os.chdir(req["cwd"])
    os.environ.clear()
    os.environ.update(req["env"])
    argv = req["argv"]
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    main = types.ModuleType("__main__")
    main.__builtins__ = __builtins__
    sys.modules["__main__"] = main
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        code = compile(argv[1], "<string>", "exec")
    else:  # a script: argv[0] as given, __file__ absolute
        sys.argv = list(argv)
        main.__file__ = os.path.abspath(argv[0])
        sys.path[0] = os.path.dirname(main.__file__)
        with open(main.__file__, "rb") as f:
            code = compile(f.read(), main.__file__, "exec")
    exec(code, main.__dict__)


def _exit(code):
    """The interpreter's shutdown up to its module teardown: threads
    joined, atexit run, output flushed. The teardown of everything the
    zygote imported took 1.3 s a child (each reference count it drops
    copies a page); a test of the teardown itself asks for a real
    interpreter (conftest.run_python's real=True)."""
    threading._shutdown()
    atexit._run_exitfuncs()
    for f in (sys.stdout, sys.stderr):
        f.flush()
    os._exit(code)


def _send(fd, obj):
    os.write(fd, (json.dumps(obj) + "\n").encode())


def main():
    # the protocol's pipes move off fd 0 and 1, which become /dev/null (a child gets its own files there)
    requests, answers = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    _preload()
    inbox = os.fdopen(requests, "r")
    for line in inbox:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                _become(req, inbox, answers)
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 0 if e.code is None else 1
                if not isinstance(e.code, (int, type(None))):
                    print(e.code, file=sys.stderr)
            except BaseException:
                sys.excepthook(*sys.exc_info())
                code = 1
            _exit(code)
        _send(answers, {"pid": pid})
        _, status = os.waitpid(pid, 0)
        _send(answers, {"rc": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    main()
