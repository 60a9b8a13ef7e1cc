package main

import (
	"strings"

	"github.com/gorun/gorun/launcher"
	"github.com/gorun/gorun/protect"
)

// The durable tier's flags: --ckpt-dir, --ckpt-every, --ckpt-concurrency,
// --ckpt-overhead, --diff-batch and --resume (launcher.DurableOptions).

// The durable tier's defaults, as the usage text gives them.
//
// --ckpt-every 100: the durable tier is for losing the whole job (a
// rack, the allocation), rarer than a host, which the memory tiers
// cover at every step; a base every 100 steps, the same period as
// --base-every's, writes each rank's state once per 100 steps, so that a
// save has 100 step times to finish (PCcheck's N = 1 regime) and the
// disk sees 1% of what a base every step would cost, while a resume
// replays at most 100 steps of differentials in diff mode.
const (
	defaultCkptEvery    = 100
	defaultCkptOverhead = 0.03
	defaultDiffBatch    = 5
)

// durableFlags describes the durable tier's flags, bound to o.durable
// (runFlags lists them in their usage section).
func (o *runOptions) durableFlags() []flagSpec {
	d := &o.durable
	return []flagSpec{
		{names: []string{"--ckpt-dir"}, arg: "DIR", group: groupDurable, define: strFlag(&d.Dir, ""),
			help: `every --ckpt-every steps each rank's protected state is
written to DIR (a shared file system, or the same path
on a local disk of each host), several saves in flight,
and committed once every rank's is on disk; DIR must
exist, be writable, and hold no other job's checkpoints`},
		{names: []string{"--ckpt-every"}, arg: "B", group: groupDurable, define: intFlag(&d.Every, defaultCkptEvery),
			help: "a base every B steps (1 to 2^31, default 100)"},
		{names: []string{"--ckpt-concurrency"}, arg: "N", group: groupDurable, define: intFlag(&d.Concurrency, 0),
			help: `saves in flight per rank (1 to 8; default: automatic,
PCcheck's formula from the measured write and step
times, at most 4)`},
		{names: []string{"--ckpt-overhead"}, arg: "Q", group: groupDurable, define: floatFlag(&d.Overhead, defaultCkptOverhead),
			help: `the fraction of the step time the automatic concurrency
lets the saves cost (0 < Q < 1, default 0.03)`},
		{names: []string{"--diff-batch"}, arg: "N", group: groupDurable, define: intFlag(&d.DiffBatch, defaultDiffBatch),
			help: `--protect-mode diff: differentials reach DIR in batches
of N steps (1 to 4096, default 5)`},
		{names: []string{"--resume"}, group: groupDurable, define: boolFlag(&d.Resume, false),
			help: "resume the job DIR holds from its last committed version"},
	}
}

// parseDurable checks the durable tier's flags (set names the flags
// given): each in range, none without --ckpt-dir, --diff-batch only with
// --protect-mode diff. The directory itself is checked by the launcher
// before anything starts (it exists, is writable, holds no other job).
func (o *runOptions) parseDurable(set map[string]bool) error {
	d := &o.durable
	if !set["ckpt-dir"] {
		for _, f := range []string{"ckpt-every", "ckpt-concurrency", "ckpt-overhead", "diff-batch", "resume"} {
			if set[f] {
				return usagef("--%s needs --ckpt-dir", f)
			}
		}
		o.durable = launcher.DurableOptions{}
		return nil
	}
	switch {
	case strings.TrimSpace(d.Dir) == "":
		return usagef("--ckpt-dir is empty")
	case d.Every < 1 || int64(d.Every) > launcher.MaxCkptEvery:
		return usagef("--ckpt-every must be 1 to 2^31, not %d", d.Every)
	case set["ckpt-concurrency"] && (d.Concurrency < 1 || d.Concurrency > launcher.MaxCkptConcurrency):
		return usagef("--ckpt-concurrency must be 1 to %d, not %d", launcher.MaxCkptConcurrency, d.Concurrency)
	case !(d.Overhead > 0 && d.Overhead < 1):
		return usagef("--ckpt-overhead must be more than 0 and less than 1, not %v", d.Overhead)
	case set["diff-batch"] && o.protectMode != protect.ModeDiff:
		return usagef("--diff-batch only applies with --protect-mode diff")
	case d.DiffBatch < 1 || d.DiffBatch > launcher.MaxDiffBatch:
		return usagef("--diff-batch must be 1 to %d, not %d", launcher.MaxDiffBatch, d.DiffBatch)
	}
	if o.protectMode != protect.ModeDiff {
		d.DiffBatch = 0
	}
	return nil
}
