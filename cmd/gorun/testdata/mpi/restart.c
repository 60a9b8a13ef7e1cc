/* Under gorun --max-restarts 1. In the first generation
 * (GORUN_RESTART_COUNT=0) rank 1 dies (exit 3) after MPI_Init while rank 0
 * waits in a barrier, rank 2 is on its way to it and rank 3 sleeps; the
 * restarted generation must get through MPI_Init (a PMI barrier), a
 * barrier and MPI_Finalize. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
	int rank, size;
	const char *gen = getenv("GORUN_RESTART_COUNT");
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (gen == NULL || strcmp(gen, "0") == 0) {
		switch (rank) {
		case 1:
			fprintf(stderr, "rank 1 dying\n");
			exit(3);
		case 2:
			sleep(1);
			break;
		case 3:
			sleep(3600);
			break;
		}
		MPI_Barrier(MPI_COMM_WORLD);
		sleep(3600);
	}
	MPI_Barrier(MPI_COMM_WORLD);
	printf("generation %s: hello from %d of %d\n", gen, rank, size);
	MPI_Finalize();
	return 0;
}
