package replay

import (
	"math"
	"math/bits"
	"sync"
	"unsafe"
)

// The TopK codec.

// topkSampleAbove is how many sampled entries TopK expects above the
// threshold it estimates, at least: the sample has at least
// topkSampleAbove/K entries.
//
// Whatever the distribution of the values, the fraction of the tensor
// above the sample's r-th largest magnitude, with r = K·m for a random
// sample of m entries, has a relative standard deviation of about
// sqrt((1-K)/(K·m)) (a binomial count; the jittered-stride sample is
// stratified, which can only lower it). With K·m >= 2048 that is at most
// 2.2%, so the kept count stays within ±10% of ceil(K·Len) at 4.5 standard
// deviations (a chance of about 1e-5 to miss per tensor);
// TestTopKKeptCount measures it on normal, Cauchy, all-equal and
// periodic data, and TestTopKSampleSpread checks the spread against this
// model over many seeds. When the sample would be half the tensor or more
// (Len below 409 600 at K = 0.01) the whole tensor is taken, and the
// count is exact. The cost of the estimate is then bounded by 2·2048/K
// gathered entries and a radix selection over them, whatever Len.
const topkSampleAbove = 2048

func (t *Tensor) compressTopK(x []float32, p codecParams) {
	n := len(x)
	if n == 0 {
		return
	}
	target := topkTarget(n, p.k)
	thr, budget := topkThreshold(x, target, p.k, p.seed)
	t.thr = thr
	if want := target + target/8 + 16; cap(t.idx) < want || cap(t.vals) < want {
		t.idx, t.vals = make([]int32, 0, want), make([]uint16, 0, want)
	}
	scan := codecKernels.scan
	for base := 0; base < n; {
		end := base + min(maxChunk, n-base)
		start := len(t.idx)
		t.idx, t.vals, budget = scan(x[base:end], thr, budget, t.idx, t.vals)
		t.chunks = append(t.chunks, topkChunk{base: base, start: start, count: len(t.idx) - start})
		base = end
	}
}

// topkTarget is ceil(K·n), at least 1, at most n.
func topkTarget(n int, k float64) int {
	c := math.Ceil(k * float64(n))
	if c >= float64(n) {
		return n
	}
	return max(int(c), 1)
}

// topkSampleSize is the number of entries TopK samples from n (n when
// it takes them all), and the log2 of the strata's width: n is cut into
// strata of 2^shift entries (and a last, shorter one), 2^shift the
// largest power of two with at least topkSampleAbove/K strata, and one
// entry is drawn in each; so there are between topkSampleAbove/K and
// twice that.
func topkSampleSize(n int, k float64) (m int, shift uint) {
	want := math.Ceil(topkSampleAbove / k)
	if want >= float64(n)/2 {
		return n, 0
	}
	shift = uint(bits.Len(uint(float64(n)/want))) - 1 // floor(log2(n/want)) >= 1
	return ceilDiv(n, 1<<shift), shift
}

// topkScratch holds the sample and the candidates of topkThreshold;
// pooled so that the per-step path does not allocate.
type topkScratch struct {
	keys, cand []uint32
	hist       [2048]uint32
}

var topkScratchPool = sync.Pool{New: func() any { return new(topkScratch) }}

// topkThreshold estimates the magnitude key (|x|'s bits) above which
// about target entries of x lie, and the tie budget: how many entries
// equal to it to keep too. Entries are kept if their key is > thr, or ==
// thr while the budget lasts.
func topkThreshold(x []float32, target int, k float64, seed uint64) (thr uint32, budget int) {
	n := len(x)
	if target >= n {
		return 0, 0 // every non-zero entry
	}
	m, shift := topkSampleSize(n, k)
	s := topkScratchPool.Get().(*topkScratch)
	defer topkScratchPool.Put(s)
	keys, r := f32bits(x), target // all of x: the exact threshold
	if m != n {
		s.keys = resize(s.keys, m)
		keys = s.keys
		topkSample(x, keys, shift, seed)
		r = int(math.Round(float64(target) * float64(m) / float64(n)))
		r = min(max(r, 1), m)
	}
	var above int
	thr, above, s.cand = topkSelect(keys, r, s.cand, &s.hist)
	if thr == 0 {
		return 0, 0 // keep the non-zero entries, no zeros
	}
	estAbove := above
	if m != n {
		estAbove = int(math.Round(float64(above) * float64(n) / float64(m)))
	}
	return thr, max(target-estAbove, 0)
}

// topkSelect returns the r-th largest (1 <= r <= len(keys)) of the keys
// k&0x7fffffff and how many are strictly larger, in linear time and
// mostly in one fast pass: a sub-sample of every 32nd key gives a lower
// bound L with, all but certainly, a few times r keys at or above it (3r
// expected, or more: L is the bottom of a histogram bin; fewer than r
// would take a relative deviation of at least 66% of a count over at
// least 32 sub-sampled keys); one branch-free pass copies those keys to
// cand; a radix selection over them finds the key. Should the bound fail,
// all keys are the candidates.
func topkSelect(keys []uint32, r int, cand []uint32, hist *[2048]uint32) (key uint32, above int, _ []uint32) {
	const abs = 0x7fffffff
	m := len(keys)
	lo := uint32(0)
	if sub := m / 32; sub >= 256 {
		clear(hist[:])
		for i := 0; i < m; i += 32 {
			hist[keys[i]&abs>>20]++
		}
		if want := max(3*ceilDiv(r*sub, m), 32); want < sub {
			b, _ := pickBin(hist[:], want)
			lo = b << 20 // the bottom of the bin of the want-th largest: at least want sub-sampled keys at or above
		}
	}
	cand = cand[:0]
	if lo > 0 {
		cand = codecKernels.keysAtLeast(keys, lo, resize(cand, m))
	}
	if len(cand) < r {
		cand = resize(cand, m)
		for i, k := range keys {
			cand[i] = k & abs
		}
	}
	clear(hist[:])
	keyHistogram(cand, hist)
	key, above = radixSelect(cand, hist, r)
	return key, above, cand
}

// topkSample fills keys with the magnitude keys (|x|'s bits) of a
// jittered-stride sample of x: x is cut into strata of 2^shift
// consecutive entries (the last one possibly shorter) and one entry is
// drawn uniformly in each, so that the sample spreads over the whole
// tensor like a fixed stride but cannot alias with a periodic structure
// of the values. The strata being powers of two, a jitter is shift random
// bits: one 64-bit draw serves 8 strata of up to 256 entries, or 4 of up
// to 65536.
func topkSample(x []float32, keys []uint32, shift uint, seed uint64) {
	const abs = 0x7fffffff
	u := f32bits(x)
	full := len(u) >> shift // whole strata
	keys = keys[:ceilDiv(len(u), 1<<shift)]
	w := 1 << shift
	mask := uint64(w - 1)
	rng := seed ^ 0x6a09e667f3bcc909
	var r uint64
	i := 0
	// Unrolled with constant shifts of the random bits: variable ones
	// would tie up CX and spill the loop's state.
	switch {
	case shift <= 8:
		for ; i+8 <= full; i += 8 {
			r, rng = wyrand(rng)
			k, b := keys[i:i+8:i+8], i<<shift
			k[0] = u[b+int(r&mask)] & abs
			k[1] = u[b+w+int(r>>8&mask)] & abs
			k[2] = u[b+2*w+int(r>>16&mask)] & abs
			k[3] = u[b+3*w+int(r>>24&mask)] & abs
			k[4] = u[b+4*w+int(r>>32&mask)] & abs
			k[5] = u[b+5*w+int(r>>40&mask)] & abs
			k[6] = u[b+6*w+int(r>>48&mask)] & abs
			k[7] = u[b+7*w+int(r>>56&mask)] & abs
		}
	case shift <= 16:
		for ; i+4 <= full; i += 4 {
			r, rng = wyrand(rng)
			k, b := keys[i:i+4:i+4], i<<shift
			k[0] = u[b+int(r&mask)] & abs
			k[1] = u[b+w+int(r>>16&mask)] & abs
			k[2] = u[b+2*w+int(r>>32&mask)] & abs
			k[3] = u[b+3*w+int(r>>48&mask)] & abs
		}
	}
	for ; i < full; i++ {
		r, rng = wyrand(rng)
		keys[i] = u[i<<shift+int(r&mask)] & abs
	}
	if full < len(keys) { // the last, shorter stratum
		r, _ = wyrand(rng)
		keys[full] = u[full<<shift+int(r%uint64(len(u)-full<<shift))] & abs
	}
}

// wyrand is the wyhash generator: a 64-bit random number from state s,
// and the next state.
func wyrand(s uint64) (r, next uint64) {
	s += 0xa0761d6478bd642f
	hi, lo := bits.Mul64(s, s^0xe7037ed1a0b428db)
	return hi ^ lo, s
}

// f32bits views x as its bits.
func f32bits(x []float32) []uint32 {
	return unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(x))), len(x))
}

// keyHistogram adds the counts of key>>20 of keys to hist. (In a pass of
// its own, not in the gathering loop, whose loads would then wait on the
// increments; over four histograms, so that runs of keys in one bin do
// not serialize on store-to-load forwarding.)
func keyHistogram(keys []uint32, hist *[2048]uint32) {
	var h [3][2048]uint32
	i := 0
	for ; i+4 <= len(keys); i += 4 {
		k := keys[i : i+4 : i+4]
		hist[k[0]>>20&2047]++
		h[0][k[1]>>20&2047]++
		h[1][k[2]>>20&2047]++
		h[2][k[3]>>20&2047]++
	}
	for _, k := range keys[i:] {
		hist[k>>20&2047]++
	}
	for b := range hist {
		hist[b] += h[0][b] + h[1][b] + h[2][b]
	}
}

// radixSelect returns the r-th largest of keys (1 <= r <= len(keys);
// every key < 2^31) and how many keys are strictly larger, in linear time:
// hist holds the counts of key>>20 on entry; two more histogram passes, on
// bits 10-19 of the keys in the chosen bin (compacted to the front of
// keys, which is clobbered) and on bits 0-9, find the key.
func radixSelect(keys []uint32, hist *[2048]uint32, r int) (key uint32, above int) {
	b1, above := pickBin(hist[:], r)
	r -= above
	var h2 [1024]uint32
	c := 0
	for _, k := range keys {
		if k>>20 == b1 {
			keys[c] = k
			c++
			h2[k>>10&1023]++
		}
	}
	b2, a := pickBin(h2[:], r)
	above += a
	r -= a
	var h3 [1024]uint32
	for _, k := range keys[:c] {
		if k>>10&1023 == b2 {
			h3[k&1023]++
		}
	}
	b3, a := pickBin(h3[:], r)
	above += a
	return b1<<20 | b2<<10 | b3, above
}

// keysAtLeastGeneric writes to out (len(out) >= len(keys)) the keys k&0x7fffffff
// that are >= lo (0 < lo <= 2^31), in order, and returns them; branch-free
// (every key is stored, and the output advances past those that count),
// since about one in twenty qualifies, at random.
func keysAtLeastGeneric(keys []uint32, lo uint32, out []uint32) []uint32 {
	out = out[:len(keys)]
	c := 0
	for _, v := range keys {
		k := v & 0x7fffffff
		out[c] = k
		c += int((lo - 1 - k) >> 31) // k >= lo: lo-1-k < 0, and both are below 2^31
	}
	return out[:c]
}

// pickBin returns the bin holding the r-th largest key of histogram h and
// how many keys the bins above it hold.
func pickBin(h []uint32, r int) (bin uint32, above int) {
	for b := len(h) - 1; b > 0; b-- {
		c := int(h[b])
		if above+c >= r {
			return uint32(b), above
		}
		above += c
	}
	return 0, above
}

// scanGeneric appends to idx and vals the entries of x to keep (key >
// thr, or == thr while budget lasts), indices relative to x.
func scanGeneric(x []float32, thr uint32, budget int, idx []int32, vals []uint16) ([]int32, []uint16, int) {
	u := f32bits(x)
	lo := scanFloor(thr, budget)
	for i := nextCandidate(u, 0, lo); i < len(u); i = nextCandidate(u, i+1, lo) {
		if u[i]&0x7fffffff == thr { // a tie, while the budget lasts
			if budget--; budget == 0 {
				lo = thr + 1
			}
		}
		idx = append(idx, int32(i))
		vals = append(vals, f32BitsToF16(u[i]))
	}
	return idx, vals, budget
}

// scanFloor is the smallest key a scan keeps: thr while the tie budget
// lasts, thr+1 after (so that with thr = 0, a sparse tensor's zeros are
// skipped at full speed). At most 2^31, which no key reaches.
func scanFloor(thr uint32, budget int) uint32 {
	if budget > 0 {
		return thr
	}
	return thr + 1
}

// nextCandidate returns the first i >= from with u[i]&0x7fffffff >= thr
// (thr <= 2^31), or len(u). It tests 8 keys at a time as two 32-bit lanes
// of uint64s: lane|2^31 - thr has its top bit set iff key >= thr. (A loop
// of its own, which keeps few values live: handling the candidates inline
// made the whole scan slower.)
func nextCandidate(u []uint32, from int, thr uint32) int {
	i := from
	if i+8 <= len(u) {
		const lanes, tops = 0x7fffffff7fffffff, 0x8000000080000000
		t := uint64(thr) | uint64(thr)<<32
		w := unsafe.Slice((*uint64)(unsafe.Pointer(unsafe.SliceData(u[i:]))), (len(u)-i)/2)
		j := 0
		for ; j+4 <= len(w); j += 4 {
			v := w[j : j+4 : j+4]
			if ((v[0]&lanes|tops-t)|(v[1]&lanes|tops-t)|(v[2]&lanes|tops-t)|(v[3]&lanes|tops-t))&tops != 0 {
				break
			}
		}
		i += 2 * j
	}
	for ; i < len(u); i++ {
		if u[i]&0x7fffffff >= thr {
			return i
		}
	}
	return len(u)
}
