package gortest

import (
	"fmt"
	"os"
)

// RunHelper lets a test binary play a helper process: when the variable
// env names one of helpers, it runs it and exits with its status (98 for
// a name it does not know); otherwise it returns, and TestMain goes on to
// run the tests. Tests start the helper by re-executing os.Args[0] with
// env set.
func RunHelper(env string, helpers map[string]func() int) {
	h := os.Getenv(env)
	if h == "" {
		return
	}
	fn, ok := helpers[h]
	if !ok {
		fmt.Fprintf(os.Stderr, "unknown helper %q\n", h)
		os.Exit(98)
	}
	os.Exit(fn())
}
