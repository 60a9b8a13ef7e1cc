package main

import (
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/events"
)

// TestHotSwapEC loses two of four hosts at once under --redundancy ec:2+2
// (one group: two data hosts, two parity hosts; two spares), while the
// survivors compute, in both recovery modes: both data hosts (the lost
// ranks have no clear copy left: every one of them is decoded from the
// parity rows and the surviving members), and a data host with a parity
// host (decode from the other parity row). The job must end as a run
// without failure: exit 0, the same final hashes, both spares spliced in.
func TestHotSwapEC(t *testing.T) {
	c := newHSCluster(t, 4, 2)
	ec := []string{"--redundancy", "ec:2+2"}
	g, asg := c.ecGroup(t, 2)
	// The ranks of a lost data host have no clear copy left, nor have
	// the ranks whose clear copy it held: they are decoded.
	decoded := func(lost []int) []int {
		var rs []int
		for x, dg := range g.DataGroups {
			if !slices.Contains(lost, g.Data[x]) {
				continue
			}
			for _, r := range dg {
				if slices.Contains(lost, asg[r].Host) {
					rs = append(rs, r)
				}
			}
		}
		return rs
	}
	// The failure-free run's hashes, which the protection does not change.
	wantP, wantO := hsReference(t, c)
	for _, mode := range []string{"restart", "in-place"} {
		for _, tc := range []struct {
			name string
			lost []int
		}{
			{"data+data", []int{g.Data[0], g.Data[1]}},
			{"data+parity", []int{g.Data[0], g.Parity[0]}},
		} {
			t.Run(mode+"/"+tc.name, func(t *testing.T) {
				r := c.start(t, append([]string{"--recovery", mode}, ec...), "--protect")
				r.waitStep(t, 8)
				for _, h := range tc.lost {
					if err := c.hosts.KillAll(h); err != nil {
						t.Fatal(err)
					}
				}
				res := r.finish(t, 0)
				defer func() {
					if t.Failed() {
						t.Logf("stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
					}
				}()
				checkHashes(t, res, wantP, wantO)
				evs := readEvents(t, r.events)
				var with []string
				for _, s := range ofKind[events.Splice](evs) {
					with = append(with, s.With)
				}
				slices.Sort(with)
				if want := c.hosts.Names[c.work:]; !slices.Equal(with, want) {
					t.Errorf("spliced in %v, want both spares %v", with, want)
				}
				// -v logs the machine's restore plans. The ranks of the
				// data host lost first have no copy but their own slot:
				// some plan decodes. Whether the others do depends on
				// whether the second loss is seen before the first's
				// copies are re-sent; no plan decodes a rank that keeps
				// a clear copy whatever the timing.
				decodes := regexp.MustCompile(` r(\d+)<-decode,`)
				n := 0
				for _, l := range strings.Split(res.stderr, "\n") {
					if !strings.Contains(l, "hot-swap") || !strings.Contains(l, "restore epoch=") {
						continue
					}
					for _, m := range decodes.FindAllStringSubmatch(l, -1) {
						n++
						if x, _ := strconv.Atoi(m[1]); !slices.Contains(decoded(tc.lost), x) {
							t.Errorf("rank %d decoded, but its clear copy survives (ranks without one: %v): %s", x, decoded(tc.lost), l)
						}
					}
				}
				if n == 0 {
					t.Errorf("no restore plan decodes (ranks without a clear copy: %v)", decoded(tc.lost))
				}
				if mode == "in-place" && len(ofKind[events.Restart](evs)) > 0 {
					t.Errorf("in-place recovery restarted the ranks: %+v", ofKind[events.Restart](evs))
				}
			})
		}
	}
}

// TestHotSwapECDiff is TestHotSwapEC in diff mode: --protect-mode diff
// --redundancy ec:2+2 --base-every 8 (dptrain with --device-grad, the
// replay optimizer), two of four hosts lost at once while the survivors
// compute, in both recovery modes. Only the bases are coded: a lost rank
// without a clear copy is decoded at H, the newest base every rank has,
// and replays its differentials (H, G] from a log holder. Both data hosts
// (decode + replay), and a data with a parity host (mixed): the job must
// end as a run without failure, exit 0 with the same final hashes.
func TestHotSwapECDiff(t *testing.T) {
	c := newHSCluster(t, 4, 2)
	flags := []string{"--redundancy", "ec:2+2", "--protect-mode", "diff", "--base-every", "8"}
	extra := []string{"--device-grad"}
	g, _ := c.ecGroup(t, 2)
	wantP, wantO := hsReference(t, c, extra...)
	for _, mode := range []string{"restart", "in-place"} {
		for _, tc := range []struct {
			name string
			lost []int
		}{
			{"data+data", []int{g.Data[0], g.Data[1]}},
			{"data+parity", []int{g.Data[0], g.Parity[0]}},
		} {
			t.Run(mode+"/"+tc.name, func(t *testing.T) {
				r := c.start(t, append([]string{"--recovery", mode}, flags...), append([]string{"--protect"}, extra...)...)
				// Past the second base (H >= 8 once coded): the decode
				// has differentials to replay.
				r.waitStep(t, 20)
				for _, h := range tc.lost {
					if err := c.hosts.KillAll(h); err != nil {
						t.Fatal(err)
					}
				}
				res := r.finish(t, 0)
				defer func() {
					if t.Failed() {
						t.Logf("stdout:\n%s\nstderr:\n%s", res.stdout, res.stderr)
					}
				}()
				checkHashes(t, res, wantP, wantO)
				evs := readEvents(t, r.events)
				var with []string
				for _, s := range ofKind[events.Splice](evs) {
					with = append(with, s.With)
				}
				slices.Sort(with)
				if want := c.hosts.Names[c.work:]; !slices.Equal(with, want) {
					t.Errorf("spliced in %v, want both spares %v", with, want)
				}
				// The ranks of the data host lost first keep no clear copy
				// but their own slot, lost with it: some plan decodes.
				if !regexp.MustCompile(` r\d+<-decode,`).MatchString(res.stderr) {
					t.Errorf("no restore plan decodes")
				}
				if !strings.Contains(res.stderr, "H = ") {
					t.Errorf("-v does not show H beside G")
				}
				if mode == "in-place" && len(ofKind[events.Restart](evs)) > 0 {
					t.Errorf("in-place recovery restarted the ranks: %+v", ofKind[events.Restart](evs))
				}
			})
		}
	}
}
