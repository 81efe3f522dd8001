//! Host-side planning: from `cu_seqlens` to per-sequence token and chunk offsets.
//!
//! The plan is a pure function of the sequence lengths. It is computed once on the host, uploaded
//! once ([`crate::DevicePlan`]), and reused by every launch, so a launch never reads `cu_seqlens`
//! back or synchronises.

use crate::KdaError;
use kda_kernel::layout::{self, DESC_CHUNK_START, DESC_LEN, DESC_TOKEN_START, SEQ_DESC_WORDS};

/// One sequence of the batch: where its tokens and its chunks start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqDesc {
    /// First token of the sequence in the packed `[T, ...]` tensors.
    pub token_start: usize,
    /// Length in tokens (may be 0).
    pub len: usize,
    /// First chunk of the sequence in `h` (the exclusive prefix sum of chunk counts).
    pub chunk_start: usize,
}

impl SeqDesc {
    /// Chunks of this sequence: `ceil(len / 64)`.
    pub fn chunks(&self) -> usize {
        layout::chunks_of(self.len)
    }
}

/// The validated layout of a ragged batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    seqs: Vec<SeqDesc>,
    tokens: usize,
    chunks: usize,
}

impl Plan {
    /// Plans a batch from its boundaries `cu_seqlens` (`[N + 1]`, `0 = cu[0] <= ... <= cu[N] = T`).
    ///
    /// Accepts `i32` or `i64` entries. An empty slice is rejected (there is no `cu[0]`); `[0]` is a
    /// valid batch of no sequences.
    pub fn from_cu_seqlens<I: Copy + Into<i64>>(cu_seqlens: &[I]) -> Result<Self, KdaError> {
        let Some(first) = cu_seqlens.first() else {
            return Err(KdaError::CuSeqlens {
                index: 0,
                reason: "must have N + 1 >= 1 entries, got an empty list".into(),
            });
        };
        let first: i64 = (*first).into();
        if first != 0 {
            return Err(KdaError::CuSeqlens { index: 0, reason: format!("must be 0, got {first}") });
        }
        let mut lengths = Vec::with_capacity(cu_seqlens.len() - 1);
        for (i, pair) in cu_seqlens.windows(2).enumerate() {
            let (a, b): (i64, i64) = (pair[0].into(), pair[1].into());
            if b < a {
                return Err(KdaError::CuSeqlens {
                    index: i + 1,
                    reason: format!("boundaries must not decrease, got {b} after {a}"),
                });
            }
            lengths.push((b - a) as usize);
        }
        Ok(Self::from_lengths(&lengths))
    }

    /// Plans a batch of sequences of the given lengths, packed in order.
    pub fn from_lengths(lengths: &[usize]) -> Self {
        let mut seqs = Vec::with_capacity(lengths.len());
        let (mut tokens, mut chunks) = (0usize, 0usize);
        for &len in lengths {
            let seq = SeqDesc { token_start: tokens, len, chunk_start: chunks };
            tokens += len;
            chunks += seq.chunks();
            seqs.push(seq);
        }
        Self { seqs, tokens, chunks }
    }

    /// Plans a dense batch `[batch, seq_len]`: the ragged case with equal lengths.
    pub fn dense(batch: usize, seq_len: usize) -> Self {
        Self::from_lengths(&vec![seq_len; batch])
    }

    /// The sequences, in packing order.
    pub fn seqs(&self) -> &[SeqDesc] {
        &self.seqs
    }

    /// Number of sequences `N`.
    pub fn num_seqs(&self) -> usize {
        self.seqs.len()
    }

    /// Total tokens `T`.
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    /// Total chunks `NT` (rows of `h` per head).
    pub fn chunks(&self) -> usize {
        self.chunks
    }

    /// Sequence lengths in packing order.
    pub fn lengths(&self) -> Vec<usize> {
        self.seqs.iter().map(|s| s.len).collect()
    }

    /// The boundaries `cu_seqlens` of this batch (`[N + 1]`).
    pub fn cu_seqlens(&self) -> Vec<i64> {
        core::iter::once(0).chain(self.seqs.iter().map(|s| (s.token_start + s.len) as i64)).collect()
    }

    /// The descriptor table the kernels read: `SEQ_DESC_WORDS` `i64` words per sequence.
    pub fn descriptors(&self) -> Vec<i64> {
        let mut out = vec![0i64; self.seqs.len() * SEQ_DESC_WORDS];
        for (d, s) in out.chunks_exact_mut(SEQ_DESC_WORDS).zip(&self.seqs) {
            d[DESC_TOKEN_START] = s.token_start as i64;
            d[DESC_LEN] = s.len as i64;
            d[DESC_CHUNK_START] = s.chunk_start as i64;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_of_a_ragged_batch() {
        let plan = Plan::from_cu_seqlens(&[0i32, 1, 65, 65, 195]).unwrap();
        assert_eq!(plan.lengths(), vec![1, 64, 0, 130]);
        let starts: Vec<usize> = plan.seqs().iter().map(|s| s.chunk_start).collect();
        assert_eq!(starts, vec![0, 1, 2, 2]);
        assert_eq!(plan.chunks(), 5);
        assert_eq!(plan.tokens(), 195);
        assert_eq!(plan.cu_seqlens(), vec![0, 1, 65, 65, 195]);
        assert_eq!(plan.descriptors(), vec![0, 1, 0, 1, 64, 1, 65, 0, 2, 65, 130, 2]);
    }

    #[test]
    fn dense_is_equal_length_ragged() {
        assert_eq!(Plan::dense(3, 100), Plan::from_cu_seqlens(&[0i64, 100, 200, 300]).unwrap());
    }

    #[test]
    fn empty_batches_are_valid() {
        let plan = Plan::from_cu_seqlens(&[0i64]).unwrap();
        assert_eq!((plan.num_seqs(), plan.tokens(), plan.chunks()), (0, 0, 0));
        let plan = Plan::from_cu_seqlens(&[0i64, 0, 0]).unwrap();
        assert_eq!((plan.num_seqs(), plan.tokens(), plan.chunks()), (2, 0, 0));
    }

    #[test]
    fn rejects_bad_boundaries() {
        let err = Plan::from_cu_seqlens::<i64>(&[]).unwrap_err();
        assert!(matches!(err, KdaError::CuSeqlens { index: 0, .. }), "{err}");
        let err = Plan::from_cu_seqlens(&[3i32, 5]).unwrap_err();
        assert!(matches!(err, KdaError::CuSeqlens { index: 0, .. }), "{err}");
        let err = Plan::from_cu_seqlens(&[0i64, 70, 69]).unwrap_err();
        assert!(matches!(err, KdaError::CuSeqlens { index: 2, .. }), "{err}");
        assert!(err.to_string().contains("69 after 70"), "{err}");
    }
}
