package crc32c

import (
	"bytes"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// want is hash/crc32's answer, which Update must equal.
func want(crc uint32, p []byte) uint32 { return crc32.Update(crc, table(), p) }

// randomBytes returns n bytes of a fixed pseudo-random sequence.
func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 0x9e3779b97f4a7c15))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64()
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	for i := n &^ 7; i < n; i++ {
		b[i] = byte(r.Uint32())
	}
	return b
}

// initials are the initial CRCs every input is checked from: the edges
// and a few random values.
var initials = []uint32{0, 0xffffffff, 0x80000000, 0x00000001, 0x5a3c96e1, 0xdeadbeef}

// TestUpdate checks Update, and the folding code alone, against
// hash/crc32 at every length 0..2048, every alignment 0..63, from each
// initial CRC.
func TestUpdate(t *testing.T) {
	t.Logf("folding code in use: %v (from %d bytes)", useFold, foldMin)
	const maxLen, maxAlign = 2048, 64
	buf := randomBytes(1, maxLen+maxAlign)
	r := rand.New(rand.NewPCG(2, 3))
	for n := 0; n <= maxLen; n++ {
		for a := range maxAlign {
			p := buf[a : a+n]
			for _, c := range append(initials, r.Uint32()) {
				w := want(c, p)
				if got := Update(c, p); got != w {
					t.Fatalf("Update(%#x, %d bytes at alignment %d) = %#x, want %#x", c, n, a, got, w)
				}
				if useFold && n >= foldMin {
					if got := ^foldUpdate(^c, p); got != w {
						t.Fatalf("foldUpdate(%#x, %d bytes at alignment %d) = %#x, want %#x", ^c, n, a, ^got, ^w)
					}
				}
			}
		}
	}
}

// TestUpdate256 checks Update256 against hash/crc32 from each initial
// CRC, on random 256-byte arrays and all-0x00 and all-0xff ones.
func TestUpdate256(t *testing.T) {
	r := rand.New(rand.NewPCG(4, 5))
	ps := []*[256]byte{new([256]byte), (*[256]byte)(bytes.Repeat([]byte{0xff}, 256))}
	for i := range 8 {
		ps = append(ps, (*[256]byte)(randomBytes(uint64(10+i), 256)))
	}
	for _, p := range ps {
		for _, c := range append(initials, r.Uint32()) {
			if got, w := Update256(c, p), want(c, p[:]); got != w {
				t.Fatalf("Update256(%#x, % x...) = %#x, want %#x", c, p[:8], got, w)
			}
		}
	}
}

// TestUpdateEdgeBytes checks inputs whose bytes are all 0x00 or all 0xff,
// and a single set bit at each position of a 2 KiB input.
func TestUpdateEdgeBytes(t *testing.T) {
	for _, fill := range []byte{0x00, 0xff} {
		p := bytes.Repeat([]byte{fill}, 4099)
		for _, n := range []int{0, 1, 63, 64, 255, 256, 257, 1024, 4096, 4099} {
			for _, c := range initials {
				if got, w := Update(c, p[:n]), want(c, p[:n]); got != w {
					t.Errorf("Update(%#x, %d bytes of %#x) = %#x, want %#x", c, n, fill, got, w)
				}
			}
		}
	}
	p := make([]byte, 2048)
	for bit := range 8 * len(p) {
		p[bit/8] = 1 << (bit % 8)
		if got, w := Update(0, p), want(0, p); got != w {
			t.Fatalf("Update(0, bit %d set) = %#x, want %#x", bit, got, w)
		}
		p[bit/8] = 0
	}
}

// TestUpdateLarge checks large inputs of odd sizes, whole and in pieces
// (Update(Update(0, a), b) is the CRC of a‖b).
func TestUpdateLarge(t *testing.T) {
	sizes := []int{4095, 4097, 65536 + 17, 1<<20 - 1, 3<<20 + 255, 16<<20 + 1}
	if !testing.Short() {
		sizes = append(sizes, 64<<20-5, 64<<20)
	}
	buf := randomBytes(4, 64<<20+64)
	for _, n := range sizes {
		for _, a := range []int{0, 1, 31, 63} {
			p := buf[a : a+n]
			w := want(0x1234abcd, p)
			if got := Update(0x1234abcd, p); got != w {
				t.Errorf("Update(%d bytes at alignment %d) = %#x, want %#x", n, a, got, w)
			}
			cut := n/3 + a
			if got := Update(Update(0x1234abcd, p[:cut]), p[cut:]); got != w {
				t.Errorf("Update in pieces %d+%d = %#x, want %#x", cut, n-cut, got, w)
			}
		}
	}
}

// TestChecksum checks Checksum against crc32.Checksum.
func TestChecksum(t *testing.T) {
	for _, n := range []int{0, 1, 100, 300, 5000, 1 << 16} {
		p := randomBytes(uint64(n), n)
		if got, w := Checksum(p), crc32.Checksum(p, crc32.MakeTable(crc32.Castagnoli)); got != w {
			t.Errorf("Checksum(%d bytes) = %#x, want %#x", n, got, w)
		}
	}
	// The check value of the CRC-32C catalogue entry.
	if got := Checksum([]byte("123456789")); got != 0xe3069283 {
		t.Errorf("Checksum(123456789) = %#x, want 0xe3069283", got)
	}
}

func FuzzUpdate(f *testing.F) {
	f.Add(uint32(0), []byte{})
	f.Add(uint32(0xffffffff), randomBytes(5, 64))
	f.Add(uint32(0x5a3c96e1), randomBytes(6, 300))
	f.Add(uint32(1), randomBytes(7, 4111))
	f.Fuzz(func(t *testing.T, crc uint32, p []byte) {
		w := want(crc, p)
		if got := Update(crc, p); got != w {
			t.Fatalf("Update(%#x, %d bytes) = %#x, want %#x", crc, len(p), got, w)
		}
		if useFold && len(p) >= foldMin {
			if got := ^foldUpdate(^crc, p); got != w {
				t.Fatalf("foldUpdate(%d bytes) = %#x, want %#x", len(p), ^got, ^w)
			}
		}
	})
}

// BenchmarkChecksum measures Checksum and hash/crc32 on inputs of a few
// sizes, cached (64 KiB) and not (64 MiB), as separate benchmarks.
func BenchmarkChecksum(b *testing.B) {
	for _, n := range []int{64 << 10, 64 << 20} {
		p := randomBytes(8, n)
		b.Run(fmt.Sprintf("size=%s/impl=hash-crc32", sizeName(n)), func(b *testing.B) {
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				crc32.Checksum(p, table())
			}
		})
		b.Run(fmt.Sprintf("size=%s/impl=crc32c", sizeName(n)), func(b *testing.B) {
			b.SetBytes(int64(n))
			b.ReportAllocs()
			for b.Loop() {
				Checksum(p)
			}
		})
	}
}

// BenchmarkRatio runs hash/crc32 and Checksum alternately on the same
// input, in the same run, and reports each one's MB/s and the ratio
// (crc32c's speed over hash/crc32's).
func BenchmarkRatio(b *testing.B) {
	for _, n := range []int{64 << 10, 64 << 20} {
		p := randomBytes(9, n)
		b.Run("size="+sizeName(n), func(b *testing.B) {
			var std, ours int64 // nanoseconds
			k := 0
			for b.Loop() {
				t0 := nanotime()
				s1 := crc32.Checksum(p, table())
				t1 := nanotime()
				s2 := Checksum(p)
				t2 := nanotime()
				if s1 != s2 {
					b.Fatalf("Checksum = %#x, hash/crc32 %#x", s2, s1)
				}
				std += t1 - t0
				ours += t2 - t1
				k++
			}
			mb := float64(n) * float64(k) / 1e6
			b.ReportMetric(mb/(float64(std)/1e9), "hash-crc32-MB/s")
			b.ReportMetric(mb/(float64(ours)/1e9), "crc32c-MB/s")
			b.ReportMetric(float64(std)/float64(ours), "ratio")
		})
	}
}

// BenchmarkSmall compares hash/crc32 with the folding code on short
// inputs: where the folding code starts to pay is foldMin.
func BenchmarkSmall(b *testing.B) {
	if !useFold {
		b.Skip("no folding code on this processor or build")
	}
	for _, n := range []int{64, 128, 192, 256, 320, 384, 512, 1024, 4096} {
		p := randomBytes(10, n)
		b.Run(fmt.Sprintf("size=%d/impl=hash-crc32", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				crc32.Checksum(p, table())
			}
		})
		b.Run(fmt.Sprintf("size=%d/impl=fold", n), func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				foldUpdate(0xffffffff, p)
			}
		})
	}
}

func sizeName(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%dMiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%dKiB", n>>10)
	}
	return fmt.Sprint(n)
}

// TestCopyUpdate: CopyUpdate leaves dst equal to src and returns src's
// CRC32C from the initial value, for lengths around the block size.
func TestCopyUpdate(t *testing.T) {
	src := make([]byte, 3*copyBlock+17)
	for i := range src {
		src[i] = byte(i*7 + i>>9)
	}
	for _, n := range []int{0, 1, 63, 64, copyBlock - 1, copyBlock, copyBlock + 1, 2*copyBlock + 5, len(src)} {
		for _, init := range []uint32{0, 0xffffffff, 0x12345678} {
			dst := make([]byte, n+3)
			got := CopyUpdate(init, dst, src[:n])
			if want := crc32.Update(init, crc32.MakeTable(crc32.Castagnoli), src[:n]); got != want {
				t.Fatalf("CopyUpdate(%#x) of %d bytes = %#08x, want %#08x", init, n, got, want)
			}
			if !bytes.Equal(dst[:n], src[:n]) || dst[n] != 0 {
				t.Fatalf("%d bytes: dst differs from src, or was written past n", n)
			}
		}
	}
}
