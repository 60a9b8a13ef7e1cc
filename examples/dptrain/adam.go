package main

import "github.com/gorun/gorun/replay"

// adamHyper are Adam's hyper-parameters. With weightDecay > 0 the update is
// AdamW's (decoupled weight decay).
type adamHyper struct {
	lr, beta1, beta2, eps, weightDecay float32
}

// adamStepConsts are the per-step constants of the update (replay.Consts):
// computed in float64 from the hyper-parameters and the step number and
// rounded once to float32.
type adamStepConsts = replay.Consts

// consts returns the constants of step t (t ≥ 1).
func (h adamHyper) consts(t int) adamStepConsts { return h.at(t).Consts() }

// at returns the hyper-parameters of step t (t ≥ 1) as replay.Step takes
// them: what differential protection hands the holders, which replay the
// update from them.
func (h adamHyper) at(t int) replay.Hyper {
	return replay.Hyper{LR: h.lr, Beta1: h.beta1, Beta2: h.beta2, Eps: h.eps, WeightDecay: h.weightDecay, T: t}
}

// adamUpdate applies one Adam(W) step to a shard: the master weights w,
// the moments m and v, from the gradient g (all of the same length). It is
// replay.Step, gorun's reference optimizer (PyTorch's AdamW update, every
// float32 operation rounded on its own, AVX-512 when built with
// GOEXPERIMENT=simd, the same bits either way), so that the differential
// stream of this trainer replays to exactly its states. Each element's
// update depends only on that element, which is what makes the result
// independent of shard boundaries.
func adamUpdate(w, m, v, g []float32, c adamStepConsts) {
	replay.Step(w, m, v, g, c)
}
