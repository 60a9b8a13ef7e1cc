# allreduce.c in mpi4py: every rank checks the sum of 1..size over
# Allreduce (and the max of the ranks), prints it, and fails if it is
# wrong.
import os
import sys

from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
total = comm.allreduce(rank + 1, op=MPI.SUM)
top = comm.allreduce(rank, op=MPI.MAX)
ok = total == size * (size + 1) // 2 and top == size - 1
# One write: mpirun.openmpi's output forwarding can run the lines of
# several ranks together when a line comes in two writes.
os.write(1, f"rank {rank}: sum {total} max {top} {'ok' if ok else 'WRONG'}\n".encode())
sys.exit(0 if ok else 3)
