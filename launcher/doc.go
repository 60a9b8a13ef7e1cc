// Package launcher runs a gorun job: it maps ranks to hosts, starts the
// control plane and one agent per host (in-process for the launcher's own
// host, through --rsh for the others), multiplexes the ranks' output, turns
// user signals into orders to the agents, and decides the job's exit code
// the way mpirun does: 0 when every rank exits 0, otherwise the status of
// the rank that failed first, after stopping the others.
package launcher
