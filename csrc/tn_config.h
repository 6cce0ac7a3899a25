/*
** The tunables table: every knob of torchneuron_jit, with its default and a
** one-line doc, in one X-macro (after LuaJIT's JIT_PARAMDEF). Each entry is
** readable and writable from Python as torchneuron_jit.config.<name> and set
** from the environment as TORCHNEURON_<NAME> when the extension loads.
*/
#ifndef TN_CONFIG_H
#define TN_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#define TN_CFG_BOOL  0   /* 0/1; text: 1 0 true false yes no on off */
#define TN_CFG_INT   1   /* int64 in the range its string default names */
#define TN_CFG_BYTES 2   /* int64 >= 0; text may end in K, M, G or T (powers of 1024) */
#define TN_CFG_STR   3   /* UTF-8 text */
#define TN_CFG_CHOICE 4  /* one of the '|'-separated names in the string default (case-insensitive);
                         ** held as its index, read from Python as its name */

/* _(name, type, integer default, string default, doc); a CHOICE's integer
** default is the index of its default among the names of its string default;
** an INT's string default is its range, "lo.." or "lo..hi" (set_int refuses
** a value outside it, naming the setting) */
#define TN_CONFIG_DEF(_) \
  _(cache, TN_CFG_BOOL, 1, NULL, \
    "Use the persistent compile cache.") \
  _(cache_dir, TN_CFG_STR, 0, "", \
    "Cache directory; empty means $XDG_CACHE_HOME/torchneuron_jit, else ~/.cache/torchneuron_jit.") \
  _(cache_max_bytes, TN_CFG_BYTES, INT64_C(1) << 30, NULL, \
    "Size limit of the cache file; least recently used records are evicted past 7/8 of it.") \
  _(cache_initial_map_bytes, TN_CFG_BYTES, INT64_C(32) << 20, NULL, \
    "Initial LMDB map size; the map doubles on demand up to cache_max_bytes.") \
  _(cache_verify, TN_CFG_BOOL, 1, NULL, \
    "Check an existing cache file in a child process before using it (LMDB has no page checksums).") \
  _(kernel_threads, TN_CFG_INT, 0, "0..", \
    "Threads a large generated kernel is split across; 0 follows torch.get_num_threads().") \
  _(row_fusion, TN_CFG_CHOICE, 0, "auto|on|off", \
    "Lower reductions and norms over trailing dims (softmax, layer norm, RMS norm, sum, mean, amax, var, " \
    "logsumexp, ...) into row kernels with their pointwise prologue and epilogue. auto (the default): where " \
    "tier 2 can run (compile_tier2 not off and a C compiler found); tier 1's row kernels are 2-4x slower than " \
    "eager's. At tier 2 the suite's pointwise block gained 1.28-1.20x -> 1.61-1.27x eager, LLaMA and the T5 " \
    "encoder 4-5%, the others within noise; rows of 64 run at 0.75-0.9x eager's. Under auto a reduction whose " \
    "rows are not one unit-stride run of its input (a mean over H and W of a channels-last tensor) stays " \
    "eager's, which reduces across rows: as a row kernel it took 157 us against 16. True/False set on/off.") \
  _(row_fusion_min_row, TN_CFG_INT, 256, "0..", \
    "With row_fusion auto, the fewest elements a row must be known to have for its reduction to be fused " \
    "(on: every row). Shorter rows go one at a time through tier 2's passes and measured slower than " \
    "eager's kernels: the attention softmax over rows of 128 at batch 8 cost the zoo's eager-attention " \
    "rows 7%, rows of 64 ran at 0.75-0.9x; rows of 256 measured even and longer ones faster.") \
  _(gemm_fusion, TN_CFG_CHOICE, 2, "auto|on|off", \
    "Run float32 mm/addmm/bmm/baddbmm through torch's own BLAS sgemm with their pointwise epilogue (bias, " \
    "activation, residual) fused into one kernel. auto: where tier 2 can run. Off by default: measured no " \
    "faster than eager's addmm and the op after it. True/False set on/off.") \
  _(onednn_linear, TN_CFG_BOOL, 1, NULL, \
    "Run float32 linear layers that stay in PyTorch through oneDNN, with the op after each (a separate " \
    "bias add, relu, gelu or a residual add) in the same call, wherever a measurement when the graph is " \
    "lowered finds that faster than aten.linear; the choices are cached with the graph.") \
  _(conv_channels_last, TN_CFG_BOOL, 1, NULL, \
    "Run the 2-d convolutions of a graph, and the ops between them, on channels-last (NHWC) tensors, as " \
    "oneDNN's fastest kernels and max pooling want them (inputs converted once, results given back in " \
    "eager's strides). The values differ from eager's NCHW convolution by rounding only; float16 convolutions stay " \
    "NCHW (their rounding, through a model, went past float16's tolerance of eager's).") \
  _(flash_attention, TN_CFG_CHOICE, 0, "auto|on|off", \
    "Run attention written as matmul, softmax and matmul (Hugging Face's eager attention, hand-written " \
    "attention; float32, scaled by a number, with additive masks or none) as one call of PyTorch's CPU " \
    "flash attention, the kernel of eager's scaled_dot_product_attention: no scores in memory. auto: " \
    "without a mask always (0.6-0.9x the time of matmul, our fused softmax and matmul at 1-8 x 64-1024 " \
    "tokens, 4 heads of 64), with one where the scores hold flash_attention_min_scores elements or more " \
    "(below that, up to 1.14x slower; at 8 x 512 tokens 0.3x). The values differ by rounding only; a " \
    "row masked with -inf throughout stays NaN as in eager. True/False set on/off.") \
  _(flash_attention_min_scores, TN_CFG_INT, INT64_C(1) << 21, "0..", \
    "With flash_attention auto, the fewest elements (batch x heads x queries x keys, a symbolic size " \
    "counted at the traced call's value) a masked attention's scores must have to run as flash attention.") \
  _(onednn_packed_weights, TN_CFG_BOOL, 0, NULL, \
    "With onednn_linear, also time oneDNN on a copy of each weight packed into its blocked layout, made on " \
    "first use and again when the weight is another tensor or its version counter moved (in-place updates, " \
    "load_state_dict). Fastest at small batches, but writes that bypass the version counter (through .data, " \
    "numpy) are not seen, and each such weight is held twice: for weights that stay put while served.") \
  _(compile_tier2, TN_CFG_CHOICE, 0, "background|sync|off", \
    "Tier 2 of generated kernels: each kernel's fused loops compiled by the system C compiler (tier2_cc, -O3 " \
    "for the ISA cpu_isa names), cached in the compile cache, and swapped in while calls go on at tier 1. " \
    "background: compiled on worker threads, no call waits, the compiler in the idle class and stopped while " \
    "calls are served (build_pause_ms); sync: compiled before the call that asks goes on " \
    "(tests, benchmarks); off: tier 1 only. Without a compiler tier 1 stays (said once under log=compile).") \
  _(tier2_after_calls, TN_CFG_INT, 2, "1..", \
    "Launches of a kernel after which it goes to tier 2 (1: at its first; a kernel run once is not worth a " \
    "compile). A cached tier 2 is loaded at that launch too.") \
  _(tier2_jobs, TN_CFG_INT, 1, "1..", \
    "Tier-2 compiles that run at once in the background (worker threads that wait for the compiler " \
    "without holding the GIL).") \
  _(tier2_cc, TN_CFG_STR, 0, "cc", \
    "The C compiler of tier 2 (a name looked up on PATH, or a path); GCC or a compiler taking its options.") \
  _(jit_cache_limit, TN_CFG_INT, 8, "0..", \
    "Entries (traced variants) a function under torchneuron_jit.jit keeps; a call no entry accepts past " \
    "this runs eagerly (one warning gives the last reason), unless a variant has gone unused long enough " \
    "to be evicted for it (jit_evict_after).") \
  _(jit_evict_after, TN_CFG_INT, 32, "0..", \
    "Calls of a function under torchneuron_jit.jit at its jit_cache_limit that its least recently used " \
    "compiled variant must have gone without taking one before a call no variant takes evicts it and " \
    "traces (a narrower variant a dynamic one superseded; a region of a generate loop's branches no longer " \
    "reached). The wait doubles each time jit_cache_limit variants of the function were evicted, so a " \
    "working set larger than the limit does not trace on every call. A miss of a guard the manager warned " \
    "of as a storm (storm_misses: a global that changes on every call) evicts nothing until its value has " \
    "stayed the same at two such misses in a row (a storm that settled). 0: never evict.") \
  _(compile_blocking, TN_CFG_BOOL, 0, NULL, \
    "A call of a function under torchneuron_jit.jit that no variant takes answers with its eager result " \
    "(the traced run) and its variant is built (symbolic trace, lowering, kernels) on a background thread, " \
    "published when ready; meanwhile its calls run eagerly. On, the call that traced waits for the build " \
    "(tests, benchmarks of steady state).") \
  _(build_worker, TN_CFG_CHOICE, 0, "auto|process|thread", \
    "Where a background build of torchneuron_jit.jit runs (compile_blocking off). thread: on a build thread " \
    "that pauses while jitted calls run (build_pause_ms) and so runs in the gaps between them. process: in a " \
    "forked child in the idle scheduling class, which makes the symbolic trace, the lowering and the kernels " \
    "and stores them as a trace record that the build thread loads (~20-30 ms of the GIL instead of ~1 s " \
    "of make_fx); where calls keep every core busy, so that it starves, each call lends it one of its " \
    "OpenMP threads until it is done, and where it starves still (calls on one thread, other processes), " \
    "it builds at our priority, stopped while calls are in flight (build_pause_ms). auto: process where " \
    "jitted calls were in flight build_child_busy_pct of the time or more since the last build began, the " \
    "gaps a paused build sleeps through (build_resume_us) counted as in flight (a server calling back to " \
    "back, whose gaps a thread never gets: 400 such calls of a TransformerEncoder left its dynamic variant " \
    "unbuilt; generate()'s steps, ~0.3 ms apart: with T5's 4 variants built on the thread, 200 requests " \
    "took 9-13.5 s, in a child 6.5-8.3 s, eagerly 5.0-5.2 s), or, where they were not (or there was no " \
    "build before: a process's first), in the build's first 0.1 s (the child is then forked at the start " \
    "of the next call, on its thread; gaps that rule it out decide at once); else thread (a lent thread " \
    "slows each call during the build: 1.3-1.9x on 2 cores). Where a child cannot be used (no fork, trace " \
    "records or the cache off, a variant that cannot be stored) or fails, the thread builds.") \
  _(build_child_busy_pct, TN_CFG_INT, 90, "0..100", \
    "With build_worker=auto, the share of the time since the last build began (0.1 s at least) in which " \
    "jitted calls were in flight, or had ended less than build_resume_us before, from which a build runs in " \
    "a child process.") \
  _(build_worker_timeout_s, TN_CFG_INT, 300, "1..", \
    "Seconds a build's forked child (build_worker) may take before it is killed and the build runs on the " \
    "thread instead.") \
  _(build_gc_off, TN_CFG_BOOL, 1, NULL, \
    "Python's cyclic garbage collector is paused from the start of a miss of torchneuron_jit.jit (its " \
    "lookup of trace records, its trace) to the end of its variant's build, and resumed after it where it " \
    "was on; a background build then collects once, when no jitted call is in flight (build_pause_ms). A " \
    "trace and its build allocate enough to set off a collection of the whole heap, which holds the GIL " \
    "for ~0.3 s with torch and transformers loaded, inside the call that traced (HF BERT's first traced " \
    "call: 90 instead of 320 ms). Off: collections run as Python schedules them.") \
  _(build_pause_ms, TN_CFG_INT, 200, "0..", \
    "A background build of torchneuron_jit.jit pauses while a call of a jitted function is in flight (at " \
    "its next Python call or return, the GIL released) and goes on when none is, or after this many ms; " \
    "after a pause that ran out it runs as long before pausing again. A build's Python beside a served " \
    "call made each of its PyTorch ops wait for the GIL: an eager BERT call of 5.6 ms took 470 ms. A " \
    "background tier-2 compiler (compile_tier2) is stopped (SIGSTOP to its process group) by the same " \
    "rule, and a compiled graph running (either door) counts as such a call: in the idle class alone " \
    "it still took a core from a call on two (a TransformerEncoder call at 53 instead of 27 ms). A " \
    "compiler that ran less than a quarter of the run after a pause that ran out (calls back to back on " \
    "every core: the idle class gets none) is lent a thread of the calls until it exits, as a build's " \
    "child is (build_worker), and not stopped again; starved again while lent, it runs again from the " \
    "start at our priority, stopped for calls. 0: builds and compilers never pause.") \
  _(build_resume_us, TN_CFG_INT, 1000, "0..", \
    "A background build or tier-2 compiler that paused for served calls (build_pause_ms) goes on this " \
    "many microseconds after the last one ended, not at once: the caller's own Python after a call (taking its result, " \
    "the next request) then keeps the GIL. Woken as a call returned, a build made those lines wait ~10 ms " \
    "(two switch intervals). Longer starves a build beside calls with short gaps between them (2 ms gaps: " \
    "~7-16 s for a ~1 s build at 1000, 21-24 s at 2000, 6-7 s at 0). 0: it goes on at once.") \
  _(dynamic_after, TN_CFG_INT, 2, "0..", \
    "Distinct sizes a tensor argument's dimension of a function under torchneuron_jit.jit takes (at the " \
    "same place: argument, path, dimension), or distinct values an int or float argument takes, before its next " \
    "trace is symbolic there: one variant then serves every size or value, guarded only by the relations " \
    "the trace needs (s1 >= 2, s1 == s2, 64 % heads == 0). 0 never makes one dynamic (every size is its " \
    "own variant). Sizes and ints 0 and 1 stay specialised; an int Python needs the value of (range(n)) " \
    "and a float the code branches on stay static.") \
  _(storm_misses, TN_CFG_INT, 4, "0..", \
    "Misses of a function under torchneuron_jit.jit that one guard causes (a global that changes, a " \
    "dimension that stays static, a module attribute set between calls) before one warning says what " \
    "changes and what to do. A value read from a tensor (item()) takes as many values as jit_cache_limit " \
    "at least, and then the function runs eagerly from now on (each variant ran its graph before the " \
    "value showed it did not serve the call). 0: no warning.") \
  _(trace_backoff, TN_CFG_INT, 2, "0..", \
    "After a jitted function's k-th trace that fails (its variant runs eagerly) or whose build is dropped, " \
    "its next trace_backoff**k - 1 misses run eagerly without tracing. 0 or 1: no backoff.") \
  _(blacklist_after, TN_CFG_INT, 4, "0..", \
    "Failed or dropped traces after which a jitted function runs eagerly for good, with one warning. 0: never.") \
  _(jit_trace_records, TN_CFG_BOOL, 1, NULL, \
    "With cache on, torchneuron_jit.jit stores each traced variant it can describe without object identities " \
    "(guards by path, the code it ran by hash, its graph) in the persistent cache, and a call no entry accepts " \
    "looks there before tracing: a fresh process whose cache is warm runs without tracing or lowering.") \
  _(cpu_isa, TN_CFG_CHOICE, 0, "auto|avx512|avx2|default", \
    "Widest vector ISA the generated kernels' runtime uses for its math functions (libmvec's AVX-512 or " \
    "AVX2 versions, else the scalar math library): auto is the CPU's widest; a narrower one shows what " \
    "a machine without the wider ISA computes. It never goes past what the CPU has. The plain loops " \
    "(loads, stores, arithmetic) are chosen by the dynamic linker from the CPU and cannot be narrowed.") \
  _(log, TN_CFG_STR, 0, "", \
    "Comma-separated event kinds printed to stderr as they happen: cache, compile, fallback, recompiles, or all.")

typedef enum tn_config_id {
#define TN_CFG_ENUM(name, type, idef, sdef, doc) TN_CFG_##name,
  TN_CONFIG_DEF(TN_CFG_ENUM)
#undef TN_CFG_ENUM
  TN_CFG__COUNT
} tn_config_id;

/* Resets every entry to its default, then applies TORCHNEURON_<NAME>
** variables. A variable whose text does not parse leaves the default in
** place and is reported by tn_config_env_error(). Not thread-safe: call once
** at load, before any thread reads the table. */
void tn_config_init(void);

/* Index of the entry called name, or -1. */
int tn_config_find(const char *name);

/* Static metadata of entry id (id must be valid). */
const char *tn_config_name(int id);
int tn_config_type(int id);
const char *tn_config_doc(int id);

/* Current value of an integer-valued (BOOL, INT, BYTES, CHOICE) entry. Safe
** to read from any thread. */
int64_t tn_config_int(int id);

/* Current value of a STR entry; valid until the entry is next set. Read it
** only from the thread that sets it (in practice: with the GIL held). */
const char *tn_config_str(int id);

/* Sets entry id from text, parsed by its type. Returns TN_OK, or TN_EINVAL
** with a message in err (size errlen) naming the entry and what was
** expected; the value is then unchanged. TN_ENOMEM for a string that cannot
** be copied. */
int tn_config_set_text(int id, const char *text, char *err, size_t errlen);

/* Sets an integer-valued entry; TN_EINVAL for a negative BYTES value or a
** BOOL other than 0/1. */
int tn_config_set_int(int id, int64_t value, char *err, size_t errlen);

/* The name of choice i of CHOICE entry id, copied into buf (size len);
** returns buf, or NULL when i is out of range (buf then empty). */
const char *tn_config_choice(int id, int64_t i, char *buf, size_t len);

/* Formats the default of entry id as text into buf (size len). */
void tn_config_default_text(int id, char *buf, size_t len);

/* The n-th environment problem found by tn_config_init, or NULL. */
const char *tn_config_env_error(int n);

#endif /* TN_CONFIG_H */
