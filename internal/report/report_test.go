package report

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/events"
)

// fixture is the events file of a real job (cmd/gorun
// TestEventsFileHostLoss, GORUN_RECORD_EVENTS): two working namespace
// hosts and a spare, host h1 killed mid-run, replaced by the spare h2.
const fixture = "testdata/hostloss.events.jsonl"

func readFixture(t *testing.T) []events.Record {
	t.Helper()
	f, err := os.Open(fixture)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := events.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

func TestBuildHostLoss(t *testing.T) {
	m, err := Build(readFixture(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Hosts) != 3 || m.Hosts[2].Role != events.RoleSpare {
		t.Fatalf("hosts %+v", m.Hosts)
	}
	if len(m.Failures) != 1 || m.Failures[0].Host != 1 || m.Failures[0].Class != "host-loss" || m.Failures[0].Epoch != 1 || !strings.HasSuffix(m.Failures[0].Recovery, " to resume") {
		t.Errorf("failures %+v, want host 1 lost, epoch 1, with its time to resume", m.Failures)
	}
	if len(m.Recovery) != 1 || len(m.Recovery[0].Phases) != 5 || m.Recovery[0].Took <= 0 {
		t.Errorf("recoveries %+v, want one through five phases", m.Recovery)
	}
	if tk := m.Hosts[2].Takeover; tk == nil || tk.Lost != m.Hosts[1].Name || len(tk.Ranks) != 2 {
		t.Errorf("spare's takeover %+v, want host 1's two ranks", tk)
	}
	if h := m.Hosts[1]; len(h.Active) != 1 || h.Active[0].To < m.Failures[0].T || h.Active[0].To >= m.Duration {
		t.Errorf("lost host active %+v", h.Active)
	}
	if len(m.Hosts[2].Idle) != 1 || len(m.Hosts[2].Active) != 1 || m.Hosts[2].Idle[0].To != m.Hosts[2].Active[0].From {
		t.Errorf("spare: idle %+v, then active %+v", m.Hosts[2].Idle, m.Hosts[2].Active)
	}
	if len(m.Series) == 0 || m.Exit == nil || m.Exit.Code != 0 {
		t.Errorf("%d series points, exit %+v", len(m.Series), m.Exit)
	}
}

func TestBuildNoLaunch(t *testing.T) {
	if _, err := Build([]events.Record{{T: 1, Event: events.Fence{Host: "a"}}}); !errors.Is(err, ErrNoLaunch) {
		t.Fatalf("error %v, want ErrNoLaunch", err)
	}
}

func render(t *testing.T, recs []events.Record) string {
	t.Helper()
	m, err := Build(recs)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	if err := Render(&b, m); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// externalRE matches anything that names or fetches another resource.
var externalRE = regexp.MustCompile(`(?i)(https?:|ftp:|file:|data:|//[a-z0-9]|url\(|@import|\bsrc\s*=|\bhref\s*=|<link|<iframe|<object|<embed|<img)`)

// TestRenderSelfContained: the page holds no external URL and no
// reference to another resource, and has one script.
func TestRenderSelfContained(t *testing.T) {
	page := render(t, readFixture(t))
	if m := externalRE.FindAllString(page, -1); len(m) > 0 {
		t.Errorf("the page refers to other resources: %q", m)
	}
	if n := strings.Count(page, "<script"); n != 1 {
		t.Errorf("%d scripts, want 1", n)
	}
	for _, want := range []string{`id="timeline"`, `id="series"`, `data-marker="failure"`, `data-marker="takeover"`, "seconds since the job started", "epoch 1"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
}

// TestRenderEscapes: host names and the program's arguments come from
// users; they reach the page as text.
func TestRenderEscapes(t *testing.T) {
	evil := `<script>alert(1)</script>`
	recs := []events.Record{
		{T: 0, Event: events.Launch{Schema: 1, Job: "j", NP: 1, Hosts: []events.LaunchHost{{Name: evil, Role: events.RoleRunning, Ranks: []int{0}}}, Program: []string{"prog", `"><svg onload=alert(2)>`}}},
		{T: 1, Event: events.Failure{Host: evil, Rank: 0, What: events.FailRankExit, Msg: `</title><script>alert(3)</script>`}},
		{T: 2, Event: events.Exit{Code: 1, Reason: "<b>bad</b>", Duration: 2}},
	}
	page := render(t, recs)
	for _, bad := range []string{"<script>alert", "<svg onload", "<b>bad"} {
		if strings.Contains(page, bad) {
			t.Errorf("the page has %q unescaped", bad)
		}
	}
	if !strings.Contains(page, "&lt;script&gt;alert(1)&lt;/script&gt;") {
		t.Errorf("the host name is not on the page as text")
	}
}

// TestDownsample: a long job's series are at most MaxPoints, its hosts'
// step lines at most MaxHostPoints (half a point per pixel), whatever the
// samples.
func TestDownsample(t *testing.T) {
	recs := []events.Record{{T: 0, Event: events.Launch{Schema: 1, Job: "long", NP: 2, Hosts: []events.LaunchHost{{Name: "a", Role: events.RoleRunning, Ranks: []int{0, 1}}}}}}
	const n = 50_000
	for i := range n {
		recs = append(recs, events.Record{T: float64(i + 1), Event: events.Sample{G: int64(i), Min: []int64{int64(i)}, Max: []int64{int64(i + 1)}, Wait: []float64{float64(i) / 1000}, ReplBytes: []int64{0}, Stages: []int64{int64(2 * i)}}})
	}
	m, err := Build(recs)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Series) != MaxPoints || len(m.Hosts[0].Steps) != MaxHostPoints {
		t.Fatalf("%d series points, %d step points; want %d and %d", len(m.Series), len(m.Hosts[0].Steps), MaxPoints, MaxHostPoints)
	}
	if last := m.Hosts[0].Steps[MaxHostPoints-1]; last.Step != n-1 {
		t.Errorf("last step point %+v, want the last sample's", last)
	}
	// Each sample: one step per rank in a second, a millisecond waited per
	// step.
	for _, p := range m.Series {
		if fmt.Sprintf("%.3f %.4f", p.StepTime, p.Wait) != "1.000 0.0005" {
			t.Fatalf("series point %+v, want 1 s per step and 0.5 ms of wait", p)
		}
	}
	var b bytes.Buffer
	if err := Render(&b, m); err != nil {
		t.Fatal(err)
	}
	if b.Len() > 1<<20 {
		t.Errorf("page of %d bytes for a long job", b.Len())
	}
}

// TestLabels: what the page says of a restart in place (no replaced
// stage: its classified → published phase is not the replaced →
// published one), of a splice onto a host that was not a spare, of
// failures' recoveries (joined by epoch), of one host, and of a long host
// name (cut with an ellipsis in the middle, whole in its tooltip).
func TestLabels(t *testing.T) {
	long := strings.Repeat("h", 40) + "-tail"
	f := func(v float64) *float64 { return &v }
	recs := []events.Record{
		{T: 0, Event: events.Launch{Schema: 1, Job: "j", NP: 2, Hosts: []events.LaunchHost{{Name: long, Role: events.RoleRunning, Ranks: []int{0, 1}}}}},
		{T: 1, Event: events.Failure{Host: long, Rank: 1, What: events.FailHang, Class: "hang", Decision: "restart", Epoch: 1, Msg: "no progress"}},
		{T: 1.5, Event: events.Timeline{Epoch: 1, Cause: "hang", Detected: f(1), Classified: f(1), Published: f(1.25), Restored: f(1.4), Resumed: f(1.5)}},
		{T: 2, Event: events.Failure{Host: long, Rank: 0, What: events.FailRankExit, Class: "rank-exit", Decision: "restart", Epoch: 2, Msg: "exit 1"}},
		{T: 2.5, Event: events.Splice{Epoch: 2, Lost: "x", With: long, Ranks: []int{1}, Spare: false}},
		{T: 3, Event: events.Timeline{Epoch: 2, Cause: "exit", Unfinished: true, Detected: f(2), Classified: f(2)}},
		{T: 3, Event: events.Exit{Code: 1, Duration: 3}},
	}
	m, err := Build(recs)
	if err != nil {
		t.Fatal(err)
	}
	r := m.Recovery[0]
	if len(r.Phases) != 4 || r.Phases[1].Name != "classified → published" || r.Phases[1].Colour != SkipColour || r.Cells[1] != "-" || !strings.Contains(r.Cells[2], "from classified") {
		t.Errorf("restart in place: phases %+v, cells %q: want classified → published in the skip colour, noted in its cell", r.Phases, r.Cells)
	}
	if got := []string{m.Failures[0].Recovery, m.Failures[1].Recovery}; got[0] != "500 ms to resume" || got[1] != "unfinished when the job ended" {
		t.Errorf("failures' recoveries %q", got)
	}
	page := render(t, recs)
	for _, want := range []string{"2 ranks on 1 host, 0 spares", `fill="` + HostTakeoverColour + `" data-marker="takeover"`, strings.Repeat("h", 10) + "…" + strings.Repeat("h", 10) + "-tail<title>" + long + "</title>", "unfinished when the job ended"} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	if strings.Contains(page, `fill="`+TakeoverColour+`" data-marker="takeover"`) || strings.Contains(page, "on 1 hosts") {
		t.Errorf("the page has a spare's takeover marker, or '1 hosts'")
	}
}

// TestCollapse: past CollapseAbove hosts, the hosts nothing happened to
// share one row (their least step), after the lost host and the spare
// that took over, whose rows and markers stay their own; the page of
// 1,000 hosts stays small. At CollapseAbove hosts or fewer every host
// has its row.
func TestCollapse(t *testing.T) {
	build := func(hosts, samples int) *Model {
		t.Helper()
		l := events.Launch{Schema: 1, Job: "big", NP: hosts - 1}
		for h := range hosts {
			role, ranks := events.RoleRunning, []int{h}
			if h == hosts-1 {
				role, ranks = events.RoleSpare, []int{}
			}
			l.Hosts = append(l.Hosts, events.LaunchHost{Name: fmt.Sprintf("node%04d", h), Role: role, Ranks: ranks})
		}
		recs := []events.Record{{T: 0, Event: l}}
		lost, spare := l.Hosts[5].Name, l.Hosts[hosts-1].Name
		for i := range samples {
			t := float64(i + 1)
			s := events.Sample{Min: make([]int64, hosts), Max: make([]int64, hosts), Wait: make([]float64, hosts), ReplBytes: make([]int64, hosts), Stages: make([]int64, hosts)}
			for h := range hosts {
				s.Min[h], s.Max[h], s.Stages[h] = int64(i+h%3), int64(i+3), int64(i)
			}
			s.Min[hosts-1] = -1
			recs = append(recs, events.Record{T: t, Event: s})
			if i == samples/2 {
				recs = append(recs, events.Record{T: t, Event: events.Failure{Host: lost, Rank: -1, What: events.FailHostLost, Class: "host-loss", Decision: "splice", Epoch: 1, Msg: "no heartbeat"}},
					events.Record{T: t, Event: events.Fence{Host: lost}},
					events.Record{T: t, Event: events.Splice{Epoch: 1, Lost: lost, With: spare, Ranks: []int{5}, Spare: true}})
			}
		}
		m, err := Build(recs)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := build(1000, 300)
	if len(m.Hosts) != 3 || m.Hosts[0].Name != "node0005" || m.Hosts[1].Name != "node0999" || m.Hosts[2].Group != 998 {
		t.Fatalf("rows %d: %+v ... want node0005, the spare, then 998 hosts in one", len(m.Hosts), m.Hosts[0])
	}
	if m.Failures[0].Host != 0 || m.Hosts[1].Takeover == nil {
		t.Errorf("failure on row %d, spare's takeover %+v: want row 0 and the spare's", m.Failures[0].Host, m.Hosts[1].Takeover)
	}
	if g := m.Hosts[2].Steps; len(g) != 300 || g[0].Step != 0 || g[len(g)-1].Step != 299 {
		t.Errorf("the group's steps %d points, %+v first: want each sample's least step", len(g), g[:min(len(g), 2)])
	}
	var b bytes.Buffer
	if err := Render(&b, m); err != nil {
		t.Fatal(err)
	}
	if b.Len() > 256<<10 || !strings.Contains(b.String(), "998 other hosts") {
		t.Errorf("page of %d bytes, or without the group's row", b.Len())
	}
	if small := build(CollapseAbove, 10); len(small.Hosts) != CollapseAbove {
		t.Errorf("%d rows for %d hosts, want one each", len(small.Hosts), CollapseAbove)
	}
}

// TestBuildWaitLinksSplice: a failure that waited for a replacement
// (decision wait, no epoch in its record) is linked to the next splice
// whose lost host is its host, as gorun status links it: the report
// shows that splice's epoch and its recovery, not "epoch 0, recovery -".
// Another host's wait, never spliced, stays unlinked.
func TestBuildWaitLinksSplice(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	recs := []events.Record{
		{T: 0, Event: events.Launch{Schema: events.SchemaVersion, Job: "j", NP: 2, Redundancy: "replicas:1", Protect: "full", Recovery: "in-place",
			Hosts: []events.LaunchHost{{Name: "h0", Role: events.RoleRunning, Ranks: []int{0}}, {Name: "h1", Role: events.RoleRunning, Ranks: []int{1}},
				{Name: "s0", Role: events.RoleSpare, Ranks: []int{}}, {Name: "s1", Role: events.RoleSpare, Ranks: []int{}}}}},
		{T: 1, Event: events.Failure{Host: "s1", Rank: -1, What: events.FailHostLost, Class: "host-loss", Decision: "none"}},
		{T: 1.5, Event: events.Failure{Host: "h1", Rank: -1, What: events.FailAgent, Class: "host-loss", Decision: "wait"}},
		{T: 1.6, Event: events.Failure{Host: "h0", Rank: -1, What: events.FailAgent, Class: "host-loss", Decision: "wait"}},
		{T: 3, Event: events.Splice{Epoch: 1, Lost: "h1", With: "s0", Ranks: []int{1}, Spare: true}},
		{T: 4, Event: events.Timeline{Epoch: 1, Cause: "h1 lost", Detected: f(3), Classified: f(3), Replaced: f(3), Published: f(3.5), Restored: f(3.8), Resumed: f(4)}},
		{T: 5, Event: events.Exit{Code: 1, Duration: 5}},
	}
	m, err := Build(recs)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Failures) != 3 {
		t.Fatalf("failures %+v", m.Failures)
	}
	if w := m.Failures[1]; w.Host != 1 || w.Epoch != 1 || w.Recovery != "1.00 s to resume" {
		t.Errorf("h1's wait: epoch %d, recovery %q; want epoch 1, %q", w.Epoch, w.Recovery, "1.00 s to resume")
	}
	if w := m.Failures[2]; w.Epoch != 0 || w.Recovery != "-" {
		t.Errorf("h0's wait, never spliced: epoch %d, recovery %q; want 0, -", w.Epoch, w.Recovery)
	}
}

// TestBuildFailureDetected: a failure is placed and timed at its
// detection (the record's "detected", gorun status's DETECTED), not at
// the record's t (when it was decided on); a record without "detected"
// (an older gorun's) at its t.
func TestBuildFailureDetected(t *testing.T) {
	detected := 1.692
	recs := []events.Record{
		{T: 0, Event: events.Launch{Schema: events.SchemaVersion, Job: "j", NP: 1, Hosts: []events.LaunchHost{{Name: "h0", Role: events.RoleRunning, Ranks: []int{0}}}}},
		{T: 1.741, Event: events.Failure{Host: "h0", Rank: 0, What: events.FailRankExit, Class: "rank-exit", Decision: "abort", Detected: &detected}},
		{T: 2.5, Event: events.Failure{Host: "h0", Rank: 0, What: events.FailRankExit, Class: "rank-exit", Decision: "abort"}},
		{T: 3, Event: events.Exit{Code: 1, Duration: 3}},
	}
	m, err := Build(recs)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.Failures) != 2 || m.Failures[0].T != detected || m.Failures[1].T != 2.5 {
		t.Fatalf("failures %+v; want at %v (detected) and 2.5 (no detected: t)", m.Failures, detected)
	}
}
