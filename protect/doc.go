// Package protect is what a Go trainer uses to have gorun protect its
// training state, every step, in memory (DESIGN.md §5; DEADPOOL §V-B,
// §VI-A; TierCheck Tier-1/2).
//
// A trainer started by gorun calls [Connect] with the regions of its
// state (optimizer, params, ...): the [Client] speaks to the rank service
// of its host on the rank socket (PROTOCOL.md) and maps the state's two
// ping-pong slot files. Once, before staging, [Client.Restore] gives the
// step to resume from (G, the globally recoverable step; -1 for a fresh
// start) and views of its regions, from this host's slots or other
// hosts' copies. Each step,
// [Client.Stage] copies the step into the staging slot in the background
// while the trainer computes (as a GPU's copy engine would) and commits
// it; [Client.Wait] before the next optimizer step is the one
// synchronization point. In diff mode ([ModeDiff]) the trainer declares
// its optimizer ([Options.Optimizer]) and hands each step's gradient and
// hyper-parameters ([Client.Gradient]) before the step's Stage.
//
// The package also holds the protocol's messages, which the service side
// (gorun's agent) shares. A stdlib-only Python client speaking the same
// protocol is in python/gorun_rank.py.
package protect
