package comm

import (
	"context"
	"errors"
	"fmt"
)

// Errors of the data plane (Comm). Match them with errors.Is: every error a
// Comm returns wraps one of them, or the context's error when the caller's
// context ended.
var (
	// ErrEpochChanged is what gorun aborts a communicator with when the
	// job moves to a new epoch: build a new Comm from the new table.
	ErrEpochChanged = errors.New("comm: epoch changed")
	// ErrPeerLost reports a peer whose connection broke, or that never
	// connected. The error's text names the rank.
	ErrPeerLost = errors.New("comm: peer lost")
	// ErrClosed is returned by every call after Close.
	ErrClosed = errors.New("comm: communicator closed")
	// ErrAuth reports a data-plane connection whose peer failed the
	// challenge-response (another job, another epoch, another key).
	ErrAuth = errors.New("comm: data-plane authentication failed")
)

// errAborted stands for Abort(nil).
var errAborted = errors.New("comm: communicator aborted")

// PeerLostError is the error of a call whose link to a peer broke. It
// matches ErrPeerLost (errors.Is) and, through errors.As, tells which peer:
// Rank is the rank at the other end of the broken link. In a collective
// that is the neighbour this rank was exchanging with, not necessarily the
// rank that failed first (a collective's failure travels from link to
// link); the launcher's exit reports say which rank ended.
type PeerLostError struct {
	Op   string // the call: "Send", "AllreduceFloat32", ...
	Rank int    // the peer
	Err  error  // the I/O error, or nil
}

func (e *PeerLostError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("comm: %s: rank %d: %v", e.Op, e.Rank, ErrPeerLost)
	}
	return fmt.Sprintf("comm: %s: rank %d: %v: %v", e.Op, e.Rank, ErrPeerLost, e.Err)
}

func (e *PeerLostError) Unwrap() []error {
	if e.Err == nil {
		return []error{ErrPeerLost}
	}
	return []error{ErrPeerLost, e.Err}
}

// peerLost is the PeerLostError of op for rank.
func peerLost(op string, rank int, cause error) error {
	return &PeerLostError{Op: op, Rank: rank, Err: cause}
}

// ctxErr wraps ctx.Err(), and the context's cause when it says more.
func ctxErr(op string, ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("comm: %s: %w (%w)", op, err, cause)
	}
	return fmt.Errorf("comm: %s: %w", op, err)
}
