package wire

import (
	"time"
)

// ControlOp is an order from the launcher to the agents.
type ControlOp string

// Control operations.
const (
	// OpSignal sends Signal to every rank; the job goes on.
	OpSignal ControlOp = "signal"
	// OpStop sends Signal to every rank, then SIGKILL after Grace.
	OpStop ControlOp = "stop"
	// OpKill sends SIGKILL to every rank at once.
	OpKill ControlOp = "kill"
	// OpExit tells agents to clean up and exit; their ranks have ended.
	// It carries the durable tier's last D and X (GlobalStep.D and X, as
	// last published): an agent applies them before it closes its
	// stores, whether or not the G that carried them reached it first.
	OpExit ControlOp = "exit"
	// OpRestart starts restart generation Gen: agents kill their ranks,
	// discard protected steps after G, and start the ranks again in
	// Epoch's table, where they restore step G.
	OpRestart ControlOp = "restart"
	// OpReach asks each agent for the reach on disk (as for --resume:
	// ResumeReach, with Epoch) of its ranks in Ranks, the rank → host
	// table of epoch Epoch, from the commit record's step G: the job rolls
	// back to the durable tier (a lost rank's state is in no memory tier).
	OpReach ControlOp = "reach"
	// OpProbe asks the agent of host Host for a heartbeat at once: the
	// launcher suspects the host, and its answer clears the suspicion.
	OpProbe ControlOp = "probe"
)

// Control is broadcast by the launcher to every agent of the job.
type Control struct {
	Op     ControlOp     `json:"op"`
	Signal int           `json:"sig,omitempty"`
	Grace  time.Duration `json:"grace,omitempty"`
	// OpRestart only.
	Gen   uint64 `json:"gen,omitempty"`
	Epoch uint64 `json:"epoch,omitempty"`
	G     int64  `json:"g,omitempty"`
	// OpRestart only: every agent rebuilds each of its ranks' states at
	// G from the durable tier before it starts them (a roll-back).
	Disk bool `json:"disk,omitempty"`
	// OpReach only: every rank's host.
	Ranks []int `json:"ranks,omitempty"`
	// OpProbe only: the host asked.
	Host int `json:"host,omitempty"`
	// OpExit only: the durable tier's watermark and resolved step as the
	// launcher last published them (GlobalStep.D and X; nil: none), its
	// decisions being final once it tells the agents to exit. D <= X.
	D *int64 `json:"d,omitempty"`
	X *int64 `json:"x,omitempty"`
}

// DecodeControl decodes and validates a Control.
func DecodeControl(b []byte) (*Control, error) {
	var c Control
	if err := decode(b, &c, "control"); err != nil {
		return nil, err
	}
	switch c.Op {
	case OpSignal, OpStop:
		if c.Signal < 1 || c.Signal > 64 {
			return nil, malformed("control: signal %d out of range", c.Signal)
		}
	case OpKill, OpExit:
		if c.Signal != 0 {
			return nil, malformed("control: %s takes no signal", c.Op)
		}
	case OpRestart:
		if c.Signal != 0 || c.Gen == 0 || c.G < -1 || c.G > MaxStep {
			return nil, malformed("control: restart generation %d from step %d", c.Gen, c.G)
		}
	case OpReach:
		if c.Signal != 0 || c.G < 0 || c.G > MaxStep || len(c.Ranks) == 0 || len(c.Ranks) > MaxWorld {
			return nil, malformed("control: reach from step %d of %d ranks", c.G, len(c.Ranks))
		}
		for _, h := range c.Ranks {
			if h < 0 || h >= MaxHosts {
				return nil, malformed("control: reach: host %d out of range", h)
			}
		}
	case OpProbe:
		if c.Signal != 0 || c.Host < 0 || c.Host >= MaxHosts {
			return nil, malformed("control: probe of host %d", c.Host)
		}
	default:
		return nil, malformed("control: unknown op %q", Truncate(string(c.Op)))
	}
	if c.Grace < 0 {
		return nil, malformed("control: negative grace")
	}
	if c.Host != 0 && c.Op != OpProbe {
		return nil, malformed("control: %s names a host", c.Op)
	}
	if c.Disk && c.Op != OpRestart || c.Ranks != nil && c.Op != OpReach {
		return nil, malformed("control: %s with a roll-back's fields", c.Op)
	}
	if (c.D != nil || c.X != nil) && c.Op != OpExit {
		return nil, malformed("control: %s with the durable tier's watermark", c.Op)
	}
	if c.D != nil && (*c.D < 0 || *c.D > MaxStep) || c.X != nil && (*c.X < 0 || *c.X > MaxStep || c.D != nil && *c.D > *c.X) {
		return nil, malformed("control: exit with durable commit %v and resolved step %v", stepString(c.D), stepString(c.X))
	}
	return &c, nil
}
