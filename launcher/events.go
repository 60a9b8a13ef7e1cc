package launcher

import (
	"encoding/json"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/gorun/gorun/hotswap"
)

// eventLog writes the job's recovery record to --events FILE: one JSON
// object per line, written as it happens (each line whole, in one Write).
// Every object has
//
//	"t"     number  seconds since the job started (for a stage of a
//	                timeline: when the stage was reached)
//	"event" string  what happened, one of the kinds below
//
// and, by kind:
//
//	fence            "host": a lost host, cut off from the job
//	splice           "epoch", "lost", "with" (host names), "ranks" (moved
//	                 ranks), "spare" (with is a spare, else a host with
//	                 free slots)
//	restart          "epoch", "gen", "g": every rank restarts in
//	                 generation gen, resuming from step g (-1: the start)
//	publish          "epoch", "gen", "g", "restore" (ranks restoring from
//	                 other hosts): the epoch's table went out
//	under-protected  "epoch", "owners": ranks whose replicas are fewer
//	                 than configured until re-sent
//	protected        every replica is in place again
//	abort            "code", "msg": the job stops
//	detected, classified, replaced, published, restored, resumed
//	                 "epoch", "cause": the recovery epoch reached the
//	                 stage at "t" (written when the epoch ends, before its
//	                 timeline, in stage order; a stage not reached is
//	                 left out)
//	timeline         "epoch", "cause", "superseded", and "detected",
//	                 "classified", "replaced", "published", "restored",
//	                 "resumed": seconds since the job started, or null
//	                 for a stage not reached (replaced is null for a
//	                 restart in place)
//
// A nil *eventLog writes nothing. The first error writing is logged (a
// warning) and the log stops; the job goes on.
type eventLog struct {
	mu  sync.Mutex
	w   io.Writer
	log *slog.Logger
	err error
}

func newEventLog(w io.Writer, log *slog.Logger) *eventLog { return &eventLog{w: w, log: log} }

type evFence struct {
	Host string `json:"host"`
}
type evSplice struct {
	Epoch uint64 `json:"epoch"`
	Lost  string `json:"lost"`
	With  string `json:"with"`
	Ranks []int  `json:"ranks"`
	Spare bool   `json:"spare"`
}
type evRestart struct {
	Epoch uint64 `json:"epoch"`
	Gen   uint64 `json:"gen"`
	G     int64  `json:"g"`
}
type evPublish struct {
	Epoch   uint64 `json:"epoch"`
	Gen     uint64 `json:"gen"`
	G       int64  `json:"g"`
	Restore int    `json:"restore"`
}
type evUnder struct {
	Epoch  uint64 `json:"epoch"`
	Owners []int  `json:"owners"`
}
type evProtected struct{}
type evAbort struct {
	Code int    `json:"code"`
	Msg  string `json:"msg"`
}
type evStage struct {
	Epoch uint64 `json:"epoch"`
	Cause string `json:"cause"`
}
type evTimeline struct {
	Epoch      uint64   `json:"epoch"`
	Cause      string   `json:"cause"`
	Superseded bool     `json:"superseded"`
	Detected   *float64 `json:"detected"`
	Classified *float64 `json:"classified"`
	Replaced   *float64 `json:"replaced"`
	Published  *float64 `json:"published"`
	Restored   *float64 `json:"restored"`
	Resumed    *float64 `json:"resumed"`
}

// kind names a record's event.
func kind(v any) string {
	switch v.(type) {
	case evFence:
		return "fence"
	case evSplice:
		return "splice"
	case evRestart:
		return "restart"
	case evPublish:
		return "publish"
	case evUnder:
		return "under-protected"
	case evProtected:
		return "protected"
	case evAbort:
		return "abort"
	case evTimeline:
		return "timeline"
	}
	return "unknown"
}

// record writes one line: v's fields after "t" and "event".
func (l *eventLog) record(at time.Duration, v any) {
	l.write(at, kind(v), v)
}

func (l *eventLog) write(at time.Duration, event string, v any) {
	if l == nil {
		return
	}
	fields, err := json.Marshal(v)
	if err != nil {
		return
	}
	head, _ := json.Marshal(struct {
		T     float64 `json:"t"`
		Event string  `json:"event"`
	}{seconds(at), event})
	line := head[:len(head)-1]
	if len(fields) > 2 { // not {}
		line = append(append(line, ','), fields[1:]...)
	} else {
		line = append(line, '}')
	}
	line = append(line, '\n')
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return
	}
	if _, l.err = l.w.Write(line); l.err != nil {
		l.log.Warn("cannot write the --events record; it stops here", "err", l.err)
	}
}

// timeline writes a recovery epoch's stages, then its record.
func (l *eventLog) timeline(t hotswap.Timeline) {
	if l == nil {
		return
	}
	for _, s := range []struct {
		name string
		at   time.Duration
	}{{"detected", t.Detected}, {"classified", t.Classified}, {"replaced", t.Replaced},
		{"published", t.Published}, {"restored", t.Restored}, {"resumed", t.Resumed}} {
		if s.at >= 0 {
			l.write(s.at, s.name, evStage{Epoch: t.Epoch, Cause: t.Cause})
		}
	}
	at := func(d time.Duration) *float64 {
		if d < 0 {
			return nil
		}
		s := seconds(d)
		return &s
	}
	end := max(t.Detected, t.Classified, t.Replaced, t.Published, t.Restored, t.Resumed)
	l.record(end, evTimeline{Epoch: t.Epoch, Cause: t.Cause, Superseded: t.Superseded,
		Detected: at(t.Detected), Classified: at(t.Classified), Replaced: at(t.Replaced),
		Published: at(t.Published), Restored: at(t.Restored), Resumed: at(t.Resumed)})
}

// Err returns the first write error, if any.
func (l *eventLog) Err() error {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

func seconds(d time.Duration) float64 { return float64(d.Microseconds()) / 1e6 }
