package keeper

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// TestECRestoreNoRoomKeepsRows: a decode that fails for want of room
// (the other members' and the agreeing row's hosts refuse their answers:
// errNoRoom, a retry may decode) still says why the other parity rows
// were not sources (here one whose host no longer has the row), as an
// unrecoverable one does. (A review found those reasons kept only under
// ErrUnrecoverable.)
func TestECRestoreNoRoomKeepsRows(t *testing.T) {
	const k, m, every = 2, 2, 3
	j, g, hb := logAfterH(t, k, m, every)
	const r = 0
	h := j.c.hosts[j.hostOf[r]]
	s := h.svc(r)
	pl := h.place()
	pos := pl.ec.pos[r]
	// A parity row of the stripe not on r's host: its host loses it.
	gone := -1
	for jr, rp := range pl.ec.rows[pos.group] {
		if rp.host != j.hostOf[r] {
			gone = jr
		}
	}
	if gone < 0 {
		t.Fatal("every parity row of rank 0's stripe is on its host")
	}
	ps := j.c.hosts[pl.ec.rows[pos.group][gone].host].parity
	key := ecRowKey{pos.group, pos.stripe, gone}
	ps.mu.Lock()
	row := ps.rows[key]
	delete(ps.rows, key)
	ps.mu.Unlock()
	if row == nil {
		t.Fatalf("host %d keeps no row %v", pl.ec.rows[pos.group][gone].host, key)
	}
	t.Cleanup(func() {
		ps.mu.Lock()
		ps.rows[key] = row
		ps.mu.Unlock()
	})
	for x, o := range j.c.hosts[:j.work] {
		if x != j.hostOf[r] {
			setLimit(t, o, 1) // refuses any reservation, whatever the count does
		}
	}
	views := replViews(s)
	err := s.decodeReplay(context.Background(), g, hb, pl.logsOf(r), pl, views)
	if !errors.Is(err, errNoRoom) || errors.Is(err, ErrUnrecoverable) {
		t.Fatalf("the other hosts without room: %v; want errNoRoom, not ErrUnrecoverable", err)
	}
	if want := fmt.Sprintf("parity row %d: ", gone); !strings.Contains(err.Error(), want) {
		t.Fatalf("%v: does not say why parity row %d was not a source", err, gone)
	}
}
