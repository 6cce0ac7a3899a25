/*
** The graph IR: values (graph inputs and node outputs) with tensor metadata,
** nodes from the op table, graph outputs; a validating builder; one canonical
** binary encoding with a validating decoder; the graph key.
**
** A graph lives in its own mimalloc heap (one arena per graph, freed in one
** call). mimalloc heaps allocate only on the thread that created them, so
** every call that allocates (builder calls, encode, decode's result, dump)
** must come from the graph's owner thread, else TN_ETHREAD. Read-only
** accessors may be used from any thread while nobody mutates the graph.
**
** A builder call that fails stores nothing, keeps its message in the graph
** (tn_graph_errmsg) and poisons the graph: every later builder call, encode
** and key returns TN_EPOISONED until tn_graph_reset.
*/
#ifndef TN_GRAPH_H
#define TN_GRAPH_H

#include <stddef.h>
#include <stdint.h>

#include "../tn_common.h"
#include "ops.h"

/* Version of the canonical encoding; part of every graph key. Bump it when
** the encoding or the meaning of any op, signature or field changes. */
#define TN_GRAPH_FORMAT_VERSION 4

#define TN_MAX_RANK 64
#define TN_MAX_ARGS 64
#define TN_MAX_OUTPUTS 4096
#define TN_MAX_LIST 65536
#define TN_MAX_STRING 4096

/* dtypes: the numbering of torch's ScalarType. */
#define TN_DTYPE_DEF(_) \
  _(UINT8, 0, "uint8") _(INT8, 1, "int8") _(INT16, 2, "int16") \
  _(INT32, 3, "int32") _(INT64, 4, "int64") _(FLOAT16, 5, "float16") \
  _(FLOAT32, 6, "float32") _(FLOAT64, 7, "float64") \
  _(COMPLEX32, 8, "complex32") _(COMPLEX64, 9, "complex64") \
  _(COMPLEX128, 10, "complex128") _(BOOL, 11, "bool") \
  _(BFLOAT16, 15, "bfloat16")

enum {
#define TN_DTYPE_ENUM(id, num, name) TN_DTYPE_##id = num,
  TN_DTYPE_DEF(TN_DTYPE_ENUM)
#undef TN_DTYPE_ENUM
};

/* Name of a dtype ("float32"), or NULL if num is not one we know. */
const char *tn_dtype_name(int num);

/* An integer that is either concrete (si_sym < 0: the value is si_val) or a
** graph symbol (si_sym >= 0, si_val is 0). Sizes, strides, SymInt arguments
** and int-list elements all use it. A stride may also be a scaled symbol:
** si_sym >= 0 with si_val >= 2 stands for si_val * s (the stride of a
** contiguous tensor with one dynamic dim, e.g. 256 * s for [4, s, 256]). */
typedef struct tn_sint {
  int64_t si_val;
  int32_t si_sym;
} tn_sint;

#define TN_SINT(v) ((tn_sint){(v), -1})
#define TN_SYM(k) ((tn_sint){0, (k)})
#define TN_SYM_SCALED(c, k) ((tn_sint){(c), (k)})

/* Tensor metadata: dtype, rank, sizes and strides (each rank long). */
typedef struct tn_meta {
  int me_dtype;
  int me_rank;
  const tn_sint *me_sizes;
  const tn_sint *me_strides;
} tn_meta;

/* Roles of values. */
#define TN_VALUE_ARG   1  /* positional argument (index) at path name ("" = itself) */
#define TN_VALUE_PARAM 2  /* parameter or buffer by qualified name */
#define TN_VALUE_CONST 3  /* captured constant number index */
#define TN_VALUE_NODE  4  /* output index of node */

typedef struct tn_value {
  int va_kind;
  int32_t va_index;     /* ARG: position; CONST: constant number; NODE: output index */
  int32_t va_node;      /* NODE: producing node; else -1 */
  const char *va_name;  /* ARG: path inside the argument; PARAM: qualified name; else NULL */
  tn_meta va_meta;
} tn_value;

/* Argument tags. */
#define TN_ARG_NONE        0
#define TN_ARG_TENSOR      1   /* ar_ref: value id */
#define TN_ARG_TENSOR_LIST 2   /* ar_refs[ar_len]: value ids */
#define TN_ARG_INT         3   /* ar_int */
#define TN_ARG_FLOAT       4   /* ar_float */
#define TN_ARG_BOOL        5   /* ar_int: 0 or 1 */
#define TN_ARG_SYM         6   /* ar_ref: symbol id */
#define TN_ARG_INT_LIST    7   /* ar_ints[ar_len] */
#define TN_ARG_STRING      8   /* ar_str, ar_len bytes, no NUL inside */
#define TN_ARG_DTYPE       9   /* ar_int: a dtype number */
#define TN_ARG_LAYOUT      10  /* ar_int: torch.layout number (0 = strided) */
#define TN_ARG_DEVICE      11  /* ar_str: "cpu", ... */
#define TN_ARG_MEMFMT      12  /* ar_int: 0 contiguous, 1 preserve, 2 channels_last, 3 channels_last_3d */
#define TN_ARG_OPT_TENSOR_LIST 13  /* ar_refs[ar_len]: value ids, -1 for None (index's indices) */
#define TN_ARG__COUNT      14

typedef struct tn_arg {
  int ar_tag;
  uint32_t ar_len;
  union {
    int64_t ar_int;
    double ar_float;
    int32_t ar_ref;
    const int32_t *ar_refs;
    const tn_sint *ar_ints;
    const char *ar_str;
  } u;
} tn_arg;

typedef struct tn_node {
  int no_op;
  const char *no_target;   /* fallback: qualified ATen name; else NULL */
  uint32_t no_nargs;
  const tn_arg *no_args;
  uint32_t no_nout;
  const int32_t *no_out;   /* value ids of the outputs */
} tn_node;

typedef struct tn_graph tn_graph;

/* Input description for tn_graph_add_input: kind is TN_VALUE_ARG (index =
** position, name = path, "" or NULL for the argument itself), TN_VALUE_PARAM
** (name = qualified name) or TN_VALUE_CONST (index = constant number). */
typedef struct tn_input_desc {
  int in_kind;
  int32_t in_index;
  const char *in_name;
  tn_meta in_meta;
} tn_input_desc;

/* -- Lifetime ----------------------------------------------------------- */

/* Creates an empty graph owned by the calling thread. TN_ENOMEM. */
int tn_graph_new(tn_graph **out);

/* Frees g and everything it holds (one mi_heap_destroy). NULL is fine. Call
** it from the owner thread once nothing else uses g (see
** tn_graph_abandoned for what happens otherwise). */
void tn_graph_free(tn_graph *g);

/* Number of graphs freed from a thread other than their owner: their heap
** is abandoned (leaked) rather than destroyed, because a mimalloc heap may
** only be torn down by its thread. Non-zero means a caller bug. */
uint64_t tn_graph_abandoned(void);

/* Empties g and clears its poison. Owner thread only. TN_ETHREAD, TN_ENOMEM. */
int tn_graph_reset(tn_graph *g);

/* The message of the error that poisoned g, or "" if none. */
const char *tn_graph_errmsg(const tn_graph *g);

/* -- Builder (owner thread only) ---------------------------------------- */

/* Declares a new size symbol; its id goes to *out. */
int tn_graph_add_symbol(tn_graph *g, int32_t *out);

/* Adds a graph input; its value id goes to *out. Errors (TN_EINVAL): bad
** kind, dtype, rank or sizes; a role (argument position and path, parameter
** name, constant number) that an earlier input already has; an input added
** after the first node. */
int tn_graph_add_input(tn_graph *g, const tn_input_desc *in, int32_t *out);

/* Adds a node of op with args (checked against the op's signature and
** class) whose outputs have metadata outs[0..nout); their value ids go to
** out_values. target names the ATen overload of a fallback node and must
** be NULL otherwise. TN_EINVAL names the node, the argument and the fault. */
int tn_graph_add_node(tn_graph *g, int op, const char *target,
                      const tn_arg *args, uint32_t nargs,
                      const tn_meta *outs, uint32_t nout, int32_t *out_values);

/* Whether tn_graph_add_node would accept a node of op (not fallback) with
** these arguments and outputs: TN_OK, or TN_EINVAL with the fault in msg.
** Changes nothing and never poisons g, so a caller can add the node as a
** fallback node instead (a number only known at run time where the op's
** signature takes a constant). Any thread, while nobody mutates g. */
int tn_graph_check_node(const tn_graph *g, int op, const tn_arg *args, uint32_t nargs,
                        const tn_meta *outs, uint32_t nout, char *msg, size_t len);

/* Sets the graph outputs (value ids; a value may appear more than once). */
int tn_graph_set_outputs(tn_graph *g, const int32_t *values, uint32_t n);

/* -- Accessors (any thread, while nobody mutates g) ---------------------- */

uint32_t tn_graph_num_symbols(const tn_graph *g);
uint32_t tn_graph_num_inputs(const tn_graph *g);
uint32_t tn_graph_num_values(const tn_graph *g);
uint32_t tn_graph_num_nodes(const tn_graph *g);
const tn_value *tn_graph_value(const tn_graph *g, int32_t id);
const tn_node *tn_graph_node(const tn_graph *g, int32_t id);
uint32_t tn_graph_num_outputs(const tn_graph *g);
const int32_t *tn_graph_outputs(const tn_graph *g);

/* The tensor values node n reads, in argument order (tensor arguments,
** then the elements of tensor lists; None elements skipped): start with
** *arg = *elem = 0 and call until it returns -1. */
int32_t tn_graph_node_input(const tn_node *n, uint32_t *arg, uint32_t *elem);

/* -- Encoding and key (owner thread only) -------------------------------- */

/* Canonical encoding of g: nodes in post-order of a depth-first walk from
** the outputs (then nodes no output needs, in insertion order); inputs by
** role (arguments by position and path, parameters by name, constants by
** number); symbols numbered by first use. The same program built in any
** insertion order gives the same bytes. *buf stays valid until g changes.
** TN_EPOISONED, TN_ENOMEM. */
int tn_graph_encode(tn_graph *g, const uint8_t **buf, size_t *len);

/* Builds a new graph (owned by the calling thread) from an encoding. Every
** field is validated through the builder, the input must be canonical
** (re-encoding gives the same bytes) and nothing may follow it. On failure
** *out is NULL and err holds a message: TN_ETRUNC (input ends early),
** TN_ECORRUPT (bad magic, field or trailing bytes), TN_EVERSION, TN_EINVAL
** (a record the builder rejects), TN_ENOMEM. */
int tn_graph_decode(const uint8_t *buf, size_t len, tn_graph **out,
                    char *err, size_t errlen);

/* The numbering of the canonical encoding: node_order[k] is the id of the
** node at canonical position k (tn_graph_num_nodes entries), value_map[v]
** the canonical id of value v. A graph decoded from the encoding numbers
** its nodes and values canonically, so these translate results computed on
** it (or cached under the graph's key) back to g. Valid until g changes.
** Encodes g if needed: TN_EPOISONED, TN_ENOMEM. */
int tn_graph_canonical(tn_graph *g, const int32_t **node_order, const int32_t **value_map);

/* key = XXH3-128 of (format version, encoding length, encoding, ctx), in
** canonical (big-endian) byte order. ctx may be NULL when ctxlen is 0. */
int tn_graph_key(tn_graph *g, const void *ctx, size_t ctxlen, uint8_t key[16]);

/* Human-readable listing of g, one line per input, node and the outputs;
** *text (NUL-terminated) lives in g's heap until g changes. */
int tn_graph_dump(tn_graph *g, const char **text);

#endif /* TN_GRAPH_H */
