/*
 * pmiabort: TestPMIAbort's rank. It initializes PMI through
 * libgorun-pmi.so and writes one byte to stdout. With the argument
 * "barrier", its main thread then enters PMI_Barrier while a second
 * thread, once a byte arrives on stdin (the server holds the barrier's
 * reply), calls PMI_Abort(7, ...): the abort must reach the server while
 * the barrier waits. Without it, the main thread calls PMI_Abort(7, ...)
 * at once. Either way errno is EINTR when PMI_Abort is called: it must
 * still return when the server closes the connection (and exit 7).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "pmi.h"

static void *aborter(void *arg) {
	char c;
	(void)arg;
	if (read(0, &c, 1) != 1)
		_exit(2);
	errno = EINTR;
	PMI_Abort(7, "rank 0\nfailed");
	return NULL;
}

int main(int argc, char **argv) {
	int spawned;
	pthread_t t;
	if (PMI_Init(&spawned) != PMI_SUCCESS)
		return 1;
	if (write(1, "i", 1) != 1)
		return 1;
	if (argc > 1 && strcmp(argv[1], "barrier") == 0) {
		if (pthread_create(&t, NULL, aborter, NULL) != 0)
			return 1;
		PMI_Barrier();
		pthread_join(t, NULL);
		return 3;
	}
	errno = EINTR;
	PMI_Abort(7, "rank 0 failed");
	return 4;
}
