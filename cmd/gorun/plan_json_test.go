package main

import (
	"encoding/json"
	"slices"
	"sort"
	"strings"
	"testing"
)

// planJSONKeys is the --json schema (version planSchema): every key path,
// "[]" for the elements of an array. Renaming, removing or adding a key
// fails TestPlanJSONKeys: a change here is a change of the schema scripts
// read, and bumps planSchema when it is not only an addition.
var planJSONKeys = []string{
	"inputs[].name", "inputs[].raw", "inputs[].source", "inputs[].value",
	"result.checkpoint_restart.cost_per_failure.overhead_s",
	"result.checkpoint_restart.cost_per_failure.recover_s",
	"result.checkpoint_restart.cost_per_failure.replay_s",
	"result.checkpoint_restart.cost_per_failure.restore_s",
	"result.checkpoint_restart.cost_per_failure_s",
	"result.checkpoint_restart.cost_per_failure_with_fallback_s",
	"result.checkpoint_restart.efficiency",
	"result.checkpoint_restart.efficiency_with_fallback",
	"result.checkpoint_restart.expected_failures_without_spare",
	"result.checkpoint_restart.expected_lost_s",
	"result.checkpoint_restart.monte_carlo.fallbacks",
	"result.checkpoint_restart.monte_carlo.mean_s",
	"result.checkpoint_restart.monte_carlo.p50_s",
	"result.checkpoint_restart.monte_carlo.p99_s",
	"result.checkpoint_restart.name",
	"result.checkpoint_stall_fraction",
	"result.expected_failures",
	"result.host_replacement.cost_per_failure.overhead_s",
	"result.host_replacement.cost_per_failure.recover_s",
	"result.host_replacement.cost_per_failure.replay_s",
	"result.host_replacement.cost_per_failure.restore_s",
	"result.host_replacement.cost_per_failure_s",
	"result.host_replacement.cost_per_failure_with_fallback_s",
	"result.host_replacement.efficiency",
	"result.host_replacement.efficiency_with_fallback",
	"result.host_replacement.expected_failures_without_spare",
	"result.host_replacement.expected_lost_s",
	"result.host_replacement.monte_carlo.fallbacks",
	"result.host_replacement.monte_carlo.mean_s",
	"result.host_replacement.monte_carlo.p50_s",
	"result.host_replacement.monte_carlo.p99_s",
	"result.host_replacement.name",
	"result.interval_steps",
	"result.loss_bound_per_job",
	"result.loss_bound_per_window",
	"result.loss_bound_units",
	"result.loss_window_s",
	"result.monte_carlo.from_trace",
	"result.monte_carlo.mean_failures",
	"result.monte_carlo.runs",
	"result.monte_carlo.seed",
	"result.mttf_sys_s",
	"result.p_run_out_of_spares",
	"result.protect_time_s",
	"result.recommended_interval_steps",
	"result.spare_risk_threshold",
	"result.spares_needed",
	"result.survives",
	"result.write_time_s",
	"schema",
}

// TestPlanJSONKeys decodes --json generically, not into the Go structs
// that wrote it, so that a renamed tag fails (review finding 14); and
// checks the schema version and that every input's raw figure is given.
func TestPlanJSONKeys(t *testing.T) {
	code, out, errs := runPlanTest(t, append(slices.Clone(planBase), "--json", "--redundancy", "ec:2+2")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var doc map[string]any
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	var walk func(x any, path string)
	walk = func(x any, path string) {
		switch v := x.(type) {
		case map[string]any:
			for k, e := range v {
				walk(e, strings.TrimPrefix(path+"."+k, "."))
			}
		case []any:
			for _, e := range v {
				walk(e, path+"[]")
			}
		default:
			got[path] = true
		}
	}
	walk(doc, "")
	var keys []string
	for k := range got {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	if !slices.Equal(keys, planJSONKeys) {
		for _, k := range keys {
			if !slices.Contains(planJSONKeys, k) {
				t.Errorf("--json has %q, not in the schema", k)
			}
		}
		for _, k := range planJSONKeys {
			if !got[k] {
				t.Errorf("--json lacks %q", k)
			}
		}
	}
	if doc["schema"] != float64(planSchema) {
		t.Errorf("schema = %v, want %d", doc["schema"], planSchema)
	}
	for _, in := range doc["inputs"].([]any) {
		in := in.(map[string]any)
		if in["name"] == "redundancy" && in["raw"] != float64(2) {
			t.Errorf("redundancy's raw = %v, want 2 (ec:2+2 survives 2 hosts of a group)", in["raw"])
		}
	}
}
