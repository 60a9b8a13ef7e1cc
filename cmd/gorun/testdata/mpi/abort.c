/* Rank 1 (or 0 alone) calls MPI_Abort with code 7 while the others wait
 * in a barrier that can never complete. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
	int rank, size;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (rank == (size > 1 ? 1 : 0)) {
		fprintf(stderr, "rank %d aborting\n", rank);
		MPI_Abort(MPI_COMM_WORLD, 7);
	}
	MPI_Barrier(MPI_COMM_WORLD);
	MPI_Finalize();
	return 0;
}
