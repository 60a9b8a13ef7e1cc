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
		prefix := "gorun." + id + "."
		all := map[string]string{
			"Register": s.Register, "Epoch": s.Epoch, "EpochGet": s.EpochGet,
			"Control": s.Control, "Up": s.Up, "Events": s.Events,
			"Output": s.Output, "Heartbeat": s.Heartbeat,
		}
		seen := map[string]string{}
		for name, subj := range all {
			if !strings.HasPrefix(subj, prefix) {
				t.Errorf("JobSubjects(%q).%s = %q, want prefix %q", id, name, subj, prefix)
			}
			if other, dup := seen[subj]; dup {
				t.Errorf("JobSubjects(%q): %s and %s are both %q", id, name, other, subj)
			}
			seen[subj] = name
			if name != "Up" && strings.ContainsAny(subj, "*> \t") {
				t.Errorf("JobSubjects(%q).%s = %q has a wildcard or space", id, name, subj)
			}
		}
		if !strings.HasSuffix(s.Up, ".>") {
			t.Errorf("Up = %q, want a trailing .> wildcard", s.Up)
		}
		// Agent-to-launcher traffic is under Up, launcher-to-agent is not.
		up := strings.TrimSuffix(s.Up, ">")
		for _, subj := range []string{s.Events, s.Output, s.Heartbeat} {
			if !strings.HasPrefix(subj, up) {
				t.Errorf("%q is not under %q", subj, s.Up)
			}
		}
		for _, subj := range []string{s.Register, s.Epoch, s.EpochGet, s.Control} {
			if strings.HasPrefix(subj, up) {
				t.Errorf("%q is under %q", subj, s.Up)
			}
		}
	}
	// Subjects of different jobs never overlap, even when one id is a
	// prefix of the other.
	a, b := wire.JobSubjects("job"), wire.JobSubjects("job-2")
	if strings.HasPrefix(b.Events, strings.TrimSuffix(a.Up, ">")) {
		t.Errorf("%q of job-2 is under %q of job", b.Events, a.Up)
	}
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
