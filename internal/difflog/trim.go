package difflog

import (
	"github.com/gorun/gorun/durable"
)

// TrimBatches removes rank's differential records of the steps after
// after from the durable directory dir (package durable's layout: the
// batches DIR/r<rank>/diff.<a>-<b>), with durable.TrimBatches: a batch
// that ends after after is removed; one that straddles it is first
// written again as the batch of its steps up to after. A restart that
// goes back to after calls it (through the Writer's Trim) so that the
// records of the history it discarded are never replayed after those of
// the new one; a crash in the middle leaves a trim record that makes
// every reader end the log at after until a trim completes (see
// durable.TrimBatches). A straddling batch that does not read back whole
// is removed without its prefix (the log then ends before after: a gap,
// not a wrong state).
func TrimBatches(dir string, rank int, after int64) error {
	return durable.TrimBatches(dir, rank, after)
}
