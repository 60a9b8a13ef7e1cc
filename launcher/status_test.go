package launcher

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/jobstatus"
)

// TestStatusLive: a running job registers, answers gorun status's query
// through its control plane (hosts, ranks, state), with every rank's row
// when asked, to several clients at once; at its end the entry and the
// registry directory are gone.
func TestStatusLive(t *testing.T) {
	reg := filepath.Join(t.TempDir(), "reg")
	stop := filepath.Join(t.TempDir(), "stop")
	r := startRun(t, 3, `echo ready; while [ ! -e `+stop+` ]; do sleep 0.02; done`, func(c *Config) { c.Registry = reg })
	r.waitLines(regexp.MustCompile(`ready`), 3)
	es, err := jobstatus.List(reg)
	if err != nil || len(es) != 1 {
		t.Fatalf("registry: %v, %v; want one entry", es, err)
	}
	e := es[0]
	if e.PID != os.Getpid() || e.URL == "" || e.Seed == "" || e.Prog != "sh" {
		t.Fatalf("entry %+v", e)
	}
	fi, err := os.Stat(filepath.Join(reg, e.Job+".json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("entry file: %v, %v", fi, err)
	}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			s, err := jobstatus.Query(ctx, e, i%2 == 0)
			if err != nil {
				t.Errorf("query %d: %v", i, err)
				return
			}
			if s.Job != e.Job || s.NP != 3 || s.State != "running" || len(s.Hosts) != 1 || s.Hosts[0].Ranks != "0-2" ||
				s.Hosts[0].State != jobstatus.HostRunning || s.G != -1 || s.Prog != "sh" || s.Recovery != "restart" {
				t.Errorf("query %d: snapshot %+v", i, s)
			}
			if want := 0; i%2 == 0 {
				want = 3
				if len(s.Ranks) != want || s.Ranks[2].Rank != 2 || s.Ranks[2].Host != "localhost" {
					t.Errorf("query %d: ranks %+v", i, s.Ranks)
				}
			} else if len(s.Ranks) != want {
				t.Errorf("query %d: %d rank rows unasked", i, len(s.Ranks))
			}
		})
	}
	wg.Wait()
	if err := os.WriteFile(stop, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	r.wait()
	if r.code != 0 {
		t.Fatalf("exit code %d", r.code)
	}
	if _, err := os.Stat(reg); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the registry directory stays after the job: %v", err)
	}
}

// TestStatusNotRegistered: without Config.Registry the job registers
// nowhere and its control plane does not listen (no remote host).
func TestStatusNotRegistered(t *testing.T) {
	r := startRun(t, 1, `true`, func(c *Config) {
		c.running = func(j *job) {
			if j.status != nil || j.srv.URL() != "" {
				t.Errorf("status service without a registry (url %q)", j.srv.URL())
			}
		}
	})
	r.wait()
}

func writeStop(path string) error { return os.WriteFile(path, nil, 0o600) }
