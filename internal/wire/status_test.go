package wire

import (
	"errors"
	"strings"
	"testing"
)

func TestStatusReplyAllowed(t *testing.T) {
	s := JobSubjects("job1")
	for _, tt := range []struct {
		reply string
		ok    bool
	}{
		{"gorun.job1.statusinbox.abc.1", true},
		{"gorun.job1.statusinbox.x", true},
		{"gorun.job1.statusinbox.", false},
		{"gorun.job1.statusinbox", false},
		{"gorun.job1.control", false},
		{"gorun.job1.inbox.0.x", false},
		{"gorun.job2.statusinbox.x", false},
		{"gorun.job1.statusinbox.>", false},
		{"gorun.job1.statusinbox.*", false},
		{"_INBOX.x", false},
		{"", false},
		{"gorun.job1.statusinbox." + strings.Repeat("x", MaxStringLen), false},
	} {
		if got := s.StatusReplyAllowed(tt.reply); got != tt.ok {
			t.Errorf("StatusReplyAllowed(%.60q) = %v, want %v", tt.reply, got, tt.ok)
		}
	}
	pub, sub := s.StatusPermissions()
	if len(pub) != 1 || pub[0] != s.Status() || len(sub) != 1 || sub[0] != s.StatusInbox()+".>" {
		t.Errorf("StatusPermissions = %v, %v", pub, sub)
	}
}

func TestDecodeStatusRequest(t *testing.T) {
	for _, tt := range []struct {
		in    string
		ranks bool
		bad   bool
	}{
		{"", false, false}, {"{}", false, false}, {`{"ranks":true}`, true, false},
		{`{"ranks":1}`, false, true}, {`{"other":1}`, false, true}, {"[]", false, true}, {"{} {}", false, true},
		{"{" + strings.Repeat(" ", MaxStringLen) + "}", false, true},
	} {
		r, err := DecodeStatusRequest([]byte(tt.in))
		if tt.bad {
			if !errors.Is(err, ErrMalformed) {
				t.Errorf("DecodeStatusRequest(%.30q) = %v, %v; want ErrMalformed", tt.in, r, err)
			}
			continue
		}
		if err != nil || r.Ranks != tt.ranks {
			t.Errorf("DecodeStatusRequest(%.30q) = %v, %v", tt.in, r, err)
		}
	}
}

func FuzzDecodeStatusRequest(f *testing.F) {
	for _, s := range []string{"", "{}", `{"ranks":true}`, `{"ranks":false}`, `{"RANKS":true}`, "null", `{"ranks":true,"ranks":false}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := DecodeStatusRequest(b)
		if err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("error %v does not wrap ErrMalformed", err)
		}
		if err == nil && r == nil {
			t.Fatal("nil request without error")
		}
	})
}
