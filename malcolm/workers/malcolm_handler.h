/* The ABI of a malcolm task handler. Include this in a handler written in C (compiled with
   cffi, or as any shared library) and name it in the rack file:
       handler = "so:/path/libmine.so:my_handler"      (dlopen + dlsym)
       handler = "cffi:my_package._handlers:my_handler" (a cffi API-mode module)
   A worker thread calls it without the GIL, once per task. */
#ifndef MALCOLM_HANDLER_H
#define MALCOLM_HANDLER_H
#include <stdint.h>

typedef struct malcolm_task {
  uint32_t client_id;
  uint16_t task_type;
  uint16_t flags;            /* 1 migrated, 2 stolen */
  uint64_t request_id;
  int64_t service_ns;        /* the service time the client asked for (synthetic handlers) */
  const uint8_t *payload;    /* the task's payload, payload_len bytes (<= 1024) */
  uint32_t payload_len;
  int32_t worker;            /* index of the worker thread running it */
  uint8_t *out;              /* write the response payload here ... */
  uint32_t out_cap;          /* ... at most this many bytes (1024) ... */
  uint32_t out_len;          /* ... and say how many */
} malcolm_task;

/* Optional per-handler state ("so:PATH:SYMBOL[@ARG]", or "cffi:MODULE:SYMBOL[@ARG]" with
   both declared in the module's cdef): export
       void *SYMBOL_init(const char *arg);   called once, before any task, with ARG ("" if
                                             none); its result is the ctx of every call;
                                             NULL refuses to start the server
       void SYMBOL_fini(void *ctx);          called once, after the last call
   The workers of a server share ctx, so keep it read-only or thread-safe; per-worker parts can
   be indexed by task->worker (0 .. workers-1; 0 when the gateway runs tasks, workers = 0).
   The rocksdb handler keeps its open database, read options and dictionary shape this way. */

/* Return MALCOLM_OK (0) on success; MALCOLM_BAD_INPUT (2, the wire status "bad input") when
   the request itself is malformed (the client's fault); anything else answers the task with
   status "handler error" (the server's fault). Before 2026-11-23 every nonzero value meant
   "handler error"; only 2 changed meaning. */
#define MALCOLM_OK 0
#define MALCOLM_ERROR 1
#define MALCOLM_BAD_INPUT 2
typedef int (*malcolm_handler_fn)(void *ctx, malcolm_task *task);
typedef void *(*malcolm_init_fn)(const char *arg);
typedef void (*malcolm_fini_fn)(void *ctx);
#endif
