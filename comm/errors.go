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
	// challenge-response (another job, another epoch, another secret).
	ErrAuth = errors.New("comm: data-plane authentication failed")
)

// errAborted stands for Abort(nil).
var errAborted = errors.New("comm: communicator aborted")

// peerLost wraps ErrPeerLost with the rank and the underlying cause.
func peerLost(op string, rank int, cause error) error {
	if cause == nil {
		return fmt.Errorf("comm: %s: rank %d: %w", op, rank, ErrPeerLost)
	}
	return fmt.Errorf("comm: %s: rank %d: %w: %w", op, rank, ErrPeerLost, cause)
}

// ctxErr wraps ctx.Err(), and the context's cause when it says more.
func ctxErr(op string, ctx context.Context) error {
	err := ctx.Err()
	if cause := context.Cause(ctx); cause != nil && cause != err {
		return fmt.Errorf("comm: %s: %w (%w)", op, err, cause)
	}
	return fmt.Errorf("comm: %s: %w", op, err)
}
