package wire_test

import (
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/wire"
)

var (
	validJobIDs = []string{
		"a", "0", "job-1", "7f3a9c", "train-llama-70b-2024-06-01",
		strings.Repeat("a", 64), strings.Repeat("9", 64),
	}
	invalidJobIDs = []string{
		"", "-", "-job", "Job", "JOB-1", "a.b", "job.>", ">", "*", "job-*", "a b", " a", "a\n",
		"a_b", "a/b", "a\x00", "é", "\xff", "job\t",
		strings.Repeat("a", 65),
	}
)

func TestValidJobID(t *testing.T) {
	for _, id := range validJobIDs {
		if !wire.ValidJobID(id) {
			t.Errorf("ValidJobID(%q) = false, want true", id)
		}
	}
	for _, id := range invalidJobIDs {
		if wire.ValidJobID(id) {
			t.Errorf("ValidJobID(%q) = true, want false", id)
		}
	}
}

func TestJobSubjects(t *testing.T) {
	for _, id := range validJobIDs {
		s := wire.JobSubjects(id)
		h := s.ForHost(7)
		prefix := "gorun." + id + "."
		all := map[string]string{
			"Register": h.Register, "Epoch": h.Epoch, "EpochGet": h.EpochGet,
			"Control": h.Control, "Events": h.Events, "Output": h.Output,
			"Heartbeat": h.Heartbeat, "UpFence": h.UpFence, "Fence": h.Fence,
			"Progress": h.Progress, "G": h.G, "Inbox": h.Inbox, "StdinTo": h.StdinTo(7),
		}
		seen := map[string]string{}
		for name, subj := range all {
			if !strings.HasPrefix(subj, prefix) {
				t.Errorf("JobSubjects(%q).ForHost(7).%s = %q, want prefix %q", id, name, subj, prefix)
			}
			if other, dup := seen[subj]; dup {
				t.Errorf("JobSubjects(%q): %s and %s are both %q", id, name, other, subj)
			}
			seen[subj] = name
			if strings.ContainsAny(subj, "*> \t") {
				t.Errorf("JobSubjects(%q).ForHost(7).%s = %q has a wildcard or space", id, name, subj)
			}
		}
		if !strings.HasSuffix(s.Up, ".>") {
			t.Errorf("Up = %q, want a trailing .> wildcard", s.Up)
		}
		// Agent-to-launcher traffic is under Up, launcher-to-agent is not;
		// the host's up subjects parse back to it.
		for kind, subj := range map[string]string{wire.UpKindEvents: h.Events, wire.UpKindOutput: h.Output,
			wire.UpKindHeartbeat: h.Heartbeat, wire.UpKindFence: h.UpFence, wire.UpKindProgress: h.Progress} {
			if !matches(s.Up, subj) {
				t.Errorf("%q is not under %q", subj, s.Up)
			}
			if host, k, ok := s.ParseUp(subj); !ok || host != 7 || k != kind {
				t.Errorf("ParseUp(%q) = %d, %q, %v", subj, host, k, ok)
			}
		}
		for _, subj := range []string{h.Register, h.Epoch, h.EpochGet, h.Control, h.Fence, h.G, h.StdinTo(7), h.Inbox} {
			if matches(s.Up, subj) {
				t.Errorf("%q is under %q", subj, s.Up)
			}
		}
		// The launcher's request subscriptions match every host's requests.
		for _, x := range []struct{ all, one, kind string }{{s.Register, h.Register, wire.ReqKindRegister}, {s.EpochGet, h.EpochGet, wire.ReqKindEpochGet}} {
			if !matches(x.all, x.one) {
				t.Errorf("%q does not match %q", x.all, x.one)
			}
			if host, k, ok := s.ParseRequest(x.one); !ok || host != 7 || k != x.kind {
				t.Errorf("ParseRequest(%q) = %d, %q, %v", x.one, host, k, ok)
			}
		}
	}
	// Subjects of different jobs never overlap, even when one id is a
	// prefix of the other.
	a, b := wire.JobSubjects("job"), wire.JobSubjects("job-2")
	if matches(a.Up, b.ForHost(0).Events) {
		t.Errorf("%q of job-2 is under %q of job", b.ForHost(0).Events, a.Up)
	}
}

func TestParseUpRefusesNonCanonical(t *testing.T) {
	s := wire.JobSubjects("job")
	for _, subj := range []string{
		"gorun.job.up.03.hb", "gorun.job.up.+3.hb", "gorun.job.up.-1.hb", "gorun.job.up.x.hb",
		"gorun.job.up.3", "gorun.job.up.3.", "gorun.job.up.3.hb.x", "gorun.job.up..hb",
		"gorun.job.up.99999999999999999999.hb", "gorun.other.up.3.hb", "gorun.job.req.3.hb",
	} {
		if h, k, ok := s.ParseUp(subj); ok {
			t.Errorf("ParseUp(%q) = %d, %q, true", subj, h, k)
		}
	}
}

// TestHostPermissions: a host may publish on its own agent-to-launcher
// subjects and on nothing another host or the launcher publishes on, and
// may subscribe to what agents receive but not to another host's.
func TestHostPermissions(t *testing.T) {
	s := wire.JobSubjects("job")
	pub, sub := s.HostPermissions(3)
	me, other := s.ForHost(3), s.ForHost(4)
	allowed := func(perms []string, subj string) bool {
		for _, p := range perms {
			if matches(p, subj) {
				return true
			}
		}
		return false
	}
	for _, subj := range []string{me.Events, me.Output, me.OutputDone, me.Heartbeat, me.UpFence, me.Progress, me.Register, me.EpochGet} {
		if !allowed(pub, subj) {
			t.Errorf("host 3 may not publish on its own %q", subj)
		}
	}
	for _, subj := range []string{s.Control, s.Epoch, s.Fence, s.G, s.StdinTo(3), s.StdinTo(4), s.OutputAck(3), s.OutputAck(4), me.Inbox + ".x",
		other.Events, other.Output, other.OutputDone, other.Heartbeat, other.UpFence, other.Progress, other.Register, other.EpochGet, other.Inbox + ".x"} {
		if allowed(pub, subj) {
			t.Errorf("host 3 may publish on %q", subj)
		}
	}
	for _, subj := range []string{s.Control, s.Epoch, s.Fence, s.G, s.StdinTo(3), s.OutputAck(3), me.Inbox + ".a.b"} {
		if !allowed(sub, subj) {
			t.Errorf("host 3 may not subscribe to %q", subj)
		}
	}
	for _, subj := range []string{s.StdinTo(4), s.OutputAck(4), other.Inbox + ".a.b", me.Heartbeat, other.Heartbeat, "gorun.job.req.4.register"} {
		if allowed(sub, subj) {
			t.Errorf("host 3 may subscribe to %q", subj)
		}
	}
}

// matches reports whether the NATS subject pattern p matches subject s.
func matches(p, s string) bool {
	pt, st := strings.Split(p, "."), strings.Split(s, ".")
	for i, tok := range pt {
		if tok == ">" {
			return len(st) > i
		}
		if i >= len(st) || tok != "*" && tok != st[i] {
			return false
		}
	}
	return len(pt) == len(st)
}

func TestJobSubjectsPanicsOnInvalidID(t *testing.T) {
	for _, id := range invalidJobIDs {
		t.Run("", func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Errorf("JobSubjects(%q) did not panic", id)
				}
			}()
			wire.JobSubjects(id)
		})
	}
}

func TestReplyAllowed(t *testing.T) {
	s := wire.JobSubjects("job1")
	h1 := s.ForHost(1)
	for _, tc := range []struct {
		subject, reply string
		want           bool
	}{
		{h1.Register, h1.Inbox + ".abc.1", true},
		{h1.EpochGet, h1.Inbox + ".x", true},
		{h1.Register, s.ForHost(0).Inbox + ".abc", false}, // another host's inbox
		{h1.Register, s.ForHost(10).Inbox + ".abc", false},
		{h1.Register, h1.Inbox, false},                        // the inbox itself, not under it
		{h1.Register, s.StdinTo(0), false},                    // another host's stdin
		{h1.Register, s.Epoch, false},                         // a broadcast
		{h1.Register, "_INBOX.abc", false},                    // outside the job
		{h1.Events, h1.Inbox + ".abc", false},                 // not a request subject
		{"gorun.job2.req.1.register", h1.Inbox + ".a", false}, // another job
	} {
		if got := s.ReplyAllowed(tc.subject, tc.reply); got != tc.want {
			t.Errorf("ReplyAllowed(%q, %q) = %v, want %v", tc.subject, tc.reply, got, tc.want)
		}
	}
}
