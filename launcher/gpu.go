package launcher

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gorun/gorun/internal/wire"
)

// The agents' GPU health reports: each told to the user once, its repeats
// counted (onGPUEvent).

// onGPUEvent records a GPU health report and tells the user. A fault
// that requires replacing the host is the machine's to act on (the loop
// passes it on); the others leave the job as it is.
func (j *job) onGPUEvent(h *hostAgent, e *wire.Event) {
	g := e.GPU
	// A flapping GPU repeats itself: keep and print the first report of
	// each (host, GPU, kind, XID), then every 100th, with the count.
	key := fmt.Sprintf("%s/%d/%s/%d", h.name, g.Index, g.Kind, g.XID)
	if j.gpuSeen == nil {
		j.gpuSeen = map[string]int{}
	}
	j.gpuSeen[key]++
	n := j.gpuSeen[key]
	if n > 1 && n%100 != 0 {
		return
	}
	if n == 1 && len(j.gpuFailures) < maxGPUFailures {
		j.gpuFailures = append(j.gpuFailures, gpuFailure{host: h.name, report: *g, msg: e.Msg})
	}
	repeat := ""
	if n > 1 {
		repeat = fmt.Sprintf(" (%d times)", n)
	}
	ranks := "no rank"
	if len(g.Ranks) > 0 {
		ranks = "rank " + joinInts(g.Ranks)
		if len(g.Ranks) > 1 {
			ranks = "ranks " + joinInts(g.Ranks)
		}
	}
	j.log.Debug("GPU failure report", "host", h.name, "gpu", g.Index, "uuid", g.UUID, "class", g.Class, "xid", g.XID, "ranks", g.Ranks)
	j.out.report("GPU %d (%s) on host %s, used by %s: %s failure: %s%s", g.Index, g.UUID, h.name, ranks, g.Class, e.Msg, repeat)
}

// maxGPUFailures bounds the GPU reports a job keeps.
const maxGPUFailures = 10000

// gpuFailure is a GPU health report received from an agent.
type gpuFailure struct {
	host   string
	report wire.GPUReport
	msg    string
}

func joinInts(xs []int) string {
	s := make([]string, len(xs))
	for i, x := range xs {
		s[i] = strconv.Itoa(x)
	}
	return strings.Join(s, ",")
}
