package jobstatus

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"syscall"
	"time"

	"github.com/gorun/gorun/internal/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// ErrCertificatePin is returned when the server's certificate is not the
// one the registry entry pins.
var ErrCertificatePin = errors.New("jobstatus: the control plane's certificate does not match the registry's pin")

// Query asks e's launcher for a snapshot of its job, with every rank's
// row if ranks. It connects with e's status credential, and closes the
// connection before it returns.
func Query(ctx context.Context, e *Entry, ranks bool) (*Snapshot, error) {
	if !wire.ValidJobID(e.Job) {
		return nil, fmt.Errorf("jobstatus: invalid job id %q", e.Job)
	}
	kp, err := nkeys.FromSeed([]byte(e.Seed))
	if err != nil {
		return nil, fmt.Errorf("jobstatus: the registry's status credential: %w", err)
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, fmt.Errorf("jobstatus: the registry's status credential: %w", err)
	}
	subj := wire.JobSubjects(e.Job)
	opts := []nats.Option{nats.Nkey(pub, kp.Sign), nats.CustomInboxPrefix(subj.StatusInbox()), nats.NoReconnect(), nats.Name("gorun status")}
	if e.Pin != "" {
		pin, err := hex.DecodeString(e.Pin)
		if err != nil || len(pin) != sha256.Size {
			return nil, fmt.Errorf("jobstatus: the registry's certificate pin is malformed")
		}
		opts = append(opts, nats.Secure(pinnedTLS(pin)))
	}
	if d, ok := ctx.Deadline(); ok {
		opts = append(opts, nats.Timeout(max(0, timeUntil(d))))
	}
	nc, err := nats.Connect(e.URL, opts...)
	if err != nil {
		return nil, fmt.Errorf("jobstatus: job %s: %w", e.Job, err)
	}
	defer nc.Close()
	req, _ := json.Marshal(&wire.StatusRequest{Ranks: ranks})
	m, err := nc.RequestWithContext(ctx, subj.Status(), req)
	if err != nil {
		return nil, fmt.Errorf("jobstatus: job %s: %w", e.Job, err)
	}
	var s Snapshot
	if err := json.Unmarshal(m.Data, &s); err != nil {
		return nil, fmt.Errorf("jobstatus: job %s: bad snapshot: %w", e.Job, err)
	}
	return &s, nil
}

// pinnedTLS accepts exactly the certificate whose SHA-256 is pin (as
// comm's agents do: the certificate is self-signed for one job).
func pinnedTLS(pin []byte) *tls.Config {
	return &tls.Config{
		MinVersion:         tls.VersionTLS13,
		InsecureSkipVerify: true,
		VerifyConnection: func(cs tls.ConnectionState) error {
			if len(cs.PeerCertificates) == 0 {
				return ErrCertificatePin
			}
			got := sha256.Sum256(cs.PeerCertificates[0].Raw)
			if subtle.ConstantTimeCompare(got[:], pin) != 1 {
				return ErrCertificatePin
			}
			return nil
		},
	}
}

func timeUntil(d time.Time) time.Duration { return time.Until(d) }

// Refused reports whether e's control plane refuses connections (nothing
// listens at its URL any more: its launcher is ending, or its server is
// gone), which Query's error does not tell.
func Refused(ctx context.Context, e *Entry) bool {
	u, err := url.Parse(e.URL)
	if err != nil || u.Host == "" {
		return false
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", u.Host)
	if err == nil {
		c.Close()
		return false
	}
	return errors.Is(err, syscall.ECONNREFUSED)
}
