package main

import (
	"bytes"
	"errors"
	"flag"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestParseCount(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int64
	}{
		{"0", 0}, {"1000", 1000}, {"1K", 1000}, {"1k", 1000}, {"1M", 1_000_000}, {"2G", 2_000_000_000},
		{"1Ki", 1024}, {"1Mi", 1 << 20}, {"4Gi", 4 << 30}, {"1.5M", 1_500_000}, {"0.5Ki", 512},
	} {
		got, err := parseCount(tc.in)
		if err != nil || got != tc.want {
			t.Errorf("parseCount(%q) = %d, %v; want %d", tc.in, got, err, tc.want)
		}
	}
	for _, in := range []string{"", "M", "-1", "-1M", "1.5", "1.0001K", "1T", "abc", "1e3", "NaNM", "99999999999G", "1 M"} {
		if got, err := parseCount(in); err == nil {
			t.Errorf("parseCount(%q) = %d, want an error", in, got)
		}
	}
}

func TestParseFlags(t *testing.T) {
	cfg, err := parseFlags([]string{"--params", "1Mi", "--steps", "3", "--seed", "9", "--batch", "32",
		"--compute", "2", "--device-ms", "1.5", "--lr", "0.001", "--beta1", "0.8", "--beta2", "0.99",
		"--eps", "1e-6", "--weight-decay", "0.1", "--log-every", "0",
		"--fail-at-step", "2", "--fail-rank", "3", "--fail-signal", "sigkill",
		"--rebuild-timeout", "90s", "--ckpt-dir", "/ckpt", "--ckpt-every", "10"}, new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	want := Config{Params: 1 << 20, Steps: 3, Seed: 9, Batch: 32, Compute: 2, LogEvery: 0,
		DeviceTime: 1500 * time.Microsecond,
		Adam:       adamHyper{lr: 0.001, beta1: 0.8, beta2: 0.99, eps: 1e-6, weightDecay: 0.1},
		FailAtStep: 2, FailRank: 3, FailSignal: syscall.SIGKILL,
		RebuildTimeout: 90 * time.Second, CkptDir: "/ckpt", CkptEvery: 10}
	if cfg != want {
		t.Errorf("got %+v\nwant %+v", cfg, want)
	}

	def, err := parseFlags(nil, new(bytes.Buffer))
	if err != nil {
		t.Fatal(err)
	}
	if def.Params != 1_000_000 || def.Steps != 200 || def.Seed != 1 || def.Batch != 64 || def.FailAtStep != -1 ||
		def.RebuildTimeout != defaultRebuildTimeout || def.CkptDir != "" || def.CkptEvery != 0 {
		t.Errorf("defaults %+v", def)
	}
}

func TestBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--params", "0"}, "--params 0"},
		{[]string{"--params", "20G"}, "--params"},
		{[]string{"--params", "lots"}, "bad count"},
		{[]string{"--batch", "0"}, "--batch 0"},
		{[]string{"--batch", "40000"}, "--batch 40000"},
		{[]string{"--steps", "-3"}, "steps"},
		{[]string{"--compute", "0"}, "--compute 0"},
		{[]string{"--lr", "0"}, "--lr"},
		{[]string{"--lr", "NaN"}, "--lr"},
		{[]string{"--lr", "1e39"}, "--lr"},
		{[]string{"--lr", "1e-50"}, "float32"},
		{[]string{"--beta1", "1"}, "--beta1"},
		{[]string{"--beta2", "-0.1"}, "--beta2"},
		{[]string{"--beta2", "0.99999999999"}, "float32"},
		{[]string{"--eps", "0"}, "--eps"},
		{[]string{"--weight-decay", "-1"}, "--weight-decay"},
		{[]string{"--weight-decay", "100"}, "--weight-decay"},
		{[]string{"--device-ms", "-1"}, "--device-ms"},
		{[]string{"--log-every", "-1"}, "--log-every"},
		{[]string{"--fail-at-step", "200"}, "--fail-at-step 200"},
		{[]string{"--fail-at-step", "-2"}, "--fail-at-step"},
		{[]string{"--fail-rank", "-1"}, "--fail-rank"},
		{[]string{"--fail-signal", "USR1"}, "--fail-signal"},
		{[]string{"--rebuild-timeout", "-1s"}, "--rebuild-timeout"},
		{[]string{"--rebuild-timeout", "soon"}, "rebuild-timeout"},
		{[]string{"--ckpt-every", "-1", "--ckpt-dir", "d"}, "--ckpt-every -1"},
		{[]string{"--ckpt-every", "5"}, "go together"},
		{[]string{"--ckpt-dir", "d"}, "go together"},
		{[]string{"--ckpt-dir", "d", "--ckpt-every", "5", "--protect"}, "use one of them"},
		{[]string{"--nope"}, "flag provided but not defined: -nope"},
		{[]string{"extra"}, `unexpected argument "extra"`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, err := parseFlags(tc.args, new(bytes.Buffer))
			if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want a usage error containing %q", err, tc.want)
			}
		})
	}
}

func TestHelp(t *testing.T) {
	var out bytes.Buffer
	if _, err := parseFlags([]string{"-h"}, &out); !errors.Is(err, flag.ErrHelp) {
		t.Fatalf("got %v, want flag.ErrHelp", err)
	}
	for _, want := range []string{"Usage: dptrain", "-params", "-device-ms", "-fail-signal", "-rebuild-timeout", "-ckpt-dir", "1M = 1000000"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("usage lacks %q:\n%s", want, out.String())
		}
	}
}
