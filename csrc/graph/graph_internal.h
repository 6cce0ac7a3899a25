/*
** Private layout of tn_graph, shared by graph.c and encode.c.
*/
#ifndef TN_GRAPH_INTERNAL_H
#define TN_GRAPH_INTERNAL_H

#include <mimalloc.h>
#include <pthread.h>

#include "graph.h"

struct tn_graph {
  mi_heap_t *gr_heap;      /* everything below lives here */
  pthread_t gr_owner;      /* the only thread that may allocate */
  int gr_rc;               /* first error; non-zero poisons the graph */
  char gr_err[TN_ERRMSG_LEN];
  uint32_t gr_nsyms;
  uint32_t gr_ninputs;     /* inputs are values [0, gr_ninputs) */
  tn_value *gr_values;
  uint32_t gr_nvalues, gr_capvalues;
  tn_node *gr_nodes;
  uint32_t gr_nnodes, gr_capnodes;
  int32_t *gr_outputs;
  uint32_t gr_noutputs;
  uint8_t *gr_enc;         /* cached canonical encoding, valid if gr_enc_valid */
  size_t gr_enclen;
  int gr_enc_valid;
  int32_t *gr_canon_nodes;  /* with the encoding: canonical position -> node id */
  int32_t *gr_canon_values; /* with the encoding: value id -> canonical value id */
  char *gr_dump;           /* cached dump or NULL */
};

/* Poisons g with the first error (printf-style message) and returns rc. */
int tn_graph_fail(tn_graph *g, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Entry check of read-only calls that allocate (encode, dump): owner
** thread and not poisoned. */
int tn_graph_enter_read(tn_graph *g);

/* mi_heap_malloc in g's heap (n may be 0). */
void *tn_graph_alloc(tn_graph *g, size_t n);

/* Name of an argument tag, for messages. */
const char *tn_arg_tag_name(int tag);

#endif /* TN_GRAPH_INTERNAL_H */
