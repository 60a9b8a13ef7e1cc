package events

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
	"time"
)

func ptr[T any](v T) *T { return &v }

// every has one record of each kind, with every field set.
var every = []Event{
	Launch{Schema: SchemaVersion, Job: "abc", NP: 4, Hosts: []LaunchHost{{Name: "a", Role: RoleRunning, Ranks: []int{0, 1}}, {Name: "b<x>", Role: RoleSpare, Ranks: []int{}}},
		Spares: 1, Redundancy: "replicas:1", Protect: "full", Recovery: "in-place", Program: []string{"train", "--lr", "1e-3"}},
	Rendezvous{Registered: 2, Took: 0.25},
	Sample{Epoch: 1, Gen: 2, G: 7, D: ptr(int64(4)), Min: []int64{7, -1}, Max: []int64{8, -1}, Wait: []float64{0.5, 0}, ReplBytes: []int64{1 << 40, 0}, Stages: []int64{16, 0}},
	Failure{Host: "a", Rank: 1, What: FailRankExit, Exit: ptr(3), Msg: "boom"},
	Failure{Host: "a", Rank: 0, What: FailRankExit, Signal: "SIGKILL"},
	Failure{Host: "a", Rank: -1, What: FailHostLost, Msg: "no heartbeat for 3s", Class: "host-loss", Decision: "splice", Epoch: 2},
	Failure{Host: "a", Rank: 1, What: FailHang, Msg: "no progress", Class: "hang", Decision: "abort"},
	Fence{Host: "a"},
	Splice{Epoch: 1, Lost: "a", With: "b", Ranks: []int{0, 1}, Spare: true},
	Restart{Epoch: 1, Gen: 1, G: -1},
	Publish{Epoch: 1, Gen: 1, G: 7, Restore: 2},
	UnderProtected{Epoch: 1, Owners: []int{2, 3}},
	Protected{},
	Abort{Code: 1, Msg: "no spare"},
	Stage{Name: "detected", Epoch: 1, Cause: "host a lost"},
	Stage{Name: "resumed", Epoch: 1, Cause: "host a lost"},
	Timeline{Epoch: 1, Cause: "host a lost", Detected: ptr(1.5), Classified: ptr(1.5), Published: ptr(1.75), Restored: ptr(2.0), Resumed: ptr(2.25)},
	Timeline{Epoch: 2, Cause: "rank 1 hung", Unfinished: true, Detected: ptr(3.0), Classified: ptr(3.0), Published: ptr(3.5)},
	Exit{Code: 0, Reason: "", Duration: 12.5},
}

func TestRoundTrip(t *testing.T) {
	for i, e := range every {
		t.Run(e.Kind(), func(t *testing.T) {
			var b bytes.Buffer
			w := NewWriter(&b)
			at := time.Duration(i) * 1500 * time.Microsecond
			if err := w.Write(at, e); err != nil {
				t.Fatal(err)
			}
			recs, err := ReadAll(&b)
			if err != nil {
				t.Fatal(err)
			}
			if len(recs) != 1 || recs[0].T != Seconds(at) || !reflect.DeepEqual(recs[0].Event, e) {
				t.Fatalf("read back %+v, want t=%v %+v", recs, Seconds(at), e)
			}
		})
	}
}

func TestReaderErrors(t *testing.T) {
	for _, c := range []struct {
		name, in string
		line     int
		want     string
	}{
		{"not json", "{\"t\":0,\"event\":\"fence\"}\nhello\n", 2, "not a JSON object"},
		{"array", "[1]\n", 1, "not a JSON object"},
		{"cut short mid-file", "{\"t\":0,\"event\":\"fence\"\n{\"t\":1,\"event\":\"fence\"}\n", 1, "not a JSON object"},
		{"no t", `{"event":"fence"}` + "\n", 1, `no "t"`},
		{"t string", `{"t":"1","event":"fence"}` + "\n", 1, `"t" is not a number`},
		{"t negative", `{"t":-1,"event":"fence"}` + "\n", 1, `"t" is -1`},
		{"no event", `{"t":1}` + "\n", 1, `no "event"`},
		{"event empty", `{"t":1,"event":""}` + "\n", 1, `"event" is not`},
		{"event number", `{"t":1,"event":3}` + "\n", 1, `"event" is not`},
		{"field type", "\n\n{\"t\":1,\"event\":\"splice\",\"ranks\":\"x\"}\n", 3, `splice: field "ranks" is string`},
		{"stage field type", `{"t":1,"event":"resumed","epoch":-1}` + "\n", 1, `resumed: field "epoch"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := ReadAll(strings.NewReader(c.in))
			var le *LineError
			if !errors.As(err, &le) || le.Line != c.line || !strings.Contains(err.Error(), c.want) || !errors.Is(err, ErrSyntax) || errors.Is(err, ErrTruncated) {
				t.Fatalf("error %v, want line %d saying %q (not ErrTruncated)", err, c.line, c.want)
			}
		})
	}
}

func TestReaderTolerant(t *testing.T) {
	in := `{"t":0,"event":"launch","schema":2,"job":"j","np":1,"hosts":[],"future":{"x":1}}` + "\n" +
		"\n" +
		`{"t":0.5,"event":"teleport","where":"mars"}` + "\n" +
		`{"t":1,"event":"exit","code":0,"reason":"","duration":1,"extra":true}` // no final newline
	recs, err := ReadAll(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 {
		t.Fatalf("%d records, want 3: %+v", len(recs), recs)
	}
	if l, ok := recs[0].Event.(Launch); !ok || l.Schema != 2 || l.Job != "j" {
		t.Errorf("launch read as %+v", recs[0].Event)
	}
	if u, ok := recs[1].Event.(Unknown); !ok || u.Name != "teleport" {
		t.Errorf("unknown kind read as %+v", recs[1].Event)
	}
	if x, ok := recs[2].Event.(Exit); !ok || x.Duration != 1 {
		t.Errorf("exit read as %+v", recs[2].Event)
	}
}

func TestReaderLongLine(t *testing.T) {
	in := `{"t":0,"event":"x","pad":"` + strings.Repeat("a", MaxLine) + `"}`
	_, err := ReadAll(strings.NewReader(in))
	var le *LineError
	if !errors.As(err, &le) || le.Line != 1 {
		t.Fatalf("error %v, want line 1 too long", err)
	}
}

func TestReaderReadError(t *testing.T) {
	_, err := ReadAll(io.MultiReader(strings.NewReader("{\"t\":0,\"event\":\"protected\"}\n"), errReader{}))
	if !errors.Is(err, errBroken) || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("error %v, want the read error at line 2", err)
	}
}

var errBroken = errors.New("broken disk")

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, errBroken }

// FuzzDecode: no input panics, and whatever decodes is written back and
// decodes to the same record.
func FuzzDecode(f *testing.F) {
	for _, e := range every {
		line, _ := Marshal(1.25, e)
		f.Add(line)
	}
	f.Add([]byte(`{"t":1,"event":"teleport"}`))
	f.Add([]byte(`{"t":1e400,"event":"fence"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		rec, err := Decode(1, b)
		if err != nil {
			var le *LineError
			if !errors.As(err, &le) {
				t.Fatalf("error %v is not a *LineError", err)
			}
			return
		}
		line, err := Marshal(rec.T, rec.Event)
		if err != nil {
			t.Fatalf("Marshal(%+v): %v", rec, err)
		}
		again, err := Decode(1, line)
		if err != nil {
			t.Fatalf("re-decoding %q: %v", line, err)
		}
		if again.T != rec.T || again.Event.Kind() != rec.Event.Kind() {
			t.Fatalf("%q read back as %+v, want %+v", line, again, rec)
		}
	})
}

// TestReaderTruncatedLastLine: a last line with no newline that does not
// decode (a file being written, or cut short by a full disk) is
// ErrTruncated, naming its line, and ReadAll returns every record before
// it; a whole last line without a newline still reads.
func TestReaderTruncatedLastLine(t *testing.T) {
	whole := "{\"t\":0,\"event\":\"fence\",\"host\":\"a\"}\n{\"t\":1,\"event\":\"fence\",\"host\":\"b\"}\n"
	for _, c := range []struct {
		name, in string
		recs     int
		trunc    bool
	}{
		{"cut mid-line", whole + `{"t":2,"event":"sam`, 2, true},
		{"cut mid-field", whole + `{"t":2,"event":"splice","ranks":[1,`, 2, true},
		{"whole, no newline", whole + `{"t":2,"event":"fence","host":"c"}`, 3, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			recs, err := ReadAll(strings.NewReader(c.in))
			if len(recs) != c.recs {
				t.Errorf("%d records, want %d", len(recs), c.recs)
			}
			if !c.trunc {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			le, ok := errors.AsType[*LineError](err)
			if !errors.Is(err, ErrTruncated) || !ok || le.Line != 3 {
				t.Fatalf("error %v, want ErrTruncated at line 3", err)
			}
		})
	}
}

// TestCheckSchema: a file of a newer schema, or with none, is refused.
func TestCheckSchema(t *testing.T) {
	for _, c := range []struct {
		name string
		recs []Record
		ok   bool
	}{
		{"current", []Record{{Event: Launch{Schema: SchemaVersion}}}, true},
		{"newer", []Record{{Event: Launch{Schema: SchemaVersion + 6}}}, false},
		{"missing", []Record{{Event: Launch{}}}, false},
		{"no launch first", []Record{{Event: Fence{Host: "a"}}, {Event: Launch{Schema: SchemaVersion}}}, false},
		{"empty", nil, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := CheckSchema(c.recs)
			if c.ok != (err == nil) || err != nil && !errors.Is(err, ErrSchema) {
				t.Fatalf("CheckSchema: %v, want ok %v", err, c.ok)
			}
		})
	}
}
