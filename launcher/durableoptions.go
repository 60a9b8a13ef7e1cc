package launcher

import (
	"cmp"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/gorun/gorun/durable"
	"github.com/gorun/gorun/internal/wire"
)

// The durable tier's settings (Config.Durable, --ckpt-dir and the flags
// that go with it): their bounds and defaults, and their check, with the
// directory's, before the job starts.

// DurableOptions configure the durable tier (Config.Durable). The zero
// value has none; with Dir set, zero fields take the defaults named.
type DurableOptions struct {
	// Dir is the job's checkpoint directory (--ckpt-dir): on a shared file
	// system, or the same path on a local disk of every host.
	Dir string
	// Every: a base every Every steps (--ckpt-every; 1 to MaxCkptEvery,
	// 0 = 100).
	Every int
	// Concurrency is the number of saves each rank allows in flight
	// (--ckpt-concurrency; 1 to MaxCkptConcurrency), 0 for automatic:
	// PCcheck's formula with the write and step times measured.
	Concurrency int
	// Overhead is the fraction of the step time the automatic concurrency
	// allows the saves to cost (--ckpt-overhead; 0 < q < 1, 0 = 0.03).
	Overhead float64
	// DiffBatch is the number of steps per batch of differentials written
	// to disk in diff mode (--diff-batch; 1 to MaxDiffBatch, 0 = 5).
	DiffBatch int
	// Resume resumes the job from Dir's commit record (--resume).
	Resume bool
}

// Bounds and defaults of DurableOptions.
const (
	MaxCkptEvery       = wire.MaxCkptEvery
	MaxCkptConcurrency = wire.MaxCkptConcurrency
	MaxDiffBatch       = wire.MaxDiffBatch

	defaultCkptEvery    = 100
	defaultCkptOverhead = 0.03
	// defaultDiffBatch is TierCheck's: differentials reach the disk in
	// batches of 5 steps.
	defaultDiffBatch = 5
)

// checkDurable checks the durable tier's settings and directory and
// fills in the defaults: every error is a ConfigError (exit 2), before
// anything starts.
func (cfg *Config) checkDurable() error {
	d := &cfg.Durable
	if d.Dir == "" {
		for _, f := range []struct {
			flag string
			set  bool
		}{{"--ckpt-every", d.Every != 0}, {"--ckpt-concurrency", d.Concurrency != 0}, {"--ckpt-overhead", d.Overhead != 0},
			{"--diff-batch", d.DiffBatch != 0}, {"--resume", d.Resume}} {
			if f.set {
				return &ConfigError{Msg: f.flag + " needs --ckpt-dir"}
			}
		}
		return nil
	}
	switch {
	case d.Every < 0 || int64(d.Every) > MaxCkptEvery:
		return &ConfigError{Msg: fmt.Sprintf("--ckpt-every %d: want 1 to 2^31", d.Every)}
	case d.Concurrency < 0 || d.Concurrency > MaxCkptConcurrency:
		return &ConfigError{Msg: fmt.Sprintf("--ckpt-concurrency %d: want 1 to %d", d.Concurrency, MaxCkptConcurrency)}
	case d.Overhead < 0 || d.Overhead >= 1 || d.Overhead != d.Overhead:
		return &ConfigError{Msg: fmt.Sprintf("--ckpt-overhead %v: want 0 < q < 1", d.Overhead)}
	case d.DiffBatch < 0 || d.DiffBatch > MaxDiffBatch:
		return &ConfigError{Msg: fmt.Sprintf("--diff-batch %d: want 1 to %d", d.DiffBatch, MaxDiffBatch)}
	case d.DiffBatch != 0 && cfg.ProtectMode != ModeDiff:
		return &ConfigError{Msg: "--diff-batch only applies with --protect-mode diff"}
	}
	d.Every = cmp.Or(d.Every, defaultCkptEvery)
	if d.Overhead == 0 {
		d.Overhead = defaultCkptOverhead
	}
	if cfg.ProtectMode == ModeDiff {
		d.DiffBatch = cmp.Or(d.DiffBatch, defaultDiffBatch)
	}
	abs, err := filepath.Abs(d.Dir)
	if err != nil {
		return &ConfigError{Msg: fmt.Sprintf("--ckpt-dir %s: %v", d.Dir, err), Err: err}
	}
	if len(abs) > wire.MaxCkptDir {
		return &ConfigError{Msg: fmt.Sprintf("--ckpt-dir: a path of %d bytes is too long", len(abs))}
	}
	if err := durable.CheckDir(abs); err != nil {
		return &ConfigError{Msg: fmt.Sprintf("--ckpt-dir %s: %s", d.Dir, strings.TrimPrefix(err.Error(), "durable: ")), Err: err}
	}
	d.Dir = abs
	if err := checkDurableDir(abs, d.Resume); err != nil {
		return err
	}
	if d.Resume {
		// The directory must hold this job (resume.go): what the
		// manifest would say, the regions aside (the ranks check theirs).
		want := durable.Manifest{World: cfg.NP, Protect: string(modeOrFull(cfg.ProtectMode)), Every: d.Every, Command: commandHash(cfg.Prog, cfg.Args)}
		if cfg.ProtectMode == ModeDiff {
			want.Codec = cfg.Diff.Codec
		}
		if _, err := checkResumeDir(abs, &want); err != nil {
			return err
		}
	}
	return nil
}

// checkDurableDir refuses a directory that holds checkpoints a new job
// would overwrite: another job's manifest (unless the job resumes it), a
// manifest that cannot be read, or ranks' files without a manifest (a job
// that ended before it wrote one). A resumed job's manifest is checked
// against it later (--resume).
func checkDurableDir(dir string, resume bool) error {
	m, err := durable.ReadManifest(dir)
	switch {
	case err == nil && !resume:
		return &ConfigError{Msg: fmt.Sprintf("--ckpt-dir %s holds job %s's checkpoints; use --resume or another --ckpt-dir", dir, m.Job)}
	case resume:
		return nil // the resume checks what it resumes
	case !errors.Is(err, durable.ErrNoManifest):
		return &ConfigError{Msg: fmt.Sprintf("--ckpt-dir %s: its manifest cannot be read (%s); use another --ckpt-dir", dir, strings.TrimPrefix(err.Error(), "durable: ")), Err: err}
	}
	l, err := durable.List(dir)
	if err != nil {
		return &ConfigError{Msg: fmt.Sprintf("--ckpt-dir %s: %s", dir, strings.TrimPrefix(err.Error(), "durable: ")), Err: err}
	}
	for _, r := range l.Ranks {
		if len(r.Bases) > 0 || len(r.Markers) > 0 || len(r.Batches) > 0 {
			return &ConfigError{Msg: fmt.Sprintf("--ckpt-dir %s holds rank %d's checkpoints of a job that wrote no manifest; use another --ckpt-dir", dir, r.Rank)}
		}
	}
	if l.HasCommit || l.CommitErr != nil {
		return &ConfigError{Msg: fmt.Sprintf("--ckpt-dir %s holds a commit record of a job that wrote no manifest; use another --ckpt-dir", dir)}
	}
	return nil
}
