package depcheck

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/gorun/gorun/"

// allowed lists, for each package, the packages of gorun it may import
// (DESIGN.md §2). Every package of the module has a rule here or is free
// (TestEveryPackageHasARule), and every package a rule names exists
// (TestRulesNamePackages).
var allowed = map[string][]string{
	"topology":        {},
	"internal/wire":   {},
	"internal/crc32c": {},
	// internal/phasetrace, the launch's phase marks (GORUN_DEBUG_PHASES),
	// which the launcher and the agent mark.
	"internal/phasetrace": {},
	"replay":              {},
	"internal/diffstore":  {"replay"},
	"gpu":                 {},
	// comm is what a Go rank links: the data plane, with the job's data
	// key from internal/jobkey; never the control plane (noNATS).
	"comm":            {"topology", "internal/wire", "internal/jobkey"},
	"internal/jobkey": {},
	// internal/control, the control plane's client side (NATS connection,
	// rendezvous, fences), for the launcher and internal/agent only.
	"internal/control":   {"internal/wire", "internal/jobkey"},
	"internal/ctlserver": {"internal/wire"},
	"internal/plan":      {"topology"}, // gorun plan's models
	"ckpt":               {"topology"},
	// hotswap is a pure state machine (DESIGN.md §2): it knows the hosts
	// and ranks of topology and nothing else of gorun; the launcher
	// carries its actions out.
	"hotswap": {"topology"},
	// durable, the disk tier, shares ckpt's region rules and CRC
	// combination and internal/wire's job ids, and nothing else.
	"durable": {"ckpt", "internal/wire"},
	// protect is what a trainer links: the client and the socket
	// protocol's messages, on ckpt's slot files, replay's optimizer and
	// records (diff mode) and internal/wire's rank socket; its test hooks
	// are in internal/protecthook. Not comm, not the service side (noNATS).
	"protect":              {"ckpt", "replay", "internal/wire", "internal/protecthook"},
	"internal/protecthook": {},
	// internal/keeper is the service side of protect, in the agent: it
	// speaks protect's protocol, replicates over comm's authenticated
	// links (keyed by internal/jobkey), stores holders' copies of diff
	// mode (internal/diffstore), and saves its bases to durable, ckpt's
	// disk tier (issue 17). The differential log on disk (internal/difflog)
	// is the service side's too; internal/cascade decides and does the
	// retrieval cascade, for the agents and the launcher; it checks the
	// differential records' optimizer layout (a diffstore.Optimizer, the
	// type difflog's records carry) from one record to the next.
	"internal/keeper":  {"protect", "ckpt", "durable", "replay", "comm", "internal/jobkey", "internal/wire", "topology", "internal/diffstore", "internal/difflog", "internal/cascade"},
	"internal/difflog": {"ckpt", "replay", "internal/diffstore", "durable"},
	"internal/cascade": {"durable", "internal/difflog", "internal/diffstore", "replay"},
	// internal/difflog/difflogtest simulates a rank of diff mode for
	// tests: the log's records, a holder's store, the reference optimizer.
	"internal/difflog/difflogtest": {"internal/difflog", "internal/diffstore", "replay"},
	"internal/agent":               {"protect", "internal/keeper", "ckpt", "comm", "internal/control", "internal/jobkey", "gpu", "topology", "internal/wire", "replay", "durable", "internal/cascade", "internal/phasetrace"},
	"launcher":                     {"topology", "comm", "internal/control", "internal/jobkey", "hotswap", "gpu", "durable", "internal/agent", "internal/ctlserver", "internal/wire", "internal/cascade", "internal/events", "internal/jobstatus", "internal/phasetrace"},
	// internal/events is the --events schema, shared by the launcher (its
	// writer) and internal/report (its reader); internal/report turns a
	// record into a page.
	"internal/events": {},
	"internal/report": {"internal/events"},
	// internal/jobstatus, gorun status's snapshot, registry and client,
	// shares internal/wire's subjects and job ids.
	"internal/jobstatus": {"internal/wire"},
	// Test helpers that the tests of any package may import import
	// nothing of gorun, so that they never make an import cycle.
	"internal/gortest":     {},
	"internal/gordump":     {},
	"internal/testcluster": {},
	"internal/depcheck":    {},
}

// free names the packages (and those under them) that may import any
// package of gorun: the command, the examples (trainers: forbidden and
// noNATS still hold for them), and the test and benchmark drivers that run
// whole jobs.
var free = []string{
	"cmd/gorun",
	"examples",
	"internal/chaos",
	"internal/benchlaunch",
	"internal/benchprotect",
}

// leaves are packages of gorun that import none of it (allowed says so)
// and that every package may import: internal/crc32c, the CRC32C of all
// protected state.
var leaves = []string{"internal/crc32c"}

// onlyImporters names packages only some packages of gorun may import:
// third-party ones, and internal/protecthook, whose hooks only tests set
// (tests' imports are not checked here).
var onlyImporters = map[string][]string{
	"github.com/nats-io/nats-server/v2": {"internal/ctlserver"},
	"github.com/NVIDIA/go-nvml":         {"gpu"},
	"github.com/klauspost/reedsolomon":  {"ckpt"},
	module + "internal/protecthook":     {"protect"},
}

// forbidden names, for packages of gorun (and those under them), the
// third-party packages they must not import: NATS (nats.go, nkeys, nuid,
// nats-server, jwt) is the control plane's, and ranks never talk to it
// (TestRanksLinkNoNATS checks their indirect dependencies too).
var forbidden = map[string][]string{
	"comm":     {natsPrefix},
	"examples": {natsPrefix},
}

// noNATS lists what a Go trainer links: none of it may depend, even
// indirectly, on a package under natsPrefix, since ranks never talk to the
// control plane (comm.Init and protect.Connect reach the agent over a Unix
// socket). A package that ranks link is added here by one line.
var noNATS = []string{
	"comm",
	"protect",
	"examples/dptrain",
}

const natsPrefix = "github.com/nats-io/"

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
			for only, who := range onlyImporters {
				if strings.HasPrefix(imp, only) && !contains(who, pkg) {
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

// TestRulesNamePackages: every package a rule names (allowed's packages
// and what they may import, leaves, free, forbidden's and onlyImporters'
// packages of gorun, noNATS) is a package of the module, or has packages
// under it where the rule covers those (free, forbidden); every
// third-party package a rule names is a dependency of the module. A rule
// about a package that was removed or renamed fails here, instead of
// silently allowing nothing or everything.
func TestRulesNamePackages(t *testing.T) {
	pkgs := modulePackages(t)
	exact := func(rule, p string) {
		t.Helper()
		if !slices.Contains(pkgs, p) {
			t.Errorf("%s names %s, which is no package of the module (go list %s...)", rule, p, module)
		}
	}
	under := func(rule, p string) {
		t.Helper()
		if !slices.ContainsFunc(pkgs, func(q string) bool { return contains([]string{p}, q) }) {
			t.Errorf("%s names %s, which has no package of the module in it", rule, p)
		}
	}
	for pkg, ok := range allowed {
		exact("allowed", pkg)
		for _, dep := range ok {
			exact("allowed["+pkg+"]", dep)
		}
	}
	for _, p := range leaves {
		exact("leaves", p)
		if ok, listed := allowed[p]; !listed || len(ok) > 0 {
			t.Errorf("leaves names %s, which allowed does not keep from importing gorun (allowed[%q] = %q, listed %v)", p, p, ok, listed)
		}
	}
	for _, p := range free {
		under("free", p)
	}
	for p := range forbidden {
		under("forbidden", p)
	}
	for _, p := range noNATS {
		exact("noNATS", p)
	}

	out, err := exec.Command("go", "list", "-deps", module+"...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	for only, who := range onlyImporters {
		if p, ok := strings.CutPrefix(only, module); ok {
			exact("onlyImporters", p)
		} else if !slices.ContainsFunc(deps, func(d string) bool { return d == only || strings.HasPrefix(d, only+"/") }) {
			t.Errorf("onlyImporters names %s, which no package of the module depends on", only)
		}
		for _, p := range who {
			exact("onlyImporters["+only+"]", p)
		}
	}
	for _, thirds := range forbidden {
		for _, third := range thirds {
			if !slices.ContainsFunc(deps, func(d string) bool { return strings.HasPrefix(d, third) }) {
				t.Errorf("forbidden names %s, which no package of the module depends on", third)
			}
		}
	}
}

// TestEveryPackageHasARule: every package of the module has its allowed
// imports in allowed, or is free, and not both: a new package gets its
// rule when it is added.
func TestEveryPackageHasARule(t *testing.T) {
	for _, p := range modulePackages(t) {
		_, ruled := allowed[p]
		isFree := contains(free, p)
		switch {
		case !ruled && !isFree:
			t.Errorf("package %s has no rule: add what it may import to allowed (DESIGN.md §2), or list it as free", p)
		case ruled && isFree:
			t.Errorf("package %s is both in allowed and free: keep one", p)
		}
	}
}

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

// modulePackages returns the module's packages (go list ./... from the
// module's root), as paths under the module: "ckpt", "internal/agent".
func modulePackages(t *testing.T) []string {
	t.Helper()
	out, err := exec.Command("go", "list", module+"...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	var pkgs []string
	for _, p := range strings.Fields(string(out)) {
		rel, ok := strings.CutPrefix(p, module)
		if !ok {
			t.Fatalf("go list %s... listed %s, outside the module", module, p)
		}
		pkgs = append(pkgs, rel)
	}
	if len(pkgs) < 5 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	return pkgs
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s || strings.HasPrefix(s, x+"/") {
			return true
		}
	}
	return false
}
