package comm

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

// ErrControlLost is returned when the control-plane connection closes.
var ErrControlLost = errors.New("comm: control plane lost")

// ControlOptions tune a control-plane connection.
type ControlOptions struct {
	// Name identifies the client in the server's monitoring.
	Name string
	// PingInterval and MaxPingsOut bound how long a silent (partitioned)
	// server goes unnoticed: about PingInterval × MaxPingsOut.
	PingInterval time.Duration
	MaxPingsOut  int
	// DialTimeout bounds the initial connection.
	DialTimeout time.Duration
}

func (o ControlOptions) withDefaults() ControlOptions {
	if o.PingInterval <= 0 {
		o.PingInterval = 2 * time.Second
	}
	if o.MaxPingsOut <= 0 {
		o.MaxPingsOut = 3
	}
	if o.DialTimeout <= 0 {
		o.DialTimeout = 10 * time.Second
	}
	return o
}

// Control is an authenticated control-plane connection.
type Control struct {
	*nats.Conn
	localAddr net.Addr
	lost      chan struct{} // closed when the connection is closed
}

// LocalAddr is the local address of the connection: the address of this
// host on the interface that reaches the launcher. Nil for in-process
// connections.
func (c *Control) LocalAddr() net.Addr { return c.localAddr }

// Lost is closed when the connection has closed, for whatever reason.
func (c *Control) Lost() <-chan struct{} { return c.lost }

// recordingDialer remembers the local address of the connection it made.
type recordingDialer struct {
	d    net.Dialer
	mu   sync.Mutex
	addr net.Addr
}

func (r *recordingDialer) Dial(network, address string) (net.Conn, error) {
	c, err := r.d.Dial(network, address)
	if err == nil {
		r.mu.Lock()
		r.addr = c.LocalAddr()
		r.mu.Unlock()
	}
	return c, err
}

// DialControl connects to the control-plane server at url, authenticating
// with secret. The connection never reconnects: losing it means losing the
// launcher, and the caller must act on Lost.
func DialControl(ctx context.Context, url string, secret Secret, o ControlOptions) (*Control, error) {
	o = o.withDefaults()
	rd := &recordingDialer{d: net.Dialer{Timeout: o.DialTimeout}}
	kp, err := secret.keyPair()
	if err != nil {
		return nil, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("comm: control-plane key: %w", err)
	}
	c, err := connect(ctx, url, o, nats.SetCustomDialer(rd), nats.Nkey(pub, kp.Sign))
	if err != nil {
		return nil, err
	}
	rd.mu.Lock()
	c.localAddr = rd.addr
	rd.mu.Unlock()
	return c, nil
}

// DialInProcess connects to an embedded server without a socket. It
// authenticates with the secret's in-process password, which costs no
// public-key operation: a job whose hosts are all local never computes one.
func DialInProcess(ctx context.Context, p nats.InProcessConnProvider, secret Secret, o ControlOptions) (*Control, error) {
	return connect(ctx, "", o.withDefaults(), nats.InProcessServer(p), nats.UserInfo(wire.InProcessUser, secret.InProcessPassword()))
}

func connect(ctx context.Context, url string, o ControlOptions, extra ...nats.Option) (*Control, error) {
	c := &Control{lost: make(chan struct{})}
	var once sync.Once
	opts := append([]nats.Option{
		nats.Name(o.Name),
		nats.NoReconnect(),
		nats.PingInterval(o.PingInterval),
		nats.MaxPingsOutstanding(o.MaxPingsOut),
		nats.Timeout(o.DialTimeout),
		nats.ClosedHandler(func(*nats.Conn) { once.Do(func() { close(c.lost) }) }),
		// Errors such as a slow consumer are reported by the subscriptions
		// themselves; the default handler would print to stderr.
		nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}),
	}, extra...)
	type result struct {
		nc  *nats.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		nc, err := nats.Connect(url, opts...)
		ch <- result{nc, err}
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			return nil, fmt.Errorf("comm: connecting to control plane %s: %w", url, r.err)
		}
		c.Conn = r.nc
		return c, nil
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.nc != nil {
				r.nc.Close()
			}
		}()
		return nil, fmt.Errorf("comm: connecting to control plane %s: %w", url, context.Cause(ctx))
	}
}
