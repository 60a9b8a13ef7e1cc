package durable

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"

	"github.com/gorun/gorun/internal/crc32c"
)

var le = binary.LittleEndian

const formatVersion = 1

// Magic numbers of the files (see the package comment).
var (
	magicManifest = [4]byte{'G', 'R', 'D', 'M'}
	magicBase     = [4]byte{'G', 'R', 'D', 'B'}
	magicPointer  = [4]byte{'G', 'R', 'D', 'P'}
	magicMarker   = [4]byte{'G', 'R', 'D', 'K'}
	magicCommit   = [4]byte{'G', 'R', 'D', 'C'}
	magicBatch    = [4]byte{'G', 'R', 'D', 'L'}
)

// checkPreamble checks the first 8 bytes every file starts with: magic,
// format version, three zeros. b holds at least 8 bytes.
func checkPreamble(b []byte, magic [4]byte, path string) error {
	switch {
	case !bytes.Equal(b[:4], magic[:]):
		return corruptErr(path, 0, 4, "magic %q, want %q", b[:4], magic[:])
	case b[4] != formatVersion:
		return corruptErr(path, 4, 5, "format version %d, want %d", b[4], formatVersion)
	case b[5] != 0 || b[6] != 0 || b[7] != 0:
		return corruptErr(path, 5, 8, "reserved bytes are not zero")
	}
	return nil
}

func putPreamble(b []byte, magic [4]byte) {
	copy(b, magic[:])
	b[4] = formatVersion
}

// checkZero returns an error if b[off:end] is not all zero.
func checkZero(b []byte, off, end int, path string) error {
	for i := off; i < end; i++ {
		if b[i] != 0 {
			return corruptErr(path, int64(i), int64(end), "reserved bytes are not zero")
		}
	}
	return nil
}

// ---- the manifest ----

const (
	manifestHdr    = 16
	maxManifestLen = 1 << 20
)

func encodeManifest(m *Manifest) ([]byte, error) {
	body, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("durable: encoding the manifest: %w", err)
	}
	if len(body) > maxManifestLen {
		return nil, fmt.Errorf("durable: the manifest is %d bytes, more than %d", len(body), maxManifestLen)
	}
	b := make([]byte, manifestHdr+len(body))
	putPreamble(b, magicManifest)
	le.PutUint32(b[8:], uint32(len(body)))
	le.PutUint32(b[12:], crc32c.Checksum(body))
	copy(b[manifestHdr:], body)
	return b, nil
}

// parseManifest checks and decodes a manifest file's bytes.
func parseManifest(b []byte, path string) (*Manifest, error) {
	if len(b) < manifestHdr {
		return nil, corruptErr(path, int64(len(b)), manifestHdr, "%d bytes, shorter than the header", len(b))
	}
	if err := checkPreamble(b, magicManifest, path); err != nil {
		return nil, err
	}
	n := int64(le.Uint32(b[8:]))
	if n < 2 || n > maxManifestLen {
		return nil, corruptErr(path, 8, 12, "body length %d, want 2 to %d", n, maxManifestLen)
	}
	if int64(len(b)) != manifestHdr+n {
		// The length field or the end of the file is wrong.
		return nil, corruptErr(path, 8, max(int64(len(b)), manifestHdr+n), "%d bytes, the header says %d", len(b), manifestHdr+n)
	}
	body := b[manifestHdr:]
	if got, want := crc32c.Checksum(body), le.Uint32(b[12:]); got != want {
		return nil, corruptErr(path, 12, manifestHdr+n, "CRC32C %#08x, the header says %#08x", got, want)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	var m Manifest
	if err := dec.Decode(&m); err != nil {
		return nil, corruptErr(path, manifestHdr, manifestHdr+n, "body: %v", err)
	}
	if dec.More() {
		return nil, corruptErr(path, manifestHdr+dec.InputOffset(), manifestHdr+n, "bytes after the body")
	}
	if err := m.check(); err != nil {
		return nil, corruptErr(path, manifestHdr, manifestHdr+n, "%v", err)
	}
	return &m, nil
}

// check checks a manifest's fields.
func (m *Manifest) check() error {
	switch {
	case !validJob(m.Job):
		return fmt.Errorf("durable: manifest: bad job id %q", m.Job)
	case m.World < 1 || m.World > MaxWorld:
		return fmt.Errorf("durable: manifest: world size %d, want 1 to %d", m.World, MaxWorld)
	case len(m.Regions) != m.World:
		return fmt.Errorf("durable: manifest: regions of %d ranks, world size %d", len(m.Regions), m.World)
	case m.Every < 1:
		return fmt.Errorf("durable: manifest: ckpt-every %d, want ≥ 1", m.Every)
	}
	for r, regs := range m.Regions {
		if err := checkRegions(regs); err != nil {
			return fmt.Errorf("manifest: rank %d: %w", r, err)
		}
	}
	return nil
}

// ---- pointer and markers ----

const ptrSize = 40

// pointer is the content of LATEST and of a marker: which base file
// holds which complete version.
type pointer struct {
	rank    int
	file    int
	step    int64
	version uint64
	hdrCRC  uint32 // CRC32C of the file's complete header, all 4096 bytes
}

func encodePointer(magic [4]byte, p pointer) []byte {
	b := make([]byte, ptrSize)
	putPreamble(b, magic)
	le.PutUint32(b[8:], uint32(p.rank))
	le.PutUint32(b[12:], uint32(p.file))
	le.PutUint64(b[16:], uint64(p.step))
	le.PutUint64(b[24:], p.version)
	le.PutUint32(b[32:], p.hdrCRC)
	le.PutUint32(b[36:], crc32c.Checksum(b[:36]))
	return b
}

// parsePointer checks and decodes a pointer or marker of rank.
func parsePointer(b []byte, magic [4]byte, rank int, path string) (pointer, error) {
	if len(b) != ptrSize {
		return pointer{}, corruptErr(path, min(int64(len(b)), ptrSize), max(int64(len(b)), ptrSize), "%d bytes, want %d", len(b), ptrSize)
	}
	if err := checkPreamble(b, magic, path); err != nil {
		return pointer{}, err
	}
	if got, want := crc32c.Checksum(b[:36]), le.Uint32(b[36:]); got != want {
		return pointer{}, corruptErr(path, 0, ptrSize, "CRC32C %#08x, the file says %#08x", got, want)
	}
	p := pointer{
		rank:    int(le.Uint32(b[8:])),
		file:    int(le.Uint32(b[12:])),
		step:    int64(le.Uint64(b[16:])),
		version: le.Uint64(b[24:]),
		hdrCRC:  le.Uint32(b[32:]),
	}
	switch {
	case p.rank != rank:
		return pointer{}, corruptErr(path, 8, 12, "rank %d, want %d", p.rank, rank)
	case p.file > 1<<20:
		return pointer{}, corruptErr(path, 12, 16, "base file %d out of range", p.file)
	case p.step < 0:
		return pointer{}, corruptErr(path, 16, 24, "negative step")
	case p.version == 0:
		return pointer{}, corruptErr(path, 24, 32, "version 0")
	}
	return p, nil
}

// ---- the commit record ----

const commitSize = 24

func encodeCommit(step int64) []byte {
	b := make([]byte, commitSize)
	putPreamble(b, magicCommit)
	le.PutUint64(b[8:], uint64(step))
	le.PutUint32(b[20:], crc32c.Checksum(b[:20]))
	return b
}

func parseCommit(b []byte, path string) (int64, error) {
	if len(b) != commitSize {
		return 0, corruptErr(path, min(int64(len(b)), commitSize), max(int64(len(b)), commitSize), "%d bytes, want %d", len(b), commitSize)
	}
	if err := checkPreamble(b, magicCommit, path); err != nil {
		return 0, err
	}
	if got, want := crc32c.Checksum(b[:20]), le.Uint32(b[20:]); got != want {
		return 0, corruptErr(path, 0, commitSize, "CRC32C %#08x, the file says %#08x", got, want)
	}
	if err := checkZero(b, 16, 20, path); err != nil {
		return 0, err
	}
	step := int64(le.Uint64(b[8:]))
	if step < 0 {
		return 0, corruptErr(path, 8, 16, "negative step")
	}
	return step, nil
}
