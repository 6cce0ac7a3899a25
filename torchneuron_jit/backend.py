"""The "neuron" back end of ``torch.compile``.

``torch.compile(model, backend="neuron")`` finds this module through the
``torch_dynamo_backends`` entry point (no import needed); importing
torchneuron_jit registers it too. TorchDynamo captures FX graphs;
aot_autograd, with our decomposition table, turns them into ATen graphs;
``compile_inference`` imports each into the graph IR and builds the compiled
callable.

Every internal failure degrades to eager execution of that graph with one
warning naming the cause (``stats()["eager_fallbacks"]`` counts them).
Graphs that need gradients run eagerly for now (``training_graphs``).
"""
import collections
import contextlib
import copy
import ctypes
import functools
import json
import math
import operator
import os
import threading
import time

import torch
import torch.utils._pytree as pytree
from torch._decomp import core_aten_decompositions
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch.fx._lazy_graph_module import _LazyGraphModule

from . import _C, _manager, _log, _planform, _tier2, cache, config, gemm
from .graph import CASTS_INSIDE, _fetch_attr, _is_size, from_fx, op_name, static_val

aten = torch.ops.aten

# Ops kept whole rather than decomposed: those the lowering takes as one
# fused kernel each, and those whose eager kernel beats its decomposition
# while they run through PyTorch (CPU flash attention).
KEEP_WHOLE = (aten._softmax, aten._log_softmax, aten.native_layer_norm, aten.gelu,
              aten.addmm, aten.baddbmm, aten.silu, aten.logsumexp, aten.var, aten.clamp_min,
              aten.clamp_max, aten.masked_fill, aten.t, aten.scaled_dot_product_attention,
              aten._scaled_dot_product_flash_attention_for_cpu,
              aten._weight_norm_interface,  # eager rounds v * (g / norm) once; the decomposition twice (bfloat16)
              # eager checks their inputs (an input outside [0, 1], a target out of range) and raises; the
              # decompositions give NaN, or a gather's RuntimeError where eager raises IndexError
              aten.binary_cross_entropy, aten.nll_loss_forward, aten.nll_loss2d_forward,
              # eager raises for an index out of range; the decompositions' index_put wraps a negative one
              # (a wrong row written) and raises IndexError for one too large; a bool index_add with alpha
              # promotes the source to int64 and raises
              aten.index_add, aten.index_copy, aten.max_unpool2d, aten.max_unpool3d,
              # eager's kernels: decomposed, F.interpolate became index and arithmetic chains 5-13x slower
              # (nearest: an index.Tensor gather), and istft's unfold_backward 512 index_add nodes (13-22x)
              # (a trace with the Python dispatcher on needs composites_whole too)
              aten.upsample_nearest1d, aten.upsample_nearest2d, aten.upsample_nearest3d,
              aten._upsample_nearest_exact1d, aten._upsample_nearest_exact2d, aten._upsample_nearest_exact3d,
              aten.upsample_linear1d, aten.upsample_bilinear2d, aten.upsample_bicubic2d, aten.upsample_trilinear3d,
              aten._upsample_bilinear2d_aa, aten._upsample_bicubic2d_aa, aten.unfold_backward,
              # F.pad's reflect and replicate modes (padding_mode="reflect", stft's center=True): decomposed,
              # index gathers 3.6-12x eager's time
              aten.reflection_pad1d, aten.reflection_pad2d, aten.reflection_pad3d,
              aten.replication_pad1d, aten.replication_pad2d, aten.replication_pad3d,
              # eager takes the square root of a variance it holds in double: decomposed to sqrt(var), a
              # float32 standard deviation above ~1.8e19 was inf
              aten.std, aten.std_mean)

# Test hook: when set to a string, the next graph's compilation fails with
# that reason (tests of the degrade-to-eager path).
fail_next_compile = None

# What this process's compilations did, for demos and reports.
compile_seconds = 0.0                      # time spent in compile_inference
fallback_ops = collections.Counter()       # ATen op -> nodes run through PyTorch
# (ATen op, reason) -> nodes run through PyTorch; the reasons:
NO_LOWERING = "no lowering"                # no kernel of ours can run it (or not with these arguments)
NOT_FUSED = "not fused"                    # in the op table, left out of every kernel
fallback_reasons = collections.Counter()


def decompositions():
    """Core ATen decompositions, minus the ops in KEEP_WHOLE (not to be
    changed: one table serves every build while no operator is registered;
    making it walks every operator, ~50 ms of the GIL per build)."""
    ops = len(torch._C._dispatch_get_all_op_names())
    if _decompositions[0] != ops:
        table = dict(core_aten_decompositions())
        for packet in KEEP_WHOLE:
            for overload in packet.overloads():
                table.pop(getattr(packet, overload), None)
        _decompositions[:] = [ops, {op: _as_eager_takes(op, fn) for op, fn in table.items()}]
        _decompositions[1][aten._grouped_mm.default] = _grouped_mm_on_cpu
    return _decompositions[1]


_decompositions = [None, None]  # [operators registered when it was made, the table]

# F.interpolate's ops, (packet, takes align_corners): KEEP_WHOLE keeps them out of our table, but each
# overload also has Python kernels at the CompositeImplicitAutograd and Autograd keys, which a trace with
# the Python dispatcher on (aot_autograd's, jit's symbolic ones) runs before any table: gathers and
# arithmetic 5-13x slower than eager's kernel
_UPSAMPLING = ((aten.upsample_nearest1d, False), (aten.upsample_nearest2d, False), (aten.upsample_nearest3d, False),
               (aten._upsample_nearest_exact1d, False), (aten._upsample_nearest_exact2d, False),
               (aten._upsample_nearest_exact3d, False), (aten.upsample_linear1d, True),
               (aten.upsample_bilinear2d, True), (aten.upsample_bicubic2d, True), (aten.upsample_trilinear3d, True),
               (aten._upsample_bilinear2d_aa, True), (aten._upsample_bicubic2d_aa, True))
_COMPOSITE_KEYS = (torch._C.DispatchKey.CompositeImplicitAutograd, torch._C.DispatchKey.Autograd)


def _upsampling_vec(packet, align):
    """The .vec overload F.interpolate calls, as the op's .default with the
    output size computed in Python (SymInts stay symbolic; the C++ kernel
    would want ints) and the scale factors eager's kernel reads."""
    from torch._decomp.decompositions import upsample_compute_output_size

    def vec(input, output_size, *rest):
        scale_factors = rest[-1]
        osize = upsample_compute_output_size(input.size(), output_size, scale_factors)
        scales = list(scale_factors) if scale_factors else [None] * len(osize)
        return packet.default(input, osize, *rest[:-1], *scales) if align else packet.default(input, osize, *scales)

    return vec


def _put_py_kernel(overload, key, kernel):
    """overload's Python kernel at key set to kernel (None: taken out)."""
    if kernel is None:
        overload.py_kernels.pop(key, None)
    else:
        overload.py_kernels[key] = kernel
    overload._dispatch_cache.clear()


class _Swapped:
    """A process-wide swap, reentrant (one count for every thread's traces
    inside): the first to enter runs apply, which makes the swaps and
    returns how to undo each; the last to leave undoes them, last first."""

    def __init__(self, apply):
        self.apply, self.lock, self.inside, self.undo = apply, threading.Lock(), 0, []

    def __enter__(self):
        with self.lock:
            if self.inside == 0:
                self.undo = self.apply()
            self.inside += 1

    def __exit__(self, *exc):
        with self.lock:
            self.inside -= 1
            if self.inside == 0:
                for undo in reversed(self.undo):
                    undo()
                self.undo = []


def _swap_composites():
    """composites_whole's swap: the Python kernels it puts in, and how to
    put the old ones back."""
    swaps = [(overload, kernel) for packet, align in _UPSAMPLING
             for overload, kernel in ((packet.vec, _upsampling_vec(packet, align)), (packet.default, None))]
    # F.pad's circular mode: torch.compile's graph calls torch._C._nn.pad itself (vf_whole swaps a name)
    swaps.append((aten._pad_circular.default, lambda input, pad: pad_circular(input, list(pad))))
    undo = []
    for overload, kernel in swaps:
        for key in _COMPOSITE_KEYS:
            undo.append(functools.partial(_put_py_kernel, overload, key, overload.py_kernels.get(key)))
            _put_py_kernel(overload, key, kernel)
    return undo


# Within: a trace with the Python dispatcher on records F.interpolate's ops whole (aten.upsample_*.default, run by
# eager's kernel as fallback nodes), where torch's Python kernels made index and arithmetic chains of them, and F.pad's
# circular mode as torchneuron::pad_circular, where its C++ composite made a copy of the result per border.
# Process-wide while any trace is inside; an op recorded whole is the op eager runs, so another thread's trace
# meanwhile gets it whole too.
composites_whole = _Swapped(_swap_composites)


# our ops' overloads -> their kernels, which a plan calls without the dispatcher (_op_callable)
_OUR_KERNELS = {}


def _our_op(name, schema, kernel):
    """torchneuron::name, a torch.library op of schema whose kernel (eager's
    own functions) a plan calls directly (_OUR_KERNELS)."""
    op = torch.library.custom_op(f"torchneuron::{name}", mutates_args=(), schema=schema)(kernel)
    _OUR_KERNELS[getattr(torch.ops.torchneuron, name).default] = kernel
    return op


def _grouped_mm_kernel(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """aten._grouped_mm where its meta kernel refuses what its CPU kernel
    takes (float32 and float16: transformers' MoE experts, Mixtral,
    Qwen2-MoE): the CPU kernel, its checks and its answer, with a fake
    kernel of its own (_grouped_mm_fake) that a symbolic trace runs through."""
    return aten._grouped_mm(mat_a, mat_b, offs=offs, bias=bias, out_dtype=out_dtype)


grouped_mm = _our_op("grouped_mm", "(Tensor self, Tensor mat2, Tensor? offs=None, Tensor? bias=None, "
                                   "ScalarType? out_dtype=None) -> Tensor", _grouped_mm_kernel)


@grouped_mm.register_fake
def _grouped_mm_fake(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """The result of the CPU kernel, contiguous: (groups, m, n) of two
    matrices split along k by offs; (m, n) where one side holds a matrix per
    group; (batch, m, n) of two batches."""
    if mat_a.dim() == 2 and mat_b.dim() == 2:
        torch._check(offs is not None, lambda: "grouped_mm of two matrices needs offs")
        sizes = (offs.size(0), mat_a.size(0), mat_b.size(1))
    elif mat_a.dim() == 2:
        sizes = (mat_a.size(0), mat_b.size(-1))
    elif mat_b.dim() == 2:
        sizes = (mat_a.size(1), mat_b.size(1))
    else:
        sizes = (mat_a.size(0), mat_a.size(1), mat_b.size(-1))
    return mat_a.new_empty(sizes, dtype=out_dtype or mat_a.dtype)


def _grouped_mm_on_cpu(mat_a, mat_b, offs=None, bias=None, out_dtype=None):
    """The decomposition of aten._grouped_mm: our op where the meta kernel
    would refuse the dtypes (anything but bfloat16), else the op as it is."""
    if mat_a.device.type != "cpu" or (mat_a.dtype == mat_b.dtype == torch.bfloat16):
        return NotImplemented
    return grouped_mm(mat_a, mat_b, offs, bias, out_dtype)


_RNN_ARGS = ("bool has_biases, int num_layers, float dropout, bool train, bool bidirectional, "
             "bool batch_first")
_VF_EAGER = torch._C._VariableFunctions  # torch._VF's own functions (vf_whole swaps some of torch._VF's)


def _rnn_kernel(mode, input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    """nn.GRU and nn.RNN (mode "gru", "rnn_tanh", "rnn_relu") as one op,
    eager's kernel: the ATen op they call has no kernel but its C++
    decomposition, which a trace records as ops per time step (every
    sequence length traced again, each variant slower than eager's loop).
    vf_whole records it as this op."""
    return getattr(_VF_EAGER, mode)(input, hx, params, has_biases, num_layers, dropout, train, bidirectional,
                                    batch_first)


rnn = _our_op("rnn", f"(str mode, Tensor input, Tensor hx, Tensor[] params, {_RNN_ARGS}) -> (Tensor, Tensor)",
              _rnn_kernel)


def _lstm_kernel(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    """nn.LSTM as one op, eager's kernel (as rnn: with proj_size or in half
    precision it has no oneDNN kernel, and was recorded per time step)."""
    return _VF_EAGER.lstm(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first)


lstm = _our_op("lstm", f"(Tensor input, Tensor[] hx, Tensor[] params, {_RNN_ARGS}) -> (Tensor, Tensor, Tensor)",
               _lstm_kernel)


def _rnn_output(input, hidden, bidirectional, batch_first):
    """The sequence output eager's kernel makes for input: (seq, batch,
    directions * hidden) row-major, returned transposed where batch_first."""
    n = (2 if bidirectional else 1) * hidden
    if batch_first:
        batch, seq = input.shape[:2]
        return input.new_empty_strided((batch, seq, n), (n, batch * n, 1))
    return input.new_empty((*input.shape[:2], n))


@rnn.register_fake
def _rnn_fake(mode, input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    return _rnn_output(input, hx.size(-1), bidirectional, batch_first), hx.new_empty(hx.shape)


@lstm.register_fake
def _lstm_fake(input, hx, params, has_biases, num_layers, dropout, train, bidirectional, batch_first):
    h, c = hx
    return _rnn_output(input, h.size(-1), bidirectional, batch_first), h.new_empty(h.shape), c.new_empty(c.shape)


def _stft_kernel(input, n_fft, hop_length, win_length, window, normalized, onesided, return_complex, align_to_window):
    """torch.stft as one op, eager's kernel: its composite kernel's strided
    view of the frames could not be made functional with symbolic sizes, so
    every signal length was a variant of its own."""
    return _VF_EAGER.stft(input, n_fft, hop_length, win_length, window, normalized, onesided, return_complex,
                          align_to_window)


stft = _our_op("stft", "(Tensor input, SymInt n_fft, SymInt? hop_length, SymInt? win_length, Tensor? window, "
                       "bool normalized, bool? onesided, bool? return_complex, bool? align_to_window) -> Tensor",
               _stft_kernel)


@stft.register_fake
def _stft_fake(input, n_fft, hop_length, win_length, window, normalized, onesided, return_complex, align_to_window):
    out = _VF_EAGER.stft(input, n_fft, hop_length, win_length, window, normalized, onesided, return_complex,
                         align_to_window)
    return out.new_empty_strided(out.shape, out.stride())


def _autograd_records(tensors):
    """Whether autograd records a call on tensors (grad mode, one of them
    requiring grad): our ops have no backward, so eager's functions take it."""
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def _as_one_op(name):
    """torch._VF.<name> inside vf_whole: our op, for the calls it takes; the
    others as eager makes them (an RNN over a packed sequence: another
    overload; dropout that draws; a call autograd records)."""
    eager = getattr(_VF_EAGER, name)

    def call(*args, **kwargs):
        if kwargs or len(args) != 9 or _autograd_records(pytree.tree_leaves(args)):
            return eager(*args, **kwargs)
        if name == "stft":
            return stft(*args)
        if not isinstance(args[1 if name == "lstm" else 2], (list, tuple)) or (args[6] and args[5] > 0):
            return eager(*args)
        input, hx, params, *rest = args
        if name == "lstm":
            return lstm(input, list(hx), list(params), *rest)
        return rnn(name, input, hx, list(params), *rest)

    return call


_NN_PAD = torch._C._nn.pad  # what F.pad calls (vf_whole swaps it)


def _pad_circular_kernel(input, pad):
    """F.pad's circular mode (Conv2d's padding_mode="circular") as one op,
    eager's kernel: its composite kernel writes the wrapped borders into
    slices of an empty tensor, which a functional graph made into a copy of
    the whole result per slice (6x eager's time)."""
    return _NN_PAD(input, pad, "circular", None)


pad_circular = _our_op("pad_circular", "(Tensor input, SymInt[] pad) -> Tensor", _pad_circular_kernel)


@pad_circular.register_fake
def _pad_circular_fake(input, pad):
    sizes = list(input.shape)
    for i in range(len(pad) // 2):
        sizes[-1 - i] = sizes[-1 - i] + pad[2 * i] + pad[2 * i + 1]
    return input.new_empty(sizes)


def _nn_pad(input, pad, mode="constant", value=None):
    """torch._C._nn.pad inside vf_whole: the circular mode as our op."""
    if mode == "circular" and value is None and isinstance(input, torch.Tensor) and not _autograd_records([input]):
        return pad_circular(input, list(pad))
    return _NN_PAD(input, pad, mode, value)


# (the module, the function's name there, ours in its place)
_WHOLE = [(torch._VF, name, _as_one_op(name)) for name in ("gru", "rnn_tanh", "rnn_relu", "lstm", "stft")] + \
    [(torch._C._nn, "pad", _nn_pad)]


def _swap_names():
    """vf_whole's swap: our functions in _WHOLE's places, and how to put the
    old ones back (torch._VF's own are found by its __getattr__: none is
    set there)."""
    undo = []
    for owner, name, call in _WHOLE:
        was = vars(owner).get(name)
        undo.append(functools.partial(setattr, owner, name, was) if was is not None else
                    functools.partial(delattr, owner, name))
        setattr(owner, name, call)
    return undo


# Within (jit's recording and its symbolic traces): nn.GRU, nn.RNN, nn.LSTM, torch.stft and F.pad's circular mode
# record torchneuron::rnn / lstm / stft / pad_circular, eager's kernel as one graph node whose sizes a symbolic
# trace keeps symbolic. torch._VF and torch._C._nn, which they call, have those functions swapped while any trace is
# inside. A TorchFunctionMode would do it for this thread only, but library code that finds one active leaves its
# fast paths (nn.TransformerEncoderLayer's, MultiheadAttention's); another thread's call meanwhile runs the same
# kernel through the op.
vf_whole = _Swapped(_swap_names)


# Ops whose decomposition rounds a float16 or bfloat16 result otherwise than eager's kernel does, found by
# running the first samples of every OpInfo in both dtypes through this table against eager (python -m
# torchneuron_jit.testing.halfdecomp; tests/python/test_dtypes.py runs them through the neuron door): the
# decompositions compute in float32 and round once (logit), or round each product on its own (addr's
# beta * a and alpha * u v^T), where eager's kernel rounds at each step of its own, or once; 1-17% of the
# values an ulp or more away, and an eps that rounds to 1.0 in bfloat16 is inf in eager's logit, finite in
# the decomposition's. Given a float16/bfloat16 tensor they stay whole (eager's kernel).
HALF_WHOLE = frozenset((aten.logit, aten.addr, aten.linalg_cross, aten.mse_loss, aten.soft_margin_loss,
                        aten.smooth_l1_loss, aten.huber_loss))


def _as_eager_takes(op, decomposition):
    """decomposition of op, for the inputs eager's kernel takes: given an
    integer, bool, float16 or bfloat16 tensor, where eager's kernel refuses
    its dtypes (lerp, softplus, mish, addcdiv of ints or bools, log_ndtr of
    float16: NotImplementedError or RuntimeError, where the decompositions
    computed an answer), it declines (NotImplemented) and op stays whole,
    to raise as eager does; so it does for an op of HALF_WHOLE given a
    float16 or bfloat16 tensor, to round as eager does."""
    half_whole = op.overloadpacket in HALF_WHOLE

    def decomposed(*args, **kwargs):
        if half_whole and any(_narrow(a) for a in (*args, *kwargs.values())):
            return NotImplemented
        if _eager_refuses(op, args, kwargs):
            return NotImplemented
        return decomposition(*args, **kwargs)
    return decomposed


def _eager_refuses(op, args, kwargs):
    """Whether op's CPU kernel raises for arguments of the dtypes and ranks
    of args and kwargs that hold an integer, bool, float16 or bfloat16
    tensor (False without one: float32 ones are the decompositions'),
    tried once per dtypes and ranks on tensors of one element each, of 0s
    and then of 1s (an index, a divisor): a refusal of both only keeps the
    op whole, eager's kernel and eager's answer."""
    if not any(_integral(a) or _narrow(a) or (type(a) in (list, tuple) and any(map(_integral, a)))
               for a in (*args, *kwargs.values())):
        return False  # the common case, at each decomposed op of a trace: no pytree walk
    leaves = pytree.tree_leaves((args, kwargs))
    if any(isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)) for x in leaves):
        return False  # sizes or numbers of the trace's own: nothing to run them on
    key = (op, tuple((t.dtype, t.dim()) if isinstance(t, torch.Tensor) else type(t) for t in leaves))
    if key not in _refusals:
        from torch.utils._python_dispatch import _disable_current_modes
        _refusals[key] = True
        for fill in (0, 1):
            try:
                with _disable_current_modes():  # real tensors, made and run outside the trace's modes
                    small = pytree.tree_map(
                        lambda t: torch.full((1,) * t.dim(), fill, dtype=t.dtype) if isinstance(t, torch.Tensor)
                        else t, (args, kwargs))
                    op(*small[0], **small[1])
            except Exception:
                continue
            _refusals[key] = False
            break
    return _refusals[key]


_refusals = {}  # (op, dtypes and ranks of its arguments) -> whether eager's kernel refuses them


def _integral(a):
    """Whether a is an integer or bool tensor."""
    return isinstance(a, torch.Tensor) and not (a.is_floating_point() or a.is_complex())


def _narrow(a):
    """Whether a is a float16 or bfloat16 tensor."""
    return isinstance(a, torch.Tensor) and a.dtype in (torch.float16, torch.bfloat16)


# Version of the cached artifact (payload layout, code generation): bump it
# when either changes meaning; it is part of every artifact key.
ARTIFACT_FORMAT = 35


def _torch_symbols(lib, *names):
    """The addresses (ints) of names in torch's own lib (torch/lib/<lib>),
    or None where that library or one of the names is missing."""
    try:
        handle = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", lib))
        return [ctypes.cast(getattr(handle, name), ctypes.c_void_p).value for name in names]
    except (OSError, AttributeError):
        return None


@functools.lru_cache(maxsize=None)
def _gemm_available():
    """Registers torch's own sgemm (MKL in the CPU wheels: the GEMM eager
    uses, on torch's thread pool) for GEMM kernels; False where this torch
    build exports none."""
    address = _torch_symbols("libtorch_cpu.so", "sgemm_")
    if not address or not address[0]:
        return False
    _C.set_sgemm(address[0])
    return True


# The unary ops whose float32/float64 kernels in eager are MKL's VM functions
# (ATen's vml): their names there, and the mode eager calls them in
# (VML_HA | VML_ERRMODE_IGNORE | VML_FTZDAZ_OFF; runtime.h TN_RT_VM_MODE).
_EAGER_MATH = {"exp": "Exp", "log": "Ln", "sin": "Sin", "cos": "Cos", "tanh": "Tanh", "erf": "Erf"}
_VM_MODE = 0x140102


@functools.lru_cache(maxsize=None)
def _eager_math():
    """Registers eager's own float32 and float64 exp, log, sin, cos, tanh
    and erf (MKL's VM functions in torch's CPU wheels, vmsExp ... in the
    mode eager passes: in vsExp's default one, every underflow, overflow
    or log(0) took an error path, 4-10x eager's time) for our kernels'
    blocks of those ops: libmvec's, the runtime's own, differ from eager's
    in the last bit for about one value in 50, which a later cast to half
    precision can turn into a visible difference. Each is registered only
    where it gives eager's bits on a probe of ordinary and special values.
    Returns the (op, dtype) pairs registered."""
    from torch.utils._python_dispatch import _disable_current_modes
    special = [0.0, -0.0, 1e-30, -1e-30, 1.0, -1.0, 88.5, -103.0, 700.0, math.inf, -math.inf, math.nan]
    signature = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong)
    done = []
    with _disable_current_modes():  # real tensors, where a compile's fake or tracing mode is on
        for op, vm in _EAGER_MATH.items():
            for prefix, dtype, bits in (("vms", torch.float32, torch.int32), ("vmd", torch.float64, torch.int64)):
                address = _torch_symbols("libtorch_cpu.so", prefix + vm)
                if not address or not address[0]:
                    continue
                x = torch.cat([torch.linspace(-40.0, 40.0, 1031, dtype=dtype), torch.tensor(special, dtype=dtype)])
                x = x.abs() if op == "log" else x
                got = torch.empty_like(x)
                signature(address[0])(x.numel(), x.data_ptr(), got.data_ptr(), _VM_MODE)
                if torch.equal(got.view(bits), getattr(torch, op)(x).view(bits)):
                    _C.set_eager_math(op, dtype == torch.float64, address[0])
                    done.append((op, dtype))
    return done


@functools.lru_cache(maxsize=None)
def _share_torch_threads():
    """Large launches split across PyTorch's own OpenMP threads (libgomp in
    the CPU wheels) rather than a pool of ours: one set of threads for both,
    already awake between ops. Registers too how a thread's OpenMP count is
    set (a build's own ops: gemm.own_threads) and how a call gives up a
    thread to a starved child process (a build's, _jit._BuildChild, or a
    tier-2 compiler): OpenMP's count and MKL's thread-local one (MKL takes
    torch.set_num_threads' count over OpenMP's). False where torch runs on
    no libgomp of its own (then a pool of ours splits launches, and nothing
    is set or lent)."""
    lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")
    try:  # only the runtime torch has loaded: loading a second one would be a second pool
        with open("/proc/self/maps") as maps:
            if not any(line.rstrip().endswith(lib) for line in maps):
                return False
    except OSError:
        return False
    omp = _torch_symbols("libgomp.so.1", "GOMP_parallel", "omp_get_thread_num", "omp_get_num_threads",
                         "omp_set_num_threads", "omp_get_max_threads")
    if not omp or not all(omp):
        return False
    _C.set_openmp(*omp[:3])
    # the C interface (mkl_service.h maps mkl_set_num_threads_local to it; that symbol is Fortran's, by pointer)
    mkl = _torch_symbols("libtorch_cpu.so", "MKL_Set_Num_Threads_Local")  # None: a torch without MKL
    _C.build_lend_with(omp[3], omp[4], mkl[0] if mkl else 0)
    return True


def _fusion_on(setting):
    """Whether a fusion setting of auto|on|off (row_fusion, gemm_fusion) is
    on now: auto is on where tier 2 can run."""
    return setting == "on" or (setting == "auto" and _tier2.available())


def _row_fusion():
    return _fusion_on(config.row_fusion)


def _row_fusion_min_row():
    """The shortest rows row fusion takes: config.row_fusion_min_row under
    auto, every row when it is on."""
    return max(0, config.row_fusion_min_row) if config.row_fusion == "auto" else 0


def _row_fusion_auto():
    """Whether row fusion leaves to eager's kernels the rows auto does not
    take (_C.fuse's auto_rows: reductions over strided rows, float16 and
    bfloat16 sums; fuse.c rows_auto): under auto, which fuses what measured
    faster and gives eager's answer; on takes them too."""
    return config.row_fusion == "auto"


def _gemm_fusion():
    return _fusion_on(config.gemm_fusion) and _gemm_available()


@functools.lru_cache(maxsize=None)
def _cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def _key_context():
    """Everything besides the graph that the artifact depends on. The GEMM
    choices are measured, so the host's CPU and thread count are in it."""
    from . import __version__
    return (f"torchneuron_jit {__version__}; torch {torch.__version__}; "
            f"graph {_C.GRAPH_FORMAT_VERSION}; artifact {ARTIFACT_FORMAT}; "
            f"row_fusion {_row_fusion()} from {_row_fusion_min_row()} auto rows {_row_fusion_auto()}; "
            f"gemm {_gemm_fusion()}; "
            f"onednn_linear {_onednn_linear()}; packed {bool(config.onednn_packed_weights)}; "
            f"conv_channels_last {bool(config.conv_channels_last)}; "
            f"flash {config.flash_attention} from {config.flash_attention_min_scores}; "
            f"cpu {_cpu_name()}; threads {gemm.call_threads()}").encode()


def _onednn_linear():
    return bool(config.onednn_linear) and gemm.available()


class _Artifact:
    """The lowering artifact of one graph: its fused groups and GEMM choices.

    It comes from the persistent cache when an earlier process lowered the
    same graph; otherwise the canonical form of the graph is lowered here
    and :meth:`store` saves it once the GEMM choices are measured. Cached
    node ids are canonical, so a graph built in another insertion order maps
    them correctly.
    """

    def __init__(self, imported):
        g = imported.graph
        self.key = g.key(_key_context())
        self.order, vmap = g.canonical_ids()
        t0 = time.perf_counter()
        payload = cache.get(cache.ARTIFACTS, self.key)
        self.artifact = None
        if payload is not None:
            try:
                artifact = json.loads(payload)
                if artifact.get("format") == ARTIFACT_FORMAT:
                    self.artifact = artifact
            except ValueError:
                pass
        self.lowered = self.artifact is None
        if not self.lowered:
            _C.stat_add("cache_hits")
            _log.event("cache", f"hit {self.key.hex()} in {(time.perf_counter() - t0) * 1e3:.2f} ms")
        else:
            _C.stat_add("cache_misses")
            groups = _C.fuse(_C.decode_graph(g.encode()), rows=_row_fusion(), gemm=_gemm_fusion(),
                             linear_act=_onednn_linear(), min_row=_row_fusion_min_row(),
                             auto_rows=_row_fusion_auto())
            self.artifact = {"format": ARTIFACT_FORMAT, "groups": groups, "onednn": None}
            self.seconds = time.perf_counter() - t0
        order, value_of = self.order, {canon: v for v, canon in enumerate(vmap)}
        self.groups = [dict(grp, nodes=[order[n] for n in grp["nodes"]],
                            inputs=[value_of[v] for v in grp["inputs"]],
                            outputs=[value_of[v] for v in grp["outputs"]],
                            into=[slot and [value_of[slot[0]], *slot[1:]] for slot in grp["into"]])
                       for grp in self.artifact["groups"]]

    def onednn_units(self, imported):
        """[(linear node, kind)] for the units (gemm.find_unit) oneDNN runs:
        the cached choice, or, in a graph lowered here, measured now."""
        fused = {n for grp in self.groups for n in grp["nodes"]}
        units = {}
        for i, node in enumerate(imported.fx_nodes):
            unit = None if i in fused else gemm.find_unit(node)
            if unit is not None:
                units[i] = unit
        canon = {imp: c for c, imp in enumerate(self.order)}
        if self.artifact["onednn"] is None:
            listed = list(units.items())
            chosen = gemm.choose([u for _, u in listed], _gemm_choices,
                                 packed=bool(config.onednn_packed_weights)) if _onednn_linear() else []
            self.artifact["onednn"] = sorted([canon[listed[k][0]], kind] for k, kind in chosen)
        picked = [(self.order[c], kind) for c, kind in self.artifact["onednn"]]
        if any(i not in units or not gemm.known_kind(kind) or kind == "aten" for i, kind in picked):
            raise RuntimeError("a cached oneDNN choice names a node that is no linear layer")
        return [(units[i].nodes[0], kind) for i, kind in picked]

    def store(self):
        """Saves a plan lowered here in the persistent cache."""
        if not self.lowered:
            return
        t0 = time.perf_counter()
        stored = cache.put(cache.ARTIFACTS, self.key, json.dumps(self.artifact).encode())
        _log.event("cache", f"miss {self.key.hex()}: lowered in {(self.seconds + time.perf_counter() - t0) * 1e3:.2f} ms"
                            + ("" if stored else " (not stored)"))


class _GemmChoices:
    """What timing chose for each GEMM unit signature (gemm.choose): kept
    for this process and in the persistent cache, under a key of the
    signature and everything the timing depended on (_key_context: the
    host's CPU, threads, versions). A graph lowered later, here or in
    another process, that holds a layer of a timed shape times nothing."""

    def __init__(self):
        self.memo = {}

    @staticmethod
    def _key(sig):
        return _C.content_key(_key_context() + b"; gemm unit " + repr(sig).encode())

    def get(self, sig):
        if sig not in self.memo:
            payload = cache.get(cache.ARTIFACTS, self._key(sig))
            try:
                kind = json.loads(payload)["kind"] if payload is not None else None
            except (ValueError, KeyError, TypeError):
                kind = None
            if gemm.known_kind(kind):
                self.memo[sig] = kind
        return self.memo.get(sig)

    def put(self, sig, kind):
        self.memo[sig] = kind
        cache.put(cache.ARTIFACTS, self._key(sig), json.dumps({"kind": kind}).encode())


_gemm_choices = _GemmChoices()


def _stable_toposort(graph):
    """Reorders graph's nodes so each comes after its inputs, keeping the
    present order wherever it already does (Kahn's algorithm, earliest
    first)."""
    import heapq
    nodes = list(graph.nodes)
    rank = {n: i for i, n in enumerate(nodes)}
    waiting = {n: len(set(n.all_input_nodes)) for n in nodes}
    ready = [rank[n] for n in nodes if waiting[n] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        n = nodes[heapq.heappop(ready)]
        order.append(n)
        for user in n.users:
            waiting[user] -= 1
            if waiting[user] == 0:
                heapq.heappush(ready, rank[user])
    if len(order) != len(nodes):
        raise RuntimeError("the fused graph has a cycle")
    if order != nodes:
        first = nodes[0]
        if order[0] is not first:
            first.prepend(order[0])
        for prev, n in zip(order, order[1:]):
            prev.append(n)


def _input_view(node, fused, cats):
    """(root, view) for a pointwise kernel's input: when node is a chain of
    view ops, each of its dtype and static layout, over a graph input, a
    module constant, a kernel's result or a cat that kernels write into
    (cats; layouts the compiled graph fixes: Dynamo guards the inputs,
    kernels allocate theirs as the graph says),
    the kernel reads root as the view (base sizes, base strides, sizes,
    strides, offset) and the view ops need not run. A copy (clone) whose
    every reader is fused (fused: the FX nodes going into kernels) is read
    through: the kernel takes what it copies, the same values in whatever
    layout. Otherwise (node, None)."""
    if node.op == "call_function" and node.target in _COPIES and \
            all(u in fused or u.meta.get("neuron_kernel") for u in node.users):
        node = node.args[0]
    val = static_val(node)
    if val is None or val.numel() == 0:
        return node, None
    root, hops = node, 0
    while root.op == "call_function" and _aliases_input(root):
        base = root.args[0].args[0] if root.target is operator.getitem else root.args[0]
        bv = static_val(base)
        if bv is None or bv.dtype != val.dtype:
            return node, None
        root, hops = base, hops + 1
    fixed = root.op in ("placeholder", "get_attr") or root in cats or (
        root.target is operator.getitem and root.args[0].meta.get("neuron_kernel"))
    rv = static_val(root)
    if not hops or not fixed or rv.numel() == 0:
        return node, None
    return root, (tuple(rv.shape), rv.stride(), tuple(val.shape), val.stride(),
                  val.storage_offset() - rv.storage_offset())


def _drop_unread(graph):
    """Erases the view ops and copies nobody reads any more (kernels read
    their roots); returns how many."""
    dropped = 0
    for node in reversed(list(graph.nodes)):
        if node.op == "call_function" and not node.users and (_aliases_input(node) or node.target in _COPIES):
            graph.erase_node(node)
            dropped += 1
    return dropped


def _cat_layout(cat):
    """(dim, offsets) of a cat whose parts have concrete sizes along the
    dim it joins (fusion's cat slots; symbolic ones elsewhere are 2 or
    more): that dim and where each part starts there (eager skips empty
    parts, of any rank)."""
    vals = [_val(part) for part in cat.args[0]]
    dim = (cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)) % _val(cat).dim()
    offsets, offset = [], 0
    for v in vals:
        offsets.append(offset)
        offset += int(v.shape[dim]) if all(isinstance(n, torch.SymInt) or n for n in v.shape) else 0
    return dim, offsets


def _cat_buffer(graph, cat, inputs):
    """A node allocating the result of cat (a cat slot's, inserted at the
    graph's insertion point), or None where a symbolic size of it is no
    size of an input (inputs: _input_sizes), which the buffer would then
    have to read off a tensor computed later."""
    cv = _val(cat)
    if any(isinstance(n, torch.SymInt) and n.node.expr not in inputs for n in cv.shape):
        return None
    sizes = []
    for n in cv.shape:
        if isinstance(n, torch.SymInt):
            source, dim = inputs[n.node.expr]
            if dim is not None:
                source = graph.call_function(aten.sym_size.int, (source, dim))
                source.meta["val"] = n
            n = source
        sizes.append(n)
    buf = graph.call_function(torch.empty, (tuple(sizes),), {"dtype": cv.dtype})
    buf.meta = dict(cat.meta)
    return buf


def _cat_finish(buf, dim, parts, offsets, *written):
    """A cat's result: buf, whose slices kernels wrote (written: their
    results, which order this call after them), with the other parts
    copied in at offsets along dim."""
    for part, offset in zip(parts, offsets):
        if part.numel():
            buf.narrow(dim, offset, part.shape[dim]).copy_(part)
    return buf


def _finish_cats(graph, cats):
    """Replaces each cat some kernels write into (cats: cat -> (its buffer,
    the kernels' results written there, which are parts of it)) by
    _cat_finish. Returns how many."""
    for cat, (buf, written) in cats.items():
        dim, offsets = _cat_layout(cat)
        rest = [(part, offset) for part, offset in zip(cat.args[0], offsets) if part not in written]
        done = _replace_by_call(graph, cat, _cat_finish, (buf, dim, [p for p, _ in rest], [o for _, o in rest],
                                                          *written))
        done.meta["neuron_cat"] = True
        graph.erase_node(cat)
    return len(cats)


def _fuse(graph, imported, groups):
    """Replaces each fused group of graph by one generated kernel.

    Groups are
    found on the graph's canonical order, where every input of a group
    exists before its first node; in the graph's own order that need not
    hold, so the nodes are put back in a topological order afterwards (a
    group is convex, so one exists).
    """
    moved = {}  # FX node of a group output -> the getitem that now holds it
    cats = {}   # cat written into by kernels -> (its buffer, the kernels' results written there)
    unslotted = set()  # cats of a symbolic size that no input holds: no kernel writes into them
    input_sizes = _input_sizes(graph)
    members_all = {imported.fx_nodes[i] for grp in groups for i in grp["nodes"]}
    for grp in groups:
        members = [imported.fx_nodes[i] for i in grp["nodes"]]
        inputs = [moved.get(n, n) for n in (imported.fx_values[v] for v in grp["inputs"])]
        outputs = [imported.fx_values[v] for v in grp["outputs"]]
        views = donors = into = None
        slots = []
        if not grp["gemm"] and not grp["reduce_dims"]:
            inputs, views = zip(*(_input_view(n, members_all, cats) for n in inputs)) if inputs else ((), ())
            views = list(views) if any(views) else None
            # the cat each output is written into (fusion's cat slots): (its FX node, dim, offset)
            slots = [slot and (imported.fx_values[slot[0]], slot[1], slot[2]) for slot in grp["into"]]
            with graph.inserting_before(members[0]):
                for slot in filter(None, slots):
                    if slot[0] not in cats and slot[0] not in unslotted:
                        buf = _cat_buffer(graph, slot[0], input_sizes)
                        if buf is None:
                            unslotted.add(slot[0])
                        else:
                            cats[slot[0]] = (buf, [])
            slots = [slot if slot and slot[0] in cats else None for slot in slots]
            into = [slot and slot[1:] for slot in slots] if any(slots) else None
            donors = grp["donors"] if any(d >= 0 for d in grp["donors"]) else None  # none where a slot is
        spec = (grp["source"], len(inputs), len(outputs), list(grp["dtypes"]), grp["reduce_dims"],
                grp["out_kinds"], grp["nonempty"], grp["gemm"], grp["epilogue"], grp["out_strides"],
                grp["gathers"], views, donors, into, grp["tier2"])
        kernel = make_kernel(spec)
        with graph.inserting_before(members[0]):
            targets = []
            for slot in filter(None, slots):
                targets.append(cats[slot[0]][0])
            call = graph.call_function(kernel, tuple(inputs) + tuple(targets))
            call.meta["neuron_kernel"] = spec  # how to make it again (a stored plan's constant)
            for i, old in enumerate(outputs):
                item = graph.call_function(operator.getitem, (call, i))
                item.meta = dict(old.meta)
                old.replace_all_uses_with(item)
                moved[old] = item
                if into and into[i]:
                    cats[slots[i][0]][1].append(item)
        for node in reversed(members):
            for user in list(node.users):  # getitems of a multi-output node, now unused
                if user.target is operator.getitem and not user.users:
                    graph.erase_node(user)
            graph.erase_node(node)
        _log.event("compile", f"fused {len(members)} ops into one kernel: "
                              + ", ".join(str(m.target) for m in members))
    _finish_cats(graph, cats)
    if groups:
        _drop_unread(graph)
        _stable_toposort(graph)


def make_kernel(spec, object_code=None):
    """The generated kernel of spec: _C.Kernel's arguments, its dtypes by
    name and without the allocator (the one place a kernel is made, for a
    fused group and for a stored plan's constant, which gives its
    object_code: loaded, not compiled)."""
    source, nin, nout, dtypes, *rest = spec
    tier2 = rest.pop() if len(rest) == 11 else None  # its tier-2 source (_tier2.py swaps that in when due)
    return _C.Kernel(source, nin, nout, torch.empty, [getattr(torch, d) for d in dtypes], *rest,
                     object=object_code, tier2=tier2)


def _op_callable(target):
    """What a plan step calls for an FX node's target: one of our ops
    (torchneuron::) its kernel, the Python function that runs eager's
    (the dispatcher's way to a Python kernel cost 10-40 us a call: GRU's
    190 against 151 us, stft's 26 against 11 us); another overload its own
    C++ callable (OpOverload.__call__ only forwards to it); else the target
    itself."""
    if isinstance(target, torch._ops.OpOverload):
        return _OUR_KERNELS.get(target, target._op)
    return target


def _step_kind(node):
    if node.meta.get("neuron_kernel"):
        return _C.STEP_KERNEL
    if isinstance(node.target, torch._ops.OpOverload):
        return _C.STEP_ATEN
    return _C.STEP_CALL


def plan_of(gm, eager):
    """The compiled-graph plan of a fused graph module gm (the FX graph is
    its input format only): one step per call, slots for the inputs and each
    step's result, every other argument a constant of the plan's table.
    eager is the graph's eager original, which csrc/fallback runs when a
    step fails."""
    consts, const_ids, described = [], {}, []
    slot = {}

    def const(value, what=None):
        key = (type(value), id(value))
        if key not in const_ids:  # the objects stay alive in consts: ids stay unique
            const_ids[key] = len(consts)
            consts.append(value)
            described.append(value if what is None else what)
        return const_ids[key]

    def operand(a, in_list=False):
        if isinstance(a, torch.fx.Node) and a.op == "get_attr":  # a tensor of the module: a constant
            return (_C.OPND_CONST, const(_fetch_attr(gm, a.target)))
        if isinstance(a, torch.fx.Node):
            return (_C.OPND_SLOT, slot[a])
        if isinstance(a, (list, tuple)) and not in_list and any(isinstance(e, torch.fx.Node) for e in a):
            return (_C.OPND_LIST, [operand(e, True) for e in a])
        if isinstance(a, (list, tuple)) and any(isinstance(e, torch.fx.Node) for e in a):
            raise RuntimeError("plan: a list of nodes inside a list")
        return (_C.OPND_CONST, const(a))

    steps, ninputs = [], 0
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            slot[node] = ninputs
            ninputs += 1
    nslots = ninputs
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            continue
        if node.op == "get_attr":
            continue
        if node.op == "output":
            outs = node.args[0]
            bare = not isinstance(outs, (list, tuple))  # returned as eager's graph returns it
            outputs = [operand(o) for o in ((outs,) if bare else outs)]
            break
        if node.op != "call_function":
            raise RuntimeError(f"plan: {node.op} node {node.name}")
        if node.target is operator.getitem and isinstance(node.args[0], torch.fx.Node):
            steps.append((_C.STEP_ITEM, 0, node.args[1], [operand(node.args[0])], 0, 0))
        else:
            args = [operand(a) for a in node.args]
            kw = list(node.kwargs.items())
            kwargs = [operand(v) for _, v in kw]
            names = const(tuple(k for k, _ in kw)) if kw else 0
            what = node.meta.get("neuron_kernel")
            what = _planform.KernelSpec(what) if what else node.target
            steps.append((_step_kind(node), const(_op_callable(node.target), what), 0, args + kwargs, len(kw),
                          names))
        slot[node] = nslots
        nslots += 1
    plan = _C.Plan(ninputs, tuple(consts), steps, outputs, eager_callable(eager), _warn_once, gm, bare)
    plan.form = {"consts": described}  # what each constant is, for _planform.encode
    return plan


def eager_callable(eager):
    """What a plan calls to run graph eager eagerly (when a step fails, or
    the graph runs eagerly for good): a graph module's forward itself, as
    the user's own code would raise (through the module's __call__, torch.fx
    prints its generated code to stderr for an exception the user's code
    raises in it, a ZeroDivisionError of an int argument)."""
    return eager.forward if isinstance(eager, torch.fx.GraphModule) else eager


def _warn_once(message):
    _log.warn_once(message)


# -- graph passes before import ---------------------------------------------------
# Each rewrites an aot graph in place and returns how many rewrites it made;
# _build lints and regenerates the module's code once, after all of them.

def _replace_by_call(graph, old, target, args):
    """A call of target on args, in old's place: before it, with its
    metadata and its users."""
    with graph.inserting_before(old):
        new = graph.call_function(target, args)
    new.meta = dict(old.meta)
    old.replace_all_uses_with(new)
    return new


def _aliases_input(node):
    """Whether node's result may share storage with its first argument (a
    view op, or getitem of a view op's tuple)."""
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return _aliases_input(node.args[0])
    if node.target in (aten._unsafe_view.default, aten._reshape_alias.default):
        return True  # views whose schema does not say so
    schema = getattr(node.target, "_schema", None)
    return bool(schema and schema.returns and schema.returns[0].alias_info is not None
                and not schema.returns[0].alias_info.is_write)


# Copies _drop_copies may remove: clones, and the copies aot_autograd makes
# of tensor constants (torch.tensor(...) in the traced code).
_COPIES = (aten.clone.default, aten.lift_fresh_copy.default)


def _mutates(graph):
    """Whether a node of graph calls an op that writes to one of its arguments."""
    for node in graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is not None and schema.is_mutable:
            return True
    return False


def _escaping(graph):
    """The nodes whose storage can reach graph's outputs: the outputs, what
    each is a view of, and the op whose results an output was taken from
    (sort's, topk's, max's over a dim: two such ops are two results)."""
    escapes = set()
    todo = list(graph.output_node().all_input_nodes)
    while todo:
        n = todo.pop()
        if n in escapes:
            continue
        escapes.add(n)
        if (_aliases_input(n) or n.target is operator.getitem) and n.args and isinstance(n.args[0], torch.fx.Node):
            todo.append(n.args[0])
    return escapes


_LAYOUT_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.as_strided.default)


def _views_its_layout(node):
    """Whether a view of node's result, or of a view of it, takes its
    strides as they are (view, as_strided): valid on a clone, which is
    dense, and not on what it copied where that is not (an expanded
    tensor: XLNet's positional embedding through eval-mode dropout, then
    reshaped)."""
    todo, seen = list(node.users), set()
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        seen.add(n)
        if n.op == "call_function" and n.target in _LAYOUT_VIEWS:
            return True
        if _aliases_input(n):
            todo.extend(n.users)
    return False


def _dense(node):
    """Whether node's result is non-overlapping and dense at its static
    layout (a clone that preserves format copies its strides then)."""
    from torch._prims_common import is_non_overlapping_and_dense_or_false
    val = static_val(node)
    return val is not None and bool(is_non_overlapping_and_dense_or_false(val))


def _drop_copies(graph):
    """Removes the clones whose copy nobody can observe: in a graph that
    mutates nothing, a clone that preserves layout (or one to contiguous
    format of a tensor that already is contiguous, with static sizes) whose
    result, and every view of it, stays inside the graph is its input, but
    where a view takes the copy's strides and its input may not be dense
    (_views_its_layout).
    aot_autograd leaves such clones for dropout in eval mode and around
    attention's reshapes, where eager copies nothing. Returns how many."""
    if _mutates(graph):
        return 0
    escapes = _escaping(graph)
    dropped = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _COPIES or node in escapes:
            continue
        fmt = node.kwargs.get("memory_format", node.args[1] if len(node.args) > 1 else None)
        src = node.args[0]
        if fmt not in (None, torch.preserve_format):
            val = static_val(src)
            if not (fmt == torch.contiguous_format and val is not None and val.is_contiguous()):
                continue
        if _views_its_layout(node) and not _dense(src):
            continue
        node.replace_all_uses_with(src)
        graph.erase_node(node)
        dropped += 1
    if dropped:
        _log.event("compile", f"dropped {dropped} copies nobody observes")
    return dropped


def _cse_key(value):
    """A hashable form of an argument for _merge_repeats: numbers with
    their type and sign (True, 1 and 1.0, or 0.0 and -0.0, are different
    arguments to an op), containers as tuples."""
    if isinstance(value, torch.fx.Node):
        return ("node", value)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_cse_key(v) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple(sorted((k, _cse_key(v)) for k, v in value.items())))
    if isinstance(value, (bool, int, float, complex, str)) or value is None:
        return (type(value).__name__, repr(value))
    hash(value)  # dtypes, devices, layouts, memory formats; anything else raises TypeError: no key
    return (type(value).__name__, value)


def _merge_repeats(graph):
    """Common subexpressions: in a graph that mutates nothing, a node that
    calls the same op on the same arguments as an earlier one is that
    node (HF models build the same float attention mask from the bool one
    in every layer). Not for ops that draw random numbers or return
    uninitialised memory, and never two nodes that both reach the graph's
    outputs (eager returns two tensors there, not one twice). Returns how
    many nodes went."""
    if _mutates(graph):
        return 0
    escapes = _escaping(graph)
    first, merged = {}, 0
    for node in list(graph.nodes):
        target = node.target
        if node.op != "call_function" or not (isinstance(target, torch._ops.OpOverload) or target is operator.getitem):
            continue
        if target is not operator.getitem and (torch.Tag.nondeterministic_seeded in target.tags
                                               or target.overloadpacket.__name__.lstrip("_").startswith(
                                                   ("empty", "new_empty"))):
            continue
        try:
            # a merged node's users name the earlier one now: their keys meet too
            key = (target, _cse_key(node.args), _cse_key(node.kwargs))
            earlier = first.setdefault(key, node)
        except TypeError:
            continue
        if earlier is node or (node in escapes and earlier in escapes):
            continue
        node.replace_all_uses_with(earlier)
        graph.erase_node(node)
        if node in escapes:
            escapes.add(earlier)
        merged += 1
    if merged:
        _log.event("compile", f"merged {merged} repeated nodes")
    return merged


# -- attention as one call ----------------------------------------------------

_FLASH = aten._scaled_dot_product_flash_attention_for_cpu.default
_VIEWS = (aten.view.default, aten._unsafe_view.default, aten.reshape.default)


def _calls(node, *targets):
    """Whether node is an FX node calling one of targets."""
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


def _sizes_known_equal(a, b):
    """Whether two size lists are equal for every value of their symbols."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true
    return len(a) == len(b) and all(statically_known_true(x == y) for x, y in zip(a, b))


def _val(node):
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return val if isinstance(val, torch.Tensor) else None


def _bmm_operand(view):
    """x where view = view(clone(expand(x, x's own sizes)), [b*h, m, n])
    (the clone and the expand may be absent), x 4-d: one side of a batched
    matmul as torch.matmul writes it. The nodes in between have one user each.
    Returns (x, [nodes between x and the bmm]) or (None, None)."""
    chain = [view]
    if not _single_use(view, *_VIEWS):
        return None, None
    x = view.args[0]
    if _single_use(x, aten.clone.default):  # matmul's copy of a strided operand
        chain.append(x)
        x = x.args[0]
    if _single_use(x, aten.expand.default):
        chain.append(x)
        if _val(x.args[0]) is None or not _sizes_known_equal(_val(x.args[0]).shape, _val(x).shape):
            return None, None
        x = x.args[0]
    xv, vv = _val(x), _val(view)
    if xv is None or vv is None or xv.dim() != 4 or vv.dim() != 3 \
            or not _sizes_known_equal(vv.shape, [xv.shape[0] * xv.shape[1], xv.shape[2], xv.shape[3]]):
        return None, None
    return x, chain


def _key_of(kt):
    """k where kt is k with its last two dims swapped (permute or
    transpose, one user), else None."""
    if not _single_use(kt, aten.permute.default, aten.transpose.int):
        return None
    dims = kt.args[1] if kt.target is aten.permute.default else sorted(d % 4 for d in kt.args[1:3])
    ok = list(dims) == [0, 1, 3, 2] if kt.target is aten.permute.default else dims == [2, 3]
    return kt.args[0] if ok else None


def _hint_numel(val):
    """Elements of a tensor's metadata, a symbolic size counted at the value
    it had when traced (0 where none is known)."""
    n = 1
    for d in val.shape:
        d = d if isinstance(d, int) else d.node.hint
        if d is None:
            return 0
        n *= int(d)
    return n


def _fake_call(mode, target, args, kwargs=None):
    """target's result on the metadata of its node arguments (fake tensors
    of mode)."""
    def val(a):
        return a.meta["val"] if isinstance(a, torch.fx.Node) else a
    with mode:
        return target(*[val(a) for a in args], **{k: val(a) for k, a in (kwargs or {}).items()})


def _new_call(graph, mode, target, args, kwargs=None):
    """A call of target inserted at the graph's insertion point, with its
    metadata."""
    node = graph.call_function(target, tuple(args), kwargs or {})
    node.meta["val"] = _fake_call(mode, target, args, kwargs)
    return node


class _Inserted:
    """Calls of a rewrite inserted at the graph's insertion point, each
    with its metadata (_new_call), kept in order so that a rewrite that
    fails part way can take them all out again (undo)."""

    def __init__(self, graph, mode):
        self.graph, self.mode, self.nodes = graph, mode, []

    def __call__(self, target, args, kwargs=None):
        self.nodes.append(_new_call(self.graph, self.mode, target, args, kwargs))
        return self.nodes[-1]

    def undo(self):
        for node in reversed(self.nodes):
            self.graph.erase_node(node)


def _scaled_scores(s):
    """(scale, [the nodes scaling], scores) where s = scores times or over
    numbers (in place too: view round trips), scores a 4-d view of a bmm,
    each of one use; else None."""
    scale, scaled = 1.0, []
    s = _through_round_trip(s, scaled)
    while _single_use(s, aten.mul.Tensor, aten.div.Tensor) and not s.kwargs:
        c = s.args[1]
        if _calls(c, aten.full.default) and list(c.args[0]) == [] and _val(c) is not None \
                and _val(c).dtype == torch.float32:
            c = c.args[1]  # a 0-dim tensor of a number: GPT-2's torch.full([], head_dim ** 0.5)
        if isinstance(c, bool) or not isinstance(c, (int, float)) or c == 0:
            return None
        scale = scale * c if s.target is aten.mul.Tensor else scale / c
        scaled.append(s)
        s = _through_round_trip(s.args[0], scaled)
    if not _single_use(s, *_VIEWS) or not _single_use(s.args[0], aten.bmm.default):
        return None
    return scale, scaled, s


def _through_round_trip(s, nodes):
    """s's base where s is a chain of views (each of one use) that gives
    back its base's sizes and strides (functionalization writes
    `scores += mask` on a view so), the views appended to nodes; else s."""
    chain, base = [], s
    while _single_use(base, *_VIEWS):
        chain.append(base)
        base = base.args[0]
    sv, bv = _val(s), _val(base)
    if not chain or sv is None or bv is None or not _sizes_known_equal(sv.shape, bv.shape) \
            or not _sizes_known_equal(sv.stride(), bv.stride()):
        return s
    nodes += chain
    return base


def _peel_masks(s):
    """([masks], [the adds], _scaled_scores(...)) where s = scaled scores
    plus tensors (the masks, innermost first; the adds, outermost first),
    each add of one use; else None."""
    views = []
    s = _through_round_trip(s, views)
    if _single_use(s, aten.add.Tensor) and not s.kwargs:
        for a, b in (s.args, s.args[::-1]):
            inner = _peel_masks(a) if isinstance(b, torch.fx.Node) else None
            if inner is not None:
                return inner[0] + [b], views + [s] + inner[1], inner[2]
        return None
    found = _scaled_scores(s)
    return None if found is None else ([], views, found)


def _attention_match(out):
    """The attention torch.matmul writes, ending at out: out =
    bmm(softmax(scale * (q @ k^T) [+ mask]), v) viewed back to 4-d, float32,
    every node between one use. Returns dict(q, k, v, masks, scale, nodes,
    scores: the scores' metadata) or None."""
    bmm = out.args[0] if _calls(out, *_VIEWS) else None
    if not _single_use(bmm, aten.bmm.default):
        return None
    p, p_chain = _bmm_operand(bmm.args[0])
    v, v_chain = _bmm_operand(bmm.args[1])
    if p is None or v is None:
        return None
    nodes = [bmm] + p_chain + v_chain
    while _single_use(p, aten.clone.default) and not p.kwargs:  # dropout in eval
        nodes.append(p)
        p = p.args[0]
    if not _single_use(p, aten._softmax.default) or p.args[2] or p.args[1] not in (-1, 3):
        return None
    nodes.append(p)
    peeled = _peel_masks(p.args[0])
    if peeled is None:
        return None
    masks, adds, (scale, scaled, s) = peeled
    nodes += adds
    q, q_chain = _bmm_operand(s.args[0].args[0])
    kt, k_chain = _bmm_operand(s.args[0].args[1])
    k = _key_of(kt)
    if q is None or k is None:
        return None
    nodes += scaled + [s, s.args[0]] + q_chain + k_chain + [kt]
    qv, kv, vv, sv, ov = (_val(n) for n in (q, k, v, s, out))
    if any(t is None or t.dtype != torch.float32 for t in (qv, kv, vv, sv, ov)):
        return None
    b, h, l, e = qv.shape
    n = kv.shape[2]
    if not (_sizes_known_equal(kv.shape, [b, h, n, e]) and _sizes_known_equal(vv.shape, [b, h, n, e])
            and _sizes_known_equal(sv.shape, [b, h, l, n]) and _sizes_known_equal(ov.shape, [b, h, l, e])):
        return None  # flash attention takes q, k and v of one head size
    for mask in masks:
        mv = _val(mask)
        if mv is None or mv.dtype != torch.float32 or mv.dim() > 4 \
                or not all(_sizes_known_equal([m], [1]) or _sizes_known_equal([m], [d])
                           for m, d in zip(mv.shape, list(sv.shape)[-mv.dim():])):
            return None
    if masks and max(_val(m).dim() for m in masks) not in (2, 4):
        return None  # flash attention takes a mask of 2 or 4 dims
    return dict(q=q, k=k, v=v, masks=masks, scale=float(scale), nodes=nodes, scores=sv)


def _flash_call(graph, out, m, call):
    """The flash attention call that replaces the attention _attention_match
    found at out (m), inserted before out through call (an _Inserted, so
    that a failure can take the nodes out). Returns the node of the
    result."""
    with graph.inserting_before(out):
        mask = m["masks"][0] if m["masks"] else None
        for more in m["masks"][1:]:  # the scores plus each mask: the scores plus their sum
            mask = call(aten.add.Tensor, (mask, more))
        kwargs = {"scale": m["scale"]} if mask is None else {"attn_mask": mask, "scale": m["scale"]}
        flash = call(_FLASH, (m["q"], m["k"], m["v"], 0.0, False), kwargs)
        res = call(operator.getitem, (flash, 0))
        if mask is not None:
            row_max = call(aten.amax.default, (mask, [-1], True))
            dead = call(aten.eq.Scalar, (row_max, float("-inf")))
            nan = call(aten.scalar_tensor.default, (float("nan"),), {"dtype": torch.float32})
            res = call(aten.where.self, (dead, nan, res))
        if not _sizes_known_equal(res.meta["val"].stride(), out.meta["val"].stride()):
            res = call(aten.clone.default, (res,), {"memory_format": torch.contiguous_format})
    return res


def _surely_nonempty(val):
    """Whether tensor metadata val has elements whatever its symbols are
    (a symbolic size is known to be 2 or more, as jit and Dynamo make it)."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true
    return val is not None and all(statically_known_true(d != 0) if isinstance(d, torch.SymInt) else d != 0
                                   for d in val.shape)


def _flash_attention(graph):
    """Writes attention as torch.matmul and softmax spell it (Hugging Face's
    eager attention, hand-written attention) as one call of PyTorch's CPU
    flash attention, the kernel eager's scaled_dot_product_attention runs:
    no [b, h, l, n] scores in memory, one pass instead of three. float32,
    additive float masks (their sum of 2 or 4 dims), a number as scale;
    config.flash_attention says where (auto: masked attention only where
    its scores are large). The values differ by rounding only, but where a
    mask row is -inf throughout eager's softmax gives NaN and flash
    attention 0: the NaN is put back (where the row's max of the mask is
    -inf). Returns how many."""
    if config.flash_attention == "off":
        return 0
    done = 0
    for out in list(graph.nodes):
        m = _attention_match(out) if _calls(out, *_VIEWS) else None
        if m is None or (m["masks"] and config.flash_attention == "auto"
                         and _hint_numel(m["scores"]) < config.flash_attention_min_scores) \
                or not all(_surely_nonempty(_val(m[x])) for x in "qkv"):
            continue  # the flash kernel divides by zero on an empty q, k or v (SIGFPE), where eager's gives 0s
        mode = getattr(m["q"].meta["val"], "fake_mode", None)
        if mode is None:
            continue
        call = _Inserted(graph, mode)
        try:
            res = _flash_call(graph, out, m, call)
        except Exception as exc:  # a meta function that refuses these inputs: left as it was
            call.undo()
            _log.event("compile", f"attention at {out} stays matmul and softmax: {type(exc).__name__}: {exc}")
            continue
        out.replace_all_uses_with(res)
        graph.erase_node(out)
        for node in m["nodes"]:  # users first: the match lists them from the output back
            graph.erase_node(node)
        done += 1
    if done:
        _log.event("compile", f"{done} attention blocks as one flash attention call each")
    return done


# Ops whose result is a fresh tensor laid out as their meta function says
# (contiguous): as_strided over it reads the elements the views would.
_DENSE_RESULTS = (aten.mm.default, aten.addmm.default, aten.bmm.default, aten.baddbmm.default,
                  aten.linear.default, aten.clone.default)


def _dense_result(node):
    """Whether node's result is fresh and laid out as its metadata says: the
    ops above, and pointwise ops (their meta function is the eager one's
    TensorIterator)."""
    if node.op != "call_function":
        return False
    return node.target in _DENSE_RESULTS or torch.Tag.pointwise in getattr(node.target, "tags", ())


def _collapse_views(graph):
    """Replaces each chain of two or more view ops (each feeding only the
    next) over the fresh result of a GEMM, a copy or a pointwise op by one
    as_strided call:
    the same elements, one dispatch instead of several (attention's head
    reshapes are chains of four). Static shapes only; the result's layout
    is taken from the graph's metadata, so only ops whose layout that
    metadata states for certain are bases. Returns how many view nodes
    went."""
    dropped = 0
    for node in list(graph.nodes):
        if not _aliases_input(node) or node.target is operator.getitem or static_val(node) is None:
            continue
        # node ends a chain when its single user is not a view op that could extend it
        users = list(node.users)
        if len(users) == 1 and _aliases_input(users[0]) and users[0].target is not operator.getitem:
            continue
        chain = [node]
        while True:
            prev = chain[-1].args[0]
            if (isinstance(prev, torch.fx.Node) and _aliases_input(prev) and prev.target is not operator.getitem
                    and len(prev.users) == 1):
                chain.append(prev)
            else:
                break
        base = chain[-1].args[0]
        if len(chain) < 2 or not isinstance(base, torch.fx.Node) or not _dense_result(base):
            continue
        out, src = static_val(node), static_val(base)
        if src is None or src.storage_offset() != 0 or src.dtype != out.dtype:  # x.view(torch.int32): bits
            continue
        _replace_by_call(graph, node, aten.as_strided.default,
                         (base, list(out.shape), list(out.stride()), out.storage_offset()))
        for v in chain:
            graph.erase_node(v)
        dropped += len(chain) - 1
    if dropped:
        _log.event("compile", f"collapsed view chains: {dropped} fewer view ops")
    return dropped


def _single_use(node, *targets):
    """Whether node calls one of targets and has one user (None is no node)."""
    return _calls(node, *targets) and len(node.users) == 1


# Arithmetic whose first operand may be a number in the graph (1.0 - x).
_NUMBER_FIRST = (aten.add.Tensor, aten.sub.Tensor, aten.mul.Tensor, aten.div.Tensor)


def _materialize_number_operands(graph):
    """Gives a number that stands first where the schema says Tensor (aot
    writes `1.0 - x` as sub.Tensor(1.0, x)) a 0-dim tensor of the result's
    dtype, so that the op can fuse (the factory becomes a constant of the
    kernel). Same values: eager converts such a number to the result's
    dtype as well. Returns how many."""
    done = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _NUMBER_FIRST or not node.args:
            continue
        first, val = node.args[0], node.meta.get("val")
        if isinstance(first, bool) or not isinstance(first, (int, float)) or not isinstance(val, torch.Tensor) \
                or not val.dtype.is_floating_point:
            continue
        with graph.inserting_before(node):
            const = graph.call_function(aten.scalar_tensor.default, (first,), {"dtype": val.dtype})
        const.meta["val"] = val.new_empty(())
        node.args = (const,) + tuple(node.args[1:])
        done += 1
    return done


def _full_like_as_full(graph):
    """Writes full_like(x, v) (zeros_like, ones_like) as full(shape, v)
    where the result's sizes are static and it is contiguous anyway (then
    the two are the same tensor), so that it can become a constant of the
    kernel that reads it. Returns how many."""
    done = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not aten.full_like.default or len(node.args) != 2:
            continue
        val = static_val(node)
        if val is None or not val.is_contiguous() or node.kwargs.get("layout") not in (None, torch.strided) \
                or node.kwargs.get("pin_memory") or val.device.type != "cpu":
            continue
        with graph.inserting_before(node):
            full = graph.call_function(aten.full.default, (list(val.shape), node.args[1]),
                                       {"dtype": val.dtype, "layout": torch.strided, "device": val.device,
                                        "pin_memory": False})
        full.meta = dict(node.meta)
        node.replace_all_uses_with(full)
        graph.erase_node(node)
        done += 1
    return done


# a value the graph computes from constants alone of more elements than this stays an op at run time
_FOLD_MAX = 1 << 16
# factories whose value a kernel makes as a constant of its own (full, zeros): folded only as the source of
# a computation
_FOLD_SOURCES_KEPT = {aten.full.default, aten.zeros.default, aten.ones.default, aten.scalar_tensor.default,
                      aten.empty.memory_format, aten.empty_strided.default}


def _fold_constants(gm):
    """Computes once, here, with eager's own kernels, each value the graph
    computes from constants alone (numbers, and the tensor literals of the
    traced code: an arange of number bounds and what follows it, a
    relative position index built on every call where Hugging Face's
    lru_cache is off under torch.compile: BEiT's 266 nodes), and makes
    the last such values before the rest of the graph constants of the
    module: inputs the kernels read like any other, so the ops after them
    fuse (a position mask, an iota scaled). Not a value the graph returns,
    or a view of which it returns (each call returns a tensor of its own,
    as eager's: a caller may change it in place), nor any in a graph that
    writes a tensor in place; up to _FOLD_MAX elements; random ops never.
    Returns how many values became constants."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    graph = gm.graph
    if _mutates(graph):
        return 0
    escapes, values = _escaping(graph), {}
    for node in graph.nodes:
        if node.op == "get_attr" and node.target.startswith(("_tensor_constant", "_neuron_")):
            values[node] = getattr(gm, node.target)
            continue
        target = node.target
        val = static_val(node) if node.op == "call_function" else None
        if val is None or node in escapes or not isinstance(target, torch._ops.OpOverload) or \
                target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags or \
                val.numel() > _FOLD_MAX or val.device.type != "cpu" or val.layout != torch.strided or \
                any(n not in values for n in node.all_input_nodes) or \
                any(isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool))
                    for a in torch.utils._pytree.tree_leaves((node.args, node.kwargs))):
            continue
        args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: values[n])
        try:
            with unset_fake_temporarily():
                value = target(*args, **kwargs)
        except Exception:  # eager's error is the run's to raise
            continue
        if isinstance(value, torch.Tensor):
            values[node] = value
    done = 0
    for node, value in values.items():
        if node.op != "call_function" or all(user in values for user in node.users):
            continue  # a constant's, or used by constants alone
        if node.target in _FOLD_SOURCES_KEPT or not node.users:
            continue
        name = f"_neuron_constant_{done}"
        while hasattr(gm, name):
            name += "_"
        gm.register_buffer(name, value, persistent=False)
        with graph.inserting_before(node):
            const = graph.get_attr(name)
        const.meta = dict(node.meta)
        node.replace_all_uses_with(const)
        done += 1
    if done:
        graph.eliminate_dead_code()
        _log.event("compile", f"folded {done} values computed from constants alone into constants")
    return done


def _stored_matrix(node):
    """Whether node is a 2-D float32 tensor the graph is given (an input or
    an attribute: a weight), not one it computes, of static sizes."""
    return node.op in ("placeholder", "get_attr") and gemm._f32(node, 2)


def _recompose_linear(graph):
    """Puts linear layers back together: mm(x, t(w)) and addmm(b, x, t(w))
    become aten.linear(x, w[, b]), and the views that flatten a 3-D input
    and unflatten the result go too (sizes symbolic or not): one dispatch
    instead of two to four, the same kernels underneath. A product with a
    stored (K, N) matrix, mm(x, W) or addmm(b, x, W) (GPT-2's Conv1D),
    becomes aten.linear(x, t(W)[, b]): aten.linear runs it as the same
    addmm, and oneDNN takes the transposed view in place, so such layers
    are timed for oneDNN too (gemm.py). Not with gemm_fusion, whose groups
    are made of mm/addmm. Returns how many."""
    if _gemm_fusion():
        return 0
    done = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in (aten.mm.default, aten.addmm.default):
            continue
        if node.target is aten.mm.default:
            bias, x, wt = None, *node.args[:2]
        elif node.kwargs or len(node.args) > 3:
            continue  # beta or alpha given
        else:
            bias, x, wt = node.args
        transposed = None  # x @ W with W stored: its transposed view, made below, is the linear weight
        if _stored_matrix(wt) and wt is not x:
            transposed = wt
        elif not _single_use(wt, aten.t.default):
            continue
        # x = view(x3, [M, K]) and the result's only use unflattens it to x3's leading dims; a bias of
        # (M, N) is added to the flat rows only (linear on x3 would broadcast it against x3's dims)
        unflatten = None
        user = next(iter(node.users)) if len(node.users) == 1 else None
        flat_bias = bias is not None and (static_val(bias) is None or static_val(bias).dim() > 1)
        if not flat_bias and _single_use(x, aten.view.default) \
                and _single_use(user, aten.view.default, aten._unsafe_view.default):
            # sizes as expressions: a jit variant's symbolic rows too (left flat, a dynamic BERT's FFN kept
            # its GELU and residual add out of the oneDNN call: its steady p50 0.75x the static variant's)
            x3, res = _val(x.args[0]), _val(user)
            if x3 is not None and res is not None and x3.dim() >= 2 and _sizes_known_equal(res.shape[:-1],
                                                                                           x3.shape[:-1]):
                unflatten = user
        if transposed is not None:
            with graph.inserting_before(node):
                weight = graph.call_function(aten.t.default, (transposed,))
            weight.meta["val"] = static_val(transposed).t()
        else:
            weight = wt.args[0]
        args = (x.args[0] if unflatten is not None else x, weight) + (() if bias is None else (bias,))
        _replace_by_call(graph, unflatten if unflatten is not None else node, aten.linear.default, args)
        for dead in (unflatten, node, x) if unflatten is not None else (node,):
            graph.erase_node(dead)
        if transposed is None:
            graph.erase_node(wt)
        done += 1
    if done:
        _log.event("compile", f"recomposed {done} linear layers")
    return done


def _input_sizes(graph):
    """Where graph's inputs hold its symbolic sizes: sympy expression ->
    (placeholder, dim), or (placeholder, None) for a number input."""
    where = {}
    for node in graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt):
            where.setdefault(val.node.expr, (node, None))
        elif isinstance(val, torch.Tensor):
            for d, size in enumerate(val.shape):
                if isinstance(size, torch.SymInt):
                    where.setdefault(size.node.expr, (node, d))
    return where


def _sizes_from_inputs(graph):
    """A size read off a computed tensor (sym_size.int of a view, as a jit
    trace over symbolic sizes reads them) whose value is a size of an input
    or a number input is read there instead. The IR does not see size
    arithmetic (it runs in the FX graph), so a kernel could take in both
    the tensor a size was read from and a later op that needs the size:
    with the size read from an input there is no such path (BART's
    embeddings: "the fused graph has a cycle"). Returns how many."""
    where = _input_sizes(graph)
    done = 0
    for node in list(graph.nodes):
        if not _calls(node, aten.sym_size.int) or node.args[0].op == "placeholder":
            continue
        val = node.meta.get("val")
        found = where.get(val.node.expr) if isinstance(val, torch.SymInt) else None
        if found is None:
            continue
        source, dim = found
        if dim is None:
            node.replace_all_uses_with(source)
            graph.erase_node(node)
        else:
            node.args = (source, dim)
        done += 1
    if done:
        _log.event("compile", f"{done} sizes read off inputs instead of computed tensors")
    return done


def _max_pools_as_maxima(graph):
    """A 2-d max pool without padding or dilation whose indices nobody
    reads, of a static float input, becomes the maximum of its window's
    k*k strided views of the input (x[..., i::s, j::s] cut to the output's
    size): one generated kernel reads the input once, where eager's
    max_pool2d measured 2.2x slower at 8x16x64x64 channels-last (113 us
    against 50) and 10x slower NCHW. The values are eager's: maximum, as
    max_pool2d, gives NaN where the window holds one. Windows of more than
    9 elements (a kernel input each), padding (it would need a copy with
    -inf borders first), ceil_mode and a result whose strides would not be
    eager's stay eager's, as do symbolic sizes (a jit variant of dynamic
    batch: the kernel cannot take views of symbolic sizes, and the maxima
    through PyTorch are slower than the pool). Returns how many."""
    done = 0
    for pool in list(graph.nodes):
        if not _calls(pool, aten.max_pool2d_with_indices.default):
            continue
        x, kernel, *rest = pool.args
        stride, padding, dilation, ceil_mode = (list(rest) + [[], [0, 0], [1, 1], False][len(rest):])[:4]
        kernel = list(kernel) * (2 // len(kernel))
        stride = list(stride or kernel) * (2 // len(stride or kernel))
        xv, items = static_val(x), list(pool.users)
        if xv is None or not xv.is_floating_point() or xv.dim() not in (3, 4) or pool.kwargs \
                or any(p != 0 for p in padding) or any(d != 1 for d in dilation) or ceil_mode \
                or not 1 < kernel[0] * kernel[1] <= 9 or min(kernel) < 1 or min(stride) < 1 \
                or not all(u.target is operator.getitem and (u.args[1] == 0 or not u.users) for u in items):
            continue
        h, w = xv.shape[-2:]
        oh, ow = (h - kernel[0]) // stride[0] + 1, (w - kernel[1]) // stride[1] + 1
        if oh < 1 or ow < 1:
            continue
        mode = getattr(xv, "fake_mode", None)
        if mode is None:
            continue
        call = _Inserted(graph, mode)
        with graph.inserting_before(pool):
            res = None
            for i in range(kernel[0]):
                rows = call(aten.slice.Tensor, (x, xv.dim() - 2, i, i + stride[0] * (oh - 1) + 1, stride[0]))
                for j in range(kernel[1]):
                    view = call(aten.slice.Tensor, (rows, xv.dim() - 1, j, j + stride[1] * (ow - 1) + 1, stride[1]))
                    res = view if res is None else call(aten.maximum.default, (res, view))
        want = next((u for u in items if u.args[1] == 0), None)
        got, wanted = res.meta["val"], static_val(want)
        if wanted is None or tuple(got.shape) != tuple(wanted.shape) \
                or (wanted.numel() > 1 and tuple(got.stride()) != tuple(wanted.stride())):
            call.undo()
            continue
        want.replace_all_uses_with(res)
        for u in items:
            graph.erase_node(u)
        graph.erase_node(pool)
        done += 1
    if done:
        _log.event("compile", f"{done} max pools as the maximum of their windows' views")
    return done


def _channels_last_convs(gm):
    """With config.conv_channels_last, the 2-d convolutions of gm read
    channels-last inputs: a clone to channels_last before each whose input
    is not yet, and the graph's metadata propagated again, so the ops after
    it (relu, pooling, our kernels) follow that layout, as eager's do; a
    result whose strides changed is made contiguous again where eager's was
    (otherwise nothing is changed). oneDNN runs a convolution with a
    channels-last input in NHWC throughout: at 8x3x64x64 through two convs
    and a max pool, 1.8x eager's NCHW. A symbolic batch (a jit variant of
    dynamic sizes) is fine; channels, height and width must be static.
    Returns how many convs read NHWC."""
    if not config.conv_channels_last or not torch.backends.mkldnn.is_available() or not torch.backends.mkldnn.enabled:
        return 0
    graph = gm.graph
    convs = []
    for n in graph.nodes:
        # one whose input comes from a conv that goes channels-last gets a channels-last input anyway
        if n.op == "call_function" and n.target is aten.convolution.default and not n.args[6] and \
                _nchw_conv_input(n.args[0]) and (_channels_last_pays(n) or _after_any(n, convs)):
            convs.append(n)
    if not convs:
        return 0
    old = {n: n.meta.get("val") for n in graph.nodes}
    clones = []
    for conv in convs:
        with graph.inserting_before(conv):
            clone = graph.call_function(aten.clone.default, (conv.args[0],),
                                        {"memory_format": torch.channels_last})
        conv.replace_input_with(conv.args[0], clone)
        clones.append(clone)
    output = next(n for n in graph.nodes if n.op == "output")
    restored = []
    try:
        _propagate_meta(gm)
        for value in output.all_input_nodes:
            want, got = old.get(value), value.meta.get("val")
            if not isinstance(want, torch.Tensor) or _sizes_known_equal(got.stride(), want.stride()):
                continue
            if not want.is_contiguous() or _aliases_input(value):
                raise ValueError(f"{value} would change strides")
            with graph.inserting_before(output):
                back = graph.call_function(aten.clone.default, (value,), {"memory_format": torch.contiguous_format})
            back.meta = dict(value.meta, val=want)
            output.replace_input_with(value, back)
            restored.append(back)
    except Exception as exc:  # a graph the layout cannot go through: as it was
        for back in restored:
            output.replace_input_with(back, back.args[0])
            graph.erase_node(back)
        for clone in clones:
            clone.replace_all_uses_with(clone.args[0])
            graph.erase_node(clone)
        for n, val in old.items():
            n.meta["val"] = val
        _log.event("compile", f"convolutions stay NCHW: {type(exc).__name__}: {exc}")
        return 0
    for clone in clones:  # its input is channels-last already (after an earlier conv)
        if clone.args[0].meta["val"].is_contiguous(memory_format=torch.channels_last):
            clone.replace_all_uses_with(clone.args[0])
            graph.erase_node(clone)
    relus = sum(_conv_relu(graph, conv) for conv in convs)
    _log.event("compile", f"{len(convs)} convolutions run channels-last, {relus} with their relu")
    return len(convs)


def _after_any(node, nodes):
    """Whether node computes from (transitively) one of nodes."""
    targets, seen, todo = set(nodes), set(), list(node.all_input_nodes)
    while todo and targets:
        n = todo.pop()
        if n in targets:
            return True
        if n not in seen:
            seen.add(n)
            todo.extend(n.all_input_nodes)
    return False


def _channels_last_pays(conv):
    """Whether conv is worth running in oneDNN on a channels-last copy of
    its input. Where ATen itself takes oneDNN for it, yes (at 8x3x64x64
    0.13x eager's time). Where it takes its Slow2d kernel (a batch of 1 and
    few elements: ATen's thresholds), oneDNN's fixed cost of ~45 us a call
    decides: on results of 16x16 or fewer pixels it lost every time
    (1x4x16x16: 48 against 14 us; 1x16x16x16 1.4x, 1x64x8x8 1.3x eager's
    time), from 32x32 it was about even or won (1x3x64x64 0.83x), and the
    layout then pays on in the pooling after it. Timing each conv alone
    (with its clone) chose wrongly where the ops after it gained."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily
    x, w, b, *args = conv.args
    xv, wv, bv, out = _val(x), _val(w), _val(b), _val(conv)
    select = getattr(torch._C, "_select_conv_backend", None)
    if select is None or wv is None or out is None or \
            not all(isinstance(d, int) for t in (xv, wv, out) for d in (*t.shape, *t.stride())):
        return True
    with unset_fake_temporarily():  # empty: ATen's choice reads sizes only
        xr, wr = torch.empty_strided(xv.shape, xv.stride(), dtype=xv.dtype), torch.empty(wv.shape, dtype=wv.dtype)
        br = torch.empty(bv.shape, dtype=bv.dtype) if bv is not None else None
        try:
            slow = select(xr, wr, br, *args, None) == torch._C._ConvBackend.Slow2d
        except (RuntimeError, TypeError, AttributeError):  # another torch's signature: channels-last, as before
            return True
    return not (slow and out.shape[-1] * out.shape[-2] <= 256)


def _conv_relu(graph, conv):
    """relu(convolution(x, ...)) of float32, the relu the conv's only
    reader, as one oneDNN call with relu as its post-op (the values are
    the same: max(v, 0) of each sum): a pass over the result saved.
    Returns 1 if done."""
    relu = next(iter(conv.users)) if len(conv.users) == 1 else None
    if relu is None or relu.target is not aten.relu.default or not hasattr(torch.ops.mkldnn, "_convolution_pointwise") \
            or any(getattr(_val(a), "dtype", None) != torch.float32 for a in conv.args[:2]):
        return 0
    x, w, b, stride, padding, dilation, _, _, groups = conv.args
    _replace_by_call(graph, relu, torch.ops.mkldnn._convolution_pointwise.default,
                     (x, w, b, padding, stride, dilation, groups, "relu", [], ""))
    graph.erase_node(relu)
    graph.erase_node(conv)
    return 1


def _nchw_conv_input(x):
    """A 4-d float input of static sizes but maybe the batch (a jit variant
    of dynamic batch) that is not channels-last. Not float16: oneDNN's NHWC
    and NCHW convolutions round differently, and a float16 ViT's patch
    embedding, through its encoder, came out beyond float16's tolerance of
    eager's (66 of 2176 elements)."""
    val = _val(x)
    if val is None or val.dim() != 4 or not val.is_floating_point() or val.dtype == torch.float16 \
            or not all(isinstance(d, int) for d in (*val.shape[1:], *val.stride())):
        return False
    c, h, w = val.shape[1:]
    return tuple(val.stride()[1:]) != (1, w * c, c)


def _propagate_meta(gm):
    """Every node's meta["val"] again, from its placeholders' (after a
    rewrite that changes strides)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    inputs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    vals = [n.meta.get("val") for n in inputs]
    symbolic = next((_val(n) for n in inputs if _val(n) is not None and static_val(n) is None), None)
    if symbolic is not None:  # a dynamic variant: its own mode, whose shape environment holds the symbols
        FakeTensorProp(gm, symbolic.fake_mode).propagate_dont_convert_inputs(*vals)
        return
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    args = [mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for v in vals]
    FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*args)


def _subgraph(gm, node):
    """The graph module a get_attr node of gm names (a higher-order op's
    subgraph: torch.cond's branch, a nested_compile_region's body), else None."""
    if isinstance(node, torch.fx.Node) and node.op == "get_attr":
        body = _fetch_attr(gm, node.target)
        return body if isinstance(body, torch.fx.GraphModule) else None
    return None


def _inline_subgraphs(gm):
    """Each call of a torch.compiler.nested_compile_region function (the
    higher-order op invoke_subgraph: Dynamo traced its body once) with the
    body's nodes in its place, so that they are lowered and fused with the
    graph around them: as a fallback node, the whole region ran eagerly.
    A body that reads attributes of its own (tensor constants, nested
    subgraphs) stays a call. Returns how many were inlined."""
    hop = getattr(torch.ops.higher_order, "invoke_subgraph", None)
    graph, inlined = gm.graph, 0
    for node in list(graph.nodes):
        if hop is None or node.op != "call_function" or node.target is not hop:
            continue
        holder, operands = node.args[0], node.args[2:]
        body = _subgraph(gm, holder)
        if body is None or any(n.op == "get_attr" for n in body.graph.nodes) or \
                sum(n.op == "placeholder" for n in body.graph.nodes) != len(operands) or \
                any(u.target is not operator.getitem for u in node.users):
            continue
        env = dict(zip([n for n in body.graph.nodes if n.op == "placeholder"], operands))
        with graph.inserting_before(node):
            results = graph.graph_copy(body.graph, env)
        results = results if isinstance(results, (list, tuple)) else (results,)
        for user in list(node.users):
            user.replace_all_uses_with(results[user.args[1]])
            graph.erase_node(user)
        graph.erase_node(node)
        if not holder.users:
            graph.erase_node(holder)
        inlined += 1
    if inlined:
        _log.event("compile", f"inlined {inlined} calls of nested_compile_region functions")
    return inlined


def _compile_branches(gm):
    """torch.cond's branches, each compiled to a plan of its own: the op, a
    fallback node, calls them as functions (its own eager form runs the
    branch the predicate picks). A branch that does not compile runs as
    traced. Done after the import: the graph's key names the branches by
    their code."""
    hop = getattr(torch.ops.higher_order, "cond", None)
    for node in gm.graph.nodes:
        if hop is None or node.op != "call_function" or node.target is not hop:
            continue
        args = list(node.args)
        for i in (1, 2):
            body = _subgraph(gm, args[i])
            if body is None:
                continue
            try:
                args[i] = _build(body, None).call  # the branch's operands one by one
            except Exception as exc:  # ours: this branch runs as Dynamo traced it
                _log.event("compile", f"a branch of {node.name} runs as traced ({type(exc).__name__}: {exc})")
        node.args = tuple(args)


def _build(gm, example_inputs, eager=None):
    """The compiled plan of an inference graph (raises on any failure); gm
    is rewritten in place when eager (its original) is given."""
    global fail_next_compile
    if fail_next_compile is not None:
        reason, fail_next_compile = fail_next_compile, None
        raise RuntimeError(reason)
    if eager is None:
        eager = gm
        # the caller keeps the eager original; the copy is the plan's input, never run, so its
        # Python code is never generated (a lazy graph module makes it on a first call only)
        gm = _LazyGraphModule(gm, copy.deepcopy(gm.graph))
    _inline_subgraphs(gm)
    _drop_copies(gm.graph)
    _sizes_from_inputs(gm.graph)
    _flash_attention(gm.graph)
    _recompose_linear(gm.graph)
    _collapse_views(gm.graph)
    _merge_repeats(gm.graph)  # after the passes that match single-use nodes (a weight's t(), a view chain)
    _materialize_number_operands(gm.graph)
    _full_like_as_full(gm.graph)
    _fold_constants(gm)
    _channels_last_convs(gm)
    _max_pools_as_maxima(gm.graph)
    set_threads()
    imported = from_fx(gm)
    artifact = _Artifact(imported)
    _fuse(gm.graph, imported, artifact.groups)
    for head, kind in artifact.onednn_units(imported):
        gemm.rewrite(gm.graph, head, kind)
    artifact.store()
    gm.graph.lint()
    _compile_branches(gm)
    compiled = plan_of(gm, eager)
    _C.stat_add("graphs_compiled")
    if artifact.lowered:
        _C.stat_add("graphs_lowered")
    report = _fallback_report_of(gm.graph, imported)
    if isinstance(compiled, _C.Plan):  # kept for the plan's stored form (_planform)
        compiled.form["report"] = report
    count_fallbacks(report)
    return compiled


def set_threads():
    """Our kernels' thread count (config.kernel_threads, else torch's), and
    torch's OpenMP pool shared with them."""
    threads = config.kernel_threads or torch.get_num_threads()
    _C.set_kernel_threads(max(1, min(64, threads)))
    _share_torch_threads()
    _eager_math()


def _fallback_report_of(graph, imported):
    """What a compiled graph runs through PyTorch: {"lowered": nodes of
    ours, "ops": [[op, reason, nodes]], "targets": {str(target): nodes}}
    (count_fallbacks counts it; a stored plan keeps it)."""
    lowers = _lowered_ops()
    unlowered = {imported.fx_nodes[i] for i, name in enumerate(imported.node_ops) if name not in lowers}
    here, targets = collections.Counter(), collections.Counter()
    for node in graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem or node.meta.get("neuron_kernel") \
                or node.meta.get("neuron_cat") or node.target is torch.empty:
            continue
        targets[str(node.target)] += 1
        if node.meta.get("neuron_gemm") or _is_size(node) or \
                not isinstance(node.target, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
            continue  # our own calls (the linear units oneDNN runs), size arithmetic
        here[(op_name(node.target), NO_LOWERING if node in unlowered else NOT_FUSED)] += 1
    return {"lowered": max(0, len(imported.fx_nodes) - sum(here.values())),
            "ops": [[name, reason, n] for (name, reason), n in sorted(here.items())], "targets": dict(targets)}


@functools.lru_cache(maxsize=None)
def _lowered_ops():
    """The ops of the IR's table that our lowering can put in a kernel."""
    return frozenset(_C.lowered_ops())


def count_fallbacks(report):
    """Counts a compiled graph's report (_fallback_report_of): the nodes
    that run through PyTorch by op and reason (fallback_reasons,
    stats()["fallback_ops"], one TORCHNEURON_LOG=fallback line per op and
    reason) and those that run in ours."""
    fallback_ops.update(report["targets"])
    _C.stat_add("fallback_nodes", sum(n for _, _, n in report["ops"]))
    _C.stat_add("lowered_nodes", report["lowered"])
    for name, reason, n in report["ops"]:
        fallback_reasons[(name, reason)] += n
        _log.event("fallback", f"{name}: {reason} ({n} node{'s' if n > 1 else ''})")


def fallback_report():
    """{op: {reason: nodes}} over this process's compiled graphs."""
    out = {}
    for (name, reason), n in fallback_reasons.most_common():
        out.setdefault(name, {})[reason] = n
    return out


def _runs_eagerly(fallback, failed, reason):
    """fallback, the graph as it runs eagerly because failed (words: "could
    not compile") for reason: counted, warned once, and noted for explain()."""
    _C.stat_add("eager_fallbacks")
    _log.warn_once(f"{failed} a graph, running it eagerly ({reason})")
    _manager.dynamo_graph(fallback, f"runs eagerly: {failed} it ({reason})")
    return fallback


def compile_inference(gm, example_inputs, eager=None):
    """aot_autograd's compiler for graphs that need no gradients. eager:
    the graph's eager original when the caller hands gm over (a graph
    nothing else runs: the back end then rewrites gm itself instead of a
    copy); by default gm is the original, and stays as it is."""
    global compile_seconds
    t0 = time.perf_counter()
    # counted before _build may rewrite gm in place, and only for the log line
    ops = sum(1 for n in gm.graph.nodes if n.op == "call_function") if _log.enabled("compile") else 0
    try:
        compiled = _build(gm, example_inputs, eager)
    except Exception as exc:  # any failure of ours: this graph runs eagerly
        reason = f"{type(exc).__name__}: {exc}"
        _log.event("compile", f"failed after {(time.perf_counter() - t0) * 1e3:.2f} ms: {reason}")
        return _runs_eagerly(make_boxed_func(gm if eager is None else eager), "could not compile", reason)
    compile_seconds += time.perf_counter() - t0
    _manager.dynamo_graph(compiled)
    _log.event("compile", f"graph of {ops} ops in {(time.perf_counter() - t0) * 1e3:.2f} ms")
    return compiled


def _training(gm, example_inputs=None):
    """A graph that needs gradients runs eagerly for now: Dynamo's graph as
    it captured it (neuron), under eager's autograd (aot_autograd's joint
    graph refused double backward: a gradient penalty's
    autograd.grad(create_graph=True) and backward through it), or a forward
    or backward graph aot_autograd made of a graph it found to need them
    (boxed, as its compilers return them). Dynamo's graph's checkpoints run
    eager's checkpoint (_eager_checkpoints)."""
    _C.stat_add("training_graphs")
    _log.event("compile", "graph needs gradients: running it eagerly")
    # once: a model called without torch.no_grad() ran wholly eagerly and said nothing
    _warn_once(f"torch.compile(backend='neuron'): a graph that needs gradients (grad mode on, and parameters or "
               f"inputs that require grad) runs eagerly: {_log.NO_TRAINING}")
    if example_inputs is None:
        gm = _eager_checkpoints(gm)
    fallback = gm if example_inputs is None else make_boxed_func(gm)  # gm: what Dynamo holds (explain's weakref)
    _manager.dynamo_graph(fallback, "runs eagerly: the graph needs gradients (compiled training is not built yet)")
    return fallback


_aot = aot_autograd(fw_compiler=_training, bw_compiler=_training,
                    inference_compiler=compile_inference, decompositions=decompositions())


def _needs_gradients(gm, example_inputs):
    """Whether Dynamo's graph gm of these inputs needs gradients: grad mode
    on, an input (a parameter, lifted) that requires grad, and an output
    that requires grad as Dynamo traced it (its example value; unknown:
    needs them). A function that turns grad mode off itself
    (@torch.no_grad() under torch.compile, a with-block around its body)
    makes none: aot_autograd gives it the inference compiler."""
    if not (torch.is_grad_enabled() and any(isinstance(x, torch.Tensor) and x.requires_grad for x in example_inputs)):
        return False
    outputs = []
    for node in gm.graph.find_nodes(op="output"):
        torch.fx.node.map_arg(node.args, outputs.append)
    values = [n.meta.get("example_value") for n in outputs]
    return any(v is None or (isinstance(v, torch.Tensor) and v.requires_grad) for v in values)


def _eager_checkpoint(gmod, *args, **kwargs):
    """What a torch.utils.checkpoint node of Dynamo's graph runs in a graph
    that runs eagerly (_training): eager's non-reentrant checkpoint, which
    gives the recompute the forward's random numbers. The higher-order op's
    own eager form turns preserve_rng_state off (a compiler's graph draws the
    same numbers its own way): the recompute drew other dropout masks, and
    the gradients were off."""
    from torch._higher_order_ops.wrap import TagActivationCheckpoint
    ckpt, fn_kwargs = TagActivationCheckpoint.divide_kwargs(kwargs)
    ckpt["use_reentrant"] = False
    if "_checkpoint_context_fn" in getattr(gmod, "meta", {}):  # selective checkpointing's policy
        ckpt["context_fn"] = gmod.meta["_checkpoint_context_fn"]
    return torch.utils.checkpoint.checkpoint(gmod, *args, **ckpt, **fn_kwargs)


def _eager_checkpoints(gm):
    """gm with its torch.utils.checkpoint nodes calling _eager_checkpoint
    (in place: the graph Dynamo holds runs so)."""
    hop = getattr(torch.ops.higher_order, "tag_activation_checkpoint", None)
    found = [n for n in gm.graph.nodes if hop is not None and n.op == "call_function" and n.target is hop]
    for node in found:
        node.target = _eager_checkpoint
    if found:
        gm.recompile()
    return gm


@functools.lru_cache(maxsize=None)
def _compile_modes():
    """torch.compile's modes (Inductor's: "max-autotune", ...), which the
    neuron back end accepts and reads none of."""
    try:
        from torch._inductor import list_mode_options
        return tuple(list_mode_options())
    except Exception:  # another torch's layout
        return ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def neuron(gm, example_inputs, mode=None, options=None):
    """The "neuron" back end of torch.compile: aot_autograd with our
    compilers. aot_autograd's own analysis of the graph may refuse it
    (x.data = ... beside another write of x): the graph then runs as
    Dynamo captured it, with one warning, as compile_inference's failures
    do. torch.compile's mode (Inductor's names: "max-autotune" and the
    others) changes nothing here; its options are Inductor's settings, and
    ours are in torchneuron_jit.config: one warning names them (aot_autograd
    warned of both on every graph)."""
    from torch._dynamo.exc import TorchDynamoException
    if mode is not None and mode not in _compile_modes():  # a typo Inductor refuses ("Unrecognized mode=")
        _warn_once(f"torch.compile(backend='neuron'): mode={mode!r} is none of torch.compile's modes "
                   f"({', '.join(map(repr, _compile_modes()))}); this back end reads none of them")
    if options:
        _warn_once(f"torch.compile(backend='neuron') does not read options ({', '.join(map(str, options))}); "
                   f"its settings are torchneuron_jit.config and the TORCHNEURON_* environment variables")
    if any(isinstance(x, torch.Tensor) and x.device.type != "cpu" for x in example_inputs):
        # meta tensors (shape inference before weights exist): PyTorch's ops answer for them; our kernels
        # would read memory they do not have (a segfault)
        _log.event("compile", "a graph of tensors not on the CPU runs as Dynamo captured it")
        return gm
    fused = next((n.target for n in gm.graph.nodes if n.op == "call_function" and n.target in CASTS_INSIDE), None)
    if fused is not None and torch.is_autocast_enabled("cpu"):
        # aot_autograd traces it with autocast's key excluded (its inner linear layers stay float32, where eager
        # casts them): Dynamo's graph gives eager's answer
        return _runs_eagerly(gm, "CPU autocast around", f"torch.{fused.__name__} (nn.TransformerEncoderLayer's fast "
                             "path) casts inside itself, which aot_autograd's graph of it would not")
    try:
        if _needs_gradients(gm, example_inputs):
            return _training(gm)
        with composites_whole:
            return _aot(gm, example_inputs)
    except (TorchDynamoException, Warning):  # Dynamo's own control flow (RestartAnalysis: it traces the frame
        raise  # again); a warning of ours that -W error made an exception (not aot_autograd refusing the graph)
    except Exception as exc:  # not ours to compile: the user's program goes on with eager's answer
        first_line = (str(exc).strip().splitlines() or [""])[0]
        return _runs_eagerly(gm, "aot_autograd could not take", f"{type(exc).__name__}: {first_line}")


_manager.watch_dynamo(neuron)  # the recompilation manager's storm words for this door too


def register():
    """Makes "neuron" known to TorchDynamo.

    When this package is installed, Dynamo loads it from our
    ``torch_dynamo_backends`` entry point on first use, and registering here
    too would collide with that; otherwise (a bare source tree on sys.path)
    it is registered here.
    """
    from importlib.metadata import entry_points

    from torch._dynamo.backends.registry import _COMPILER_FNS, register_backend
    if "neuron" in _COMPILER_FNS:
        return
    for ep in entry_points(group="torch_dynamo_backends"):
        if ep.name == "neuron" and ep.value == "torchneuron_jit.backend:neuron":
            return
    register_backend(neuron, name="neuron")
