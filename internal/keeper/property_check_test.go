package keeper

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/gorun/gorun/ckpt"
)

// check verifies the property at the instant host fh failed with G = g.
func (j *propJob) check(g int64, fh int) {
	if g < 0 {
		return // nothing was ever recoverable: nothing to keep
	}
	paramsFrom := -1
	own := make([]string, j.world()) // "" when r's own slots hold g
	for r := range j.world() {
		if j.hostOf(r) == fh {
			own[r] = "its host failed"
			continue
		}
		own[r] = j.slotsHold(r, g)
		if own[r] == "" && paramsFrom < 0 {
			paramsFrom = r
		}
	}
	for r := range j.world() {
		if own[r] == "" {
			continue
		}
		repl := j.replicaHeld(r, g, fh)
		if repl == "" && paramsFrom >= 0 {
			continue
		}
		var b strings.Builder
		for h := range j.nh {
			if h == fh {
				continue
			}
			_, ps := j.host(h).Progress()
			fmt.Fprintf(&b, " host %d %+v;", h, ps)
		}
		j.errorf("host %d failed with G = %d: no surviving copy of rank %d's step %d: own slots: %s; replicas: %s; params: peer rank %d (-1: none); progress of the survivors:%s",
			fh, g, r, g, own[r], repl, paramsFrom, b.String())
	}
}

// slotsHold says why rank r's own slots do not hold step g, intact ("" if
// they do). It reads them as another process would, while the rank may be
// staging: the overwrite rule must keep the slot of g.
func (j *propJob) slotsHold(r int, g int64) string {
	sl, err := ckpt.Open(j.c.job, r, propCkptRegions(), ckpt.Options{Dir: j.dir(j.hostOf(r))})
	if err != nil {
		return err.Error()
	}
	defer sl.Close()
	sn, err := sl.At(uint64(g))
	if err != nil {
		return err.Error()
	}
	st := propState(r, g)
	for _, reg := range propRegions {
		if !bytes.Equal(sn.Region(reg.Name), st[reg.Name]) {
			return fmt.Sprintf("step %d: region %s is not the rank's", g, reg.Name)
		}
	}
	if !sn.Valid() {
		return fmt.Sprintf("step %d was overwritten while it was read", g)
	}
	return ""
}

// replicaHeld says why no holder of rank r on a host other than fh has r's
// replicated regions of step g ("" if one has).
func (j *propJob) replicaHeld(r int, g int64, fh int) string {
	st := propState(r, g)
	var why []string
	for _, hr := range j.holders[r] {
		hh := j.hostOf(hr)
		if hh == fh {
			why = append(why, fmt.Sprintf("holder rank %d: failed", hr))
			continue
		}
		store := j.host(hh).store
		store.mu.Lock()
		o := store.owners[r]
		store.mu.Unlock()
		if o == nil {
			why = append(why, fmt.Sprintf("holder rank %d: nothing", hr))
			continue
		}
		o.mu.Lock()
		steps := []int64{o.bufs[0].step, o.bufs[1].step}
		ok := false
		for _, b := range o.bufs {
			if b.step != g || len(b.table) != len(b.data) {
				continue
			}
			ok = len(b.table) == len(propRegions)-1
			for i, e := range b.table {
				if e.name == "params" || !bytes.Equal(b.data[i], st[e.name]) {
					ok = false
				}
			}
		}
		o.mu.Unlock()
		if ok {
			return ""
		}
		why = append(why, fmt.Sprintf("holder rank %d: steps %v", hr, steps))
	}
	return strings.Join(why, ", ")
}
