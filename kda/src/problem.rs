//! Host-side tensors of one problem (inputs and outputs) and the shape rules both the host and the
//! device launcher check.

use crate::{KdaError, Plan};
use half::bf16;
use kda_kernel::layout::{K_DIM, V_DIM};

/// The sizes every tensor's shape is derived from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    /// Total tokens `T`.
    pub tokens: usize,
    /// Heads `H`.
    pub heads: usize,
    /// Sequences `N`.
    pub seqs: usize,
    /// Total chunks `NT`.
    pub chunks: usize,
}

impl Dims {
    /// The sizes of `plan` with `heads` heads.
    pub fn new(plan: &Plan, heads: usize) -> Self {
        Self { tokens: plan.tokens(), heads, seqs: plan.num_seqs(), chunks: plan.chunks() }
    }

    /// Elements of `k`, `w` and `gk`: `[T, H, K]`.
    pub fn key_len(&self) -> usize {
        self.tokens * self.heads * K_DIM
    }
    /// Elements of `u` and `v_new`: `[T, H, V]`.
    pub fn value_len(&self) -> usize {
        self.tokens * self.heads * V_DIM
    }
    /// Elements of `h0` and `ht`: `[N, H, K, V]`.
    pub fn state_len(&self) -> usize {
        self.seqs * self.heads * K_DIM * V_DIM
    }
    /// Elements of `h`: `[NT, H, K, V]`.
    pub fn h_len(&self) -> usize {
        self.chunks * self.heads * K_DIM * V_DIM
    }

    /// The contract's shape of tensor `name` (one of the SPEC's names).
    pub fn shape_of(&self, name: &str) -> Vec<usize> {
        let (t, h, n, nt) = (self.tokens, self.heads, self.seqs, self.chunks);
        match name {
            "k" | "w" | "gk" => vec![t, h, K_DIM],
            "u" | "v_new" => vec![t, h, V_DIM],
            "h0" | "ht" => vec![n, h, K_DIM, V_DIM],
            "h" => vec![nt, h, K_DIM, V_DIM],
            other => unreachable!("no tensor named {other} in the contract"),
        }
    }

    /// Checks that `tensor` has `actual` elements, as its contract shape requires.
    pub fn check_len(&self, tensor: &'static str, actual: usize) -> Result<(), KdaError> {
        let shape = self.shape_of(tensor);
        let expected_len = shape.iter().product();
        if actual == expected_len {
            return Ok(());
        }
        Err(KdaError::Shape {
            tensor,
            expected: self.describe(tensor, &shape),
            expected_len,
            actual: format!("{actual} elements"),
        })
    }

    /// Shape with dimension names, e.g. `[T=200, H=2, K=128]`.
    pub fn describe(&self, tensor: &str, shape: &[usize]) -> String {
        let names: &[&str] = match tensor {
            "k" | "w" | "gk" => &["T", "H", "K"],
            "u" | "v_new" => &["T", "H", "V"],
            "h0" | "ht" => &["N", "H", "K", "V"],
            _ => &["NT", "H", "K", "V"],
        };
        let dims: Vec<String> = names.iter().zip(shape).map(|(n, d)| format!("{n}={d}")).collect();
        format!("[{}]", dims.join(", "))
    }
}

/// Inputs of one problem on the host, in the contract's layouts.
#[derive(Clone, Debug)]
pub struct Problem {
    /// The batch layout.
    pub plan: Plan,
    /// Heads `H`.
    pub heads: usize,
    /// `[T, H, K]` gated keys.
    pub k: Vec<bf16>,
    /// `[T, H, K]` WY weights.
    pub w: Vec<bf16>,
    /// `[T, H, V]` WY values.
    pub u: Vec<bf16>,
    /// `[T, H, K]` cumulative log2 gates inside each chunk.
    pub gk: Vec<f32>,
    /// `[N, H, K, V]` initial states; `None` means zeros.
    pub h0: Option<Vec<f32>>,
}

impl Problem {
    /// The sizes of this problem.
    pub fn dims(&self) -> Dims {
        Dims::new(&self.plan, self.heads)
    }

    /// Checks every tensor against the shapes implied by the plan and `heads`.
    pub fn validate(&self) -> Result<(), KdaError> {
        if self.heads == 0 {
            return Err(KdaError::Argument { name: "heads", reason: "must be at least 1".into() });
        }
        let d = self.dims();
        d.check_len("k", self.k.len())?;
        d.check_len("w", self.w.len())?;
        d.check_len("u", self.u.len())?;
        d.check_len("gk", self.gk.len())?;
        if let Some(h0) = &self.h0 {
            d.check_len("h0", h0.len())?;
        }
        Ok(())
    }
}

/// Outputs of one problem on the host.
#[derive(Clone, Debug, PartialEq)]
pub struct Outputs {
    /// `[NT, H, K, V]` the state entering every chunk, bf16.
    pub h: Vec<bf16>,
    /// `[T, H, V]` corrected values, bf16.
    pub v_new: Vec<bf16>,
    /// `[N, H, K, V]` final states, f32.
    pub ht: Vec<f32>,
}

/// Relative Frobenius error `||out - reference|| / ||reference||`, in f64.
///
/// Returns `f64::INFINITY` when `out` holds a NaN or infinity where the reference is finite, and
/// the absolute norm of the difference when the reference is all zeros.
pub fn rel_error<A: Copy + Into<f64>, B: Copy + Into<f64>>(out: &[A], reference: &[B]) -> f64 {
    assert_eq!(out.len(), reference.len(), "rel_error: lengths differ");
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (&o, &r) in out.iter().zip(reference) {
        let (o, r): (f64, f64) = (o.into(), r.into());
        if !o.is_finite() && r.is_finite() {
            return f64::INFINITY;
        }
        diff += (o - r) * (o - r);
        norm += r * r;
    }
    if norm == 0.0 { diff.sqrt() } else { (diff / norm).sqrt() }
}
