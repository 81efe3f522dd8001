//! The decode step on the device, for timing (`../shared/LAYER.md`, "Decode"): each bench shape
//! as a call of `draft` tokens per sequence over a pool with one slot per sequence, the first call
//! checked against the f64 layer over the pool, then timed.

use crate::median_us;
use cudarc::driver::{CudaSlice, CudaStream};
use kda::layer::{GateInput, LayerKind, LayerOptions, LayerProblem, LayerShape};
use kda::pool::layer_reference_pooled;
use kda::pool::{PoolShape, StateDtype, slot_uses};
use kda::{DecodeInputs, DecodePlan, FloatBuffer, Kda, KdaError, StateLayout, bf16};
use std::sync::Arc;

/// One decode bench shape: `seqs` sequences of `draft` tokens each (1: a decode step; more: a
/// chain of draft tokens verified, its last state back to the slot).
#[derive(Clone, Copy, Debug)]
pub struct DecodeShape {
    /// As named in `../shared/LAYER.md` and `bench/results.json`.
    pub name: &'static str,
    /// The layer's heads and sizes.
    pub shape: LayerShape,
    /// The layer's options.
    pub options: LayerOptions,
    /// Sequences, each with its own slot.
    pub seqs: usize,
    /// Tokens per sequence.
    pub draft: usize,
}

/// The decode shapes of `../shared/LAYER.md` (the serving issue's table): KDA with 32 heads in
/// FlashKDA's configuration (gate activated inside with lower bound -5, L2 norm and `beta`'s
/// sigmoid inside), Gated DeltaNet with 16 key and 32 value heads and a 2 / 4 head shard (`g`
/// given in log space), K = V = 128.
pub fn decode_bench_shapes() -> Vec<DecodeShape> {
    let size = 128;
    let scale = (size as f64).powf(-0.5);
    let kda = LayerShape { kind: LayerKind::Kda, heads: 32, value_heads: 32, key_dim: size, value_dim: size };
    let kda_options = LayerOptions { scale, l2norm_qk: true, beta_sigmoid: true, gate: GateInput::LowerBound(-5.0) };
    let gdn = LayerShape { kind: LayerKind::Gdn, heads: 16, value_heads: 32, key_dim: size, value_dim: size };
    let gdn_options = LayerOptions { scale, l2norm_qk: true, beta_sigmoid: false, gate: GateInput::Log };
    let shard = LayerShape { heads: 2, value_heads: 4, ..gdn };
    let of = |name, shape, options, seqs, draft| DecodeShape { name, shape, options, seqs, draft };
    vec![
        of("decode_kda_256", kda, kda_options, 256, 1),
        of("decode_kda_64", kda, kda_options, 64, 1),
        of("verify_kda_64x4", kda, kda_options, 64, 4),
        of("decode_gdn_256", gdn, gdn_options, 256, 1),
        of("decode_gdn_tp_h2_256", shard, gdn_options, 256, 1),
        of("decode_kda_1", kda, kda_options, 1, 1),
    ]
}

/// The decode floor in bytes (`../shared/LAYER.md`): every state read once and written once
/// (f32), every token's inputs read and `o` written once, in the dtypes the kernel takes (bf16
/// `q`, `k`, `v`, `o`; f32 `beta` and gate).
pub fn decode_floor_bytes(d: &DecodeShape) -> usize {
    let s = d.shape;
    let states = 2 * d.seqs * s.value_heads * s.key_dim * s.value_dim * 4;
    let per_token = 2 * s.heads * s.key_dim * 2 + 2 * s.value_heads * s.value_dim * 2 + s.value_heads * 4;
    states + d.seqs * d.draft * (per_token + s.value_heads * s.gate_width() * 4)
}

/// A decode call's token inputs on the device (the token rows of a layer problem), with the
/// view [`Kda::launch_decode`] takes.
pub struct DeviceDecodeInputs {
    /// `[rows, H, K]` bf16.
    pub q: CudaSlice<bf16>,
    /// `[rows, H, K]` bf16.
    pub k: CudaSlice<bf16>,
    /// `[rows, HV, V]` bf16.
    pub v: CudaSlice<bf16>,
    /// `[rows, HV, gate width]`, f32 or bf16.
    pub g: FloatBuffer,
    /// `[rows, HV]`, f32 or bf16.
    pub beta: FloatBuffer,
    /// `[HV]` f32, with a raw gate.
    pub a_log: Option<CudaSlice<f32>>,
    /// `[HV, gate width]` f32, with a raw gate.
    pub dt_bias: Option<CudaSlice<f32>>,
}

impl DeviceDecodeInputs {
    /// Copies `p`'s token rows (no initial states: the pool holds them) to the device.
    pub fn upload(stream: &Arc<CudaStream>, p: &LayerProblem) -> Result<Self, KdaError> {
        let up_bf = |x: &[bf16]| stream.clone_htod(x);
        let up_f = |x: &[f32]| stream.clone_htod(x);
        Ok(Self {
            q: up_bf(&p.q)?,
            k: up_bf(&p.k)?,
            v: up_bf(&p.v)?,
            g: FloatBuffer::upload(stream, &p.g, p.dtypes.g)?,
            beta: FloatBuffer::upload(stream, &p.beta, p.dtypes.beta)?,
            a_log: p.a_log.as_deref().map(up_f).transpose()?,
            dt_bias: p.dt_bias.as_deref().map(up_f).transpose()?,
        })
    }

    /// The inputs as [`Kda::launch_decode`] takes them.
    pub fn inputs(&self) -> DecodeInputs<'_> {
        DecodeInputs {
            q: self.q.slice(..),
            k: self.k.slice(..),
            v: self.v.slice(..),
            g: self.g.slice(..),
            beta: self.beta.slice(..),
            a_log: self.a_log.as_ref().map(|x| x.slice(..)),
            dt_bias: self.dt_bias.as_ref().map(|x| x.slice(..)),
        }
    }
}

/// One timed decode shape: the median time, the floor at the given bandwidth, and the first
/// call's errors against the f64 layer over the pool (`o`, the pooled states).
pub struct DecodeTiming {
    /// Median of the event-timed calls, us.
    pub us: f64,
    /// The floor, us.
    pub floor_us: f64,
    /// Relative errors of `o` and of `ht` (the pool after the first call: every final state).
    pub errors: [f64; 2],
}

/// Runs `d` once (every sequence from its own slot of a random pool) and checks it against
/// `kda::pool::layer_reference_pooled`, then times `repeat` calls (each continuing from the
/// states the previous one left).
pub fn time_decode(
    kda: &Kda,
    stream: &Arc<CudaStream>,
    d: &DecodeShape,
    repeat: usize,
    bandwidth: f64,
) -> Result<DecodeTiming, KdaError> {
    let s = d.shape;
    let p: LayerProblem = kda::inputs::random_layer_problem(&vec![d.draft; d.seqs], s, d.options, false, 3);
    let pool_shape = PoolShape::for_layer(&s, d.seqs, StateLayout::KeyFirst, StateDtype::F32);
    let pool: Vec<f32> = kda::inputs::random_pool(&pool_shape, 5);
    let indices: Vec<i64> = (0..d.seqs as i64).collect();
    let fresh = vec![false; d.seqs];
    let plan = DecodePlan::verify(stream, s, d.options, pool_shape, &indices, &fresh, d.draft, None, None)?;
    let dev = DeviceDecodeInputs::upload(stream, &p)?;
    let inputs = dev.inputs();
    let mut pool_dev = stream.clone_htod(&pool)?;
    let mut o = stream.alloc_zeros::<bf16>(p.plan.tokens() * s.value_heads * s.value_dim)?;
    kda.launch_decode(stream, &plan, &inputs, &mut pool_dev.slice_mut(..), &mut o.slice_mut(..))?;
    let got_pool = stream.clone_dtoh(&pool_dev)?;
    let got_o: Vec<f32> = stream.clone_dtoh(&o)?.iter().map(|x| x.to_f32()).collect();
    let mut want_pool = pool.clone();
    let uses = slot_uses(&indices, &fresh, &pool_shape)?;
    let want_o: Vec<f32> =
        layer_reference_pooled(&p, &mut want_pool, &pool_shape, &uses)?.into_iter().flatten().flatten().collect();
    let errors = [kda::rel_error(&got_o, &want_o), kda::rel_error(&got_pool, &want_pool)];
    let us = median_us(stream, 3, repeat, |_| {
        kda.launch_decode(stream, &plan, &inputs, &mut pool_dev.slice_mut(..), &mut o.slice_mut(..))
    })?;
    Ok(DecodeTiming { us, floor_us: decode_floor_bytes(d) as f64 / bandwidth * 1e6, errors })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decode_floor_counts_the_states_twice_and_every_token_once() {
        let shapes = decode_bench_shapes();
        let one = shapes.iter().find(|d| d.name == "decode_kda_1").unwrap();
        // 32 heads of 128 x 128 f32 states, read and written; q, k, v, o in bf16, beta and a
        // per-key gate in f32.
        let state = 2 * 32 * 128 * 128 * 4;
        let token = 2 * 32 * 128 * 2 + 2 * 32 * 128 * 2 + 32 * 4 + 32 * 128 * 4;
        assert_eq!(decode_floor_bytes(one), state + token);
        let verify = shapes.iter().find(|d| d.name == "verify_kda_64x4").unwrap();
        assert_eq!(decode_floor_bytes(verify), 64 * state + 64 * 4 * token);
        assert!(shapes.iter().all(|d| d.draft <= kda::pool::MAX_DRAFT));
    }
}
