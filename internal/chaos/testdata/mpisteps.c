/* The chaos suite's MPICH workload: argv[1] steps, each an MPI_Allreduce
 * of a value of the step and the rank followed by argv[2] ms of sleep (an
 * emulated step); rank 0 prints "step N" after each, and at the end
 * "final hash H", an FNV-1a fold of every step's sum. It keeps no state:
 * a job restarted from the start ends with the same hash.
 *
 * SIGUSR1 (Slurm's preemption notice, which gorun forwards) does not end
 * it: MPICH's MPI_Init installs a handler of its own. Each rank notes it:
 * "mpisteps: rank N: got SIGUSR1 at step S (a preemption notice); going
 * on" on stderr before step S (S = STEPS: after the last), MPICH's handler
 * still called. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static volatile sig_atomic_t usr1;
static struct sigaction mpich_usr1; /* MPICH's own, chained */

static void on_usr1(int sig, siginfo_t *info, void *uc) {
	usr1 = 1;
	if (mpich_usr1.sa_flags & SA_SIGINFO)
		mpich_usr1.sa_sigaction(sig, info, uc);
	else if (mpich_usr1.sa_handler != SIG_DFL && mpich_usr1.sa_handler != SIG_IGN)
		mpich_usr1.sa_handler(sig);
}

static void note_usr1(int rank, int s) {
	if (usr1) {
		usr1 = 0;
		fprintf(stderr, "mpisteps: rank %d: got SIGUSR1 at step %d (a preemption notice); going on\n", rank, s);
		fflush(stderr);
	}
}

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
	struct sigaction sa = {0};
	sa.sa_sigaction = on_usr1;
	sa.sa_flags = SA_SIGINFO | SA_RESTART;
	sigemptyset(&sa.sa_mask);
	sigaction(SIGUSR1, &sa, &mpich_usr1);
	unsigned long long h = 1469598103934665603ULL;
	for (int s = 0; s < steps; s++) {
		note_usr1(rank, s);
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
	note_usr1(rank, steps);
	if (rank == 0)
		printf("final hash %016llx\n", h);
	MPI_Finalize();
	return 0;
}
