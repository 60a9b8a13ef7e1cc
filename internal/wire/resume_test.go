package wire_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/gorun/gorun/internal/wire"
)

func validResumeReach() wire.ResumeReach {
	return wire.ResumeReach{Host: 2, Base: 10, Ranks: []wire.ResumeRank{
		{Rank: 4, To: 26},
		{Rank: 5, To: 10, Stop: "durable: gap in the differential log: rank 5: no batch holds step 11"},
		{Rank: 6, To: -1, Err: "no complete version of step 10"},
	}}
}

func TestDecodeResumeReachRoundTrip(t *testing.T) {
	for _, r := range []wire.ResumeReach{validResumeReach(), {Host: 0, Base: 0, Err: "cannot read /ckpt: permission denied"}, {Host: 1, Base: 3}} {
		got, err := wire.DecodeResumeReach(wire.Marshal(&r))
		if err != nil {
			t.Fatalf("%+v: %v", r, err)
		}
		if !reflect.DeepEqual(*got, r) && !(len(r.Ranks) == 0 && len(got.Ranks) == 0) {
			t.Errorf("got %+v, want %+v", *got, r)
		}
	}
}

func TestDecodeResumeReachRejects(t *testing.T) {
	long := strings.Repeat("x", wire.MaxResumeMsg+1)
	for _, tc := range []struct {
		name string
		edit func(r *wire.ResumeReach)
	}{
		{"host negative", func(r *wire.ResumeReach) { r.Host = -1 }},
		{"host too large", func(r *wire.ResumeReach) { r.Host = wire.MaxHosts }},
		{"base negative", func(r *wire.ResumeReach) { r.Base = -1 }},
		{"base past 2^53", func(r *wire.ResumeReach) { r.Base = wire.MaxStep + 1 }},
		{"reach before base", func(r *wire.ResumeReach) { r.Ranks[0].To = 9 }},
		{"reach past 2^53", func(r *wire.ResumeReach) { r.Ranks[0].To = wire.MaxStep + 1 }},
		{"rank twice", func(r *wire.ResumeReach) { r.Ranks[1].Rank = 4 }},
		{"rank negative", func(r *wire.ResumeReach) { r.Ranks[1].Rank = -1 }},
		{"rank too large", func(r *wire.ResumeReach) { r.Ranks[1].Rank = wire.MaxWorld }},
		{"long stop", func(r *wire.ResumeReach) { r.Ranks[1].Stop = long }},
		{"long rank error", func(r *wire.ResumeReach) { r.Ranks[2].Err = long }},
		{"long error", func(r *wire.ResumeReach) { r.Ranks, r.Err = nil, long }},
		{"error and ranks", func(r *wire.ResumeReach) { r.Err = "x" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := validResumeReach()
			tc.edit(&r)
			if _, err := wire.DecodeResumeReach(wire.Marshal(&r)); !errors.Is(err, wire.ErrMalformed) {
				t.Errorf("%+v: %v, want ErrMalformed", r, err)
			}
		})
	}
	for _, b := range []string{``, `{}x`, `{"host":0,"base":0,"extra":1}`, `[]`} {
		if _, err := wire.DecodeResumeReach([]byte(b)); !errors.Is(err, wire.ErrMalformed) {
			t.Errorf("%q: %v, want ErrMalformed", b, err)
		}
	}
}

func FuzzDecodeResumeReach(f *testing.F) {
	r := validResumeReach()
	fuzzJSON(f, wire.DecodeResumeReach, func(t *testing.T, r *wire.ResumeReach) {
		if r.Host < 0 || r.Host >= wire.MaxHosts || r.Base < 0 || r.Base > wire.MaxStep {
			t.Fatalf("accepted invalid %+v", r)
		}
		for _, k := range r.Ranks {
			if k.Err == "" && (k.To < r.Base || k.To > wire.MaxStep) {
				t.Fatalf("accepted invalid %+v", k)
			}
		}
	},
		wire.Marshal(&r),
		[]byte(`{"host":0,"base":0,"ranks":[{"r":0,"to":0}]}`),
		[]byte(`{"host":0,"base":5,"err":"x"}`),
	)
}
