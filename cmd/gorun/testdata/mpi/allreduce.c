/* Every rank checks the sum of 1..size over MPI_Allreduce (and the max of
 * the ranks), prints it, and fails if it is wrong. */
#include <mpi.h>
#include <stdio.h>

int main(int argc, char **argv) {
	int rank, size;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	long mine[2] = {rank + 1, rank}, got[2];
	MPI_Allreduce(&mine[0], &got[0], 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	MPI_Allreduce(&mine[1], &got[1], 1, MPI_LONG, MPI_MAX, MPI_COMM_WORLD);
	long want = (long)size * (size + 1) / 2;
	int ok = got[0] == want && got[1] == size - 1;
	printf("rank %d: sum %ld max %ld %s\n", rank, got[0], got[1], ok ? "ok" : "WRONG");
	MPI_Finalize();
	return ok ? 0 : 3;
}
