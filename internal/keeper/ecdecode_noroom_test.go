package keeper

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
)

// TestECDecodeNoRoom: a decode left with fewer than K sources fails with
// errNoRoom, not ErrUnrecoverable, only when the sources dropped for want
// of room (a host's reserve refused the answer) would make K again with
// those still usable: a retry once there is room may decode
// (retryNoRoom). When they would not (other sources failed or are gone)
// it fails with ErrUnrecoverable, which does not match errNoRoom, so that
// it is not retried in vain. (A review found any source dropped for room
// made the failure errNoRoom.)
func TestECDecodeNoRoom(t *testing.T) {
	const k, m = 4, 3
	st := newECStripe(t, k, m, unequalSizes)
	p0, p2 := k, k+2
	errRefused := fmt.Errorf("refused by the holder: %w", errNoRoom)
	for _, c := range []struct {
		name         string
		gone, noRoom []int
		fail         []int
		want         error // nil: decoded
	}{
		{"two without room, K left", nil, []int{1, p0}, nil, nil},
		{"three without room, K with room", nil, []int{1, 2, p0}, nil, errNoRoom},
		{"one without room, two fail, K with room", nil, []int{1}, []int{2, 3}, errNoRoom},
		{"one without room, two fail, one gone", []int{p2}, []int{1}, []int{2, p0}, ErrUnrecoverable},
		{"none without room, three fail", nil, nil, []int{1, 2, p0}, ErrUnrecoverable},
	} {
		t.Run(c.name, func(t *testing.T) {
			var active atomic.Int32
			srcs, _ := st.sources(append([]int{0}, c.gone...), &active, func(i int, s *memSource) {
				for _, f := range c.fail {
					if f == i {
						s.failAt = 1
					}
				}
			})
			for _, i := range c.noRoom {
				srcs[i] = shardSourceFunc(func(context.Context, int64, []byte) error { return errRefused })
			}
			views, err := st.decode(t, context.Background(), 0, srcs, &active, 1000)
			switch c.want {
			case nil:
				if err != nil {
					t.Fatal(err)
				}
				if err := st.same(0, views); err != nil {
					t.Fatal(err)
				}
			case errNoRoom:
				if !errors.Is(err, errNoRoom) || errors.Is(err, ErrUnrecoverable) {
					t.Fatalf("got %v, want errNoRoom, not ErrUnrecoverable", err)
				}
			default:
				if !errors.Is(err, ErrUnrecoverable) || errors.Is(err, errNoRoom) {
					t.Fatalf("got %v, want ErrUnrecoverable, not errNoRoom", err)
				}
				if len(c.fail) > 0 && !errors.Is(err, errTestSource) {
					t.Fatalf("got %v, want the failed sources' errors in it", err)
				}
			}
		})
	}
}
