/* Rank 1 calls MPI_Abort with code 0 while the others wait in a barrier:
 * the job must still stop (with status 0, as under Hydra). */
#include <mpi.h>

int main(int argc, char **argv) {
	int rank;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	if (rank == 1)
		MPI_Abort(MPI_COMM_WORLD, 0);
	MPI_Barrier(MPI_COMM_WORLD);
	MPI_Finalize();
	return 0;
}
