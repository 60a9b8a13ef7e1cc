package depcheck

import (
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/gorun/gorun/"

// allowed lists, for each package, the packages of gorun it may import
// (DESIGN.md §2). Packages not listed may import anything of gorun.
var allowed = map[string][]string{
	"topology":            {},
	"internal/wire":       {},
	"internal/crc32c":     {},
	"replay":              {},
	"internal/diffstore":  {"replay"},
	"gpu":                 {},
	"comm":                {"topology", "internal/wire"},
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
	"internal/keeper": {"protect", "ckpt", "durable", "replay", "comm", "internal/wire", "topology", "internal/diffstore", "internal/difflog", "internal/cascade"},

	// protect is what a trainer links: the client and the protocol's
	// messages, on ckpt's slot files and internal/wire's rank socket;
	// internal/protecthook holds its test hooks and imports nothing.
	"protect":              {"ckpt", "internal/wire", "replay", "internal/protecthook"},
	"internal/protecthook": {},

	"internal/difflog": {"ckpt", "replay", "internal/diffstore", "durable"},
	"internal/cascade": {"durable", "internal/difflog", "internal/diffstore", "replay"},
	"internal/agent":   {"protect", "internal/keeper", "ckpt", "comm", "gpu", "topology", "internal/wire", "replay", "durable", "internal/cascade"},
	"launcher":         {"topology", "comm", "hotswap", "gpu", "durable", "internal/agent", "internal/ctlserver", "internal/wire", "internal/cascade", "internal/events", "internal/jobstatus"},
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

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s || strings.HasPrefix(s, x+"/") {
			return true
		}
	}
	return false
}
