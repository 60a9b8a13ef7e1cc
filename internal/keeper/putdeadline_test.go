package keeper

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
)

// pausingConn is the holder's end of a link that, once at bytes have
// been read, holds the read that got them until resume is closed: the
// put has all its data off the link and is about to check and commit it.
type pausingConn struct {
	net.Conn
	at, n  int
	once   sync.Once
	paused chan struct{}
	resume chan struct{}
}

func (c *pausingConn) Read(b []byte) (int, error) {
	if c.n < c.at && c.n+len(b) > c.at {
		b = b[:c.at-c.n]
	}
	k, err := c.Conn.Read(b)
	c.n += k
	if c.n == c.at {
		c.once.Do(func() { close(c.paused); <-c.resume })
	}
	return k, err
}

// servePausing serves a link to h whose holder end pauses once at bytes
// were read.
func servePausing(links *pipeLinks, h *Keeper, at int) (net.Conn, *pausingConn) {
	cli, srv := net.Pipe()
	pc := &pausingConn{Conn: srv, at: at, paused: make(chan struct{}), resume: make(chan struct{})}
	links.conns = append(links.conns, cli)
	links.wg.Go(func() { h.store.serve(context.Background(), 0, pc) })
	return cli, pc
}

// TestPutDeadlineCleared: put A has read all its data and not yet
// committed when another put of the same owner, on another link, sets a
// read deadline on A's link (taking A's buffer over, or refused over the
// limit). Whatever A's answer, A's link is in step: its next request (a
// has) must be read and answered, not fail as a link error (which makes
// the sender report the healthy holder lost). Failed before the put
// cleared the deadline: "read/write on closed pipe".
func TestPutDeadlineCleared(t *testing.T) {
	for _, tc := range []struct {
		name      string
		overLimit bool   // B is refused over the limit: A commits
		wantA     string // "" acknowledged, else in A's refusal
	}{
		{"taken over", false, "taken over"},
		{"other refused over the limit", true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h1 := holderOfRank0(t)
			hdr, tab, data, frame := stepFrame(t, h1, 2, 0x30, nil)
			links := &pipeLinks{}
			t.Cleanup(links.close)
			a, pc := servePausing(links, h1, len(frame))
			go a.Write(frame)
			<-pc.paused // A has read everything, not yet committed
			if tc.overLimit {
				before := storeBytes(h1)
				h1.store.mu.Lock()
				h1.store.limit = before + tableBytes(tab) - 1
				h1.store.mu.Unlock()
			}
			b := links.serve(h1, 0)
			within(t, "put B", func() error {
				if err := writeFrame(b, hdr, tab, data); err != nil {
					return err
				}
				readAck(b, hdr) // acknowledged (took A's buffer) or refused (over the limit)
				return nil
			})
			close(pc.resume)
			var errA error
			within(t, "put A's answer", func() error { errA = readAck(a, hdr); return nil })
			if tc.wantA == "" && errA != nil {
				t.Fatalf("put A: %v, want it acknowledged", errA)
			}
			if re, ok := errors.AsType[*remoteError](errA); tc.wantA != "" && (!ok || !strings.Contains(re.msg, tc.wantA)) {
				t.Fatalf("put A: %v, want a refusal naming %q", errA, tc.wantA)
			}
			has := hdr
			has.kind = kindHas
			var errHas error
			within(t, "a has on A's link", func() error {
				if errHas = writeFrame(a, has, tab, nil); errHas == nil {
					errHas = readAck(a, has)
				}
				return nil
			})
			if _, refused := errors.AsType[*remoteError](errHas); errHas != nil && !refused {
				t.Errorf("the next request on A's link after its put was answered: %v (a link error)", errHas)
			}
		})
	}
}
