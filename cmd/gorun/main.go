// Command gorun launches SPMD jobs across hosts, mpirun style, and keeps
// them alive through failures. Run `gorun --help` for usage.
package main

import (
	"os"
)

func main() {
	os.Exit(Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr))
}
