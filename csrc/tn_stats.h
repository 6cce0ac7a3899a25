/*
** Process-wide counters of torchneuron_jit, in one X-macro table; atomic,
** so any thread (compiler threads included) may bump them. Python reads
** them as torchneuron_jit.stats().
*/
#ifndef TN_STATS_H
#define TN_STATS_H

#include <stdint.h>

/* _(name, doc) */
#define TN_STATS_DEF(_) \
  _(graphs_compiled, "graphs the back end accepted (lowered, or run node by node)") \
  _(graphs_lowered, "graphs that went through lowering and code generation") \
  _(kernels_compiled, "generated C kernels compiled by libtcc") \
  _(kernels_loaded, "generated C kernels loaded from the object code a stored plan keeps (no compile)") \
  _(tier2_kernels, "kernels swapped to tier 2 (compiled, loaded from the cache, or sharing another kernel's source)") \
  _(tier2_compiled, "tier-2 sources the system C compiler built (once per source and process)") \
  _(tier2_loaded, "kernels whose tier 2 came from the persistent cache (no compile)") \
  _(tier2_failed, "kernels left at tier 1 because their tier 2 failed to compile or load") \
  _(tier2_runs, "kernel calls (or parts of one, per thread) that ran tier-2 code") \
  _(tier2_compile_ms, "milliseconds spent in tier-2 compiles (on worker threads unless compile_tier2=sync)") \
  _(cache_hits, "compiled artifacts found in the persistent cache") \
  _(cache_misses, "compiled artifacts looked up and not found") \
  _(lowered_nodes, "nodes of compiled graphs that run inside our kernels and GEMM calls") \
  _(fallback_nodes, "nodes of compiled graphs that run through PyTorch's eager kernels") \
  _(eager_fallbacks, "whole graphs that run eagerly because compiling them failed") \
  _(training_graphs, "graphs needing gradients, run eagerly for now") \
  _(traces, "calls of jitted functions that ran under the recorder (a first call, or a guard miss)") \
  _(guard_failures, "calls of jitted functions that no entry's guards accepted") \
  _(recompiles, "traces of a function that already had an entry (guard_failures that traced)") \
  _(variants_evicted, "variants of jitted functions at their limit evicted for a call none took, after none took a call for config.jit_evict_after calls") \
  _(eager_reruns, "calls whose compiled variant raised (bad input) and that ran again eagerly, for eager's exception or except clause") \
  _(dynamic_traces, "traces made again over symbolic sizes: one variant serves every size of the dimensions that kept changing") \
  _(calls_while_building, "calls of jitted functions no entry took that ran eagerly, untraced, while a variant was being built in the background") \
  _(calls_backing_off, "calls of jitted functions no entry took that ran eagerly, untraced, because recent traces of the function failed (the manager's backoff)") \
  _(traces_loaded, "entries of jitted functions made from trace records of the persistent cache, not traced") \
  _(trace_records_stored, "trace records written to the persistent cache") \
  _(plans_loaded, "compiled graphs made from the plan a trace record stores (nothing imported, fused or lowered)")

typedef enum tn_stat_id {
#define TN_STAT_ENUM(name, doc) TN_STAT_##name,
  TN_STATS_DEF(TN_STAT_ENUM)
#undef TN_STAT_ENUM
  TN_STAT__COUNT
} tn_stat_id;

/* Adds n to counter id. */
void tn_stat_add(int id, uint64_t n);

/* Current value of counter id. */
uint64_t tn_stat_get(int id);

/* Name and doc of counter id. */
const char *tn_stat_name(int id);
const char *tn_stat_doc(int id);

/* Sets every counter to 0. */
void tn_stats_reset(void);

#endif /* TN_STATS_H */
