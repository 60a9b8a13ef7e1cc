package wire

// gorun --resume (issue 17): the job died whole and starts again from its
// durable directory. Each agent reads, for every rank the first epoch
// table places on its host, the newest step the rank's state can be
// rebuilt at from disk (the committed base plus its contiguous
// differentials: internal/cascade.Reach) and sends it to the launcher on
// its Resume subject (ResumeReach). The launcher takes the global minimum
// T (cascade.Decide) once every host with ranks has answered, and
// publishes T as G (GlobalStep, generation 0): each agent then rebuilds
// its ranks' states at T into their slots and starts them, and they
// restore T as after a restart in place. A rank that cannot be resumed
// (no complete base of the committed step, an unreadable directory) is
// reported with Err, and the launcher stops the job saying so.

// ResumeReach is one host's answer for gorun --resume.
type ResumeReach struct {
	Host int `json:"host"`
	// Epoch: the roll-back's epoch it answers (OpReach); 0 for --resume.
	Epoch uint64 `json:"epoch,omitempty"`
	// Base is the commit record's step the agent read (every host must
	// read the same).
	Base  int64        `json:"base"`
	Ranks []ResumeRank `json:"ranks"`
	// Err: the agent cannot resume any of its ranks (the directory cannot
	// be read, its manifest is not the job's); Ranks is then empty.
	Err string `json:"err,omitempty"`
}

// ResumeRank is one rank's reach on disk.
type ResumeRank struct {
	Rank int `json:"r"`
	// To is the newest step the rank's state can be rebuilt at, from Base
	// (Base itself in full mode), when Err is empty.
	To int64 `json:"to"`
	// Stop says why the rank's differentials stop at To (a gap, a batch or
	// record that does not verify), when they do before the end of the log.
	Stop string `json:"stop,omitempty"`
	// Err: the rank cannot be resumed at all (no base of Base).
	Err string `json:"err,omitempty"`
}

// MaxResumeMsg bounds ResumeReach's and ResumeRank's messages.
const MaxResumeMsg = 1024

// DecodeResumeReach decodes and validates a ResumeReach.
func DecodeResumeReach(b []byte) (*ResumeReach, error) {
	var r ResumeReach
	if err := decode(b, &r, "resume reach"); err != nil {
		return nil, err
	}
	switch {
	case r.Host < 0 || r.Host >= MaxHosts:
		return nil, malformed("resume reach: host %d out of range", r.Host)
	case r.Base < 0 || r.Base > MaxStep:
		return nil, malformed("resume reach: base step %d out of range", r.Base)
	case len(r.Ranks) > MaxWorld:
		return nil, malformed("resume reach: %d ranks", len(r.Ranks))
	case len(r.Err) > MaxResumeMsg:
		return nil, malformed("resume reach: error of %d bytes", len(r.Err))
	case r.Err != "" && len(r.Ranks) > 0:
		return nil, malformed("resume reach: an error and ranks")
	}
	seen := make(map[int]bool, len(r.Ranks))
	for _, k := range r.Ranks {
		switch {
		case k.Rank < 0 || k.Rank >= MaxWorld || seen[k.Rank]:
			return nil, malformed("resume reach: rank %d out of range or twice", k.Rank)
		case len(k.Stop) > MaxResumeMsg || len(k.Err) > MaxResumeMsg:
			return nil, malformed("resume reach: rank %d: message too long", k.Rank)
		case k.Err == "" && (k.To < r.Base || k.To > MaxStep):
			return nil, malformed("resume reach: rank %d reaches step %d from base %d", k.Rank, k.To, r.Base)
		}
		seen[k.Rank] = true
	}
	return &r, nil
}
