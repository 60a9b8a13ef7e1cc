/* Under gorun --spares with a host killed. Every rank initializes MPI,
 * checks an allreduce and says it is up; in the first generation
 * (GORUN_RESTART_COUNT=0) it then waits to be killed, in the restarted one
 * it finalizes. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
	int rank, size;
	long one = 1, sum = 0;
	const char *gen = getenv("GORUN_RESTART_COUNT");
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	MPI_Allreduce(&one, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	printf("generation %s: rank %d of %d up, sum %ld\n", gen ? gen : "?", rank, size, sum);
	fflush(stdout);
	if (gen == NULL || strcmp(gen, "0") == 0)
		sleep(3600);
	MPI_Finalize();
	return sum == size ? 0 : 3;
}
