/*
 * What the files of libgorun-pmi.so share (gorun_pmi.c: the PMI-1 calls;
 * gorun_pmi_wire.c: the connection to gorun's PMI server, its framing and
 * the escaping of keys and values). Internal: everything here has hidden
 * visibility; only pmi.h's PMI_* calls are exported.
 */
#ifndef GORUN_PMI_INTERNAL_H
#define GORUN_PMI_INTERNAL_H

#include <pthread.h>
#include <stddef.h>

#include "pmi.h"

#define PMI_INTERNAL __attribute__((visibility("hidden")))

/* The longest reply line read; the server's lines are shorter. */
#define LINE_MAX_BYTES 8192

/* The connection (gorun_pmi_wire.c). */
PMI_INTERNAL extern pthread_mutex_t wmu; /* taken after mu, or alone; guards writes on fd, and fd */
PMI_INTERNAL extern int fd;
PMI_INTERNAL extern size_t rlen; /* bytes buffered for read_line */

/* The puts kept (see gorun_pmi.c): their lines, and how many; mu guards them. */
#define PUTS_MAX_BYTES (64 * 1024)
PMI_INTERNAL extern char puts_buf[PUTS_MAX_BYTES];
PMI_INTERNAL extern size_t puts_len;
PMI_INTERNAL extern int puts_kept;

PMI_INTERNAL int parse_int(const char *s, int *out);
PMI_INTERNAL int write_all_locked(const char *p, size_t n);
PMI_INTERNAL void set_fd(int f);
PMI_INTERNAL int read_line(char *line, size_t cap);
PMI_INTERNAL int send_kept(const char *req, size_t n);
PMI_INTERNAL int exchange(const char *req, char *reply, size_t cap);

/* Reply lines. */
PMI_INTERNAL const char *token(const char *line, const char *name, size_t *len);
PMI_INTERNAL int token_is(const char *line, const char *name, const char *want);
PMI_INTERNAL int token_int(const char *line, const char *name, int *out);
PMI_INTERNAL int ok(const char *reply, const char *want);

/* Escaping. */
PMI_INTERNAL int key_plain(unsigned char c);
PMI_INTERNAL int value_plain(unsigned char c);
PMI_INTERNAL int escape(const char *in, char *out, size_t cap, int max, int (*plain)(unsigned char), char mark);
PMI_INTERNAL int unescape_value(const char *in, size_t n, char *out, size_t cap);

#endif
