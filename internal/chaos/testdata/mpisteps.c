/* The chaos suite's MPICH workload: argv[1] steps, each an MPI_Allreduce
 * of a value of the step and the rank followed by argv[2] ms of sleep (an
 * emulated step); rank 0 prints "step N" after each, and at the end
 * "final hash H", an FNV-1a fold of every step's sum. It keeps no state:
 * a job restarted from the start ends with the same hash. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv) {
	int rank, size;
	if (argc != 3) {
		fprintf(stderr, "usage: mpisteps STEPS MS\n");
		return 2;
	}
	int steps = atoi(argv[1]), ms = atoi(argv[2]);
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	unsigned long long h = 1469598103934665603ULL;
	for (int s = 0; s < steps; s++) {
		long mine = (long)(s + 1) * (rank + 1), sum = 0;
		MPI_Allreduce(&mine, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
		h = (h ^ (unsigned long long)sum) * 1099511628211ULL;
		if (rank == 0) {
			printf("step %d\n", s);
			fflush(stdout);
		}
		struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
		nanosleep(&ts, NULL);
	}
	if (rank == 0)
		printf("final hash %016llx\n", h);
	MPI_Finalize();
	return 0;
}
