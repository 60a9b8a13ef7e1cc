package depcheck

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/gorun/gorun/"

// allowed lists, for each package, the packages of gorun it may import
// (DESIGN.md §2). Packages not listed may import anything of gorun.
var allowed = map[string][]string{
	"topology":           {},
	"internal/wire":      {},
	"internal/crc32c":    {},
	"replay":             {},
	"internal/diffstore": {"replay"},
	"gpu":                {},
	// comm is what a Go rank links: the data plane, with the job's data
	// key from internal/jobkey; never the control plane (noNATS).
	"comm":            {"topology", "internal/wire", "internal/jobkey"},
	"internal/jobkey": {},
	// internal/control, the control plane's client side (NATS connection,
	// rendezvous, fences), for the launcher and internal/agent only.
	"internal/control":    {"internal/wire", "internal/jobkey"},
	"internal/ctlserver":  {"internal/wire"},
	"internal/membership": {"topology"},
	"internal/plan":       {"topology"}, // gorun plan's models
	"ckpt":                {"topology"},
	"hotswap":             {"topology", "ckpt"},
	// durable, the disk tier, shares ckpt's region rules and CRC
	// combination and internal/wire's job ids, and nothing else.
	"durable": {"ckpt", "internal/wire"},
	// internal/diffstore is the holders' store of diff mode: part of
	// the service side, which DESIGN.md §2 puts in an internal package.
	// durable is ckpt's disk tier (issue 17): the ranks' services save
	// their bases there, and the launcher writes the job's manifest and
	// commit record. The differential log on disk (internal/difflog) is
	// the service side's too; internal/cascade decides and does the
	// retrieval cascade, for the agents and the launcher; it checks the
	// differential records' optimizer layout (a diffstore.Optimizer, the
	// type difflog's records carry) from one record to the next.
	"internal/keeper":      {"protect", "ckpt", "durable", "replay", "comm", "internal/jobkey", "internal/wire", "topology", "internal/diffstore", "internal/difflog", "internal/cascade"},
	"protect":              {"ckpt", "internal/wire", "replay", "internal/protecthook"},
	"internal/protecthook": {},
	"internal/difflog":     {"ckpt", "replay", "internal/diffstore", "durable"},
	"internal/cascade":     {"durable", "internal/difflog", "internal/diffstore", "replay"},
	"internal/agent":       {"protect", "internal/keeper", "ckpt", "comm", "internal/control", "internal/jobkey", "gpu", "topology", "internal/wire", "replay", "durable", "internal/cascade"},
	"launcher":             {"topology", "comm", "internal/control", "internal/jobkey", "hotswap", "gpu", "durable", "internal/agent", "internal/ctlserver", "internal/wire", "internal/cascade", "internal/events", "internal/jobstatus"},
	// internal/events is the --events schema, shared by the launcher (its
	// writer) and internal/report (its reader); internal/report turns a
	// record into a page.
	"internal/events": {},
	"internal/report": {"internal/events"},
	// internal/jobstatus, gorun status's snapshot, registry and client,
	// shares internal/wire's subjects and job ids.
	"internal/jobstatus": {"internal/wire"},
}

// leaves are packages of gorun that import none of it (allowed says so)
// and that every package may import: internal/crc32c, the CRC32C of all
// protected state.
var leaves = []string{"internal/crc32c"}

// onlyImporters names third-party packages only some packages may import.
var onlyImporters = map[string][]string{
	"github.com/nats-io/nats-server/v2": {"internal/ctlserver"},
	"github.com/NVIDIA/go-nvml":         {"gpu"},
	"github.com/klauspost/reedsolomon":  {"ckpt"},
}

// forbidden names, for packages of gorun (and those under them), the
// third-party packages they must not import: NATS (nats.go, nkeys, nuid,
// nats-server, jwt) is the control plane's, and ranks never talk to it
// (TestRanksLinkNoNATS checks their indirect dependencies too).
var forbidden = map[string][]string{
	"comm":     {natsPrefix},
	"examples": {natsPrefix},
}

func TestImportRules(t *testing.T) {
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Imports " "}}`, module+"...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		pkg := strings.TrimPrefix(f[0], module)
		n++
		for _, imp := range f[1:] {
			for under, thirds := range forbidden {
				for _, third := range thirds {
					if contains([]string{under}, pkg) && strings.HasPrefix(imp, third) {
						t.Errorf("%s imports %s, which it must not", pkg, imp)
					}
				}
			}
			for third, who := range onlyImporters {
				if strings.HasPrefix(imp, third) && !contains(who, pkg) {
					t.Errorf("%s imports %s; only %v may", pkg, imp, who)
				}
			}
			if !strings.HasPrefix(imp, module) {
				continue
			}
			dep := strings.TrimPrefix(imp, module)
			if contains(leaves, dep) {
				continue
			}
			if ok, listed := allowed[pkg]; listed && !contains(ok, dep) {
				t.Errorf("%s imports %s, which DESIGN.md §2 does not allow", pkg, dep)
			}
		}
	}
	if n < 5 {
		t.Fatalf("go list found only %d packages", n)
	}
}

// noNATS lists what a Go trainer links: none of it may depend, even
// indirectly, on a package under natsPrefix, since ranks never talk to the
// control plane (comm.Init reaches the agent over a Unix socket). A
// package that ranks link is added here by one line.
var noNATS = []string{
	"comm",
	"examples/dptrain",
	"protect",
}

const natsPrefix = "github.com/nats-io/"

// TestRanksLinkNoNATS: go list -deps of every package of noNATS names no
// package under github.com/nats-io/.
func TestRanksLinkNoNATS(t *testing.T) {
	for _, pkg := range noNATS {
		t.Run(strings.ReplaceAll(pkg, "/", "_"), func(t *testing.T) {
			out, err := exec.Command("go", "list", "-deps", module+pkg).CombinedOutput()
			if err != nil {
				t.Fatalf("go list -deps %s: %v\n%s", pkg, err, out)
			}
			deps := strings.Fields(string(out))
			if !slices.Contains(deps, module+pkg) {
				t.Fatalf("go list -deps %s did not list the package itself:\n%s", pkg, out)
			}
			for _, d := range deps {
				if strings.HasPrefix(d, natsPrefix) {
					t.Errorf("%s depends on %s", pkg, d)
				}
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s || strings.HasPrefix(s, x+"/") {
			return true
		}
	}
	return false
}
