//! Host-side planning: from `cu_seqlens` to per-sequence token and chunk offsets.
//!
//! The plan is a pure function of the sequence lengths. It is computed once on the host, uploaded
//! once ([`crate::DevicePlan`]), and reused by every launch, so a launch never reads `cu_seqlens`
//! back or synchronises.

use crate::KdaError;
use kda_kernel::layout::{self, DESC_CHUNK_START, DESC_LEN, DESC_SEQ, DESC_TOKEN_START, SEQ_DESC_WORDS};

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
    /// Plans a batch from its boundaries `cu_seqlens` (`[N + 1]`, `0 = cu[0] <= ... <= cu[N] = T`;
    /// docs/CONTRACT.md#shapes-and-layouts).
    ///
    /// Accepts `i32` or `i64` entries. An empty slice is rejected (there is no `cu[0]`); `[0]` is a
    /// valid batch of no sequences.
    ///
    /// ```
    /// use kda::Plan;
    /// let plan = Plan::from_cu_seqlens(&[0i32, 200, 265, 265])?;
    /// assert_eq!((plan.num_seqs(), plan.tokens(), plan.lengths()), (3, 265, vec![200, 65, 0]));
    /// // Chunks of 64 tokens: 4 for the first sequence (a partial last one), 2 for the second.
    /// assert_eq!(plan.chunks(), 6);
    /// assert!(Plan::from_cu_seqlens(&[0i64, 5, 3]).is_err()); // decreasing: a typed error
    /// # Ok::<(), kda::KdaError>(())
    /// ```
    pub fn from_cu_seqlens<I: Copy + Into<i64>>(cu_seqlens: &[I]) -> Result<Self, KdaError> {
        let Some((first, rest)) = cu_seqlens.split_first() else {
            return Err(KdaError::CuSeqlens {
                index: 0,
                reason: "must have N + 1 >= 1 entries, got an empty list".into(),
            });
        };
        let first: i64 = (*first).into();
        if first != 0 {
            return Err(KdaError::CuSeqlens { index: 0, reason: format!("must be 0, got {first}") });
        }
        let mut lengths = Vec::with_capacity(rest.len());
        let mut prev = first;
        for (i, &b) in rest.iter().enumerate() {
            let b: i64 = b.into();
            // `b >= prev >= 0`, so the difference is in `0..=i64::MAX`.
            let len = b.checked_sub(prev).and_then(|d| usize::try_from(d).ok()).ok_or_else(|| KdaError::CuSeqlens {
                index: i + 1,
                reason: format!("boundaries must not decrease, got {b} after {prev}"),
            })?;
            lengths.push(len);
            prev = b;
        }
        Self::try_from_lengths(&lengths)
    }

    /// Plans a batch of sequences of the given lengths, packed in order.
    ///
    /// # Panics
    /// If the lengths add up to more than `i64::MAX` tokens; [`Plan::try_from_lengths`] returns
    /// that as an error instead.
    ///
    /// ```
    /// let plan = kda::Plan::from_lengths(&[1000, 1, 0]);
    /// assert_eq!(plan.cu_seqlens(), vec![0, 1000, 1001, 1001]);
    /// ```
    pub fn from_lengths(lengths: &[usize]) -> Self {
        match Self::try_from_lengths(lengths) {
            Ok(plan) => plan,
            Err(e) => panic!("{e}"),
        }
    }

    /// Plans a batch of sequences of the given lengths, packed in order; fails when they add up to
    /// more than `i64::MAX` tokens (`cu_seqlens` is `i64`).
    pub fn try_from_lengths(lengths: &[usize]) -> Result<Self, KdaError> {
        Self::build(lengths.iter().copied(), lengths.len())
    }

    /// Plans a dense batch `[batch, seq_len]`: the ragged case with equal lengths.
    ///
    /// # Panics
    /// If the batch holds more than `i64::MAX` tokens or its sequence table cannot be allocated;
    /// [`Plan::try_dense`] returns those as errors instead.
    pub fn dense(batch: usize, seq_len: usize) -> Self {
        match Self::try_dense(batch, seq_len) {
            Ok(plan) => plan,
            Err(e) => panic!("{e}"),
        }
    }

    /// Plans a dense batch `[batch, seq_len]`; fails when it holds more than `i64::MAX` tokens or
    /// more sequences than a table of them in memory can hold.
    pub fn try_dense(batch: usize, seq_len: usize) -> Result<Self, KdaError> {
        Self::build(std::iter::repeat_n(seq_len, batch), batch)
    }

    /// The plan of `count` sequences of lengths `lengths`.
    fn build(lengths: impl Iterator<Item = usize>, count: usize) -> Result<Self, KdaError> {
        let too_many = || KdaError::Argument {
            name: "lengths",
            reason: format!(
                "{count} sequences cannot be planned: more than i64::MAX tokens, or too many sequences for memory"
            ),
        };
        // A file may name a huge dense batch of empty sequences: its table must not abort the
        // process when memory cannot hold it.
        let mut seqs = Vec::new();
        seqs.try_reserve_exact(count).map_err(|_| too_many())?;
        let (mut tokens, mut chunks) = (0usize, 0usize);
        for len in lengths {
            let seq = SeqDesc { token_start: tokens, len, chunk_start: chunks };
            tokens = tokens.checked_add(len).filter(|&t| i64::try_from(t).is_ok()).ok_or_else(too_many)?;
            // Never more chunks than tokens.
            chunks += seq.chunks();
            seqs.push(seq);
        }
        Ok(Self { seqs, tokens, chunks })
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
        // Lossless: a plan holds at most `i64::MAX` tokens.
        core::iter::once(0).chain(self.seqs.iter().map(|s| (s.token_start + s.len) as i64)).collect()
    }

    /// The descriptor table the kernels read: `SEQ_DESC_WORDS` `i64` words per sequence, in
    /// launch order: longest first, equal lengths in batch order (`layout::SEQ_DESC_WORDS`).
    pub fn descriptors(&self) -> Vec<i64> {
        let mut order: Vec<usize> = (0..self.seqs.len()).collect();
        order.sort_by_key(|&i| core::cmp::Reverse(self.seqs[i].len)); // stable: ties keep batch order
        // Every offset, length and index is at most the token count or the batch size, so the
        // casts are lossless.
        let mut out = vec![0i64; self.seqs.len() * SEQ_DESC_WORDS];
        for (d, &i) in out.chunks_exact_mut(SEQ_DESC_WORDS).zip(&order) {
            let s = &self.seqs[i];
            d[DESC_TOKEN_START] = s.token_start as i64;
            d[DESC_LEN] = s.len as i64;
            d[DESC_CHUNK_START] = s.chunk_start as i64;
            d[DESC_SEQ] = i as i64;
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
        // Longest first, the empty sequence last; each row names its sequence.
        assert_eq!(plan.descriptors(), vec![65, 130, 2, 3, 1, 64, 1, 1, 0, 1, 0, 0, 65, 0, 2, 2]);
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
        let err = Plan::from_cu_seqlens(&[0i64, i64::MAX, i64::MIN]).unwrap_err();
        assert!(matches!(err, KdaError::CuSeqlens { index: 2, .. }), "{err}");
    }

    #[test]
    fn token_counts_past_i64_are_errors_not_wraps() {
        let huge = i64::MAX as usize;
        assert_eq!(Plan::try_from_lengths(&[huge]).unwrap().cu_seqlens(), vec![0, i64::MAX]);
        let err = Plan::try_from_lengths(&[huge, 1]).unwrap_err();
        assert!(matches!(err, KdaError::Argument { name: "lengths", .. }), "{err}");
        assert!(Plan::try_from_lengths(&[usize::MAX, usize::MAX]).is_err());
        assert!(Plan::try_dense(2, huge).is_err());
        assert!(Plan::try_dense(usize::MAX, 0).is_err());
        assert_eq!(Plan::try_dense(3, 5).unwrap(), Plan::from_lengths(&[5, 5, 5]));
        assert!(std::panic::catch_unwind(|| Plan::from_lengths(&[huge, 1])).is_err());
    }
}
