// Command hello is the smallest gorun job: every rank says who it is and
// where, and rank 0 checks in every other rank over TCP at
// MASTER_ADDR:MASTER_PORT, as a torchrun-style trainer would.
//
//	gorun -np 4 ./bin/hello
package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"
)

func main() {
	rank, _ := strconv.Atoi(os.Getenv("RANK"))
	world, _ := strconv.Atoi(os.Getenv("WORLD_SIZE"))
	if world == 0 {
		fmt.Fprintln(os.Stderr, "hello: run me under gorun: gorun -np 4 hello")
		os.Exit(2)
	}
	host, _ := os.Hostname()
	fmt.Printf("hello from rank %d of %d on %s (local rank %s of %s)\n",
		rank, world, host, os.Getenv("LOCAL_RANK"), os.Getenv("LOCAL_WORLD_SIZE"))
	master := net.JoinHostPort(os.Getenv("MASTER_ADDR"), os.Getenv("MASTER_PORT"))
	if err := checkIn(rank, world, master); err != nil {
		fmt.Fprintf(os.Stderr, "rank %d: %v\n", rank, err)
		os.Exit(1)
	}
}

// checkIn has rank 0 accept one connection from every other rank.
func checkIn(rank, world int, master string) error {
	deadline := time.Now().Add(30 * time.Second)
	if rank == 0 {
		l, err := net.Listen("tcp", master)
		if err != nil {
			return err
		}
		defer l.Close()
		l.(*net.TCPListener).SetDeadline(deadline)
		for range world - 1 {
			c, err := l.Accept()
			if err != nil {
				return err
			}
			line, err := bufio.NewReader(c).ReadString('\n')
			c.Close()
			if err != nil {
				return err
			}
			_ = line
		}
		fmt.Printf("rank 0: all %d ranks checked in at %s\n", world, master)
		return nil
	}
	for {
		c, err := net.DialTimeout("tcp", master, time.Second)
		if err == nil {
			_, err = fmt.Fprintf(c, "%d\n", rank)
			c.Close()
			return err
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(10 * time.Millisecond) // rank 0 is not listening yet
	}
}
