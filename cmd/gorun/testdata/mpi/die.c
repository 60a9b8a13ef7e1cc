/* Rank 1 dies (exit 3, without MPI_Finalize) while the others wait in a
 * barrier: the launcher must end the job at once, with rank 1's status. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
	int rank;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	if (rank == 1) {
		fprintf(stderr, "rank 1 dying\n");
		exit(3);
	}
	MPI_Barrier(MPI_COMM_WORLD);
	MPI_Finalize();
	return 0;
}
