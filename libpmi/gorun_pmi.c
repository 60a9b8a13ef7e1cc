/*
 * libgorun-pmi.so: a PMI-1 client library over gorun's PMI server.
 *
 * Open MPI 4's flux pmix component dlopens the library FLUX_PMI_LIBRARY_PATH
 * names and bootstraps through its PMI-1 calls. gorun's agent serves the
 * PMI-1 "simple" wire protocol on the descriptor PMI_FD (for MPICH, whose
 * own client speaks it); this library speaks it too, one request line and
 * one reply line at a time, under a mutex (Open MPI's progress thread may
 * call in). Writes also take a second lock, wmu, alone: PMI_Abort takes
 * only that one, so an abort gets out while another thread of the rank
 * waits in PMI_Barrier (which holds mu until the barrier's reply).
 *
 * The wire carries space-separated key=value tokens, so what a program
 * puts is escaped here, and unescaped on get (the server stays strict):
 *   keys:   [a-z0-9] pass; every other byte becomes '_' and two lowercase
 *           hex digits ("1-0-key0" -> "1_2d0_2dkey0"); at most keylen_max
 *           escaped bytes.
 *   values: bytes 0x21-0x7e pass except '%'; every other byte becomes '%'
 *           and two lowercase hex digits; at most the usable value length
 *           (vallen_max - kvsname_max - keylen_max - 31, from get_maxes)
 *           escaped bytes.
 * A put too long once escaped fails (PMI_ERR_INVALID_KEY_LENGTH,
 * PMI_ERR_INVALID_VAL_LENGTH) with a note on stderr, never truncated.
 * The server's own key, PMI_process_mapping, is got unescaped; a put of
 * it fails (PMI_ERR_INVALID_KEY).
 *
 * PMI_Init sends its four questions in one write. The last one is
 * gorun's own (cmd=gorun_kvs_keys): how many keys the barriers have
 * published. While none are and this rank has put nothing since, a get
 * is "not found" without a round trip: Open MPI asks for every peer's
 * data once before its first barrier. A put or a barrier ends that
 * (published becomes unknown).
 *
 * Puts go together: PMI_KVS_Put checks its request (kvsname, lengths)
 * and keeps its line; the next request of another kind (a commit, a
 * barrier, a get, finalize) writes the puts kept first, in the same
 * write, and reads their answers: Open MPI puts its data in about ten
 * chunks, each a round trip to the agent otherwise. A put the server
 * refuses (more than a barrier takes) fails that request (PMI_FAIL), with
 * the server's answer on stderr.
 *
 * Built by make build: gcc -O2 -fPIC -shared -fvisibility=hidden; it needs
 * only libc and exports only the PMI_* calls.
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gorun_pmi_internal.h"

#define ABORT_MSG_MAX 400

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;  /* guards every field below, fd and the puts kept (gorun_pmi_wire.c) */
static int initialized;
static int rank = -1, size = -1;
static char kvsname[1024];
static int kvsname_max, keylen_max, vallen_max;
static int value_usable;   /* the longest escaped value the server takes */
static int value_announced; /* what PMI_KVS_Get_value_length_max says */

/*
 * Prefetch: Open MPI splits each rank's blob into keys "<job>-<rank>-key0",
 * "key1", ... and every rank gets every other rank's one by one: a round
 * trip to the agent each (at 64 ranks, about 700 per rank, each waiting
 * for the agent to be scheduled). A get of a key ending in "key<N>" also
 * asks, in the same write, for the PREFETCH keys after it; their answers
 * (values, or not found) are kept until this rank's next put or barrier,
 * the only events that can change what a get returns (other ranks' puts
 * show after a barrier).
 */
#define PREFETCH 15
static struct {
	char key[LINE_MAX_BYTES / 4];
	int found;
	char value[LINE_MAX_BYTES / 2]; /* escaped, as the server sent it */
} cached[PREFETCH];
static int ncached; /* entries of cached in use; mu guards both */

/*
 * published is the number of keys the barriers have published, as the
 * server said at PMI_Init, or -1 if unknown (since a put or a barrier, or
 * a server without gorun_kvs_keys); mu guards it.
 */
static int published = -1;

PMI_API int PMI_Init(int *spawned) {
	char reply[LINE_MAX_BYTES];
	int f, r, s, rc = PMI_FAIL;
	if (spawned == NULL)
		return PMI_ERR_INVALID_ARG;
	pthread_mutex_lock(&mu);
	if (initialized) {
		*spawned = 0;
		pthread_mutex_unlock(&mu);
		return PMI_SUCCESS;
	}
	if (parse_int(getenv("PMI_FD"), &f) != 0 || parse_int(getenv("PMI_RANK"), &r) != 0 ||
	    parse_int(getenv("PMI_SIZE"), &s) != 0 || s < 1 || r >= s) {
		fprintf(stderr, "libgorun-pmi: PMI_FD, PMI_RANK or PMI_SIZE missing or invalid: not started by gorun?\n");
		goto out;
	}
	set_fd(f);
	rlen = 0;
	/* The four questions in one write (one round trip), answered in order. */
	if (exchange("cmd=init pmi_version=1 pmi_subversion=1\ncmd=get_maxes\ncmd=get_my_kvsname\ncmd=gorun_kvs_keys\n",
		     reply, sizeof reply) != 0 ||
	    !ok(reply, "response_to_init"))
		goto fail;
	if (read_line(reply, sizeof reply) != 0 || !ok(reply, "maxes") ||
	    token_int(reply, "kvsname_max", &kvsname_max) != 0 || token_int(reply, "keylen_max", &keylen_max) != 0 ||
	    token_int(reply, "vallen_max", &vallen_max) != 0)
		goto fail;
	/*
	 * MPICH's client takes a value of at most vallen_max - kvsname_max -
	 * keylen_max - 30 bytes (with its NUL) in a get_result, and gorun's
	 * server refuses longer puts. Open MPI splits its blobs into chunks of
	 * 3/4 of the length announced to it: announcing 8/9 of the usable
	 * length, a multiple of 8, leaves the escapes of a chunk room.
	 */
	if (keylen_max < 1 || keylen_max > LINE_MAX_BYTES / 4 || vallen_max > LINE_MAX_BYTES / 2 || kvsname_max > LINE_MAX_BYTES / 4)
		goto fail;
	value_usable = vallen_max - kvsname_max - keylen_max - 31;
	if (value_usable < 64)
		goto fail;
	value_announced = value_usable * 8 / 9 / 8 * 8;
	if (read_line(reply, sizeof reply) != 0 || !ok(reply, "my_kvsname"))
		goto fail;
	{
		size_t n;
		const char *v = token(reply, "kvsname", &n);
		if (v == NULL || n == 0 || n >= sizeof kvsname || (kvsname_max > 0 && n > (size_t)kvsname_max))
			goto fail;
		memcpy(kvsname, v, n);
		kvsname[n] = '\0';
	}
	/* An unknown command's answer (rc=-1) leaves it unknown. */
	if (read_line(reply, sizeof reply) != 0)
		goto fail;
	if (!ok(reply, "gorun_kvs_keys_result") || token_int(reply, "keys", &published) != 0)
		published = -1;
	rank = r;
	size = s;
	initialized = 1;
	*spawned = 0;
	rc = PMI_SUCCESS;
	goto out;
fail:
	fprintf(stderr, "libgorun-pmi: PMI_Init: no valid answer from gorun's PMI server on descriptor %d\n", f);
	set_fd(-1);
out:
	pthread_mutex_unlock(&mu);
	return rc;
}

PMI_API int PMI_Initialized(int *out) {
	if (out == NULL)
		return PMI_ERR_INVALID_ARG;
	pthread_mutex_lock(&mu);
	*out = initialized;
	pthread_mutex_unlock(&mu);
	return PMI_SUCCESS;
}

PMI_API int PMI_Finalize(void) {
	char reply[LINE_MAX_BYTES];
	int rc = PMI_SUCCESS;
	pthread_mutex_lock(&mu);
	if (initialized) {
		/* The descriptor stays open, as MPICH's client leaves it. */
		if (exchange("cmd=finalize\n", reply, sizeof reply) != 0 || !ok(reply, "finalize_ack"))
			rc = PMI_FAIL;
		initialized = 0;
	}
	pthread_mutex_unlock(&mu);
	return rc;
}

/* getint returns *field once initialized. */
static int getint(int *out, const int *field) {
	int rc = PMI_SUCCESS;
	if (out == NULL)
		return PMI_ERR_INVALID_ARG;
	pthread_mutex_lock(&mu);
	if (!initialized)
		rc = PMI_ERR_INIT;
	else
		*out = *field;
	pthread_mutex_unlock(&mu);
	return rc;
}

PMI_API int PMI_Get_size(int *out) { return getint(out, &size); }
PMI_API int PMI_Get_rank(int *out) { return getint(out, &rank); }
PMI_API int PMI_Get_universe_size(int *out) { return getint(out, &size); }
PMI_API int PMI_KVS_Get_name_length_max(int *out) { return getint(out, &kvsname_max); }
PMI_API int PMI_KVS_Get_key_length_max(int *out) { return getint(out, &keylen_max); }
PMI_API int PMI_KVS_Get_value_length_max(int *out) { return getint(out, &value_announced); }
PMI_API int PMI_Get_id_length_max(int *out) { return getint(out, &kvsname_max); }

PMI_API int PMI_Get_appnum(int *out) {
	static const int zero = 0;
	return getint(out, &zero);
}

PMI_API int PMI_Barrier(void) {
	char reply[LINE_MAX_BYTES];
	int rc = PMI_SUCCESS;
	pthread_mutex_lock(&mu);
	ncached = 0; /* other ranks' puts show after the barrier */
	published = -1;
	if (!initialized)
		rc = PMI_ERR_INIT;
	else if (exchange("cmd=barrier_in\n", reply, sizeof reply) != 0 || !ok(reply, "barrier_out"))
		rc = PMI_FAIL;
	pthread_mutex_unlock(&mu);
	return rc;
}

PMI_API int PMI_Abort(int exit_code, const char error_msg[]) {
	char line[64 + ABORT_MSG_MAX + 2];
	int n, f, sent;
	/*
	 * Only wmu: another thread may hold mu for as long as a barrier
	 * lasts. A thread in a read keeps reading replies; this one only
	 * waits for the end of the connection.
	 */
	pthread_mutex_lock(&wmu);
	f = fd;
	sent = 0;
	if (f >= 0) {
		/* The message is the rest of the line: its newlines become spaces. */
		n = snprintf(line, sizeof line - 2, "cmd=abort exitcode=%d message=", exit_code);
		for (const char *p = error_msg ? error_msg : ""; *p != '\0' && n < (int)sizeof line - 2; p++)
			line[n++] = (*p == '\n' || *p == '\r') ? ' ' : *p;
		line[n++] = '\n';
		line[n] = '\0';
		sent = write_all_locked(line, (size_t)n) == 0;
	}
	pthread_mutex_unlock(&wmu);
	if (sent) {
		/* Until the agent kills this process, as under MPICH's client. */
		char buf[256];
		for (;;) {
			ssize_t r = read(f, buf, sizeof buf);
			if (r > 0 || (r < 0 && errno == EINTR))
				continue;
			break;
		}
	}
	_exit(exit_code);
}

/* copy_name copies kvsname into out (length bytes with its NUL). */
static int copy_name(char out[], int length) {
	int rc = PMI_SUCCESS;
	if (out == NULL)
		return PMI_ERR_INVALID_ARG;
	pthread_mutex_lock(&mu);
	if (!initialized)
		rc = PMI_ERR_INIT;
	else if (length < 0 || strlen(kvsname) + 1 > (size_t)length)
		rc = PMI_ERR_INVALID_LENGTH;
	else
		strcpy(out, kvsname);
	pthread_mutex_unlock(&mu);
	return rc;
}

PMI_API int PMI_KVS_Get_my_name(char out[], int length) { return copy_name(out, length); }
PMI_API int PMI_Get_id(char out[], int length) { return copy_name(out, length); }
PMI_API int PMI_Get_kvs_domain_id(char out[], int length) { return copy_name(out, length); }

PMI_API int PMI_KVS_Commit(const char name[]) {
	int rc = PMI_SUCCESS;
	(void)name; /* the server keeps the puts until the barrier */
	pthread_mutex_lock(&mu);
	if (initialized && send_kept(NULL, 0) != 0)
		rc = PMI_FAIL;
	pthread_mutex_unlock(&mu);
	return rc;
}

/* check_kvs checks a call's kvsname; mu held. */
static int check_kvs(const char name[]) {
	if (!initialized)
		return PMI_ERR_INIT;
	if (name == NULL || strcmp(name, kvsname) != 0)
		return PMI_ERR_INVALID_ARG;
	return PMI_SUCCESS;
}

/* The server's own key: a get asks for it unescaped, and a put of it fails. */
#define MAPPING_KEY "PMI_process_mapping"

/* put_key escapes key into out; mu held. */
static int put_key(const char key[], char *out, size_t cap) {
	if (key == NULL || key[0] == '\0')
		return PMI_ERR_INVALID_KEY;
	if (escape(key, out, cap, keylen_max, key_plain, '_') < 0) {
		fprintf(stderr, "libgorun-pmi: key \"%.80s\" is longer than %d bytes once escaped (only a-z and 0-9 take one byte)\n", key, keylen_max);
		return PMI_ERR_INVALID_KEY_LENGTH;
	}
	return PMI_SUCCESS;
}

PMI_API int PMI_KVS_Put(const char name[], const char key[], const char value[]) {
	char ekey[LINE_MAX_BYTES / 4], evalue[LINE_MAX_BYTES / 2], line[LINE_MAX_BYTES];
	int rc, n;
	if (value == NULL)
		return PMI_ERR_INVALID_VAL;
	pthread_mutex_lock(&mu);
	if ((rc = check_kvs(name)) != PMI_SUCCESS)
		goto out;
	if (key != NULL && strcmp(key, MAPPING_KEY) == 0) {
		fprintf(stderr, "libgorun-pmi: key \"%s\" is gorun's own: it cannot be put\n", key);
		rc = PMI_ERR_INVALID_KEY;
		goto out;
	}
	if ((rc = put_key(key, ekey, sizeof ekey)) != PMI_SUCCESS)
		goto out;
	if (escape(value, evalue, sizeof evalue, value_usable, value_plain, '%') < 0) {
		fprintf(stderr, "libgorun-pmi: the value of key \"%.80s\" is longer than %d bytes once escaped\n", key, value_usable);
		rc = PMI_ERR_INVALID_VAL_LENGTH;
		goto out;
	}
	ncached = 0; /* a prefetched answer may be this key's */
	published = -1; /* a get of this key finds it */
	n = snprintf(line, sizeof line, "cmd=put kvsname=%s key=%s value=%s\n", kvsname, ekey, evalue);
	if (n < 0 || (size_t)n >= sizeof line) {
		rc = PMI_FAIL;
		goto out;
	}
	/* Kept until the next request (see above). */
	if (puts_len + (size_t)n > sizeof puts_buf && send_kept(NULL, 0) != 0) {
		rc = PMI_FAIL;
		goto out;
	}
	memcpy(puts_buf + puts_len, line, (size_t)n);
	puts_len += (size_t)n;
	puts_kept++;
	rc = PMI_SUCCESS;
out:
	pthread_mutex_unlock(&mu);
	return rc;
}

/* get_reply reads one get_result: its value's escaped bytes at v (n). */
static int get_reply(char *reply, size_t cap, const char **v, size_t *n) {
	if (read_line(reply, cap) != 0 || !token_is(reply, "cmd", "get_result"))
		return PMI_FAIL;
	if (!token_is(reply, "rc", "0"))
		return PMI_ERR_INVALID_KEY; /* not found */
	if ((*v = token(reply, "value", n)) == NULL)
		return PMI_FAIL;
	return PMI_SUCCESS;
}

/* get asks the server for ekey (escaped) and unescapes its value; mu held. */
static int get(const char *ekey, char value[], int length) {
	char lines[(PREFETCH + 1) * (LINE_MAX_BYTES / 8)], reply[LINE_MAX_BYTES];
	size_t n, len = strlen(ekey), used, digits = 0;
	const char *v;
	int rc, refused, prefetch = 0;
	for (int i = 0; i < ncached; i++) {
		if (strcmp(cached[i].key, ekey) == 0) {
			if (!cached[i].found)
				return PMI_ERR_INVALID_KEY;
			return unescape_value(cached[i].value, strlen(cached[i].value), value, (size_t)length);
		}
	}
	if (fd < 0 || len + strlen(kvsname) + 32 > LINE_MAX_BYTES / 8)
		return PMI_FAIL;
	if (published == 0 && strcmp(ekey, MAPPING_KEY) != 0)
		return PMI_ERR_INVALID_KEY; /* nothing published, nothing put: not found */
	used = (size_t)snprintf(lines, sizeof lines, "cmd=get kvsname=%s key=%s\n", kvsname, ekey);
	while (digits < len && digits < 9 && ekey[len - 1 - digits] >= '0' && ekey[len - 1 - digits] <= '9')
		digits++;
	ncached = 0;
	if (digits > 0 && len - digits >= 3 && strncmp(ekey + len - digits - 3, "key", 3) == 0) {
		long next = strtol(ekey + len - digits, NULL, 10);
		for (; prefetch < PREFETCH; prefetch++) {
			int k = snprintf(cached[prefetch].key, sizeof cached[prefetch].key, "%.*s%ld", (int)(len - digits), ekey, next + 1 + prefetch);
			if (k < 0 || k > keylen_max)
				break;
			used += (size_t)snprintf(lines + used, sizeof lines - used, "cmd=get kvsname=%s key=%s\n", kvsname, cached[prefetch].key);
		}
	}
	if ((refused = send_kept(lines, used)) < 0)
		return PMI_FAIL;
	rc = get_reply(reply, sizeof reply, &v, &n);
	if (rc == PMI_SUCCESS)
		rc = unescape_value(v, n, value, (size_t)length);
	/* Every answer is read, whatever the first, to keep the stream in step. */
	for (int i = 0; i < prefetch; i++) {
		char more[LINE_MAX_BYTES];
		int r = get_reply(more, sizeof more, &v, &n);
		if (r == PMI_FAIL || (r == PMI_SUCCESS && n >= sizeof cached[i].value)) {
			ncached = 0;
			return PMI_FAIL;
		}
		cached[i].found = r == PMI_SUCCESS;
		if (cached[i].found) {
			memcpy(cached[i].value, v, n);
			cached[i].value[n] = '\0';
		}
		ncached = i + 1;
	}
	return refused ? PMI_FAIL : rc;
}

PMI_API int PMI_KVS_Get(const char name[], const char key[], char value[], int length) {
	char ekey[LINE_MAX_BYTES / 4];
	int rc;
	if (value == NULL || length <= 0)
		return PMI_ERR_INVALID_ARG;
	pthread_mutex_lock(&mu);
	if ((rc = check_kvs(name)) != PMI_SUCCESS)
		goto out;
	if (key != NULL && strcmp(key, MAPPING_KEY) == 0) {
		/* The server's own key, unescaped. */
		rc = get(key, value, length);
		goto out;
	}
	if ((rc = put_key(key, ekey, sizeof ekey)) != PMI_SUCCESS)
		goto out;
	rc = get(ekey, value, length);
out:
	pthread_mutex_unlock(&mu);
	return rc;
}

/*
 * Clique: the ranks on this host. GORUN_PMI_CLIQUE lists them as ranges
 * ("0-3,8-11"); without it, PMI_process_mapping is read from the server.
 * parse_ranges fills ranks (cap entries; NULL to count) and returns the
 * count, or -1 if s is malformed.
 */
static int parse_ranges(const char *s, int *ranks, int cap) {
	int n = 0;
	if (s == NULL || *s == '\0')
		return -1;
	for (;;) {
		char *end;
		long lo = strtol(s, &end, 10), hi;
		if (end == s || lo < 0 || lo >= size)
			return -1;
		hi = lo;
		s = end;
		if (*s == '-') {
			hi = strtol(s + 1, &end, 10);
			if (end == s + 1 || hi < lo || hi >= size)
				return -1;
			s = end;
		}
		for (long r = lo; r <= hi; r++) {
			if (ranks != NULL) {
				if (n >= cap)
					return -1;
				ranks[n] = (int)r;
			}
			n++;
		}
		if (*s == '\0')
			return n;
		if (*s++ != ',')
			return -1;
	}
}

/*
 * parse_mapping reads MPICH's "(vector,(node,count,ranks),...)": each
 * block says count consecutive nodes from node run ranks consecutive
 * ranks each, in rank order. It fills ranks with those on rank's node.
 */
static int parse_mapping(const char *s, int *ranks, int cap) {
	int node[3], mine = -1, n = 0, pass;
	const char *start;
	if (strncmp(s, "(vector", 7) != 0)
		return -1;
	start = s + 7;
	for (pass = 0; pass < 2; pass++) {
		int r = 0;
		s = start;
		while (*s == ',') {
			if (sscanf(s, ",(%d,%d,%d)", &node[0], &node[1], &node[2]) != 3 || node[0] < 0 || node[1] < 0 || node[2] < 0)
				return -1;
			for (int c = 0; c < node[1]; c++) {
				for (int k = 0; k < node[2] && r < size; k++, r++) {
					if (pass == 0 && r == rank)
						mine = node[0] + c;
					if (pass == 1 && node[0] + c == mine) {
						if (ranks != NULL) {
							if (n >= cap)
								return -1;
							ranks[n] = r;
						}
						n++;
					}
				}
			}
			s = strchr(s, ')');
			if (s == NULL)
				return -1;
			s++;
		}
		if (*s != ')' || mine < 0)
			return -1;
	}
	return n;
}

/* clique fills ranks (cap entries; NULL to count) with this host's ranks. */
static int clique(int *ranks, int cap) {
	char mapping[LINE_MAX_BYTES];
	int n;
	pthread_mutex_lock(&mu);
	if (!initialized) {
		pthread_mutex_unlock(&mu);
		return -PMI_ERR_INIT;
	}
	n = parse_ranges(getenv("GORUN_PMI_CLIQUE"), ranks, cap);
	if (n < 0 && get(MAPPING_KEY, mapping, sizeof mapping) == PMI_SUCCESS)
		n = parse_mapping(mapping, ranks, cap);
	if (n < 0) {
		/* Nothing known: this rank alone. */
		if (ranks != NULL && cap >= 1)
			ranks[0] = rank;
		n = 1;
	}
	pthread_mutex_unlock(&mu);
	return n;
}

PMI_API int PMI_Get_clique_size(int *out) {
	int n;
	if (out == NULL)
		return PMI_ERR_INVALID_ARG;
	if ((n = clique(NULL, 0)) < 0)
		return -n;
	*out = n;
	return PMI_SUCCESS;
}

PMI_API int PMI_Get_clique_ranks(int ranks[], int length) {
	int n;
	if (ranks == NULL || length <= 0)
		return PMI_ERR_INVALID_ARG;
	if ((n = clique(NULL, 0)) < 0)
		return -n;
	if (n > length)
		return PMI_ERR_INVALID_LENGTH;
	return clique(ranks, length) < 0 ? PMI_FAIL : PMI_SUCCESS;
}
