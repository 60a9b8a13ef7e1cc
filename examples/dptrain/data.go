package main

import "math"

// The data stream and the model are pure functions of the seed and of
// counters, so they do not depend on the world size, the rank or the order in
// which anything is computed. Every random number is splitmix64's output
// function applied to a counter (a counter-based generator): value c of a
// stream with key k is mix64(k + (c+1)·golden).

// golden is splitmix64's increment, 2^64/φ.
const golden = 0x9e3779b97f4a7c15

// Stream domains: each use of randomness draws from its own key.
const (
	domainInit   = 1 // initial parameters
	domainBasis  = 2 // the per-parameter basis u_r(i)
	domainMean   = 3 // the true coefficients m_r
	domainSample = 4 // the per-sample coefficients a_r(s)
	domainDevice = 5 // the gradients of --device-grad
)

// deviceGrad fills g with the gradients of --device-grad for the
// parameters lo.. at step s: those of ½(w_i - t_i(s))², t_i(s) a fixed
// target per parameter plus per-step noise, each a pure function of the
// seed, the parameter index and the step, so that they stand for what an
// accelerator computed and reduced, whatever the world size. w is at least
// as long as g.
//
// Element i is g[i] = w[i] - (target + 0.25·noise), target =
// unit(at(key, 2·idx)) and noise = unit(at(noiseKey, 2·idx+1)) with idx =
// lo+i (deviceGradScalar). Built with GOEXPERIMENT=simd on an AVX-512 CPU,
// the AVX-512 kernel (deviceGradVector) computes whole vectors of sixteen
// elements and the scalar code the rest: the same bits, since it does
// the same integer operations and the same two roundings.
func deviceGrad(g, w []float32, seed uint64, s, lo int) {
	key, noiseKey := deviceKeys(seed, s)
	w = w[:len(g)]
	n := deviceGradVector(g, w, key, noiseKey, lo)
	deviceGradScalar(g[n:], w[n:], key, noiseKey, lo+n)
}

// deviceKeys are the keys of deviceGrad's streams at step s: the target's
// (one per seed) and the noise's (one per seed and step).
func deviceKeys(seed uint64, s int) (key, noiseKey uint64) {
	key = streamKey(seed, domainDevice)
	return key, key ^ uint64(s+1)*golden
}

// deviceGradScalar is deviceGrad on one element at a time, for the
// parameters lo.. (len(w) ≥ len(g)). Of its float32 operations only the
// last two round: unit's values are integers times 2^-23 scaled exactly,
// and 0.25·noise is exact (a power of two, far from the subnormals), so
// fusing target + 0.25·noise into one operation, as the compiler may,
// gives the same bits.
func deviceGradScalar(g, w []float32, key, noiseKey uint64, lo int) {
	for i := range g {
		idx := uint64(lo + i)
		target := unit(at(key, 2*idx))
		noise := unit(at(noiseKey, 2*idx+1))
		g[i] = w[i] - (target + float32(0.25)*noise)
	}
}

// sampleNoise is the amplitude of the per-sample noise around m_r.
const sampleNoise = 0.5

// mix64 is splitmix64's output function, a bijection with good avalanche.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// streamKey is the key of the stream of the given domain under seed.
func streamKey(seed, domain uint64) uint64 { return mix64(mix64(seed) ^ domain) }

// at is value c of the stream with the given key.
func at(key, c uint64) uint64 { return mix64(key + (c+1)*golden) }

// unit maps a random word to a float32 uniform on [-1, 1) with 24 bits; the
// conversion is exact.
func unit(z uint64) float32 { return float32(int64(z)>>40) * 0x1p-23 }

// initParams fills p with the initial parameters, uniform on [-0.1, 0.1).
func initParams(p []float32, seed uint64) {
	key := streamKey(seed, domainInit)
	for i := range p {
		p[i] = float32(0.1 * unit(at(key, uint64(i))))
	}
}

// sampleCoefficients fills coef (n×k, row-major) with the coefficients of
// samples first … first+n-1 of the given step: a_r(s) = norm·(m_r + 0.5·z_r(s)),
// where m_r are the true coefficients (one set per seed), z_r(s) is uniform
// on [-1, 1) and keyed by (seed, step, sample index within the global batch),
// and norm keeps the variance of the targets near 1 whatever k is. They are
// computed in float64 and rounded once.
func sampleCoefficients(coef []float32, seed uint64, step, first, n, k int) {
	meanKey := streamKey(seed, domainMean)
	stepKey := at(streamKey(seed, domainSample), uint64(step))
	norm := math.Sqrt(7.2 / float64(k))
	for j := range n {
		sampleKey := at(stepKey, uint64(first+j))
		row := coef[j*k : j*k+k]
		for r := range row {
			m := float64(unit(at(meanKey, uint64(r))))
			z := float64(unit(at(sampleKey, uint64(r))))
			row[r] = float32(norm * (m + float64(sampleNoise*z)))
		}
	}
}
