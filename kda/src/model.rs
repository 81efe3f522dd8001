//! The generalized recurrence's problems: which gates, how many key and value heads, which head
//! sizes and which state layout (docs/CONTRACT.md#the-generalized-recurrence).
//!
//! The f64 reference ([`crate::reference::model_reference`]) and the file reader
//! ([`crate::io::read_model_problem`]) cover all of it; the GPU kernels run the KDA slice that
//! [`crate::Problem`] describes (`gk` only, `HV = H`, `K = V = 128`, key-first state), and a
//! [`Problem`] is a [`ModelView`] of exactly that shape.

use crate::{KdaError, Plan, Problem};
use half::bf16;
use kda_kernel::layout::{K_DIM, V_DIM};

/// Which gates decay the state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gates {
    /// The scalar gate `g` (`[T, HV]` f32, log2, cumulative inside each chunk): Gated DeltaNet.
    pub g: bool,
    /// The per-key gate `gk` (`[T, HV, K]` f32, log2, cumulative inside each chunk): KDA.
    pub gk: bool,
}

/// How a `[K, V]` state is stored in `h`, `h0` and `ht`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateLayout {
    /// `[.., K, V]`: row `k`, column `v` (the default).
    KeyFirst,
    /// `[.., V, K]`: the transpose (FLA's `state_v_first`).
    ValueFirst,
}

impl StateLayout {
    /// The code the kernels take (`kda_kernel::abi::StateLayoutCode`).
    pub fn code(self) -> u32 {
        use kda_kernel::abi::StateLayoutCode;
        match self {
            StateLayout::KeyFirst => StateLayoutCode::KeyFirst as u32,
            StateLayout::ValueFirst => StateLayoutCode::ValueFirst as u32,
        }
    }

    /// Offset of element (key `kk`, value column `v`) inside one `K x V` state in this layout.
    pub fn index(self, key_dim: usize, value_dim: usize, kk: usize, v: usize) -> usize {
        match self {
            StateLayout::KeyFirst => kk * value_dim + v,
            StateLayout::ValueFirst => v * key_dim + kk,
        }
    }
}

/// Head counts, head sizes, gates and state layout of a problem.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ModelShape {
    /// Key heads `H`.
    pub heads: usize,
    /// Value heads `HV`, a multiple of `H`; value head `i` reads key head `i / (HV / H)`.
    pub value_heads: usize,
    /// Key size `K`.
    pub key_dim: usize,
    /// Value size `V`.
    pub value_dim: usize,
    /// The gates.
    pub gates: Gates,
    /// The state layout.
    pub layout: StateLayout,
}

impl ModelShape {
    /// The KDA slice the GPU kernels run: `gk` only, `HV = H`, `K = V = 128`, key-first state.
    pub fn kda(heads: usize) -> Self {
        Self {
            heads,
            value_heads: heads,
            key_dim: K_DIM,
            value_dim: V_DIM,
            gates: Gates { g: false, gk: true },
            layout: StateLayout::KeyFirst,
        }
    }

    /// Checks the head counts and sizes: every one at least 1, `HV` a multiple of `H`.
    pub fn validate(&self) -> Result<(), KdaError> {
        let positive = [
            ("heads", self.heads),
            ("value_heads", self.value_heads),
            ("key_dim", self.key_dim),
            ("value_dim", self.value_dim),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, n)| *n == 0) {
            return Err(KdaError::Argument { name, reason: "must be at least 1".into() });
        }
        if !self.value_heads.is_multiple_of(self.heads) {
            return Err(KdaError::Argument {
                name: "value_heads",
                reason: format!("HV = {} is not a multiple of H = {}", self.value_heads, self.heads),
            });
        }
        Ok(())
    }

    /// The key head value head `i` reads.
    pub fn key_head(&self, i: usize) -> usize {
        i / (self.value_heads / self.heads)
    }

    /// Elements of one state.
    pub fn state_len(&self) -> usize {
        self.key_dim * self.value_dim
    }

    /// Offset of element `(kk, v)` inside one state, in this layout.
    pub fn state_index(&self, kk: usize, v: usize) -> usize {
        self.layout.index(self.key_dim, self.value_dim, kk, v)
    }
}

/// The product of `dims` (a tensor's element count), or `None` when it overflows `usize`.
pub(crate) fn checked_product(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

/// The inputs of a generalized problem, borrowed.
#[derive(Clone, Copy, Debug)]
pub struct ModelView<'a> {
    /// The batch layout.
    pub plan: &'a Plan,
    /// Heads, sizes, gates and layout.
    pub shape: ModelShape,
    /// `[T, H, K]` keys.
    pub k: &'a [bf16],
    /// `[T, HV, K]` WY weights.
    pub w: &'a [bf16],
    /// `[T, HV, V]` WY values.
    pub u: &'a [bf16],
    /// `[T, HV]` scalar gate, when `shape.gates.g`.
    pub g: Option<&'a [f32]>,
    /// `[T, HV, K]` per-key gate, when `shape.gates.gk`.
    pub gk: Option<&'a [f32]>,
    /// `[N, HV, K, V]` (or `[N, HV, V, K]`) initial states; `None` means zeros.
    pub h0: Option<&'a [f32]>,
}

impl ModelView<'_> {
    /// Checks the shape and every tensor's length against the plan; a gate is given exactly when
    /// the shape names it.
    pub fn validate(&self) -> Result<(), KdaError> {
        let s = &self.shape;
        s.validate()?;
        let (t, n) = (self.plan.tokens(), self.plan.num_seqs());
        let len = checked_product;
        let check = |name: &'static str, actual: Option<usize>, dims: &[usize], wanted: bool| match (actual, wanted) {
            (None, false) => Ok(()),
            (Some(actual), true) if Some(actual) == len(dims) => Ok(()),
            (actual, _) => Err(KdaError::Shape {
                tensor: name,
                expected: if wanted { format!("{dims:?}") } else { "absent (its gate is off)".into() },
                expected_len: len(dims).unwrap_or(0),
                actual: actual.map_or("no tensor".into(), |a| format!("{a} elements")),
            }),
        };
        let (h, hv, kd, vd) = (s.heads, s.value_heads, s.key_dim, s.value_dim);
        check("k", Some(self.k.len()), &[t, h, kd], true)?;
        check("w", Some(self.w.len()), &[t, hv, kd], true)?;
        check("u", Some(self.u.len()), &[t, hv, vd], true)?;
        check("g", self.g.map(<[f32]>::len), &[t, hv], s.gates.g)?;
        check("gk", self.gk.map(<[f32]>::len), &[t, hv, kd], s.gates.gk)?;
        let state = match s.layout {
            StateLayout::KeyFirst => [n, hv, kd, vd],
            StateLayout::ValueFirst => [n, hv, vd, kd],
        };
        check("h0", self.h0.map(<[f32]>::len), &state, self.h0.is_some())?;
        // The outputs must be allocatable: every count below is then at most one of these.
        let outputs = [("h", [self.plan.chunks(), hv, kd, vd]), ("ht", [n, hv, kd, vd])];
        for (name, dims) in outputs {
            if len(&dims).is_none_or(|l| l > isize::MAX as usize / 4) {
                return Err(KdaError::TooLarge { tensor: name, shape: format!("{dims:?}") });
            }
        }
        Ok(())
    }

    /// Element counts of the outputs `h`, `v_new` and `ht`.
    pub fn output_lens(&self) -> [usize; 3] {
        let s = &self.shape;
        let p = self.plan;
        [
            p.chunks() * s.value_heads * s.state_len(),
            p.tokens() * s.value_heads * s.value_dim,
            p.num_seqs() * s.value_heads * s.state_len(),
        ]
    }
}

/// A generalized problem, owning its inputs.
#[derive(Clone, Debug)]
pub struct ModelProblem {
    /// The batch layout.
    pub plan: Plan,
    /// Heads, sizes, gates and layout.
    pub shape: ModelShape,
    /// `[T, H, K]` keys.
    pub k: Vec<bf16>,
    /// `[T, HV, K]` WY weights.
    pub w: Vec<bf16>,
    /// `[T, HV, V]` WY values.
    pub u: Vec<bf16>,
    /// `[T, HV]` scalar gate.
    pub g: Option<Vec<f32>>,
    /// `[T, HV, K]` per-key gate.
    pub gk: Option<Vec<f32>>,
    /// Initial states in `shape.layout`; `None` means zeros.
    pub h0: Option<Vec<f32>>,
}

impl ModelProblem {
    /// The problem, borrowed.
    pub fn view(&self) -> ModelView<'_> {
        ModelView {
            plan: &self.plan,
            shape: self.shape,
            k: &self.k,
            w: &self.w,
            u: &self.u,
            g: self.g.as_deref(),
            gk: self.gk.as_deref(),
            h0: self.h0.as_deref(),
        }
    }
}

impl From<Problem> for ModelProblem {
    /// The KDA problem as a generalized one ([`ModelShape::kda`], with its value heads).
    fn from(p: Problem) -> Self {
        Self {
            shape: ModelShape { value_heads: p.value_heads, ..ModelShape::kda(p.heads) },
            plan: p.plan,
            k: p.k,
            w: p.w,
            u: p.u,
            g: None,
            gk: Some(p.gk),
            h0: p.h0,
        }
    }
}

impl Problem {
    /// This KDA problem as a generalized one ([`ModelShape::kda`], with its value heads).
    pub fn model_view(&self) -> ModelView<'_> {
        ModelView {
            plan: &self.plan,
            shape: ModelShape { value_heads: self.value_heads, ..ModelShape::kda(self.heads) },
            k: &self.k,
            w: &self.w,
            u: &self.u,
            g: None,
            gk: Some(&self.gk),
            h0: self.h0.as_deref(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inputs;

    #[test]
    fn a_kda_problem_is_a_valid_model_view() {
        let p = inputs::random_problem(Plan::from_lengths(&[70, 0, 3]), 2, true, 4);
        let v = p.model_view();
        v.validate().unwrap();
        let d = p.dims();
        assert_eq!(v.output_lens(), [d.h_len(), d.value_len(), d.state_len()]);
    }

    #[test]
    fn bad_shapes_and_gates_are_named() {
        let plan = Plan::from_lengths(&[5]);
        let shape = ModelShape { heads: 2, value_heads: 3, ..ModelShape::kda(2) };
        let err = shape.validate().unwrap_err();
        assert!(matches!(err, KdaError::Argument { name: "value_heads", .. }), "{err}");
        let zero = ModelShape { key_dim: 0, ..ModelShape::kda(1) };
        assert!(matches!(zero.validate(), Err(KdaError::Argument { name: "key_dim", .. })));

        let (k, u, gk) = (vec![bf16::ZERO; 5 * 128], vec![bf16::ZERO; 5 * 128], vec![0.0f32; 5 * 128]);
        let g = vec![0.0f32; 5];
        let view =
            ModelView { plan: &plan, shape: ModelShape::kda(1), k: &k, w: &k, u: &u, g: None, gk: Some(&gk), h0: None };
        view.validate().unwrap();
        let huge = ModelView { shape: ModelShape { key_dim: usize::MAX / 2, ..ModelShape::kda(1) }, ..view };
        assert!(huge.validate().is_err());
        let with_g = ModelView { g: Some(&g), ..view };
        assert!(matches!(with_g.validate(), Err(KdaError::Shape { tensor: "g", .. })));
        let no_gk = ModelView { gk: None, ..view };
        assert!(matches!(no_gk.validate(), Err(KdaError::Shape { tensor: "gk", .. })));
        let short_u = ModelView { u: &u[1..], ..view };
        assert!(matches!(short_u.validate(), Err(KdaError::Shape { tensor: "u", .. })));
    }

    #[test]
    fn value_heads_read_their_group_key_head_and_layouts_transpose() {
        let s = ModelShape { heads: 2, value_heads: 6, ..ModelShape::kda(2) };
        assert_eq!((0..6).map(|i| s.key_head(i)).collect::<Vec<_>>(), [0, 0, 0, 1, 1, 1]);
        let s = ModelShape { key_dim: 3, value_dim: 5, ..ModelShape::kda(1) };
        assert_eq!(s.state_index(2, 4), 2 * 5 + 4);
        let t = ModelShape { layout: StateLayout::ValueFirst, ..s };
        assert_eq!(t.state_index(2, 4), 4 * 3 + 2);
    }
}
