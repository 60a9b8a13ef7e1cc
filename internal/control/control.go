package control

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/gorun/gorun/internal/jobkey"
	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
)

// ErrControlLost is returned when the control-plane connection closes.
var ErrControlLost = errors.New("control: control plane lost")

// ErrCertificatePin reports a control-plane server whose TLS certificate
// is not the one the agent was told to expect (jobkey.HostCredentials.Pin): a
// server in the middle, or another job's.
var ErrCertificatePin = errors.New("control: control-plane certificate does not match its pin")

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
	// InboxPrefix, when not empty, is where the replies to this client's
	// requests go (wire.Subjects.Inbox for an agent, the one inbox its
	// control-plane user may subscribe to).
	InboxPrefix string
	// Logger, when not nil, hears of publications and subscriptions the
	// server refused (a permission violation: a bug, since each client
	// knows its permissions).
	Logger *slog.Logger
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

// DialControl connects to the control-plane server at url as the agent of
// creds.Host, proving it holds the host's nkey seed. When creds.Pin is set
// the connection is TLS and the server must present the certificate whose
// SHA-256 is the pin (nothing else about it is checked: it is the job's
// own, self-signed); a server that does not is refused with an error
// matching ErrCertificatePin. The connection never reconnects: losing it
// means losing the launcher, and the caller must act on Lost.
func DialControl(ctx context.Context, url string, creds jobkey.HostCredentials, o ControlOptions) (*Control, error) {
	o = o.withDefaults()
	rd := &recordingDialer{d: net.Dialer{Timeout: o.DialTimeout}}
	kp, err := keyPair(creds)
	if err != nil {
		return nil, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("control: control-plane key: %w", err)
	}
	extra := []nats.Option{nats.SetCustomDialer(rd), nats.Nkey(pub, kp.Sign)}
	if len(creds.Pin) > 0 {
		extra = append(extra, nats.Secure(pinnedTLS(creds.Pin)))
	}
	c, err := connect(ctx, url, o, extra...)
	if err != nil {
		return nil, err
	}
	rd.mu.Lock()
	c.localAddr = rd.addr
	rd.mu.Unlock()
	return c, nil
}

// pinnedTLS is a client configuration that accepts exactly the server
// certificate whose SHA-256 is pin. The usual chain and name checks are
// off (InsecureSkipVerify) because the pin replaces them: the certificate
// is self-signed for one job, and VerifyConnection, which Go calls even
// then, refuses any other.
func pinnedTLS(pin []byte) *tls.Config {
	want := append([]byte(nil), pin...)
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return fmt.Errorf("%w: the server presented no certificate", ErrCertificatePin)
			}
			got := sha256.Sum256(cs.PeerCertificates[0].Raw)
			if subtle.ConstantTimeCompare(got[:], want) != 1 {
				return ErrCertificatePin
			}
			return nil
		},
	}
}

// DialInProcess connects the launcher to its embedded server without a
// socket, as the launcher's user (every subject). It authenticates with
// the secret's in-process password, which costs no public-key operation.
func DialInProcess(ctx context.Context, p nats.InProcessConnProvider, secret jobkey.Secret, o ControlOptions) (*Control, error) {
	return connect(ctx, "", o.withDefaults(), nats.InProcessServer(p), nats.UserInfo(wire.InProcessUser, secret.InProcessPassword()))
}

// DialInProcessHost connects the agent of the launcher's own host to the
// embedded server without a socket, as that host's user: it has the same
// permissions as a remote host's agent.
func DialInProcessHost(ctx context.Context, p nats.InProcessConnProvider, creds jobkey.HostCredentials, o ControlOptions) (*Control, error) {
	return connect(ctx, "", o.withDefaults(), nats.InProcessServer(p), nats.UserInfo(wire.HostUser(creds.Host), creds.InProcessPassword()))
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
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if o.Logger != nil && errors.Is(err, nats.ErrPermissionViolation) {
				o.Logger.Warn("control plane refused", "err", err)
			}
		}),
	}, extra...)
	if o.InboxPrefix != "" {
		opts = append(opts, nats.CustomInboxPrefix(o.InboxPrefix))
	}
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
			return nil, fmt.Errorf("control: connecting to control plane %s: %w", url, r.err)
		}
		c.Conn = r.nc
		return c, nil
	case <-ctx.Done():
		go func() {
			if r := <-ch; r.nc != nil {
				r.nc.Close()
			}
		}()
		return nil, fmt.Errorf("control: connecting to control plane %s: %w", url, context.Cause(ctx))
	}
}
