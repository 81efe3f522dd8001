//! The whole layer's forward on the CPU (`../shared/LAYER.md`, docs/CONTRACT.md#the-layer): what a
//! KDA or Gated DeltaNet token mixer computes from `q`, `k`, `v`, the gate and `beta`, and how it
//! decomposes into the recurrence this library runs.
//!
//! Two computations, both f64:
//!
//! - [`layer_reference`]: the definition, token by token, per sequence and value head `i` (key
//!   head `j = i / (HV / H)`):
//!
//!   ```text
//!   S = h0 (zeros if absent)
//!   for each token t:  S = diag(exp(g[t])) S;  S += beta[t] k[t] (v[t] - S^T k[t])^T;  o[t] = scale S^T q[t]
//!   ht = S
//!   ```
//!
//! - [`layer_chunked`]: the same, chunked as a GPU pipeline runs it. Per chunk of 64 tokens, with
//!   `G` the gate's cumulative sum inside the chunk (per key for KDA) and `Γ = exp(G)`:
//!
//!   ```text
//!   A = (I + strictly_lower(diag(beta) (k Γ) (k / Γ)^T))^-1        the WY representation
//!   w = A diag(beta) (k Γ),   u = A diag(beta) v
//!   recurrence (docs/CONTRACT.md): KDA with k' = k Γ_last / Γ and gk = G / ln 2;
//!                                  GDN with k and g = G / ln 2      -> h (entry states), v_new
//!   o = scale ((q Γ) h + causal((q Γ) (k / Γ)^T) v_new)
//!   ```
//!
//!   With [`Rounding::Exact`] every step is f64 and the result is the definition's up to
//!   summation order (tested to 1e-9); with [`Rounding::Kernels`] `k'`, `w` and `u` are rounded to
//!   bf16, the recurrence is [`crate::reference::model_reference`] (the contract's rounding of
//!   `S` and `v_new`), and the output's intra-chunk product takes the L2-normalised keys in bf16
//!   and rounds `q Γ` and the causal attention to bf16 before their products with `h` and
//!   `v_new` (as the output kernel and FLA do), so the output shows the precision a layer built on
//!   this library's recurrence reaches.
//!
//! The products with `Γ` are formed from differences of `G` (`exp(G[t] - G[s])`, never a ratio
//! of exponentials), which stay in range however strong the decay.

use crate::model::{Gates, ModelShape, ModelView, StateLayout};
use crate::reference::model_reference;
use crate::{KdaError, Plan};
use half::bf16;
use kda_kernel::layout::CHUNK;
use rayon::prelude::*;

/// Which layer: the per-key gate of KDA or the per-head gate of Gated DeltaNet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    /// Kimi Delta Attention: `g` `[T, HV, K]`.
    Kda,
    /// Gated DeltaNet: `g` `[T, HV]`.
    Gdn,
}

/// How the layer receives its gate (FLA's `use_gate_in_kernel` and `lower_bound`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GateInput {
    /// `g` is the decay in natural log, per token.
    Log,
    /// `g` is raw: the decay is `-exp(A_log) * softplus(g + dt_bias)`.
    Softplus,
    /// `g` is raw: the decay is `lower_bound * sigmoid(exp(A_log) * (g + dt_bias))`.
    LowerBound(f64),
}

/// The layer's options, in FLA's terms.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerOptions {
    /// The output scale (FLA's default `K^-0.5`).
    pub scale: f64,
    /// `use_qk_l2norm_in_kernel`: `q` and `k` rows divided by `sqrt(sum x^2 + 1e-6)`.
    pub l2norm_qk: bool,
    /// `use_beta_sigmoid_in_kernel`: `beta` given as logits.
    pub beta_sigmoid: bool,
    /// How the gate is given.
    pub gate: GateInput,
}

/// The `epsilon` of the L2 norm inside the layer (FLA's).
pub const L2NORM_EPS: f64 = 1e-6;

/// Heads and sizes of a layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerShape {
    /// KDA or Gated DeltaNet.
    pub kind: LayerKind,
    /// Key heads `H` (`q`, `k`).
    pub heads: usize,
    /// Value heads `HV` (`v`, the gate, `beta`, the states), a multiple of `H`.
    pub value_heads: usize,
    /// Key size `K`.
    pub key_dim: usize,
    /// Value size `V`.
    pub value_dim: usize,
}

impl LayerShape {
    /// Value heads per key head.
    pub fn group(&self) -> usize {
        self.value_heads / self.heads.max(1)
    }

    /// The value heads of key heads `keep`, each key head's group in order.
    ///
    /// # Panics
    /// When a head in `keep` is not below `H`.
    fn value_heads_of(&self, keep: &[usize]) -> Vec<usize> {
        assert!(keep.iter().all(|&j| j < self.heads), "key heads {keep:?} of {}", self.heads);
        let group = self.group();
        keep.iter().flat_map(|&j| j * group..(j + 1) * group).collect()
    }

    /// Gate values per token and value head: `K` for KDA, 1 for Gated DeltaNet.
    pub fn gate_width(&self) -> usize {
        match self.kind {
            LayerKind::Kda => self.key_dim,
            LayerKind::Gdn => 1,
        }
    }

    /// Checks that the head counts and sizes describe a layer.
    pub fn validate(&self) -> Result<(), KdaError> {
        let bad = |name, reason: String| Err(KdaError::Argument { name, reason });
        if self.heads == 0 || self.value_heads == 0 || !self.value_heads.is_multiple_of(self.heads) {
            return bad(
                "value_heads",
                format!("HV = {} must be a positive multiple of H = {}", self.value_heads, self.heads),
            );
        }
        if self.key_dim == 0 || self.value_dim == 0 {
            return bad("key_dim", format!("K = {}, V = {}: both must be positive", self.key_dim, self.value_dim));
        }
        Ok(())
    }
}

impl LayerShape {
    /// The recurrence the layer runs: KDA's keys per value head (`k Γ_last / Γ` depends on the
    /// value head's gate), GDN's the key heads'; states in `layout`.
    pub fn recurrence_shape(&self, layout: StateLayout) -> ModelShape {
        let kda = self.kind == LayerKind::Kda;
        ModelShape {
            heads: if kda { self.value_heads } else { self.heads },
            value_heads: self.value_heads,
            key_dim: self.key_dim,
            value_dim: self.value_dim,
            gates: Gates { g: !kda, gk: kda },
            layout,
        }
    }
}

/// The layer kernels' option words for a [`LayerOptions`] (`kda_kernel::layout::layer`'s codes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LayerCodes {
    /// `OPT_L2NORM | OPT_BETA_SIGMOID` as set.
    pub options: u32,
    /// `GATE_LOG`, `GATE_SOFTPLUS` or `GATE_LOWER_BOUND`.
    pub gate_mode: u32,
    /// The lower bound's f32 bits (0 unless `GateInput::LowerBound`).
    pub lower_bound_bits: u32,
    /// The output scale's f32 bits.
    pub scale_bits: u32,
}

impl LayerOptions {
    /// The words the layer kernels take for these options.
    pub fn codes(&self) -> LayerCodes {
        use kda_kernel::layout::layer::{GATE_LOG, GATE_LOWER_BOUND, GATE_SOFTPLUS, OPT_BETA_SIGMOID, OPT_L2NORM};
        let options =
            (if self.l2norm_qk { OPT_L2NORM } else { 0 }) | (if self.beta_sigmoid { OPT_BETA_SIGMOID } else { 0 });
        let (gate_mode, lower_bound) = match self.gate {
            GateInput::Log => (GATE_LOG, 0.0f32),
            GateInput::Softplus => (GATE_SOFTPLUS, 0.0),
            GateInput::LowerBound(lb) => (GATE_LOWER_BOUND, lb as f32),
        };
        LayerCodes {
            options,
            gate_mode,
            lower_bound_bits: lower_bound.to_bits(),
            scale_bits: (self.scale as f32).to_bits(),
        }
    }
}

/// The layer kernels' chunk table of `plan`: per chunk, in the recurrence's chunk order, its
/// first token and its valid rows (`layout::layer::CHUNK_WORDS` words); empty sequences own no
/// chunk.
pub fn chunk_table(plan: &Plan) -> Result<Vec<u32>, KdaError> {
    let word = |x: usize| {
        u32::try_from(x).map_err(|_| KdaError::Argument {
            name: "cu_seqlens",
            reason: format!("token {x} past the layer kernels' 32-bit chunk table"),
        })
    };
    let mut table = Vec::with_capacity(plan.chunks() * kda_kernel::layout::layer::CHUNK_WORDS);
    for seq in plan.seqs() {
        for c in 0..seq.chunks() {
            let rows = (seq.len - c * CHUNK).min(CHUNK);
            table.extend([word(seq.token_start + c * CHUNK)?, word(rows)?]);
        }
    }
    Ok(table)
}

/// The element type of a float token input that model code gives either way: the gate `g` and
/// `beta` (`../shared/LAYER.md`: f32 or bf16; a model's gate projection is bf16).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum InputDtype {
    /// 4-byte floats.
    #[default]
    F32,
    /// bfloat16.
    Bf16,
}

impl InputDtype {
    /// Bytes per element.
    pub fn bytes(self) -> usize {
        match self {
            InputDtype::F32 => 4,
            InputDtype::Bf16 => 2,
        }
    }

    /// `x` as this dtype holds it (rounded to the nearest bf16, or unchanged).
    pub fn round(self, x: f32) -> f32 {
        match self {
            InputDtype::F32 => x,
            InputDtype::Bf16 => bf16::from_f32(x).to_f32(),
        }
    }

    /// The dtype's name in a safetensors file and in messages.
    pub fn name(self) -> &'static str {
        match self {
            InputDtype::F32 => "F32",
            InputDtype::Bf16 => "BF16",
        }
    }
}

/// The dtypes of a layer problem's gate and `beta` (f32 both by default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TokenDtypes {
    /// The gate `g`'s.
    pub g: InputDtype,
    /// `beta`'s.
    pub beta: InputDtype,
}

impl TokenDtypes {
    /// Both in bf16: FlashKDA's benchmark configuration, and a model's projections as they come.
    pub const BF16: TokenDtypes = TokenDtypes { g: InputDtype::Bf16, beta: InputDtype::Bf16 };

    /// The option bits the layer and decode kernels take for these dtypes
    /// (`kda_kernel::layout::layer::OPT_GATE_BF16`, `OPT_BETA_BF16`).
    pub fn option_bits(self) -> u32 {
        use kda_kernel::layout::layer::{OPT_BETA_BF16, OPT_GATE_BF16};
        (if self.g == InputDtype::Bf16 { OPT_GATE_BF16 } else { 0 })
            | (if self.beta == InputDtype::Bf16 { OPT_BETA_BF16 } else { 0 })
    }
}

/// A layer problem on the host: packed token-major tensors (`[T, heads, size]`), key-first states.
#[derive(Clone, Debug)]
pub struct LayerProblem {
    /// The batch layout.
    pub plan: Plan,
    /// Kind, heads and sizes.
    pub shape: LayerShape,
    /// Scale, normalisation, sigmoid and gate options.
    pub options: LayerOptions,
    /// `[T, H, K]`.
    pub q: Vec<bf16>,
    /// `[T, H, K]`.
    pub k: Vec<bf16>,
    /// `[T, HV, V]`.
    pub v: Vec<bf16>,
    /// `[T, HV, K]` (KDA) or `[T, HV]` (GDN): the gate, log-space or raw (`options.gate`); each
    /// value exact in `dtypes.g`.
    pub g: Vec<f32>,
    /// `[T, HV]`: `beta`, or its logits; each value exact in `dtypes.beta`.
    pub beta: Vec<f32>,
    /// The dtypes the gate and `beta` go to the GPU in ([`LayerProblem::with_dtypes`]).
    pub dtypes: TokenDtypes,
    /// `[HV]`, with a raw gate.
    pub a_log: Option<Vec<f32>>,
    /// `[HV, K]` (KDA) or `[HV]` (GDN), with a raw gate.
    pub dt_bias: Option<Vec<f32>>,
    /// `[N, HV, K, V]` initial states; `None` means zeros.
    pub h0: Option<Vec<f32>>,
}

/// The layer's outputs: `o` `[T, HV, V]` and `ht` `[N, HV, K, V]`, f32.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerOutputs {
    /// `[T, HV, V]`.
    pub o: Vec<f32>,
    /// `[N, HV, K, V]`.
    pub ht: Vec<f32>,
}

impl LayerOutputs {
    /// Relative errors of `o` and `ht` against `reference` ([`crate::rel_error`]).
    pub fn errors(&self, reference: &LayerOutputs) -> [f64; 2] {
        [crate::rel_error(&self.o, &reference.o), crate::rel_error(&self.ht, &reference.ht)]
    }

    /// The outputs of `p`'s key heads `keep` (their value heads), laid out as those of
    /// [`LayerProblem::key_heads`]`(keep)`.
    ///
    /// # Panics
    /// When a head in `keep` is not below `H`, or the outputs are not `p`'s size.
    pub fn key_heads(&self, p: &LayerProblem, keep: &[usize]) -> LayerOutputs {
        let s = p.shape;
        let value_heads = s.value_heads_of(keep);
        let (t, n) = (p.plan.tokens(), p.plan.num_seqs());
        LayerOutputs {
            o: heads_of(&self.o, t, s.value_heads, s.value_dim, &value_heads),
            ht: heads_of(&self.ht, n, s.value_heads, s.key_dim * s.value_dim, &value_heads),
        }
    }
}

/// Heads `keep` of `x` `[rows, heads, width]`, as `[rows, keep.len(), width]`.
///
/// # Panics
/// When `x` is not `rows * heads * width` long.
fn heads_of<T: Copy>(x: &[T], rows: usize, heads: usize, width: usize, keep: &[usize]) -> Vec<T> {
    assert_eq!(x.len(), rows * heads * width, "a [{rows}, {heads}, {width}] tensor");
    (0..rows).flat_map(|r| keep.iter().flat_map(move |&h| &x[(r * heads + h) * width..][..width])).copied().collect()
}

/// Where [`layer_chunked`] rounds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rounding {
    /// Nowhere: f64 throughout.
    Exact,
    /// Where a pipeline on this library's recurrence rounds: `k'`, `w`, `u` to bf16, the gate to
    /// f32, the recurrence as the contract's reference (bf16 `h` and `v_new`).
    Kernels,
}

impl LayerProblem {
    /// Checks the shape, the options and every tensor's length against the plan.
    pub fn validate(&self) -> Result<(), KdaError> {
        let s = &self.shape;
        s.validate()?;
        let (t, n) = (self.plan.tokens(), self.plan.num_seqs());
        let (h, hv, kd, vd) = (s.heads, s.value_heads, s.key_dim, s.value_dim);
        let raw = !matches!(self.options.gate, GateInput::Log);
        let lens: [(&'static str, Option<usize>, usize); 8] = [
            ("q", Some(self.q.len()), t * h * kd),
            ("k", Some(self.k.len()), t * h * kd),
            ("v", Some(self.v.len()), t * hv * vd),
            ("g", Some(self.g.len()), t * hv * s.gate_width()),
            ("beta", Some(self.beta.len()), t * hv),
            ("A_log", self.a_log.as_ref().map(Vec::len).or(raw.then_some(usize::MAX)), hv),
            ("dt_bias", self.dt_bias.as_ref().map(Vec::len).or(raw.then_some(usize::MAX)), hv * s.gate_width()),
            ("h0", self.h0.as_ref().map(Vec::len), n * hv * kd * vd),
        ];
        for (name, got, want) in lens {
            if let Some(got) = got.filter(|&g| g != want) {
                let actual = if got == usize::MAX { "missing".into() } else { format!("{got} elements") };
                return Err(KdaError::Shape {
                    tensor: name,
                    expected: format!("{want} elements"),
                    expected_len: want,
                    actual,
                });
            }
        }
        Ok(())
    }

    /// The same problem with its gate and `beta` given to the GPU in `dtypes`, their values
    /// rounded to them (so that the reference computes on what the kernels read).
    pub fn with_dtypes(mut self, dtypes: TokenDtypes) -> LayerProblem {
        self.g.iter_mut().for_each(|x| *x = dtypes.g.round(*x));
        self.beta.iter_mut().for_each(|x| *x = dtypes.beta.round(*x));
        self.dtypes = dtypes;
        self
    }

    /// The problem of the token rows `spans` (sequence `n`, tokens `range` of it), one sequence per
    /// span in that order, with no initial states: a prompt's prefix, a decode step's tokens, the
    /// live sequences of a pooled call.
    ///
    /// # Panics
    /// When a span names a sequence or tokens the problem does not have.
    pub fn select(&self, spans: &[(usize, std::ops::Range<usize>)]) -> LayerProblem {
        let s = self.shape;
        let seqs = self.plan.seqs();
        let rows = |span: &(usize, std::ops::Range<usize>)| {
            let start = seqs[span.0].token_start;
            assert!(span.1.end <= seqs[span.0].len, "tokens {:?} past sequence {}", span.1, span.0);
            start + span.1.start..start + span.1.end
        };
        fn take<T: Copy>(x: &[T], width: usize, tokens: impl Iterator<Item = std::ops::Range<usize>>) -> Vec<T> {
            tokens.flat_map(|t| &x[t.start * width..t.end * width]).copied().collect()
        }
        let (kd, hv) = (s.key_dim, s.value_heads);
        LayerProblem {
            plan: Plan::from_lengths(&spans.iter().map(|(_, r)| r.len()).collect::<Vec<_>>()),
            q: take(&self.q, s.heads * kd, spans.iter().map(rows)),
            k: take(&self.k, s.heads * kd, spans.iter().map(rows)),
            v: take(&self.v, hv * s.value_dim, spans.iter().map(rows)),
            g: take(&self.g, hv * s.gate_width(), spans.iter().map(rows)),
            beta: take(&self.beta, hv, spans.iter().map(rows)),
            dtypes: self.dtypes,
            h0: None,
            shape: s,
            options: self.options,
            a_log: self.a_log.clone(),
            dt_bias: self.dt_bias.clone(),
        }
    }

    /// The same batch restricted to the key heads `keep` (in that order), each with its group of
    /// value heads: heads are independent, so the f64 reference of a large batch can be computed
    /// on a sample of them and compared with the same heads of a kernel's outputs
    /// ([`LayerOutputs::key_heads`]).
    ///
    /// # Panics
    /// When a head in `keep` is not below `H`.
    pub fn key_heads(&self, keep: &[usize]) -> LayerProblem {
        let s = self.shape;
        let value_heads = s.value_heads_of(keep);
        let (t, n) = (self.plan.tokens(), self.plan.num_seqs());
        let (kd, vd, gw) = (s.key_dim, s.value_dim, s.gate_width());
        LayerProblem {
            plan: self.plan.clone(),
            shape: LayerShape { heads: keep.len(), value_heads: value_heads.len(), ..s },
            options: self.options,
            q: heads_of(&self.q, t, s.heads, kd, keep),
            k: heads_of(&self.k, t, s.heads, kd, keep),
            v: heads_of(&self.v, t, s.value_heads, vd, &value_heads),
            g: heads_of(&self.g, t, s.value_heads, gw, &value_heads),
            beta: heads_of(&self.beta, t, s.value_heads, 1, &value_heads),
            dtypes: self.dtypes,
            a_log: self.a_log.as_ref().map(|x| heads_of(x, 1, s.value_heads, 1, &value_heads)),
            dt_bias: self.dt_bias.as_ref().map(|x| heads_of(x, 1, s.value_heads, gw, &value_heads)),
            h0: self.h0.as_ref().map(|x| heads_of(x, n, s.value_heads, kd * vd, &value_heads)),
        }
    }

    /// Token `t`'s inputs for value head `i`, as the layer uses them: `q`, `k` (normalised when
    /// asked), `v`, `beta` (after the sigmoid when asked) and the decay in natural log (activated
    /// when raw).
    fn token(&self, t: usize, i: usize) -> Token {
        let s = &self.shape;
        let (kd, vd, gw) = (s.key_dim, s.value_dim, s.gate_width());
        let j = i / s.group();
        let row = |x: &[bf16], heads: usize, head: usize, d: usize| -> Vec<f64> {
            x[(t * heads + head) * d..][..d].iter().map(|v| v.to_f64()).collect()
        };
        let norm = |x: Vec<f64>| {
            if !self.options.l2norm_qk {
                return x;
            }
            let r = (x.iter().map(|v| v * v).sum::<f64>() + L2NORM_EPS).sqrt();
            x.into_iter().map(|v| v / r).collect()
        };
        let b = self.beta[t * s.value_heads + i] as f64;
        let beta = if self.options.beta_sigmoid { sigmoid(b) } else { b };
        let raw = &self.g[(t * s.value_heads + i) * gw..][..gw];
        let g = raw
            .iter()
            .enumerate()
            .map(|(c, &x)| {
                let (x, bias) = (x as f64, self.dt_bias.as_ref().map_or(0.0, |d| d[i * gw + c] as f64));
                let a = self.a_log.as_ref().map_or(0.0, |a| (a[i] as f64).exp());
                match self.options.gate {
                    GateInput::Log => x,
                    GateInput::Softplus => -a * softplus(x + bias),
                    GateInput::LowerBound(lb) => lb * sigmoid(a * (x + bias)),
                }
            })
            .collect();
        Token {
            q: norm(row(&self.q, s.heads, j, kd)),
            k: norm(row(&self.k, s.heads, j, kd)),
            v: row(&self.v, s.value_heads, i, vd),
            beta,
            g,
        }
    }

    /// Value head `i`'s initial state of sequence `n` (zeros without `h0`), `[K][V]`.
    fn initial_state(&self, n: usize, i: usize) -> Vec<f64> {
        let state = self.shape.key_dim * self.shape.value_dim;
        match &self.h0 {
            Some(h0) => h0[(n * self.shape.value_heads + i) * state..][..state].iter().map(|&x| x as f64).collect(),
            None => vec![0.0; state],
        }
    }
}

/// One token's inputs for one value head, in f64.
struct Token {
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    beta: f64,
    /// The decay in natural log: `K` values (KDA) or one (GDN).
    g: Vec<f64>,
}

impl Token {
    /// The decay of key row `a`.
    fn gate(&self, a: usize) -> f64 {
        if self.g.len() == 1 { self.g[0] } else { self.g[a] }
    }
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn softplus(x: f64) -> f64 {
    // log(1 + e^x) without overflow.
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

/// The (sequence, value head) items of `p`.
fn items(p: &LayerProblem) -> Vec<(usize, usize)> {
    (0..p.plan.num_seqs()).flat_map(|n| (0..p.shape.value_heads).map(move |i| (n, i))).collect()
}

/// One (sequence, value head) item's results: its index, its `o` rows and its final state.
type ItemResult = ((usize, usize), (Vec<f64>, Vec<f64>));

/// Scatters per-item outputs (`o` rows of the sequence, final state) into the batch's tensors.
fn gather(p: &LayerProblem, results: Vec<ItemResult>) -> LayerOutputs {
    let (hv, vd) = (p.shape.value_heads, p.shape.value_dim);
    let state = p.shape.key_dim * vd;
    let mut out =
        LayerOutputs { o: vec![0.0; p.plan.tokens() * hv * vd], ht: vec![0.0; p.plan.num_seqs() * hv * state] };
    for ((n, i), (o, ht)) in results {
        let seq = &p.plan.seqs()[n];
        for (t, row) in o.chunks_exact(vd).enumerate() {
            let at = ((seq.token_start + t) * hv + i) * vd;
            out.o[at..at + vd].iter_mut().zip(row).for_each(|(d, &x)| *d = x as f32);
        }
        let at = (n * hv + i) * state;
        out.ht[at..at + state].iter_mut().zip(&ht).for_each(|(d, &x)| *d = x as f32);
    }
    out
}

/// The layer by its definition, token by token, in f64 (see the module).
///
/// ```
/// use kda::layer::{GateInput, LayerKind, LayerOptions, LayerShape, Rounding, layer_chunked, layer_reference};
/// // Gated DeltaNet with two value heads per key head, the gate raw (activated inside).
/// let shape = LayerShape { kind: LayerKind::Gdn, heads: 1, value_heads: 2, key_dim: 64, value_dim: 64 };
/// let options = LayerOptions { scale: 0.125, l2norm_qk: true, beta_sigmoid: true, gate: GateInput::Softplus };
/// let p = kda::inputs::random_layer_problem(&[100, 3], shape, options, true, 1);
/// let exact = layer_reference(&p)?;
/// assert_eq!((exact.o.len(), exact.ht.len()), (103 * 2 * 64, 2 * 2 * 64 * 64));
/// // The chunked pipeline the GPU runs, in f64, is the same function.
/// let [o, ht] = layer_chunked(&p, Rounding::Exact)?.errors(&exact);
/// assert!(o < 1e-9 && ht < 1e-9, "{o:e} {ht:e}");
/// # Ok::<(), kda::KdaError>(())
/// ```
pub fn layer_reference(p: &LayerProblem) -> Result<LayerOutputs, KdaError> {
    p.validate()?;
    let (kd, vd) = (p.shape.key_dim, p.shape.value_dim);
    let run = |&(n, i): &(usize, usize)| {
        let seq = &p.plan.seqs()[n];
        let mut s = p.initial_state(n, i);
        let mut o = Vec::with_capacity(seq.len * vd);
        for t in seq.token_start..seq.token_start + seq.len {
            o.extend(step(&mut s, &p.token(t, i), kd, vd, p.options.scale));
        }
        ((n, i), (o, s))
    };
    Ok(gather(p, items(p).par_iter().map(run).collect()))
}

/// One token of the definition: decays the state `s` (`[K][V]`), writes the token into it, and
/// returns the token's output row (`[V]`).
fn step(s: &mut [f64], x: &Token, kd: usize, vd: usize, scale: f64) -> Vec<f64> {
    for a in 0..kd {
        let d = x.gate(a).exp();
        s[a * vd..][..vd].iter_mut().for_each(|e| *e *= d);
    }
    for c in 0..vd {
        let sk: f64 = (0..kd).map(|a| s[a * vd + c] * x.k[a]).sum();
        let delta = x.beta * (x.v[c] - sk);
        (0..kd).for_each(|a| s[a * vd + c] += x.k[a] * delta);
    }
    (0..vd).map(|c| scale * (0..kd).map(|a| s[a * vd + c] * x.q[a]).sum::<f64>()).collect()
}

/// Checkpoints for prefix caching, by definition: the state (`[HV][K][V]` key-first, f32) of
/// every sequence after each of its `positions[n]` (token counts from the sequence's start, any
/// position, 0 giving the initial state), as a prefill would write them to the caller's slots.
pub fn checkpoint_reference(p: &LayerProblem, positions: &[Vec<usize>]) -> Result<Vec<Vec<Vec<f32>>>, KdaError> {
    p.validate()?;
    let (hv, kd, vd) = (p.shape.value_heads, p.shape.key_dim, p.shape.value_dim);
    if positions.len() != p.plan.num_seqs() {
        return Err(KdaError::Argument {
            name: "positions",
            reason: format!("{} lists for {} sequences", positions.len(), p.plan.num_seqs()),
        });
    }
    let mut out = Vec::with_capacity(positions.len());
    for (n, (seq, wanted)) in p.plan.seqs().iter().zip(positions).enumerate() {
        if let Some(&bad) = wanted.iter().find(|&&x| x > seq.len) {
            return Err(KdaError::Argument {
                name: "positions",
                reason: format!("sequence {n}: position {bad} is past its {} tokens", seq.len),
            });
        }
        let mut states: Vec<Vec<f64>> = (0..hv).map(|i| p.initial_state(n, i)).collect();
        let mut saved = vec![Vec::new(); wanted.len()];
        for done in 0..=seq.len {
            for (w, &x) in wanted.iter().enumerate() {
                if x == done {
                    saved[w] = states.iter().flat_map(|s| s.iter().map(|&v| v as f32)).collect();
                }
            }
            if done < seq.len {
                for (i, s) in states.iter_mut().enumerate() {
                    step(s, &p.token(seq.token_start + done, i), kd, vd, p.options.scale);
                }
            }
        }
        out.push(saved);
    }
    Ok(out)
}

/// What [`verify_tree_reference`] returns per sequence: each draft token's output row
/// (`[HV][V]`) and the state after it (`[HV][K][V]` key-first), in token order.
pub type VerifiedTokens = Vec<(Vec<f32>, Vec<f32>)>;

/// Speculative verification by its definition: every sequence's draft tokens form a tree, token
/// `t` continuing from the state after token `parents[t]` (an index inside its sequence, earlier
/// than `t`), or from the sequence's initial state (`h0`, or zeros) when it is negative. A chain
/// (`parents[t] = t - 1`) is ordinary decoding. Returns, per sequence, each token's output and
/// the state after it, so that an engine can keep the accepted path's state.
///
/// ```
/// use kda::layer::{GateInput, LayerKind, LayerOptions, LayerShape, verify_tree_reference};
/// let shape = LayerShape { kind: LayerKind::Kda, heads: 1, value_heads: 1, key_dim: 64, value_dim: 64 };
/// let options = LayerOptions { scale: 0.125, l2norm_qk: true, beta_sigmoid: false, gate: GateInput::Log };
/// // One sequence of four draft tokens: 0 -> 1 -> 2 is a chain, 3 branches off token 0.
/// let p = kda::inputs::random_layer_problem(&[4], shape, options, true, 2);
/// let tree = verify_tree_reference(&p, &[-1, 0, 1, 0])?;
/// let chain = verify_tree_reference(&p, &[-1, 0, 1, 2])?;
/// // Tokens 0 to 2 have the same parents in both, so the same outputs and states.
/// assert_eq!(tree[0][..3], chain[0][..3]);
/// assert_ne!(tree[0][3], chain[0][3]);
/// assert!(verify_tree_reference(&p, &[-1, 1, 1, 2]).is_err()); // a parent must come earlier
/// # Ok::<(), kda::KdaError>(())
/// ```
pub fn verify_tree_reference(p: &LayerProblem, parents: &[i64]) -> Result<Vec<VerifiedTokens>, KdaError> {
    p.validate()?;
    let (hv, kd, vd) = (p.shape.value_heads, p.shape.key_dim, p.shape.value_dim);
    if parents.len() != p.plan.tokens() {
        return Err(KdaError::Shape {
            tensor: "parents",
            expected: "[T]".into(),
            expected_len: p.plan.tokens(),
            actual: format!("{} elements", parents.len()),
        });
    }
    let mut out = Vec::with_capacity(p.plan.num_seqs());
    for (n, seq) in p.plan.seqs().iter().enumerate() {
        let mut tokens: VerifiedTokens = Vec::with_capacity(seq.len);
        for r in 0..seq.len {
            let parent = parents[seq.token_start + r];
            if parent >= r as i64 {
                return Err(KdaError::Argument {
                    name: "parents",
                    reason: format!("sequence {n}, token {r}: parent {parent} is not an earlier token"),
                });
            }
            let (mut o, mut state) = (Vec::with_capacity(hv * vd), Vec::with_capacity(hv * kd * vd));
            for i in 0..hv {
                let mut s: Vec<f64> = match usize::try_from(parent) {
                    Ok(q) => tokens[q].1[i * kd * vd..][..kd * vd].iter().map(|&x| x as f64).collect(),
                    Err(_) => p.initial_state(n, i),
                };
                o.extend(
                    step(&mut s, &p.token(seq.token_start + r, i), kd, vd, p.options.scale)
                        .into_iter()
                        .map(|x| x as f32),
                );
                state.extend(s.into_iter().map(|x| x as f32));
            }
            tokens.push((o, state));
        }
        out.push(tokens);
    }
    Ok(out)
}

/// One chunk of one (sequence, value head), prepared for the recurrence and the output.
struct Chunk {
    tokens: Vec<Token>,
    /// `G[r][a]`: the decay's cumulative sum inside the chunk up to row `r` (inclusive), per key
    /// row `a` (one column for GDN).
    cum: Vec<Vec<f64>>,
}

impl Chunk {
    /// This chunk with every key rounded to bf16 (the output kernel's key tile), the rest as is.
    fn with_bf16_keys(&self) -> Chunk {
        let round = |x: &Vec<f64>| x.iter().map(|&v| bf16::from_f64(v).to_f64()).collect();
        let tokens = self
            .tokens
            .iter()
            .map(|t| Token { q: t.q.clone(), k: round(&t.k), v: t.v.clone(), beta: t.beta, g: t.g.clone() })
            .collect();
        Chunk { tokens, cum: self.cum.clone() }
    }

    fn new(tokens: Vec<Token>) -> Self {
        let mut cum: Vec<Vec<f64>> = Vec::with_capacity(tokens.len());
        for x in &tokens {
            let row = match cum.last() {
                Some(prev) => prev.iter().zip(&x.g).map(|(p, g)| p + g).collect(),
                None => x.g.clone(),
            };
            cum.push(row);
        }
        Self { tokens, cum }
    }

    /// `G[r]` at key row `a`.
    fn g(&self, r: usize, a: usize) -> f64 {
        let row = &self.cum[r];
        if row.len() == 1 { row[0] } else { row[a] }
    }

    /// `sum_a x[a] y[a] exp(G[r][a] - G[s][a])`: a product of rows `r` and `s` gated from `s` to `r`.
    fn gated_dot(&self, x: &[f64], r: usize, y: &[f64], s: usize) -> f64 {
        x.iter().zip(y).enumerate().map(|(a, (p, q))| p * q * (self.g(r, a) - self.g(s, a)).exp()).sum()
    }

    /// The WY representation: `w` `[L][K]` and `u` `[L][V]` (see the module).
    fn wy(&self) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
        let l = self.tokens.len();
        let kd = self.tokens[0].k.len();
        // Rows of diag(beta) (k Γ) and diag(beta) v; then forward substitution of
        // (I + strictly_lower(diag(beta) (k Γ) (k / Γ)^T)) X = rhs, row by row.
        let mut w: Vec<Vec<f64>> = Vec::with_capacity(l);
        let mut u: Vec<Vec<f64>> = Vec::with_capacity(l);
        for r in 0..l {
            let x = &self.tokens[r];
            let mut wr: Vec<f64> = (0..kd).map(|a| x.beta * x.k[a] * self.g(r, a).exp()).collect();
            let mut ur: Vec<f64> = x.v.iter().map(|v| x.beta * v).collect();
            for s in 0..r {
                let coef = x.beta * self.gated_dot(&x.k, r, &self.tokens[s].k, s);
                wr.iter_mut().zip(&w[s]).for_each(|(a, b)| *a -= coef * b);
                ur.iter_mut().zip(&u[s]).for_each(|(a, b)| *a -= coef * b);
            }
            w.push(wr);
            u.push(ur);
        }
        (w, u)
    }

    /// The keys decayed from each row to the chunk's end, `k Γ_last / Γ`: the second product's
    /// keys of the exact recurrence.
    fn keys_to_chunk_end(&self) -> Vec<Vec<f64>> {
        let last = self.tokens.len() - 1;
        let scaled = |r: usize| -> Vec<f64> {
            let k = &self.tokens[r].k;
            k.iter().enumerate().map(|(a, v)| v * (self.g(last, a) - self.g(r, a)).exp()).collect()
        };
        (0..self.tokens.len()).map(scaled).collect()
    }

    /// The keys the recurrence's contract takes: for KDA [`Self::keys_to_chunk_end`], for GDN `k`
    /// itself (the contract's scalar gate applies the decay to each row).
    fn recurrence_keys(&self, kind: LayerKind) -> Vec<Vec<f64>> {
        match kind {
            LayerKind::Kda => self.keys_to_chunk_end(),
            LayerKind::Gdn => self.tokens.iter().map(|x| x.k.clone()).collect(),
        }
    }

    /// The chunk's output rows from its entry state `s0` (`[K][V]`) and corrected values `vn`,
    /// the products' left operands (`q Γ` and the causal attention) rounded by `operand`.
    fn output(&self, s0: &[f64], vn: &[Vec<f64>], scale: f64, operand: impl Fn(f64) -> f64) -> Vec<f64> {
        let (kd, vd) = (self.tokens[0].k.len(), self.tokens[0].v.len());
        let mut o = Vec::with_capacity(self.tokens.len() * vd);
        for r in 0..self.tokens.len() {
            let q = &self.tokens[r].q;
            let qg: Vec<f64> = (0..kd).map(|a| operand(q[a] * self.g(r, a).exp())).collect();
            let mut row: Vec<f64> = (0..vd).map(|c| (0..kd).map(|a| qg[a] * s0[a * vd + c]).sum()).collect();
            for (s, vs) in vn.iter().enumerate().take(r + 1) {
                let att = operand(self.gated_dot(q, r, &self.tokens[s].k, s));
                row.iter_mut().zip(vs).for_each(|(o, v)| *o += att * v);
            }
            o.extend(row.into_iter().map(|x| scale * x));
        }
        o
    }
}

/// The chunks of sequence `n` for value head `i`.
fn chunks(p: &LayerProblem, n: usize, i: usize) -> Vec<Chunk> {
    let seq = &p.plan.seqs()[n];
    (0..seq.chunks())
        .map(|c| {
            let t0 = seq.token_start + c * CHUNK;
            let t1 = (t0 + CHUNK).min(seq.token_start + seq.len);
            Chunk::new((t0..t1).map(|t| p.token(t, i)).collect())
        })
        .collect()
}

/// The layer chunked as a GPU pipeline runs it (see the module), rounding as `rounding` says.
/// [`Rounding::Kernels`] needs `H = HV` for KDA (its recurrence keys are per value head).
pub fn layer_chunked(p: &LayerProblem, rounding: Rounding) -> Result<LayerOutputs, KdaError> {
    p.validate()?;
    match rounding {
        Rounding::Exact => Ok(chunked_exact(p)),
        Rounding::Kernels => chunked_on_the_contract(p),
    }
}

/// [`layer_chunked`] in f64 throughout: the recurrence `S' = Γ_last S + k'^T (u - w S)` inline.
fn chunked_exact(p: &LayerProblem) -> LayerOutputs {
    let (kd, vd, scale) = (p.shape.key_dim, p.shape.value_dim, p.options.scale);
    let run = |&(n, i): &(usize, usize)| {
        let mut s = p.initial_state(n, i);
        let mut o = Vec::new();
        for chunk in chunks(p, n, i) {
            let (w, u) = chunk.wy();
            let vn: Vec<Vec<f64>> = w
                .iter()
                .zip(&u)
                .map(|(wr, ur)| (0..vd).map(|c| ur[c] - (0..kd).map(|a| wr[a] * s[a * vd + c]).sum::<f64>()).collect())
                .collect();
            o.extend(chunk.output(&s, &vn, scale, |a| a));
            let keys = chunk.keys_to_chunk_end();
            let last = chunk.tokens.len() - 1;
            for a in 0..kd {
                let decay = chunk.g(last, a).exp();
                for c in 0..vd {
                    let kv: f64 = (0..=last).map(|r| keys[r][a] * vn[r][c]).sum();
                    s[a * vd + c] = decay * s[a * vd + c] + kv;
                }
            }
        }
        ((n, i), (o, s))
    };
    gather(p, items(p).par_iter().map(run).collect())
}

/// [`layer_chunked`] through the recurrence's contract: `k'`, `w`, `u` and the log2 gate built
/// for the whole batch, [`model_reference`] for `h` and `v_new`, then the output from them.
fn chunked_on_the_contract(p: &LayerProblem) -> Result<LayerOutputs, KdaError> {
    let s = p.shape;
    let (h, hv, kd, vd) = (s.heads, s.value_heads, s.key_dim, s.value_dim);
    if s.kind == LayerKind::Kda && h != hv {
        return Err(KdaError::Unsupported {
            argument: "value_heads",
            reason: format!(
                "KDA with grouped value heads (H = {h}, HV = {hv}): the recurrence's keys are per value head"
            ),
        });
    }
    let t = p.plan.tokens();
    let key_heads = if s.kind == LayerKind::Kda { hv } else { h };
    let mut k = vec![bf16::ZERO; t * key_heads * kd];
    let mut w = vec![bf16::ZERO; t * hv * kd];
    let mut u = vec![bf16::ZERO; t * hv * vd];
    let mut gate = vec![0f32; t * hv * s.gate_width()];
    let per_item: Vec<((usize, usize), Vec<Chunk>)> =
        items(p).par_iter().map(|&(n, i)| ((n, i), chunks(p, n, i))).collect();
    let put = |dst: &mut [bf16], at: usize, row: &[f64]| {
        dst[at..at + row.len()].iter_mut().zip(row).for_each(|(d, &x)| *d = bf16::from_f32(x as f32))
    };
    for ((n, i), chunks) in &per_item {
        let mut t0 = p.plan.seqs()[*n].token_start;
        for chunk in chunks {
            let (wc, uc) = chunk.wy();
            let keys = chunk.recurrence_keys(s.kind);
            for r in 0..chunk.tokens.len() {
                let tok = t0 + r;
                put(&mut w, (tok * hv + i) * kd, &wc[r]);
                put(&mut u, (tok * hv + i) * vd, &uc[r]);
                // GDN's keys are the key head's, written once per group.
                if s.kind == LayerKind::Kda || i % s.group() == 0 {
                    let head = if s.kind == LayerKind::Kda { *i } else { i / s.group() };
                    put(&mut k, (tok * key_heads + head) * kd, &keys[r]);
                }
                let gw = s.gate_width();
                for a in 0..gw {
                    gate[(tok * hv + i) * gw + a] = (chunk.cum[r][a] / std::f64::consts::LN_2) as f32;
                }
            }
            t0 += chunk.tokens.len();
        }
    }
    let shape = ModelShape {
        heads: key_heads,
        value_heads: hv,
        key_dim: kd,
        value_dim: vd,
        gates: Gates { g: s.kind == LayerKind::Gdn, gk: s.kind == LayerKind::Kda },
        layout: StateLayout::KeyFirst,
    };
    let view = ModelView {
        plan: &p.plan,
        shape,
        k: &k,
        w: &w,
        u: &u,
        g: (s.kind == LayerKind::Gdn).then_some(&gate[..]),
        gk: (s.kind == LayerKind::Kda).then_some(&gate[..]),
        h0: p.h0.as_deref(),
    };
    let rec = model_reference(&view)?;
    let state = kd * vd;
    let results = per_item
        .par_iter()
        .map(|((n, i), chunks)| {
            let seq = &p.plan.seqs()[*n];
            let mut o = Vec::with_capacity(seq.len * vd);
            for (c, chunk) in chunks.iter().enumerate() {
                let at = ((seq.chunk_start + c) * hv + i) * state;
                let s0: Vec<f64> = rec.h[at..at + state].iter().map(|x| x.to_f64()).collect();
                let t0 = seq.token_start + c * CHUNK;
                let vn: Vec<Vec<f64>> = (0..chunk.tokens.len())
                    .map(|r| rec.v_new[((t0 + r) * hv + i) * vd..][..vd].iter().map(|x| x.to_f64()).collect())
                    .collect();
                // Keys given in bf16 stay as given; normalised ones are rounded, and so are the
                // output products' operands (see the module).
                let output_chunk = p.options.l2norm_qk.then(|| chunk.with_bf16_keys());
                let bf16_operand = |a: f64| bf16::from_f64(a).to_f64();
                o.extend(output_chunk.as_ref().unwrap_or(chunk).output(&s0, &vn, p.options.scale, bf16_operand));
            }
            let at = (n * hv + i) * state;
            ((*n, *i), (o, rec.ht[at..at + state].iter().map(|&x| x as f64).collect()))
        })
        .collect();
    Ok(gather(p, results))
}

/// What a layer fixture holds besides the problem (`tests/fixtures/layer/README.md`): FLA's
/// outputs, the f64 reference's (stored as f32), and FLA's own errors against it (`o`, `ht`).
#[derive(Clone, Debug)]
pub struct LayerGolden {
    /// FLA's outputs (`o_fla`, `ht_fla`).
    pub fla: LayerOutputs,
    /// The f64 token-by-token reference's (`o_ref`, `ht_ref`).
    pub reference: LayerOutputs,
    /// FLA's relative errors against the reference, `o` and `ht` (the metadata's).
    pub fla_errors: [f64; 2],
}

/// Whether the safetensors file at `path` holds a layer problem: it has `q`, `v` and `beta`, which
/// no recurrence file has. An unreadable file is not.
pub fn is_layer_file(path: &std::path::Path) -> bool {
    let Ok(bytes) = std::fs::read(path) else { return false };
    safetensors::SafeTensors::deserialize(&bytes).is_ok_and(|f| ["q", "v", "beta"].iter().all(|t| f.tensor(t).is_ok()))
}

/// Reads a layer fixture (`tests/fixtures/layer/README.md`): the problem and what FLA and the
/// f64 reference computed ([`read_layer_problem`], the outputs required).
pub fn read_layer_fixture(path: &std::path::Path) -> Result<(LayerProblem, LayerGolden), KdaError> {
    let (p, golden) = read_layer_problem(path)?;
    let golden = golden.ok_or(KdaError::MissingTensor { tensor: "o_fla" })?;
    Ok((p, golden))
}

/// Reads a layer problem from a safetensors file: `q`, `k` `[B, T, H, K]`, `v` `[B, T, HV, V]`,
/// `g` (`[B, T, HV, K]` for KDA, `[B, T, HV]` for Gated DeltaNet; f32 or bf16), `beta`
/// `[B, T, HV]`, optional `A_log`, `dt_bias`, `h0` `[N, HV, K, V]` and `cu_seqlens` (with
/// `B = 1`). The metadata may give `kind` (`kda` or `gdn`; else from `g`'s rank), `gate` (`log`,
/// `softplus`, `lower_bound` with `lower_bound`; default `log`), `scale` (default `K^-0.5`),
/// `use_qk_l2norm_in_kernel` and `use_beta_sigmoid_in_kernel` (default false). A fixture's
/// outputs and FLA's errors come back when the file has them.
pub fn read_layer_problem(path: &std::path::Path) -> Result<(LayerProblem, Option<LayerGolden>), KdaError> {
    use safetensors::{Dtype, SafeTensors};
    let origin = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|source| KdaError::Io { path: origin.clone(), source })?;
    let bad = |reason: String| KdaError::Safetensors { path: origin.clone(), reason };
    let file = SafeTensors::deserialize(&bytes).map_err(|e| bad(e.to_string()))?;
    let (_, header) = SafeTensors::read_metadata(&bytes).map_err(|e| bad(e.to_string()))?;
    let meta = header.metadata().clone().unwrap_or_default();
    let entry = |key: &str| meta.get(key).cloned().ok_or_else(|| bad(format!("metadata `{key}` missing")));
    let number = |key: &str| entry(key)?.parse::<f64>().map_err(|e| bad(format!("metadata `{key}`: {e}")));
    let flag = |key: &str| meta.get(key).is_some_and(|v| v == "true");
    let values = |name: &'static str| -> Result<(Vec<f32>, Vec<usize>), KdaError> {
        let t = file.tensor(name).map_err(|_| KdaError::MissingTensor { tensor: name })?;
        let data = t.data();
        let v = match t.dtype() {
            Dtype::F32 => data.as_chunks::<4>().0.iter().map(|&b| f32::from_le_bytes(b)).collect(),
            Dtype::BF16 => {
                data.as_chunks::<2>().0.iter().map(|&b| bf16::from_bits(u16::from_le_bytes(b)).to_f32()).collect()
            }
            other => {
                return Err(KdaError::Dtype {
                    tensor: name.into(),
                    expected: "F32 or BF16",
                    actual: format!("{other:?}"),
                });
            }
        };
        Ok((v, t.shape().to_vec()))
    };
    let to_bf16 = |v: Vec<f32>| v.into_iter().map(bf16::from_f32).collect::<Vec<_>>();
    let (q, q_shape) = values("q")?;
    let (v, v_shape) = values("v")?;
    let [b, t, heads, key_dim] =
        <[usize; 4]>::try_from(q_shape.as_slice()).map_err(|_| bad("q: expected [B, T, H, K]".into()))?;
    let [_, _, value_heads, value_dim] =
        <[usize; 4]>::try_from(v_shape.as_slice()).map_err(|_| bad("v: expected [B, T, HV, V]".into()))?;
    let (g, g_shape) = values("g")?;
    let kind = match meta.get("kind").map(String::as_str) {
        Some("kda") => LayerKind::Kda,
        Some("gdn") => LayerKind::Gdn,
        None if g_shape.len() == 4 => LayerKind::Kda,
        None if g_shape.len() == 3 => LayerKind::Gdn,
        other => return Err(bad(format!("kind {other:?}: expected kda or gdn (or g of rank 4 or 3)"))),
    };
    let gate = match meta.get("gate").map(String::as_str) {
        None | Some("log") => GateInput::Log,
        Some("softplus") => GateInput::Softplus,
        Some("lower_bound") => GateInput::LowerBound(number("lower_bound")?),
        Some(other) => return Err(bad(format!("gate `{other}`: expected log, softplus or lower_bound"))),
    };
    let scale = if meta.contains_key("scale") { number("scale")? } else { (key_dim as f64).powf(-0.5) };
    let plan = match file.tensor("cu_seqlens") {
        Ok(cu) if cu.dtype() == Dtype::I64 && b == 1 => {
            let cu: Vec<i64> = cu.data().as_chunks::<8>().0.iter().map(|&x| i64::from_le_bytes(x)).collect();
            Plan::from_cu_seqlens(&cu)?
        }
        Ok(_) => return Err(bad("cu_seqlens: expected I64 with a batch of 1".into())),
        Err(_) => Plan::try_dense(b, t)?,
    };
    let optional = |name: &'static str| file.tensor(name).ok().map(|_| values(name).map(|x| x.0)).transpose();
    // The gate and `beta` go to the GPU in the file's dtype.
    let dtype = |name: &'static str| match file.tensor(name).map(|t| t.dtype()) {
        Ok(Dtype::BF16) => InputDtype::Bf16,
        _ => InputDtype::F32,
    };
    let problem = LayerProblem {
        plan,
        shape: LayerShape { kind, heads, value_heads, key_dim, value_dim },
        options: LayerOptions {
            scale,
            l2norm_qk: flag("use_qk_l2norm_in_kernel"),
            beta_sigmoid: flag("use_beta_sigmoid_in_kernel"),
            gate,
        },
        q: to_bf16(q),
        k: to_bf16(values("k")?.0),
        v: to_bf16(v),
        g,
        beta: values("beta")?.0,
        dtypes: TokenDtypes { g: dtype("g"), beta: dtype("beta") },
        a_log: optional("A_log")?,
        dt_bias: optional("dt_bias")?,
        h0: optional("h0")?,
    };
    problem.validate()?;
    if file.tensor("o_fla").is_err() {
        return Ok((problem, None));
    }
    let errors = entry("errors")?;
    let error = |key: &str| -> Result<f64, KdaError> {
        let at = errors.find(key).ok_or_else(|| bad(format!("errors: no `{key}`")))? + key.len();
        let tail = errors[at..].trim_start_matches(['"', ':', ' ']);
        let end = tail.find([',', '}']).unwrap_or(tail.len());
        tail[..end].trim().parse().map_err(|e| bad(format!("errors `{key}`: {e}")))
    };
    let golden = LayerGolden {
        fla: LayerOutputs { o: values("o_fla")?.0, ht: values("ht_fla")?.0 },
        reference: LayerOutputs { o: values("o_ref")?.0, ht: values("ht_ref")?.0 },
        fla_errors: [error("fla_o_vs_f64")?, error("fla_ht_vs_f64")?],
    };
    Ok((problem, Some(golden)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `T = (I + L)^-1`, `L` the chunk's strictly lower `diag(beta) (k Γ) (k / Γ)^T` (the matrix
    /// [`Chunk::wy`] substitutes through), by forward substitution on the identity.
    fn inverse(chunk: &Chunk) -> Vec<Vec<f64>> {
        let l = chunk.tokens.len();
        let mut t: Vec<Vec<f64>> = Vec::with_capacity(l);
        for r in 0..l {
            let x = &chunk.tokens[r];
            let mut row: Vec<f64> = (0..l).map(|c| if c == r { 1.0 } else { 0.0 }).collect();
            for (s, ts) in t.iter().enumerate() {
                let coef = x.beta * chunk.gated_dot(&x.k, r, &chunk.tokens[s].k, s);
                row.iter_mut().zip(ts).for_each(|(a, b)| *a -= coef * b);
            }
            t.push(row);
        }
        t
    }

    /// The identity a prepare kernel that writes only `T` (bench/RESULTS.md, "Where the layer can
    /// go next") relies on: for any entry state `S`, `u - w S = T diag(beta) (v - (k Γ) S)`, so
    /// the chain can form `v_new` from `k`, `v`, `beta`, the gate and `T` without `w` and `u`;
    /// with a per-head gate `(k Γ) S` is `diag(Γ) (k S)`. Checked in f64 on every chunk of a
    /// ragged batch of both kinds, `S` random.
    #[test]
    fn the_wy_form_factors_through_the_inverse() {
        let options = LayerOptions { scale: 0.125, l2norm_qk: true, beta_sigmoid: true, gate: GateInput::Log };
        for kind in [LayerKind::Kda, LayerKind::Gdn] {
            let shape = LayerShape { kind, heads: 1, value_heads: 2, key_dim: 64, value_dim: 64 };
            let p = crate::inputs::random_layer_problem(&[150, 64, 1], shape, options, false, 7);
            let (kd, vd) = (shape.key_dim, shape.value_dim);
            let mut worst = 0f64;
            for (n, i) in items(&p) {
                for (c, chunk) in chunks(&p, n, i).iter().enumerate() {
                    let s: Vec<f64> =
                        (0..kd * vd).map(|e| ((e * 7919 + c * 31 + n) % 1000) as f64 / 500.0 - 1.0).collect();
                    let (w, u) = chunk.wy();
                    let t = inverse(chunk);
                    let l = chunk.tokens.len();
                    // Y = diag(beta) (v - (k Γ) S), row by row.
                    let y: Vec<Vec<f64>> = (0..l)
                        .map(|r| {
                            let x = &chunk.tokens[r];
                            let kg: Vec<f64> = (0..kd).map(|a| x.k[a] * chunk.g(r, a).exp()).collect();
                            (0..vd)
                                .map(|col| x.beta * (x.v[col] - (0..kd).map(|a| kg[a] * s[a * vd + col]).sum::<f64>()))
                                .collect()
                        })
                        .collect();
                    for r in 0..l {
                        for col in 0..vd {
                            let want = u[r][col] - (0..kd).map(|a| w[r][a] * s[a * vd + col]).sum::<f64>();
                            let got: f64 = (0..l).map(|j| t[r][j] * y[j][col]).sum();
                            worst = worst.max((got - want).abs() / want.abs().max(1.0));
                        }
                    }
                }
            }
            assert!(worst < 1e-12, "{kind:?}: u - w S and T Y differ by {worst:e}");
        }
    }
}
