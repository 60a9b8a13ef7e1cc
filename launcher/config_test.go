package launcher

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorun/gorun/internal/wire"
	"github.com/gorun/gorun/topology"
)

func validConfig() Config {
	return Config{Hosts: []topology.Host{{Name: "localhost", Slots: 1}}, NP: 1, Prog: "true"}
}

func TestWithDefaults(t *testing.T) {
	c := validConfig()
	got, err := c.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	wd, _ := os.Getwd()
	exe, _ := os.Executable()
	if got.KillGrace != 10*time.Second || got.HeartbeatInterval != time.Second || got.HeartbeatTimeout != 10*time.Second ||
		got.StartTimeout != 60*time.Second || got.MaxParallelStarts != 128 || got.OutputDelay != 5*time.Millisecond {
		t.Errorf("durations and limits: %+v", got)
	}
	if !slices.Equal(got.Rsh, []string{"ssh"}) {
		t.Errorf("Rsh = %q", got.Rsh)
	}
	if got.Stdout != io.Discard || got.Stderr != io.Discard || got.Logger == nil {
		t.Errorf("Stdout %v Stderr %v Logger %v", got.Stdout, got.Stderr, got.Logger)
	}
	if got.Dir != wd || got.AgentPath != exe {
		t.Errorf("Dir %q AgentPath %q, want %q %q", got.Dir, got.AgentPath, wd, exe)
	}
	if got.Bind != "" || got.Timeout != 0 {
		t.Errorf("Bind %q Timeout %v changed", got.Bind, got.Timeout)
	}
	// The caller's Config is left alone.
	if c.KillGrace != 0 || c.Rsh != nil || c.Stdout != nil || c.Dir != "" {
		t.Errorf("withDefaults changed its receiver: %+v", c)
	}
}

func TestWithDefaultsKeepsSettings(t *testing.T) {
	var out, errs bytes.Buffer
	log := slog.New(slog.DiscardHandler)
	c := validConfig()
	c.KillGrace = 3 * time.Second
	c.HeartbeatInterval = 200 * time.Millisecond
	c.StartTimeout = time.Second
	c.MaxParallelStarts = 4
	c.OutputDelay = time.Millisecond
	c.Rsh = []string{"ip", "netns", "exec"}
	c.Stdout, c.Stderr, c.Logger = &out, &errs, log
	c.Dir, c.AgentPath = "/somewhere", "/opt/gorun"
	got, err := c.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if got.KillGrace != 3*time.Second || got.HeartbeatInterval != 200*time.Millisecond ||
		got.HeartbeatTimeout != 2*time.Second || // 10 × the interval given
		got.StartTimeout != time.Second || got.MaxParallelStarts != 4 || got.OutputDelay != time.Millisecond ||
		!slices.Equal(got.Rsh, c.Rsh) || got.Stdout != &out || got.Stderr != &errs || got.Logger != log ||
		got.Dir != "/somewhere" || got.AgentPath != "/opt/gorun" {
		t.Errorf("settings not kept: %+v", got)
	}
}

func TestWithDefaultsKillGrace(t *testing.T) {
	for _, tt := range []struct{ in, want time.Duration }{
		{0, 10 * time.Second},
		{-1, 0}, // negative: kill at once
		{-time.Hour, 0},
		{time.Millisecond, time.Millisecond},
	} {
		c := validConfig()
		c.KillGrace = tt.in
		got, err := c.withDefaults()
		if err != nil || got.KillGrace != tt.want {
			t.Errorf("KillGrace %v → %v, %v; want %v", tt.in, got.KillGrace, err, tt.want)
		}
	}
}

func TestWithDefaultsErrors(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Config)
		msg    string
	}{
		{"no program", func(c *Config) { c.Prog = "" }, "no program to run"},
		{"np zero", func(c *Config) { c.NP = 0 }, "-np must be at least 1"},
		{"np negative", func(c *Config) { c.NP = -4 }, "-np must be at least 1"},
		{"no hosts", func(c *Config) { c.Hosts = nil }, "no hosts"},
		{"empty hosts", func(c *Config) { c.Hosts = []topology.Host{} }, "no hosts"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.change(&c)
			_, err := c.withDefaults()
			checkConfigError(t, err, tt.msg)
		})
	}
}

// checkConfigError checks that err is a *ConfigError saying msg that
// matches ErrConfig.
func checkConfigError(t *testing.T, err error, msg string) *ConfigError {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want %q", msg)
	}
	if !errors.Is(err, ErrConfig) {
		t.Errorf("errors.Is(%v, ErrConfig) = false", err)
	}
	ce, ok := errors.AsType[*ConfigError](err)
	if !ok {
		t.Fatalf("%T %v is not a *ConfigError", err, err)
	}
	if ce.Error() != msg {
		t.Errorf("message %q, want %q", ce.Error(), msg)
	}
	// A nil underlying error does not trip the errors package.
	var pe *fs.PathError
	if ce.Err == nil && errors.As(err, &pe) {
		t.Errorf("errors.As found a *fs.PathError in %v", err)
	}
	return ce
}

// TestECDiffWarning: diff mode under an erasure code warns when
// --base-every is more than 4 × --diff-fold, naming the memory the logs
// take (they cannot fold), and only then.
func TestECDiffWarning(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*Config)
		want   string // "" for no warning
	}{
		{"default base-every", func(c *Config) { c.ProtectMode, c.ECK, c.ECM = ModeDiff, 2, 2 },
			"--protect-mode diff with --redundancy ec:2+2 and --base-every 100 (more than 4 x --diff-fold 8): the differentials after the newest coded base cannot fold, so each of a rank's 2 log holders keeps up to 108 steps of them (base-every 100 + refresh 8) for each rank it holds"},
		{"at 4 x fold", func(c *Config) { c.ProtectMode, c.ECK, c.ECM, c.Diff.BaseEvery = ModeDiff, 2, 2, 32 }, ""},
		{"just past 4 x fold", func(c *Config) {
			c.ProtectMode, c.ECK, c.ECM, c.Diff = ModeDiff, 4, 2, DiffOptions{Fold: 2, BaseEvery: 9}
		}, "each of a rank's 2 log holders keeps up to 11 steps of them (base-every 9 + refresh 2)"},
		{"base-every 8", func(c *Config) { c.ProtectMode, c.ECK, c.ECM, c.Diff.BaseEvery = ModeDiff, 2, 2, 8 }, ""},
		{"diff with replicas", func(c *Config) { c.ProtectMode, c.Replicas = ModeDiff, 1 }, ""},
		{"full mode under EC", func(c *Config) { c.ECK, c.ECM = 2, 2 }, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := validConfig()
			tc.change(&c)
			got, err := c.withDefaults()
			if err != nil {
				t.Fatal(err)
			}
			w := got.ECDiffWarning()
			if tc.want == "" && w != "" || !strings.Contains(w, tc.want) {
				t.Fatalf("ECDiffWarning() = %q, want %q", w, tc.want)
			}
		})
	}
}

// TestWithDefaultsProtect: the protect mode and its diff settings are
// checked, naming the flag, and diff mode's zero settings take their
// defaults; the job's spec carries them to every agent, through the wire.
func TestWithDefaultsProtect(t *testing.T) {
	tests := []struct {
		name   string
		change func(*Config)
		mode   ProtectMode
		diff   DiffOptions
		msg    string // the error, if any
	}{
		{"zero is full", func(*Config) {}, ModeFull, DiffOptions{}, ""},
		{"full without replicas", func(c *Config) { c.ProtectMode, c.Replicas = ModeFull, 0 }, ModeFull, DiffOptions{}, ""},
		{"diff takes the defaults", func(c *Config) { c.ProtectMode, c.Replicas = ModeDiff, 1 }, ModeDiff, DiffOptions{Fold: 8, BaseEvery: 100, Codec: "raw"}, ""},
		{"diff keeps its settings", func(c *Config) {
			c.ProtectMode, c.Replicas, c.Diff = ModeDiff, 2, DiffOptions{Fold: 4096, BaseEvery: 1 << 31, Codec: "topk:0.5"}
		}, ModeDiff, DiffOptions{Fold: 4096, BaseEvery: 1 << 31, Codec: "topk:0.5"}, ""},
		{"unknown mode", func(c *Config) { c.ProtectMode = "delta" }, "", DiffOptions{}, "--protect-mode delta: want full or diff"},
		{"fold in full mode", func(c *Config) { c.Diff.Fold = 8 }, "", DiffOptions{}, "--diff-fold only applies with --protect-mode diff"},
		{"base-every in full mode", func(c *Config) { c.ProtectMode, c.Diff.BaseEvery = ModeFull, 8 }, "", DiffOptions{}, "--base-every only applies with --protect-mode diff"},
		{"codec in full mode", func(c *Config) { c.Diff.Codec = "raw" }, "", DiffOptions{}, "--diff-codec only applies with --protect-mode diff"},
		{"diff without replicas", func(c *Config) { c.ProtectMode = ModeDiff }, "", DiffOptions{},
			"--protect-mode diff sends each step to the replica holders: it needs --replicas 1 or more, not 0"},
		{"diff with an erasure code", func(c *Config) { c.ProtectMode, c.ECK, c.ECM = ModeDiff, 2, 2 }, ModeDiff, DiffOptions{Fold: 8, BaseEvery: 100, Codec: "raw"}, ""},
		{"diff with an erasure code and its settings", func(c *Config) {
			c.ProtectMode, c.ECK, c.ECM, c.Diff = ModeDiff, 8, 4, DiffOptions{Fold: 4, BaseEvery: 16, Codec: "topk:0.01"}
		}, ModeDiff, DiffOptions{Fold: 4, BaseEvery: 16, Codec: "topk:0.01"}, ""},
		{"diff with an erasure code and replicas", func(c *Config) { c.ProtectMode, c.ECK, c.ECM, c.Replicas = ModeDiff, 2, 2, 1 }, "", DiffOptions{},
			"--redundancy ec:2+2 and --replicas 1: give one of them"},
		{"diff with an erasure code of 16 parity hosts", func(c *Config) { c.ProtectMode, c.ECK, c.ECM = ModeDiff, 2, 16 }, ModeDiff, DiffOptions{Fold: 8, BaseEvery: 100, Codec: "raw"}, ""},
		{"diff with an erasure code of 17 parity hosts", func(c *Config) { c.ProtectMode, c.ECK, c.ECM = ModeDiff, 2, 17 }, "", DiffOptions{},
			"--redundancy ec:2+17 with --protect-mode diff: at most 16 parity hosts, not 17: each rank's differentials after its newest coded base are kept on M hosts besides its own, and a rank keeps at most 16 holders; use --protect-mode full, or M <= 16"},
		{"diff with an erasure code, bad base-every", func(c *Config) { c.ProtectMode, c.ECK, c.ECM, c.Diff.BaseEvery = ModeDiff, 2, 2, -1 }, "", DiffOptions{},
			"--base-every -1: want 1 to 2^31"},
		{"negative fold", func(c *Config) { c.ProtectMode, c.Replicas, c.Diff.Fold = ModeDiff, 1, -1 }, "", DiffOptions{}, "--diff-fold -1: want 1 to 4096"},
		{"fold too deep", func(c *Config) { c.ProtectMode, c.Replicas, c.Diff.Fold = ModeDiff, 1, 4097 }, "", DiffOptions{}, "--diff-fold 4097: want 1 to 4096"},
		{"negative base-every", func(c *Config) { c.ProtectMode, c.Replicas, c.Diff.BaseEvery = ModeDiff, 1, -5 }, "", DiffOptions{}, "--base-every -5: want 1 to 2^31"},
		{"base-every past 2^31", func(c *Config) { c.ProtectMode, c.Replicas, c.Diff.BaseEvery = ModeDiff, 1, 1<<31+1 }, "", DiffOptions{}, "--base-every 2147483649: want 1 to 2^31"},
		{"unknown codec", func(c *Config) { c.ProtectMode, c.Replicas, c.Diff.Codec = ModeDiff, 1, "zstd" }, "", DiffOptions{},
			`--diff-codec: diff codec "zstd": want raw, int8[:B] or topk:K`},
		{"codec too long", func(c *Config) {
			c.ProtectMode, c.Replicas, c.Diff.Codec = ModeDiff, 1, "int8:"+strings.Repeat("1", 64)
		}, "", DiffOptions{},
			"--diff-codec: 69 bytes is too long"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validConfig()
			tt.change(&c)
			got, err := c.withDefaults()
			if tt.msg != "" {
				checkConfigError(t, err, tt.msg)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got.ProtectMode != tt.mode || got.Diff != tt.diff {
				t.Errorf("ProtectMode %q, Diff %+v; want %q, %+v", got.ProtectMode, got.Diff, tt.mode, tt.diff)
			}
			// What every agent gets.
			rep, err := wire.DecodeRegisterReply(wire.Marshal(&wire.RegisterReply{Spec: (&job{cfg: got}).spec()}))
			if err != nil {
				t.Fatal(err)
			}
			s := rep.Spec
			if s.ProtectMode != string(tt.mode) || s.DiffFold != tt.diff.Fold || s.BaseEvery != tt.diff.BaseEvery || s.DiffCodec != tt.diff.Codec {
				t.Errorf("spec: mode %q fold %d base every %d codec %q; want %q and %+v", s.ProtectMode, s.DiffFold, s.BaseEvery, s.DiffCodec, tt.mode, tt.diff)
			}
		})
	}
}
