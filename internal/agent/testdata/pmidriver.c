/*
 * pmidriver: FuzzPMIEscape's rank. It initializes PMI through
 * libgorun-pmi.so, writes the kvsname's length and the value length
 * announced, then for each request on stdin (u32 key length, key, u32
 * value length, value; little-endian) puts the key, enters a barrier and
 * gets it back, answering with the put's, the barrier's and the get's
 * return codes and the value got (i32 x3, u32 length, bytes). A key
 * length with bit 31 set skips the barrier; a value length of 0xffffffff
 * (no value follows) skips the put and the barrier: only the get.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "pmi.h"

static int readn(void *p, size_t n) { return fread(p, 1, n, stdin) == n ? 0 : -1; }

/* readstr reads a string; flag is set to bit 31 of its length, and a length of 0xffffffff is no string (NULL). */
static char *readstr(int *flag) {
	uint32_t n;
	char *s;
	if (readn(&n, 4) != 0)
		exit(0);
	if (n == 0xffffffffu)
		return NULL;
	*flag = (n >> 31) != 0;
	n &= 0x7fffffffu;
	if (n > (1u << 20) || (s = calloc(1, n + 1)) == NULL || readn(s, n) != 0)
		exit(0);
	return s;
}

int main(void) {
	char name[1024], got[4096];
	int spawned, vmax, rc[3];
	uint32_t len;
	if (PMI_Init(&spawned) != PMI_SUCCESS || PMI_KVS_Get_my_name(name, sizeof name) != PMI_SUCCESS ||
	    PMI_KVS_Get_value_length_max(&vmax) != PMI_SUCCESS)
		return 1;
	fwrite(&vmax, 4, 1, stdout);
	fflush(stdout);
	for (;;) {
		int nobarrier = 0, unused;
		char *key = readstr(&nobarrier), *value = readstr(&unused);
		if (key == NULL)
			return 1;
		got[0] = '\0';
		rc[0] = value != NULL ? PMI_KVS_Put(name, key, value) : PMI_SUCCESS;
		rc[1] = rc[0] == PMI_SUCCESS && value != NULL && !nobarrier ? PMI_Barrier() : 0;
		rc[2] = rc[0] == PMI_SUCCESS ? PMI_KVS_Get(name, key, got, sizeof got) : 0;
		len = rc[2] == PMI_SUCCESS ? strlen(got) : 0;
		fwrite(rc, 4, 3, stdout);
		fwrite(&len, 4, 1, stdout);
		fwrite(got, 1, len, stdout);
		fflush(stdout);
		free(key);
		free(value);
	}
}
