//! Strided views of the token-major tensors (docs/CONTRACT.md#strided-views): each of `k`, `w`,
//! `u`, `g`, `gk` and `v_new` may have its own token and head strides, its last dimension
//! contiguous, as when `k`, `w` and `u` are slices of one fused projection.

use crate::{Dims, KdaError, Tensor};

/// Element strides of a token-major tensor's token and head dimensions (`[T, heads, width]`, the
/// last dimension contiguous).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RowStrides {
    /// Elements from one token's row to the next token's.
    pub token: usize,
    /// Elements from one head's row to the next head's.
    pub head: usize,
}

impl RowStrides {
    /// The strides of a packed `[T, heads, width]` tensor.
    pub const fn packed(heads: usize, width: usize) -> Self {
        Self { token: heads * width, head: width }
    }

    /// Element offset of the row of token `t`, head `head`.
    pub const fn row(&self, t: usize, head: usize) -> usize {
        t * self.token + head * self.head
    }

    /// Elements a buffer must hold for `tokens` tokens of `heads` rows of `width` elements at
    /// these strides (the last row's end), or `None` when that overflows.
    pub fn span(&self, tokens: usize, heads: usize, width: usize) -> Option<usize> {
        if tokens == 0 || heads == 0 {
            return Some(0);
        }
        let last_token = (tokens - 1).checked_mul(self.token)?;
        let last_head = (heads - 1).checked_mul(self.head)?;
        last_token.checked_add(last_head)?.checked_add(width)
    }

    /// Whether no two rows (of `width` elements) share an element: what an output needs, so that
    /// no two rows race to write it.
    pub fn rows_disjoint(&self, tokens: usize, heads: usize, width: usize) -> bool {
        // Each dimension of extent > 1 with its stride; the inner one must clear a row, the outer
        // one the inner dimension's whole extent.
        let mut dims: Vec<(usize, usize)> =
            [(self.token, tokens), (self.head, heads)].into_iter().filter(|&(_, n)| n > 1).collect();
        dims.sort_unstable();
        let mut extent = width;
        for (stride, n) in dims {
            if stride < extent {
                return false;
            }
            extent = match stride.checked_mul(n - 1).and_then(|e| e.checked_add(extent)) {
                Some(e) => e,
                None => return false,
            };
        }
        true
    }
}

/// The strides of a launch's token-major tensors; `None` means packed (the contract's default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Strides {
    /// `k` `[T, H, K]`.
    pub k: Option<RowStrides>,
    /// `w` `[T, HV, K]`.
    pub w: Option<RowStrides>,
    /// `u` `[T, HV, V]`.
    pub u: Option<RowStrides>,
    /// `g` `[T, HV]` (the width is one element).
    pub g: Option<RowStrides>,
    /// `gk` `[T, HV, K]`.
    pub gk: Option<RowStrides>,
    /// `v_new` `[T, HV, V]` (an output: its rows must not overlap).
    pub v_new: Option<RowStrides>,
}

/// Bytes every stride of a tensor read or written through a TMA tensor map must be a multiple of.
pub const TMA_STRIDE_BYTES: usize = 16;

impl Strides {
    /// Every tensor packed.
    pub const PACKED: Self = Self { k: None, w: None, u: None, g: None, gk: None, v_new: None };

    /// The strides given for `tensor` (`None` for packed, and for the state tensors, which are
    /// always packed).
    pub fn of(&self, tensor: Tensor) -> Option<RowStrides> {
        match tensor {
            Tensor::K => self.k,
            Tensor::W => self.w,
            Tensor::U => self.u,
            Tensor::G => self.g,
            Tensor::Gk => self.gk,
            Tensor::VNew => self.v_new,
            Tensor::H0 | Tensor::H | Tensor::Ht => None,
        }
    }

    /// The strides `tensor` is used at: the given ones, or the packed ones of `dims`.
    pub fn effective(&self, dims: &Dims, tensor: Tensor) -> RowStrides {
        let (heads, width) = row_shape(dims, tensor);
        self.of(tensor).unwrap_or(RowStrides::packed(heads, width))
    }

    /// Elements a buffer of `tensor` must hold at these strides (its contract length when packed),
    /// or [`KdaError::TooLarge`] when that overflows.
    pub fn len_of(&self, dims: &Dims, tensor: Tensor) -> Result<usize, KdaError> {
        let Some(s) = self.of(tensor) else {
            return dims.len_of(tensor);
        };
        let (heads, width) = row_shape(dims, tensor);
        s.span(dims.tokens, heads, width).ok_or_else(|| KdaError::TooLarge {
            tensor: tensor.name(),
            shape: format!("{} at token stride {}, head stride {}", dims.describe(tensor), s.token, s.head),
        })
    }

    /// Every row of token-major `tensor`: `(packed offset, strided offset, width)`, token-major.
    pub fn rows(&self, dims: &Dims, tensor: Tensor) -> impl Iterator<Item = (usize, usize, usize)> {
        let (heads, width) = row_shape(dims, tensor);
        let s = self.effective(dims, tensor);
        (0..dims.tokens).flat_map(move |t| (0..heads).map(move |h| ((t * heads + h) * width, s.row(t, h), width)))
    }

    /// The packed elements `data` of token-major `tensor` laid out at these strides, `fill`
    /// between the rows (a copy of `data` when the tensor is packed).
    pub fn scatter<T: Copy>(&self, dims: &Dims, tensor: Tensor, data: &[T], fill: T) -> Vec<T> {
        if self.of(tensor).is_none() {
            return data.to_vec();
        }
        let mut out = vec![fill; self.len_of(dims, tensor).unwrap_or_default()];
        for (packed, at, width) in self.rows(dims, tensor) {
            out[at..at + width].copy_from_slice(&data[packed..packed + width]);
        }
        out
    }

    /// The packed elements of token-major `tensor` from `data`, laid out at these strides.
    pub fn gather<T: Copy + Default>(&self, dims: &Dims, tensor: Tensor, data: &[T]) -> Vec<T> {
        if self.of(tensor).is_none() {
            return data.to_vec();
        }
        let mut out = vec![T::default(); dims.len_of(tensor).unwrap_or(0)];
        for (packed, at, width) in self.rows(dims, tensor) {
            out[packed..packed + width].copy_from_slice(&data[at..at + width]);
        }
        out
    }

    /// Checks that `tensor` with `len` elements holds every row its strides reach; an output's
    /// rows must be disjoint. A packed tensor must have exactly its contract length.
    pub fn check_len(&self, dims: &Dims, tensor: Tensor, len: usize) -> Result<(), KdaError> {
        let Some(s) = self.of(tensor) else {
            return dims.check_len(tensor, len);
        };
        let (heads, width) = row_shape(dims, tensor);
        let span = self.len_of(dims, tensor)?;
        if tensor == Tensor::VNew && !s.rows_disjoint(dims.tokens, heads, width) {
            return Err(KdaError::Argument {
                name: tensor.name(),
                reason: format!(
                    "token stride {} and head stride {} make rows of {width} elements overlap; an output's rows \
                     must be disjoint",
                    s.token, s.head
                ),
            });
        }
        if len >= span {
            return Ok(());
        }
        Err(KdaError::Shape {
            tensor: tensor.name(),
            expected: format!("{} at token stride {}, head stride {}", dims.describe(tensor), s.token, s.head),
            expected_len: span,
            actual: format!("{len} elements"),
        })
    }

    /// Checks what the Hopper kernel needs of the strides: those of `k`, `w`, `u` and `v_new`
    /// (read and written by TMA, and `v_new`'s tail rows 16 bytes at a time) multiples of 16
    /// bytes and below 2^40 bytes; those the kernel takes as 32-bit parameters (`g`, `gk`,
    /// `v_new`) below 2^32 elements.
    pub fn check_hopper(&self, dims: &Dims) -> Result<(), KdaError> {
        self.check_rows(dims, "TMA", &[Tensor::G, Tensor::Gk, Tensor::VNew])
    }

    /// What the portable tensor-core kernel needs of the strides: 16-byte rows of `k`, `w`, `u`
    /// and `v_new` (one vector load per eight elements) and every stride in 32 bits.
    pub fn check_portable(&self, dims: &Dims) -> Result<(), KdaError> {
        let every = [Tensor::K, Tensor::W, Tensor::U, Tensor::G, Tensor::Gk, Tensor::VNew];
        self.check_rows(dims, "the portable kernel's 16-byte row loads", &every)
    }

    /// Rows of `k`, `w`, `u` and `v_new` at 16-byte strides below 2^40 bytes (what `who` needs),
    /// and the strides of `in_32_bits` below 2^32 elements (the kernel takes them as `u32`).
    fn check_rows(&self, dims: &Dims, who: &str, in_32_bits: &[Tensor]) -> Result<(), KdaError> {
        for tensor in [Tensor::K, Tensor::W, Tensor::U, Tensor::VNew] {
            let s = self.effective(dims, tensor);
            for (what, stride) in [("token", s.token), ("head", s.head)] {
                let bytes = stride.checked_mul(tensor.element_bytes());
                if bytes.is_none_or(|b| !b.is_multiple_of(TMA_STRIDE_BYTES) || b >= 1 << 40) {
                    return Err(KdaError::Unsupported {
                        argument: tensor.name(),
                        reason: format!(
                            "{what} stride {stride} elements is not a multiple of {TMA_STRIDE_BYTES} bytes below \
                             2^40, which {who} needs"
                        ),
                    });
                }
            }
        }
        for &tensor in in_32_bits {
            let s = self.effective(dims, tensor);
            if u32::try_from(s.token).is_err() || u32::try_from(s.head).is_err() {
                return Err(KdaError::Unsupported {
                    argument: tensor.name(),
                    reason: format!("strides {} and {} elements: the kernels take them in 32 bits", s.token, s.head),
                });
            }
        }
        Ok(())
    }
}

/// Rows per token (`H` or `HV`) and row width of a token-major tensor.
fn row_shape(dims: &Dims, tensor: Tensor) -> (usize, usize) {
    let shape = dims.shape_of(tensor);
    match shape.as_slice() {
        [_, heads] => (*heads, 1),
        [_, heads, width] => (*heads, *width),
        // The states are not token-major; they are always packed.
        _ => (1, 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Plan;

    fn dims() -> Dims {
        Dims::grouped(&Plan::from_lengths(&[100, 30]), 2, 4)
    }

    #[test]
    fn packed_strides_span_exactly_the_contract_length() {
        let d = dims();
        for t in [Tensor::K, Tensor::W, Tensor::U, Tensor::G, Tensor::Gk, Tensor::VNew] {
            let (heads, width) = row_shape(&d, t);
            let span = RowStrides::packed(heads, width).span(d.tokens, heads, width).unwrap();
            assert_eq!(span, d.len_of(t).unwrap(), "{t}");
            assert!(RowStrides::packed(heads, width).rows_disjoint(d.tokens, heads, width), "{t}");
        }
    }

    #[test]
    fn a_fused_projection_slice_is_accepted() {
        // k, w, u as slices of one [T, H*K + HV*K + HV*V] row: token stride = the fused row.
        let d = dims();
        let row = 2 * 128 + 4 * 128 + 4 * 128;
        let strided = RowStrides { token: row, head: 128 };
        let s = Strides { k: Some(strided), w: Some(strided), u: Some(strided), ..Strides::PACKED };
        let need = (d.tokens - 1) * row + 128 + 128;
        s.check_len(&d, Tensor::K, need).unwrap();
        let err = s.check_len(&d, Tensor::K, need - 1).unwrap_err();
        assert!(matches!(err, KdaError::Shape { tensor: "k", expected_len, .. } if expected_len == need), "{err}");
        assert!(err.to_string().contains("token stride 1280"), "{err}");
        s.check_hopper(&d).unwrap();
    }

    #[test]
    fn strides_tma_cannot_express_are_unsupported_not_wrong() {
        let d = dims();
        let s = Strides { u: Some(RowStrides { token: 4 * 128 + 3, head: 128 }), ..Strides::PACKED };
        let err = s.check_hopper(&d).unwrap_err();
        assert!(matches!(err, KdaError::Unsupported { argument: "u", .. }), "{err}");
        assert!(err.to_string().contains("16 bytes"), "{err}");
        // f32 gates are read element by element: any stride goes.
        let s = Strides { g: Some(RowStrides { token: 5, head: 1 }), ..Strides::PACKED };
        s.check_hopper(&d).unwrap();
    }

    #[test]
    fn overlapping_output_rows_are_rejected() {
        let d = dims();
        let s = Strides { v_new: Some(RowStrides { token: 4 * 128, head: 64 }), ..Strides::PACKED };
        let err = s.check_len(&d, Tensor::VNew, usize::MAX).unwrap_err();
        assert!(matches!(err, KdaError::Argument { name: "v_new", .. }), "{err}");
        // Head-major is fine.
        let head_major = RowStrides { token: 128, head: d.tokens * 128 };
        assert!(head_major.rows_disjoint(d.tokens, 4, 128));
        let s = Strides { v_new: Some(head_major), ..Strides::PACKED };
        s.check_len(&d, Tensor::VNew, 4 * d.tokens * 128).unwrap();
    }

    #[test]
    fn scatter_and_gather_round_trip_and_leave_the_gaps() {
        let d = Dims::grouped(&Plan::from_lengths(&[3]), 1, 2);
        let s = Strides { u: Some(RowStrides { token: 128, head: 2 * 3 * 128 }), ..Strides::PACKED };
        let packed: Vec<u32> = (0..d.len_of(Tensor::U).unwrap() as u32).collect();
        let laid = s.scatter(&d, Tensor::U, &packed, u32::MAX);
        assert_eq!(laid.len(), s.len_of(&d, Tensor::U).unwrap());
        // Token 1, head 1, column 5: packed (1 * 2 + 1) * 128 + 5, strided 128 + 768 + 5.
        assert_eq!(laid[128 + 768 + 5], 3 * 128 + 5);
        assert_eq!(laid.iter().filter(|&&x| x == u32::MAX).count(), laid.len() - packed.len());
        assert_eq!(s.gather(&d, Tensor::U, &laid), packed);
    }

    #[test]
    fn huge_strides_are_errors_not_wraps() {
        let d = dims();
        let s = Strides { gk: Some(RowStrides { token: usize::MAX / 2, head: 1 }), ..Strides::PACKED };
        assert!(matches!(s.check_len(&d, Tensor::Gk, 0), Err(KdaError::TooLarge { tensor: "gk", .. })));
        let s = Strides { gk: Some(RowStrides { token: 1 << 33, head: 128 }), ..Strides::PACKED };
        assert!(matches!(s.check_hopper(&d), Err(KdaError::Unsupported { argument: "gk", .. })));
    }
}
