package launcher

import (
	"context"
	"time"

	"github.com/gorun/gorun/internal/wire"
)

// Forwarding the launcher's stdin to the rank that reads it, following
// that rank from host to host (forwardStdin).

// stdinRank is the rank that reads the launcher's stdin, or wire.NoStdin.
func (j *job) stdinRank() int {
	if j.cfg.Stdin == nil {
		return wire.NoStdin
	}
	return j.cfg.StdinRank
}

// forwardStdin passes cfg.Stdin to the agent of the rank that reads it,
// once the ranks have started, a chunk at a time: each waits for the
// agent's answer that it is in the rank's pipe. It ends at end of file, when
// the rank's stdin closes, or with ctx.
//
// The rank may move to another host (a hot-swap): a chunk whose host is
// lost before it answers is sent whole to the new host once the rank has
// started there (what the lost rank had read is gone with it: stdin is a
// stream), and after end of file the forwarding stays until ctx ends, to
// close the stdin of a rank moved later, which would otherwise wait for
// input for ever.
func (j *job) forwardStdin(ctx context.Context) {
	select {
	case <-j.rv.Done():
	case <-ctx.Done():
		return
	}
	if d, ok := j.cfg.Stdin.(interface{ SetReadDeadline(time.Time) error }); ok {
		stop := context.AfterFunc(ctx, func() { _ = d.SetReadDeadline(time.Now()) })
		defer stop()
	}
	buf := make([]byte, 64<<10)
	for {
		n, err := j.cfg.Stdin.Read(buf)
		if n > 0 {
			if _, ok := j.sendStdin(ctx, buf[:n]); !ok {
				return
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			// End of file (or an unreadable stdin: EOF all the same).
			if host, ok := j.sendStdin(ctx, nil); ok {
				j.stdinEOFFollows(ctx, host)
			}
			return
		}
	}
}

// sendStdin sends b (nil: end of file) to the agent of the stdin rank's
// host, once the rank has started there, and reports whether the rank
// took it, and on which host. A host lost before it answered: b goes to
// the host the rank moves to.
func (j *job) sendStdin(ctx context.Context, b []byte) (int, bool) {
	for {
		st := j.stdinState()
		if st.started != st.host {
			// The rank moved and has not started on its new host yet:
			// that host's agent would find no pipe to write to.
			if !j.stdinChanges(ctx, st) {
				return -1, false
			}
			continue
		}
		rctx, cancel := context.WithCancel(ctx)
		go func() { // the request ends if the rank moves meanwhile
			if j.stdinMoves(rctx, st) {
				cancel()
			}
		}()
		m, err := j.ctl.RequestWithContext(rctx, j.subj.StdinTo(st.host), b)
		cancel()
		if err == nil {
			if len(m.Data) > 0 {
				j.log.Debug("the rank's stdin is closed", "why", string(m.Data))
				return st.host, false
			}
			return st.host, true
		}
		if ctx.Err() != nil {
			return -1, false
		}
		// The host did not answer: its agent is gone. The chunk goes to
		// the rank's next host, if the job goes on.
		j.log.Debug("stdin not forwarded; waiting for the rank's next host", "host", st.host, "err", err)
		if !j.stdinMoves(ctx, st) {
			return -1, false
		}
	}
}

// stdinEOFFollows, after end of file was delivered on host, closes the
// stdin of the stdin rank on each host it moves to, until ctx ends.
func (j *job) stdinEOFFollows(ctx context.Context, host int) {
	for {
		st := j.stdinState()
		if st.host == host && !j.stdinMoves(ctx, st) {
			return
		}
		var ok bool
		if host, ok = j.sendStdin(ctx, nil); !ok {
			return
		}
	}
}

// stdinView is where the stdin rank is, where it last started, and a
// channel closed when either changes.
type stdinView struct {
	host, started int
	changed       <-chan struct{}
}

func (j *job) stdinState() stdinView {
	j.tab.RLock()
	defer j.tab.RUnlock()
	return stdinView{j.rankHost[j.cfg.StdinRank], j.stdinStarted, j.tabChanged}
}

// stdinChanges waits until the stdin rank's host or start changes from
// st, and reports whether it did before ctx ended.
func (j *job) stdinChanges(ctx context.Context, st stdinView) bool {
	return j.stdinAwait(ctx, st, func(now stdinView) bool { return now.host != st.host || now.started != st.started })
}

// stdinMoves waits until the stdin rank runs on another host than
// st.host, and reports whether it did before ctx ended.
func (j *job) stdinMoves(ctx context.Context, st stdinView) bool {
	return j.stdinAwait(ctx, st, func(now stdinView) bool { return now.host != st.host })
}

// stdinAwait waits, from st, until done holds for the stdin rank's
// state, and reports whether it did before ctx ended.
func (j *job) stdinAwait(ctx context.Context, st stdinView, done func(stdinView) bool) bool {
	changed := st.changed
	for {
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
		now := j.stdinState()
		if done(now) {
			return true
		}
		changed = now.changed
	}
}

// stdinStartedOn records that the stdin rank's process started on host
// (its agent has the pipe): a chunk waiting for it may go there.
func (j *job) stdinStartedOn(host int) {
	j.tab.Lock()
	defer j.tab.Unlock()
	if j.stdinStarted != host {
		j.stdinStarted = host
		close(j.tabChanged)
		j.tabChanged = make(chan struct{})
	}
}
