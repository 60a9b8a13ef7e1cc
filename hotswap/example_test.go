package hotswap_test

import (
	"fmt"
	"time"

	"github.com/gorun/gorun/hotswap"
	"github.com/gorun/gorun/topology"
)

// A host is lost; its ranks move to the spare in a new epoch.
func ExampleMachine() {
	m, err := hotswap.New(hotswap.Config{
		World:   4,
		Hosts:   []topology.Host{{Name: "a", Slots: 2}, {Name: "b", Slots: 2}, {Name: "s", Slots: 2, Spare: true}},
		Assign:  []int{0, 0, 1, 1},
		Holders: [][]int{{2}, {3}, {0}, {1}},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	m.Step(0, hotswap.AgentRegistered{Host: 2, Spare: true})
	m.Step(time.Second, hotswap.GPublished{G: 41})
	for _, a := range m.Step(2*time.Second, hotswap.AgentExited{Host: 1, Why: "connection reset"}) {
		fmt.Println(a)
	}
	// Output:
	// failed host=b class=host-loss (agent) decision=splice epoch=1 why="its agent exited: connection reset"
	// fence host=b
	// report: host b lost: its agent exited: connection reset; moving ranks 2-3 to spare s (epoch 1), resuming from step 41
	// splice lost=b with=s (spare) ranks=2-3
	// restart gen=1 epoch=1 from=41
	// publish epoch=1 g=41 table=a:0-1 s:2-3 holders=0:2 1:3 2:0 3:1
	// restore epoch=1 g=41 local=0-1 r2<-opt:r0@a,params:r0@a r3<-opt:r1@a,params:r0@a
	// report: under-protected: 2 optimizer shards lost a copy (of 1) until it is re-sent
	// under-protected owners=0-1
}
