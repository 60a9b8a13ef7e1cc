/*
 * libgorun-pmi.so's connection to gorun's PMI server (see gorun_pmi.c):
 * writing and reading its lines on fd, sending the puts kept before a
 * request, reading a reply's tokens, and escaping keys and values.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gorun_pmi_internal.h"

pthread_mutex_t wmu = PTHREAD_MUTEX_INITIALIZER; /* taken after mu, or alone; guards writes on fd, and fd */
int fd = -1;
static char rbuf[LINE_MAX_BYTES];
size_t rlen; /* bytes buffered in rbuf */

/* The puts kept (see gorun_pmi.c): their lines, and how many; mu guards them. */
char puts_buf[PUTS_MAX_BYTES];
size_t puts_len;
int puts_kept;

int parse_int(const char *s, int *out) {
	char *end;
	long v;
	if (s == NULL || *s == '\0')
		return -1;
	errno = 0;
	v = strtol(s, &end, 10);
	if (errno != 0 || *end != '\0' || v < 0 || v > 0x7fffffff)
		return -1;
	*out = (int)v;
	return 0;
}

/* write_all_locked writes p to fd; wmu held. */
int write_all_locked(const char *p, size_t n) {
	if (fd < 0)
		return -1;
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* write_all writes p to fd under wmu; mu held. */
static int write_all(const char *p, size_t n) {
	int rc;
	pthread_mutex_lock(&wmu);
	rc = write_all_locked(p, n);
	pthread_mutex_unlock(&wmu);
	return rc;
}

/* set_fd sets fd; mu held. */
void set_fd(int f) {
	pthread_mutex_lock(&wmu);
	fd = f;
	pthread_mutex_unlock(&wmu);
}

/* read_line reads one line into line (NUL-terminated, without its newline). */
int read_line(char *line, size_t cap) {
	for (;;) {
		char *nl = memchr(rbuf, '\n', rlen);
		if (nl != NULL) {
			size_t n = (size_t)(nl - rbuf);
			if (n + 1 > cap)
				return -1;
			memcpy(line, rbuf, n);
			line[n] = '\0';
			rlen -= n + 1;
			memmove(rbuf, nl + 1, rlen);
			return 0;
		}
		if (rlen == sizeof rbuf)
			return -1;
		ssize_t r = read(fd, rbuf + rlen, sizeof rbuf - rlen);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		rlen += (size_t)r;
	}
}

/*
 * send_kept writes the puts kept and then req (n bytes of whole lines; none if
 * n is 0), in one write when they fit, and reads the puts' answers; mu
 * held. It returns 0, -1 if the connection failed, or 1 if the server
 * refused a put (req was sent all the same: its answer follows).
 */
int send_kept(const char *req, size_t n) {
	char reply[LINE_MAX_BYTES];
	int refused = 0;
	if (fd < 0)
		return -1;
	if (puts_kept == 0)
		return n == 0 || write_all(req, n) == 0 ? 0 : -1;
	if (n > 0 && puts_len + n <= sizeof puts_buf) {
		memcpy(puts_buf + puts_len, req, n);
		puts_len += n;
		n = 0;
	}
	if (write_all(puts_buf, puts_len) != 0 || (n > 0 && write_all(req, n) != 0))
		return -1;
	for (int i = 0; i < puts_kept; i++) {
		if (read_line(reply, sizeof reply) != 0)
			return -1;
		if (!ok(reply, "put_result")) {
			if (!refused)
				fprintf(stderr, "libgorun-pmi: gorun's PMI server refused a put: %.200s\n", reply);
			refused = 1;
		}
	}
	puts_len = 0;
	puts_kept = 0;
	return refused;
}

/*
 * exchange sends req (one line, with its newline) after the puts kept and
 * reads the reply: 0, or -1 if it failed or a put was refused.
 */
int exchange(const char *req, char *reply, size_t cap) {
	int rc = send_kept(req, strlen(req));
	if (rc < 0 || read_line(reply, cap) != 0 || rc != 0)
		return -1;
	return 0;
}

/*
 * token finds name=value in a reply line and returns value's start and
 * length, or NULL.
 */
const char *token(const char *line, const char *name, size_t *len) {
	size_t nl = strlen(name);
	const char *p = line;
	while (*p != '\0') {
		while (*p == ' ')
			p++;
		const char *end = strchr(p, ' ');
		if (end == NULL)
			end = p + strlen(p);
		if ((size_t)(end - p) > nl && strncmp(p, name, nl) == 0 && p[nl] == '=') {
			*len = (size_t)(end - p) - nl - 1;
			return p + nl + 1;
		}
		p = end;
	}
	return NULL;
}

/* token_is says whether the reply's name is want. */
int token_is(const char *line, const char *name, const char *want) {
	size_t n;
	const char *v = token(line, name, &n);
	return v != NULL && n == strlen(want) && strncmp(v, want, n) == 0;
}

/* token_int reads the reply's name as an int. */
int token_int(const char *line, const char *name, int *out) {
	char tmp[16];
	size_t n;
	const char *v = token(line, name, &n);
	if (v == NULL || n == 0 || n >= sizeof tmp)
		return -1;
	memcpy(tmp, v, n);
	tmp[n] = '\0';
	return parse_int(tmp, out);
}

/* ok says whether reply is cmd=want with rc=0. */
int ok(const char *reply, const char *want) {
	return token_is(reply, "cmd", want) && token_is(reply, "rc", "0");
}

static const char hexdigits[] = "0123456789abcdef";

static int unhex(char c) {
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

int key_plain(unsigned char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
int value_plain(unsigned char c) { return c >= 0x21 && c <= 0x7e && c != '%'; }

/*
 * escape writes in's escaped form into out (cap bytes with its NUL): the
 * bytes plain accepts as they are, every other one as mark and two hex
 * digits. It returns the length, or -1 if longer than max.
 */
int escape(const char *in, char *out, size_t cap, int max, int (*plain)(unsigned char), char mark) {
	size_t n = 0;
	for (const unsigned char *p = (const unsigned char *)in; *p != '\0'; p++) {
		int keep = plain(*p);
		size_t need = keep ? 1 : 3;
		if (n + need > (size_t)max || n + need + 1 > cap)
			return -1;
		if (keep) {
			out[n++] = (char)*p;
		} else {
			out[n++] = mark;
			out[n++] = hexdigits[*p >> 4];
			out[n++] = hexdigits[*p & 15];
		}
	}
	out[n] = '\0';
	return (int)n;
}

/*
 * unescape_value decodes the n escaped bytes at in into out (cap bytes with
 * its NUL): PMI_ERR_INVALID_VAL for a malformed escape (or one of a NUL,
 * which a C string cannot hold), PMI_ERR_INVALID_LENGTH if out is too
 * small.
 */
int unescape_value(const char *in, size_t n, char *out, size_t cap) {
	size_t o = 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)in[i];
		if (c == '%') {
			int hi, lo;
			if (i + 2 >= n)
				return PMI_ERR_INVALID_VAL;
			hi = unhex(in[i + 1]);
			lo = unhex(in[i + 2]);
			if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
				return PMI_ERR_INVALID_VAL;
			c = (unsigned char)(hi << 4 | lo);
			i += 2;
		} else if (c < 0x21 || c > 0x7e) {
			return PMI_ERR_INVALID_VAL;
		}
		if (o + 1 >= cap)
			return PMI_ERR_INVALID_LENGTH;
		out[o++] = (char)c;
	}
	if (o >= cap)
		return PMI_ERR_INVALID_LENGTH;
	out[o] = '\0';
	return PMI_SUCCESS;
}
