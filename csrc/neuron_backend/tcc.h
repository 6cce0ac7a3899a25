/*
** libtcc, wrapped: in-memory compilation of generated C units.
**
** libtcc serialises compiles with one process-wide semaphore that it
** creates lazily behind a plain flag; tn_tcc_init compiles a warm-up unit
** so that the semaphore exists before any second thread can compile. Error
** messages are collected into a C buffer by tcc's callback (it runs under
** that semaphore: no Python there). Only the option strings in tcc.c
** ("-nostdlib", "-xb") are ever passed to tcc_set_options (a bad one calls
** exit(1)). Object code (a kernel stored in the cache) goes through an
** anonymous in-memory file: libtcc reads and writes objects by path only.
*/
#ifndef TN_TCC_H
#define TN_TCC_H

#include <stddef.h>
#include <stdint.h>

#include "../tn_common.h"

typedef struct tn_tcc_unit tn_tcc_unit;

/* A symbol the generated code may call: registered with tcc_add_symbol. */
typedef struct tn_tcc_symbol {
  const char *ts_name;
  const void *ts_addr;
} tn_tcc_symbol;

/* Remembers libdir (holding libtcc1.a) and runs the warm-up compile. Call
** once, before any thread compiles; later calls return the first result.
** TN_ECOMPILE with a message in err when the warm-up fails. */
int tn_tcc_init(const char *libdir, char *err, size_t errlen);

/* Compiles src (which must include no system header) into executable
** memory, with syms registered and libtcc1.a linked. Thread-safe; call
** without holding a Python GIL. TN_ECOMPILE with tcc's messages in err,
** TN_EINVAL before tn_tcc_init succeeded, TN_ENOMEM. */
int tn_tcc_compile(const char *src, const tn_tcc_symbol *syms, size_t nsyms,
                   tn_tcc_unit **out, char *err, size_t errlen);

/* Compiles src as tn_tcc_compile does, into relocatable object code
** (TCC_OUTPUT_OBJ, the symbols it calls left unresolved): *obj (malloc'd,
** the caller frees it) of *len bytes. Thread-safe, without the GIL.
** TN_ECOMPILE with tcc's messages, TN_EINVAL before tn_tcc_init, TN_EIO,
** TN_ENOMEM. */
int tn_tcc_compile_object(const char *src, uint8_t **obj, size_t *len, char *err, size_t errlen);

/* A unit from tn_tcc_compile_object's bytes: loaded, syms registered,
** libtcc1.a linked, relocated into executable memory (no compile). The
** bytes must come from tn_tcc_compile_object (a checksummed cache record):
** only their ELF magic is checked here. TN_ECORRUPT (not an object),
** TN_ECOMPILE (tcc refused it or a symbol is missing: messages in err),
** TN_EINVAL, TN_EIO, TN_ENOMEM. */
int tn_tcc_load_object(const uint8_t *obj, size_t len, const tn_tcc_symbol *syms, size_t nsyms,
                       tn_tcc_unit **out, char *err, size_t errlen);

/* Address of a global symbol of the unit, or NULL. */
void *tn_tcc_get(tn_tcc_unit *u, const char *name);

/* Frees the unit and its code. NULL is fine. */
void tn_tcc_free(tn_tcc_unit *u);

#endif /* TN_TCC_H */
