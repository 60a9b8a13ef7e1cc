package wire_test

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/gorun/gorun/internal/wire"
)

// rejectCase is one input a decoder must refuse with an error wrapping
// wire.ErrMalformed.
type rejectCase struct {
	name string
	in   []byte
}

// testRejects runs decode on every case and checks that it fails with an
// error wrapping wire.ErrMalformed and returns no value.
func testRejects[T any](t *testing.T, decode func([]byte) (*T, error), cases []rejectCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v, err := decode(tc.in)
			if err == nil {
				t.Fatalf("decode(%s) = %+v, want error", short(tc.in), v)
			}
			if !errors.Is(err, wire.ErrMalformed) {
				t.Fatalf("decode(%s) error %q does not wrap ErrMalformed", short(tc.in), err)
			}
			if v != nil {
				t.Errorf("decode(%s) returned %+v with its error", short(tc.in), v)
			}
		})
	}
}

// roundTrip marshals v, decodes it with decode and checks the result equals v.
func roundTrip[T any](t *testing.T, v *T, decode func([]byte) (*T, error)) {
	t.Helper()
	b := wire.Marshal(v)
	got, err := decode(b)
	if err != nil {
		t.Fatalf("decode(%s): %v", short(b), err)
	}
	if !reflect.DeepEqual(got, v) {
		t.Fatalf("round trip of %s:\n got %+v\nwant %+v", short(b), got, v)
	}
}

// short renders b for a failure message, cut to a readable length.
func short(b []byte) string {
	const max = 200
	if len(b) > max {
		return fmt.Sprintf("%q… (%d bytes)", b[:max], len(b))
	}
	return fmt.Sprintf("%q", b)
}

// mutate returns a copy of base changed by f; base is not modified as long as
// f replaces (rather than writes through) reference fields.
func mutate[T any](base T, f func(*T)) *T {
	v := base
	f(&v)
	return &v
}
