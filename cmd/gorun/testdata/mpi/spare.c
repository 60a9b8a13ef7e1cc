/* Under gorun --spares with hosts killed. Every rank initializes MPI,
 * checks an allreduce and says it is up; in the generations before argv[1]
 * (GORUN_RESTART_COUNT; 1 without it) it then waits to be killed, in that
 * one and later ones it finalizes. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv) {
	int rank, size;
	long one = 1, sum = 0;
	const char *gen = getenv("GORUN_RESTART_COUNT");
	int last = argc > 1 ? atoi(argv[1]) : 1;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	MPI_Allreduce(&one, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	printf("generation %s: rank %d of %d up, sum %ld\n", gen ? gen : "?", rank, size, sum);
	fflush(stdout);
	if (gen == NULL || atoi(gen) < last)
		sleep(3600);
	MPI_Finalize();
	return sum == size ? 0 : 3;
}
