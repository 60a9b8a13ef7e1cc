package wire

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
)

// The rank socket (GORUN_SOCKET) protocol, between a rank and its agent.
// Every message is a frame:
//
//	uint32 big-endian length of what follows, 1 byte type, payload
//
// Payloads are JSON. The rank speaks first with a Hello; the agent answers
// Welcome or Error. See PROTOCOL.md beside this file.
const (
	SockHello     byte = 1 // rank → agent: Hello
	SockWelcome   byte = 2 // agent → rank: Welcome
	SockFence     byte = 3 // rank → agent: Fence
	SockFenceDone byte = 4 // agent → rank: Fence, with every rank's values
	SockError     byte = 5 // agent → rank: SockErr
	SockEpoch     byte = 6 // agent → rank, unasked: a Welcome for a new epoch
	SockPeerLost  byte = 7 // rank → agent, unanswered: PeerLost
)

// SockVersion is the version of the rank socket protocol.
const SockVersion = 1

// MaxSockFrame bounds one frame of the rank socket.
const MaxSockFrame = 64 << 20

// Hello opens a rank's session with its agent.
type Hello struct {
	Version int `json:"v"`
	Pid     int `json:"pid"`
}

// Welcome tells a rank its world: the epoch table (encoded as by
// EpochTable.Encode) and the data-plane key (hex) its links authenticate
// with (jobkey.Secret.DataKey), the only credential a rank gets: it opens no
// control-plane connection and no replica link. It travels only over the
// rank's own socket, in a directory only the job's user can enter.
// MasterAddr and MasterPort repeat the table's torchrun rendezvous address
// (MASTER_ADDR, MASTER_PORT) of the epoch in plain JSON, so that a client
// that does not decode the table (python/gorun_rank.py) can re-create its
// process group in a new epoch; omitted when the table has none.
type Welcome struct {
	Version    int    `json:"v"`
	Job        string `json:"job"`
	Rank       int    `json:"rank"`
	Epoch      uint64 `json:"epoch"`
	DataKey    string `json:"data_key"`
	Table      []byte `json:"table"`
	MasterAddr string `json:"master_addr,omitempty"`
	MasterPort int    `json:"master_port,omitempty"`
}

// Fence is a job-wide exchange: every rank of the epoch enters with its
// values, and each leaves with the values of all (keys are global; a key
// set by two ranks is an error). The agent aggregates its host's ranks, the
// launcher the hosts, so the launcher sees one message per host.
type Fence struct {
	Epoch uint64            `json:"epoch"`
	Seq   int               `json:"seq"` // the rank's n-th fence in this epoch, from 0
	KV    map[string]string `json:"kv"`
	Err   string            `json:"err,omitempty"` // in an answer: why the fence failed
}

// PeerLost is a rank's report that its links to peer ranks broke in epoch
// Epoch (a comm.PeerLostError): the agent passes it on to the launcher
// (EventPeerLost), which suspects the peers' hosts at once. It is not
// answered, and a rank never waits for it to be read.
type PeerLost struct {
	Epoch uint64 `json:"epoch"`
	Peers []int  `json:"peers"`
}

// Check validates a PeerLost from rank, a rank of a world of world ranks.
func (p *PeerLost) Check(rank, world int) error {
	if len(p.Peers) == 0 || len(p.Peers) > MaxPeers {
		return malformed("peer lost: %d peers", len(p.Peers))
	}
	for _, r := range p.Peers {
		if r < 0 || r >= world || r == rank {
			return malformed("peer lost: rank %d of %d lost peer %d", rank, world, r)
		}
	}
	return nil
}

// SockErr reports a refused request.
type SockErr struct {
	Err string `json:"err"`
}

// MaxFenceKeys bounds the keys one rank may put in one fence.
const MaxFenceKeys = 1024

// Check validates a Fence from an untrusted source, allowing at most
// maxKeys keys.
func (f *Fence) Check(maxKeys int) error {
	if f.Seq < 0 || f.Seq > 1<<30 {
		return malformed("fence: sequence %d out of range", f.Seq)
	}
	if len(f.KV) > maxKeys {
		return malformed("fence: %d keys, at most %d", len(f.KV), maxKeys)
	}
	for k, v := range f.KV {
		if k == "" || len(k) > 256 || len(v) > MaxStringLen {
			return malformed("fence: key %q or its value too long", Truncate(k))
		}
	}
	return nil
}

// WriteSock writes one frame.
func WriteSock(w io.Writer, typ byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("wire: encoding socket message: %w", err)
	}
	if len(b)+1 > MaxSockFrame {
		return fmt.Errorf("wire: socket message of %d bytes exceeds %d", len(b), MaxSockFrame)
	}
	buf := make([]byte, 5, 5+len(b))
	binary.BigEndian.PutUint32(buf, uint32(len(b)+1))
	buf[4] = typ
	_, err = w.Write(append(buf, b...))
	return err
}

// ReadSock reads one frame: its type and payload.
func ReadSock(r io.Reader) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[:4])
	if n < 1 || n > MaxSockFrame {
		return 0, nil, malformed("socket frame of %d bytes", n)
	}
	b := make([]byte, n-1)
	if _, err := io.ReadFull(r, b); err != nil {
		return 0, nil, fmt.Errorf("wire: reading socket frame: %w", err)
	}
	return hdr[4], b, nil
}

// DecodeSock decodes a socket payload into v, strictly.
func DecodeSock(b []byte, v any) error { return decode(b, v, "socket message") }

// UpFence is an agent's aggregate of its ranks' n-th fence, to the launcher.
type UpFence struct {
	Host  int               `json:"h"`
	Epoch uint64            `json:"epoch"`
	Seq   int               `json:"seq"`
	KV    map[string]string `json:"kv"`
	// Err, when set, fails the fence for the whole job: a rank of the
	// host ended without entering it, so it can never complete.
	Err string `json:"err,omitempty"`
}

// DecodeUpFence decodes and validates an UpFence.
func DecodeUpFence(b []byte) (*UpFence, error) {
	var f UpFence
	if err := decode(b, &f, "fence"); err != nil {
		return nil, err
	}
	if f.Host < 0 || f.Host >= MaxHosts {
		return nil, malformed("fence: host %d out of range", f.Host)
	}
	fe := Fence{Epoch: f.Epoch, Seq: f.Seq, KV: f.KV}
	if err := fe.Check(MaxFenceKeys * 1024); err != nil {
		return nil, err
	}
	if err := checkString("fence error", f.Err); err != nil {
		return nil, err
	}
	return &f, nil
}

// DecodeFence decodes and validates a Fence with at most maxKeys keys
// (MaxFenceKeys from a rank; more in the launcher's merged answer).
func DecodeFence(b []byte, maxKeys int) (*Fence, error) {
	var f Fence
	if err := decode(b, &f, "fence"); err != nil {
		return nil, err
	}
	if err := f.Check(maxKeys); err != nil {
		return nil, err
	}
	return &f, nil
}
