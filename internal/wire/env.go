package wire

import "path/filepath"

// Names of the environment variables gorun sets for every rank (DESIGN.md §3).
const (
	EnvJobID        = "GORUN_JOB_ID"
	EnvRank         = "GORUN_RANK"
	EnvWorldSize    = "GORUN_WORLD_SIZE"
	EnvLocalRank    = "GORUN_LOCAL_RANK"
	EnvLocalSize    = "GORUN_LOCAL_SIZE"
	EnvNodeRank     = "GORUN_NODE_RANK"
	EnvEpoch        = "GORUN_EPOCH"
	EnvSocket       = "GORUN_SOCKET"
	EnvRestartCount = "GORUN_RESTART_COUNT"
	// The parallel layout (--tp, --pp): tensor-, pipeline- and
	// data-parallel sizes, in Megatron-LM's rank order.
	EnvTPSize = "GORUN_TP_SIZE"
	EnvPPSize = "GORUN_PP_SIZE"
	EnvDPSize = "GORUN_DP_SIZE"

	// torchrun-compatible.
	EnvTorchRank          = "RANK"
	EnvTorchWorldSize     = "WORLD_SIZE"
	EnvTorchLocalRank     = "LOCAL_RANK"
	EnvTorchLocalSize     = "LOCAL_WORLD_SIZE"
	EnvTorchGroupRank     = "GROUP_RANK"
	EnvTorchGroupSize     = "GROUP_WORLD_SIZE"
	EnvTorchRoleName      = "ROLE_NAME"
	EnvTorchRoleRank      = "ROLE_RANK"
	EnvTorchRoleWorldSize = "ROLE_WORLD_SIZE"
	EnvTorchMasterAddr    = "MASTER_ADDR"
	EnvTorchMasterPort    = "MASTER_PORT"
	EnvTorchRestartCount  = "TORCHELASTIC_RESTART_COUNT"
	EnvTorchMaxRestarts   = "TORCHELASTIC_MAX_RESTARTS"
	EnvTorchRunID         = "TORCHELASTIC_RUN_ID"

	// Open MPI-compatible.
	EnvOMPIRank      = "OMPI_COMM_WORLD_RANK"
	EnvOMPISize      = "OMPI_COMM_WORLD_SIZE"
	EnvOMPILocalRank = "OMPI_COMM_WORLD_LOCAL_RANK"
	EnvOMPILocalSize = "OMPI_COMM_WORLD_LOCAL_SIZE"
	EnvOMPINodeRank  = "OMPI_COMM_WORLD_NODE_RANK"
	EnvPMIRank       = "PMI_RANK"
	EnvPMISize       = "PMI_SIZE"

	// MPICH-compatible (Hydra's): the PMI-1 connection, inherited as a
	// file descriptor, and the rank's place among its host's ranks.
	EnvPMIFD          = "PMI_FD"
	EnvMPILocalRankID = "MPI_LOCALRANKID"
	EnvMPILocalNRanks = "MPI_LOCALNRANKS"
	// EnvPMIClique lists the ranks of the rank's host in the epoch, as
	// ranges ("0-3,8-11"), for the PMI-1 client library Open MPI ranks
	// load (PMI_Get_clique_ranks).
	EnvPMIClique = "GORUN_PMI_CLIQUE"

	// EnvOMPNumThreads is set to 1 when several ranks share a host and the
	// user did not set it, as torchrun does.
	EnvOMPNumThreads = "OMP_NUM_THREADS"
	// EnvTmpdir points every rank at a private directory the agent removes
	// when the rank's job ends, so temporary files are not left behind.
	EnvTmpdir = "TMPDIR"
	// EnvGlooIfname names the network interface gloo (PyTorch's CPU
	// backend) listens on and tells its peers. The agent sets it to the
	// interface holding the address its host registered, when that is
	// not a loopback address and the user did not set it: gloo's default,
	// the address the host name resolves to, is loopback on many hosts.
	EnvGlooIfname = "GLOO_SOCKET_IFNAME"
)

// ContractNames lists every variable of the rank contract, for tests and for
// stripping stale values inherited from an enclosing job.
var ContractNames = []string{
	EnvJobID, EnvRank, EnvWorldSize, EnvLocalRank, EnvLocalSize, EnvNodeRank,
	EnvEpoch, EnvSocket, EnvRestartCount, EnvTPSize, EnvPPSize, EnvDPSize,
	EnvTorchRank, EnvTorchWorldSize, EnvTorchLocalRank, EnvTorchLocalSize,
	EnvTorchGroupRank, EnvTorchGroupSize, EnvTorchRoleName, EnvTorchRoleRank,
	EnvTorchRoleWorldSize, EnvTorchMasterAddr, EnvTorchMasterPort,
	EnvTorchRestartCount, EnvTorchMaxRestarts, EnvTorchRunID,
	EnvOMPIRank, EnvOMPISize, EnvOMPILocalRank, EnvOMPILocalSize, EnvOMPINodeRank,
	EnvPMIRank, EnvPMISize, EnvPMIFD, EnvMPILocalRankID, EnvMPILocalNRanks,
}

// StaleNames are variables an enclosing launcher may have set that would
// mislead a rank (another PMI server's address): gorun never passes them
// on, and does not set them.
var StaleNames = []string{"PMI_PORT", "PMI_ID", "PMI_VERSION", "PMI_SUBVERSION", "PMIX_RANK", "PMIX_NAMESPACE", "PMIX_SERVER_URI2", "PMIX_SERVER_URI3", "PMIX_SERVER_URI4",
	"OMPI_MCA_orte_hnp_uri", "OMPI_MCA_ess", "FLUX_URI"}

// StalePrefixes are the prefixes of more such variables (mpirun's and a
// PMIx server's: Open MPI 4's mpirun passes its runtime's settings as
// OMPI_MCA_orte_* and OMPI_MCA_ess_*, e.g. OMPI_MCA_ess_base_jobid,
// OMPI_MCA_orte_local_daemon_uri). A rank still gets what -x sets.
var StalePrefixes = []string{"OMPI_MCA_orte_", "OMPI_MCA_ess_", "PMIX_"}

// PMILibraryName is the PMI-1 client library Open MPI ranks load
// (libpmi/), which make build puts beside gorun.
const PMILibraryName = "libgorun-pmi.so"

// PMILibraryPaths returns where the library is looked for, in order: the
// one configured, else beside the executable exe, else in ../lib/gorun/
// from it.
func PMILibraryPaths(configured, exe string) []string {
	if configured != "" {
		return []string{configured}
	}
	dir := filepath.Dir(exe)
	return []string{filepath.Join(dir, PMILibraryName), filepath.Join(filepath.Dir(dir), "lib", "gorun", PMILibraryName)}
}

// PMIFD is the descriptor number of a rank's PMI connection.
const PMIFD = 3
