//go:build !linux || !cgo

package gpu

import (
	"errors"
	"strings"
	"testing"
)

// TestOpenWithoutCgo: a cgo-free build runs CPU-only (ErrNoDriver), and
// asking it for the fake backend is an error of its own.
func TestOpenWithoutCgo(t *testing.T) {
	t.Setenv("GORUN_FAKE_GPUS", "")
	b, err := Open(t.Context(), Options{})
	if !errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "without cgo") {
		t.Fatalf("Open = %v, %v; want ErrNoDriver saying why", b, err)
	}
	for _, opt := range []Options{{Fake: "testdata/example.json"}, {}} {
		if opt.Fake == "" {
			t.Setenv("GORUN_FAKE_GPUS", "testdata/example.json")
		}
		b, err := Open(t.Context(), opt)
		if err == nil || errors.Is(err, ErrNoDriver) || !strings.Contains(err.Error(), "testdata/example.json") || !strings.Contains(err.Error(), "needs a cgo build") {
			t.Fatalf("Open(%+v) = %v, %v; want an error saying the fake needs cgo", opt, b, err)
		}
	}
}
