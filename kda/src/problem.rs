//! Host-side tensors of one problem (inputs and outputs) and the shape rules both the host and the
//! device launcher check (docs/CONTRACT.md#shapes-and-layouts).

use crate::model::{ModelShape, StateLayout};
use crate::{KdaError, Plan};
use core::fmt;
use half::bf16;

/// A tensor of the contract (docs/CONTRACT.md#shapes-and-layouts): the four inputs, the
/// optional initial state and the three outputs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tensor {
    /// `k`: `[T, H, K]` bf16 keys.
    K,
    /// `w`: `[T, HV, K]` bf16 WY weights.
    W,
    /// `u`: `[T, HV, V]` bf16 WY values.
    U,
    /// `gk`: `[T, HV, K]` f32 cumulative log2 per-key gates.
    Gk,
    /// `g`: `[T, HV]` f32 cumulative log2 scalar gates.
    G,
    /// `h0`: `[N, HV, K, V]` f32 initial states.
    H0,
    /// `h`: `[NT, HV, K, V]` bf16 state entering every chunk (output).
    H,
    /// `v_new`: `[T, HV, V]` bf16 corrected values (output).
    VNew,
    /// `ht`: `[N, HV, K, V]` f32 final states (output).
    Ht,
}

impl Tensor {
    /// Every tensor, inputs first.
    pub const ALL: [Tensor; 9] =
        [Tensor::K, Tensor::W, Tensor::U, Tensor::Gk, Tensor::G, Tensor::H0, Tensor::H, Tensor::VNew, Tensor::Ht];

    /// The contract's name of the tensor (`"k"`, `"v_new"`, ...), as in files and errors.
    pub const fn name(self) -> &'static str {
        match self {
            Tensor::K => "k",
            Tensor::W => "w",
            Tensor::U => "u",
            Tensor::Gk => "gk",
            Tensor::G => "g",
            Tensor::H0 => "h0",
            Tensor::H => "h",
            Tensor::VNew => "v_new",
            Tensor::Ht => "ht",
        }
    }

    /// The tensor of a contract name, or `None` when no tensor has that name.
    pub fn from_name(name: &str) -> Option<Tensor> {
        Tensor::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Names of the dimensions, outermost first, e.g. `["T", "HV", "K"]` (`H` counts key heads,
    /// `HV` value heads), of key-first states (value-first ones swap the last two).
    pub const fn dim_names(self) -> &'static [&'static str] {
        match self {
            Tensor::K => &["T", "H", "K"],
            Tensor::W | Tensor::Gk => &["T", "HV", "K"],
            Tensor::G => &["T", "HV"],
            Tensor::U | Tensor::VNew => &["T", "HV", "V"],
            Tensor::H0 | Tensor::Ht => &["N", "HV", "K", "V"],
            Tensor::H => &["NT", "HV", "K", "V"],
        }
    }

    /// Whether the tensor is a state per head (`h`, `h0`, `ht`), laid out as the state layout
    /// says.
    pub const fn is_state(self) -> bool {
        matches!(self, Tensor::H0 | Tensor::H | Tensor::Ht)
    }

    /// Bytes of one element: 2 for the bf16 tensors, 4 for the f32 ones.
    pub const fn element_bytes(self) -> usize {
        match self {
            Tensor::K | Tensor::W | Tensor::U | Tensor::H | Tensor::VNew => 2,
            Tensor::Gk | Tensor::G | Tensor::H0 | Tensor::Ht => 4,
        }
    }
}

impl fmt::Display for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The sizes every tensor's shape is derived from.
///
/// The fields are plain numbers, so a `Dims` may describe tensors too large for memory: the
/// element counts are checked where it matters ([`Dims::len_of`], [`Dims::check_len`],
/// [`Dims::check`]), and the shorthand counts ([`Dims::key_len`] and its siblings) saturate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dims {
    /// Total tokens `T`.
    pub tokens: usize,
    /// Key heads `H`.
    pub heads: usize,
    /// Value heads `HV`, a multiple of `H` (grouped value heads: value head `i` reads key head
    /// `i / (HV / H)`); `H` when every key head has its own.
    pub value_heads: usize,
    /// Sequences `N`.
    pub seqs: usize,
    /// Total chunks `NT`.
    pub chunks: usize,
    /// Key size `K`.
    pub key_dim: usize,
    /// Value size `V`.
    pub value_dim: usize,
    /// How `h`, `h0` and `ht` store each state.
    pub layout: StateLayout,
}

impl Dims {
    /// The sizes of `plan` with `heads` heads, one value head per key head (not checked: see
    /// [`Dims::check`]).
    pub fn new(plan: &Plan, heads: usize) -> Self {
        Self::grouped(plan, heads, heads)
    }

    /// The sizes of `plan` with `heads` key heads and `value_heads` value heads (not checked: see
    /// [`Dims::check`]).
    pub fn grouped(plan: &Plan, heads: usize, value_heads: usize) -> Self {
        Self::model(plan, &ModelShape { value_heads, ..ModelShape::kda(heads) })
    }

    /// The sizes of `plan` with `shape`'s heads, head sizes and state layout (not checked: see
    /// [`Dims::check`]).
    pub fn model(plan: &Plan, shape: &ModelShape) -> Self {
        Self {
            tokens: plan.tokens(),
            heads: shape.heads,
            value_heads: shape.value_heads,
            seqs: plan.num_seqs(),
            chunks: plan.chunks(),
            key_dim: shape.key_dim,
            value_dim: shape.value_dim,
            layout: shape.layout,
        }
    }

    /// Value heads per key head, `HV / H` (0 when `H` is 0).
    pub fn group(&self) -> usize {
        self.value_heads.checked_div(self.heads).unwrap_or(0)
    }

    /// Elements of `k`: `[T, H, K]` (`usize::MAX` if that overflows).
    pub fn key_len(&self) -> usize {
        self.saturating_len(Tensor::K)
    }
    /// Elements of `w` and `gk`: `[T, HV, K]` (`usize::MAX` if that overflows); `key_len()` when
    /// `HV = H`.
    pub fn weight_len(&self) -> usize {
        self.saturating_len(Tensor::W)
    }
    /// Elements of `u` and `v_new`: `[T, HV, V]` (`usize::MAX` if that overflows).
    pub fn value_len(&self) -> usize {
        self.saturating_len(Tensor::U)
    }
    /// Elements of `h0` and `ht`: `[N, HV, K, V]` (`usize::MAX` if that overflows).
    pub fn state_len(&self) -> usize {
        self.saturating_len(Tensor::Ht)
    }
    /// Elements of `h`: `[NT, HV, K, V]` (`usize::MAX` if that overflows).
    pub fn h_len(&self) -> usize {
        self.saturating_len(Tensor::H)
    }

    fn saturating_len(&self, tensor: Tensor) -> usize {
        self.shape_of(tensor).into_iter().fold(1, usize::saturating_mul)
    }

    /// The contract's shape of `tensor`, outermost dimension first (states in this layout).
    pub fn shape_of(&self, tensor: Tensor) -> Vec<usize> {
        let (t, h, hv, n, nt) = (self.tokens, self.heads, self.value_heads, self.seqs, self.chunks);
        let (kd, vd) = (self.key_dim, self.value_dim);
        let state = match self.layout {
            StateLayout::KeyFirst => [kd, vd],
            StateLayout::ValueFirst => [vd, kd],
        };
        match tensor {
            Tensor::K => vec![t, h, kd],
            Tensor::W | Tensor::Gk => vec![t, hv, kd],
            Tensor::G => vec![t, hv],
            Tensor::U | Tensor::VNew => vec![t, hv, vd],
            Tensor::H0 | Tensor::Ht => vec![n, hv, state[0], state[1]],
            Tensor::H => vec![nt, hv, state[0], state[1]],
        }
    }

    /// The contract's dimension names of `tensor` in this layout.
    fn dim_names_of(&self, tensor: Tensor) -> Vec<&'static str> {
        let mut names = tensor.dim_names().to_vec();
        if tensor.is_state() && self.layout == StateLayout::ValueFirst {
            names.swap(2, 3);
        }
        names
    }

    /// Elements of `tensor`, or [`KdaError::TooLarge`] when its byte size would exceed
    /// `isize::MAX` (no buffer can be that large).
    pub fn len_of(&self, tensor: Tensor) -> Result<usize, KdaError> {
        let max = isize::MAX.unsigned_abs() / tensor.element_bytes();
        self.shape_of(tensor)
            .into_iter()
            .try_fold(1usize, usize::checked_mul)
            .filter(|&n| n <= max)
            .ok_or_else(|| KdaError::TooLarge { tensor: tensor.name(), shape: self.describe(tensor) })
    }

    /// Checks the head counts (at least one key head, `HV` a multiple of `H`) and that every
    /// tensor of these sizes, outputs included, fits in memory's address range (see
    /// [`Dims::len_of`]).
    pub fn check(&self) -> Result<(), KdaError> {
        if self.heads == 0 {
            return Err(KdaError::Argument { name: "heads", reason: "must be at least 1".into() });
        }
        if self.value_heads == 0 || !self.value_heads.is_multiple_of(self.heads) {
            return Err(KdaError::Argument {
                name: "value_heads",
                reason: format!("HV = {} must be a positive multiple of H = {}", self.value_heads, self.heads),
            });
        }
        Tensor::ALL.into_iter().try_for_each(|t| self.len_of(t).map(drop))
    }

    /// Checks that `tensor` has `actual` elements, as its contract shape requires.
    pub fn check_len(&self, tensor: Tensor, actual: usize) -> Result<(), KdaError> {
        let expected_len = self.len_of(tensor)?;
        if actual == expected_len {
            return Ok(());
        }
        Err(KdaError::Shape {
            tensor: tensor.name(),
            expected: self.describe(tensor),
            expected_len,
            actual: format!("{actual} elements"),
        })
    }

    /// The shape of `tensor` with dimension names, e.g. `[T=200, H=2, K=128]` (value heads are
    /// named `HV` only when they differ from the key heads).
    pub fn describe(&self, tensor: Tensor) -> String {
        let name = |n: &str| if n == "HV" && self.value_heads == self.heads { "H".to_string() } else { n.to_string() };
        let dims: Vec<String> = self
            .dim_names_of(tensor)
            .iter()
            .zip(self.shape_of(tensor))
            .map(|(n, d)| format!("{}={d}", name(n)))
            .collect();
        format!("[{}]", dims.join(", "))
    }
}

/// Inputs of one problem on the host, in the contract's layouts.
#[derive(Clone, Debug)]
pub struct Problem {
    /// The batch layout.
    pub plan: Plan,
    /// Key heads `H`.
    pub heads: usize,
    /// Value heads `HV`, a multiple of `H` (`H` for one value head per key head).
    pub value_heads: usize,
    /// `[T, H, K]` gated keys.
    pub k: Vec<bf16>,
    /// `[T, HV, K]` WY weights.
    pub w: Vec<bf16>,
    /// `[T, HV, V]` WY values.
    pub u: Vec<bf16>,
    /// `[T, HV, K]` cumulative log2 gates inside each chunk.
    pub gk: Vec<f32>,
    /// `[N, HV, K, V]` initial states; `None` means zeros.
    pub h0: Option<Vec<f32>>,
}

impl Problem {
    /// The sizes of this problem.
    pub fn dims(&self) -> Dims {
        Dims::grouped(&self.plan, self.heads, self.value_heads)
    }

    /// Checks `heads >= 1`, every input tensor against the shape implied by the plan and `heads`,
    /// and that the outputs' sizes fit in memory's address range.
    pub fn validate(&self) -> Result<(), KdaError> {
        let d = self.dims();
        // Head counts first (a length error would be meaningless under a bad grouping).
        if d.heads == 0 || d.value_heads == 0 || !d.value_heads.is_multiple_of(d.heads) {
            return d.check();
        }
        d.check_len(Tensor::K, self.k.len())?;
        d.check_len(Tensor::W, self.w.len())?;
        d.check_len(Tensor::U, self.u.len())?;
        d.check_len(Tensor::Gk, self.gk.len())?;
        if let Some(h0) = &self.h0 {
            d.check_len(Tensor::H0, h0.len())?;
        }
        // The outputs' sizes too, so that whoever allocates them can.
        d.check()
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

impl Outputs {
    /// The outputs' names, in the order of [`Outputs::errors`].
    pub const NAMES: [&'static str; 3] = ["h", "v_new", "ht"];

    /// Relative errors of `h`, `v_new` and `ht` against `reference` ([`crate::rel_error`]).
    pub fn errors(&self, reference: &Outputs) -> [f64; 3] {
        [
            crate::rel_error(&self.h, &reference.h),
            crate::rel_error(&self.v_new, &reference.v_new),
            crate::rel_error(&self.ht, &reference.ht),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims() -> Dims {
        Dims::new(&Plan::from_lengths(&[200, 0, 65]), 2)
    }

    #[test]
    fn tensor_names_round_trip() {
        for t in Tensor::ALL {
            assert_eq!(Tensor::from_name(t.name()), Some(t));
            assert_eq!(t.to_string(), t.name());
            assert_eq!(t.dim_names().len(), dims().shape_of(t).len());
        }
        assert_eq!(Tensor::from_name("cu_seqlens"), None);
    }

    #[test]
    fn shapes_and_lengths_follow_the_contract() {
        let d = dims();
        assert_eq!(d.describe(Tensor::W), "[T=265, H=2, K=128]");
        assert_eq!(d.describe(Tensor::VNew), "[T=265, H=2, V=128]");
        assert_eq!(d.describe(Tensor::H0), "[N=3, H=2, K=128, V=128]");
        assert_eq!(d.describe(Tensor::H), "[NT=6, H=2, K=128, V=128]");
        let lens = [
            d.key_len(),
            d.weight_len(),
            d.value_len(),
            d.weight_len(),
            d.tokens * d.value_heads,
            d.state_len(),
            d.h_len(),
            d.value_len(),
            d.state_len(),
        ];
        for (t, len) in Tensor::ALL.into_iter().zip(lens) {
            assert_eq!(d.len_of(t).unwrap(), len, "{t}");
            d.check_len(t, len).unwrap();
            let err = d.check_len(t, len + 1).unwrap_err();
            match &err {
                KdaError::Shape { tensor, expected_len, .. } => assert_eq!((*tensor, *expected_len), (t.name(), len)),
                other => panic!("{t}: unexpected {other}"),
            }
        }
    }

    #[test]
    fn grouped_value_heads_shape_all_but_the_keys() {
        let d = Dims::grouped(&Plan::from_lengths(&[200, 0, 65]), 2, 6);
        assert_eq!((d.group(), d.describe(Tensor::K)), (3, "[T=265, H=2, K=128]".to_string()));
        assert_eq!(d.describe(Tensor::W), "[T=265, HV=6, K=128]");
        assert_eq!(d.describe(Tensor::Ht), "[N=3, HV=6, K=128, V=128]");
        assert_eq!((d.key_len(), d.weight_len()), (265 * 2 * 128, 265 * 6 * 128));
        d.check().unwrap();
        let odd = Dims::grouped(&Plan::from_lengths(&[5]), 2, 3);
        assert!(matches!(odd.check(), Err(KdaError::Argument { name: "value_heads", .. })));
    }

    #[test]
    fn huge_sizes_are_errors_not_wraps() {
        // 2^57 tokens x 128 wraps to 0 elements in 64 bits.
        let kda = Dims::new(&Plan::from_lengths(&[]), 1);
        let d = Dims { tokens: 1 << 57, heads: 1, value_heads: 1, seqs: 1, chunks: 1 << 51, ..kda };
        assert_eq!(d.key_len(), usize::MAX);
        let err = d.check_len(Tensor::K, 0).unwrap_err();
        assert!(matches!(err, KdaError::TooLarge { tensor: "k", .. }), "{err}");
        assert!(err.to_string().contains("T=144115188075855872"), "{err}");
        // Fits in usize, but not in bytes.
        let heads = (isize::MAX as usize) / 128;
        let d = Dims { tokens: 1, heads, value_heads: heads, seqs: 0, chunks: 0, ..kda };
        assert!(matches!(d.len_of(Tensor::Gk), Err(KdaError::TooLarge { tensor: "gk", .. })));
        assert!(d.check().is_err());
        let p = Problem {
            plan: Plan::from_lengths(&[1]),
            heads: usize::MAX,
            value_heads: usize::MAX,
            k: vec![],
            w: vec![],
            u: vec![],
            gk: vec![],
            h0: None,
        };
        assert!(matches!(p.validate(), Err(KdaError::TooLarge { .. })));
    }
}
