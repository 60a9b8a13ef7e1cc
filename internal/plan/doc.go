// Package plan holds the models behind `gorun plan`: what a failure costs a
// job under checkpoint-restart and under gorun's host replacement, how
// efficient each leaves the job, how often to write durable checkpoints,
// how likely the chosen redundancy is to lose state, how many spares a job
// needs, and a seeded Monte Carlo of the lost time over a job.
//
// The models follow two papers (../shared/papers):
//
//   - DEADPOOL (003) §IV, the disruption cost model. A failure costs
//     E[C] = C_overhead + E[T_recover] + t_step·E[replay]:
//     E[C_ckpt] = C_overhead^ckpt + E[T_restart] + t_step·E[R] and
//     E[C_DEADPOOL] = C_overhead^DEADPOOL + E[T_hotswap] + t_step·E[φ];
//     efficiency η ≈ MTTF_sys/(MTTF_sys + E[C]); and §V-a Eq. (1), the loss
//     bound P_loss ≤ D·p^(k+1).
//   - PCcheck (001) §3.4 Eq. (3): the smallest checkpoint interval that
//     keeps checkpointing within the accepted slowdown q,
//     f* = ceil(T_w/(N·q·t)).
//
// Everything in the models is a pure function of [Inputs]; the only I/O is
// in measure.go (memory and durable-directory bandwidth, through an
// injected file system) and in [ParseTrace], which reads an io.Reader.
package plan
