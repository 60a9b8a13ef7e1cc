package keeper

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"
)

// TestLinkTurnCancel: a request waiting for its turn on a link gives up
// when its context ends, while the request ahead of it is stuck (it used
// to wait on the link's mutex until that request ended), and the link
// serves the next request once the stuck one is done.
func TestLinkTurnCancel(t *testing.T) {
	c := newClusterWith(t, [][]int{{0}, {1}}, [][]int{{1}, {0}}, nil, nil)
	p := c.hosts[0].links
	held, release := make(chan struct{}), make(chan struct{})
	first := make(chan error, 1)
	go func() {
		first <- p.do(context.Background(), 1, 0, func(net.Conn) error {
			close(held)
			<-release
			return nil
		})
	}()
	<-held
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	second := make(chan error, 1)
	go func() {
		second <- p.do(ctx, 1, 0, func(net.Conn) error {
			t.Error("a second request ran while the link was busy")
			return nil
		})
	}()
	var err error
	select {
	case err = <-second:
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatal("the waiting request did not give up when its context ended")
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting request: %v, want its context's deadline", err)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatalf("first request: %v", err)
	}
	ran := false
	if err := p.do(context.Background(), 1, 0, func(net.Conn) error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("next request: ran %v, %v", ran, err)
	}
}
