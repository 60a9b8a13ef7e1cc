package comm

import (
	"errors"
	"net"
	"sync"
)

// MultiListener accepts from several listeners as one (a rank listens on
// TCP for other hosts and on a Unix socket for its own). Addr is the first
// listener's address; Close closes them all.
type MultiListener struct {
	lns   []net.Listener
	conns chan net.Conn
	errc  chan error
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup // the accepting goroutines
}

// NewMultiListener starts accepting on every listener of lns.
func NewMultiListener(lns ...net.Listener) *MultiListener {
	m := &MultiListener{lns: lns, conns: make(chan net.Conn), errc: make(chan error, len(lns)), done: make(chan struct{})}
	for _, l := range lns {
		m.wg.Go(func() {
			for {
				c, err := l.Accept()
				if err != nil {
					m.errc <- err
					return
				}
				select {
				case m.conns <- c:
				case <-m.done:
					c.Close()
					return
				}
			}
		})
	}
	return m
}

// Accept returns the next connection from any of the listeners; once one
// listener fails, Accept returns its error.
func (m *MultiListener) Accept() (net.Conn, error) {
	select {
	case c := <-m.conns:
		return c, nil
	case err := <-m.errc:
		m.errc <- err // every later Accept fails too
		return nil, err
	case <-m.done:
		return nil, net.ErrClosed
	}
}

// Close closes every listener and waits for the accepting goroutines.
func (m *MultiListener) Close() error {
	var err error
	m.once.Do(func() {
		close(m.done)
		for _, l := range m.lns {
			err = errors.Join(err, l.Close())
		}
		m.wg.Wait()
	})
	return err
}

// Addr is the first listener's address.
func (m *MultiListener) Addr() net.Addr { return m.lns[0].Addr() }
