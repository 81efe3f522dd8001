//! The persistent grid's work lists, as the kernels walk them.
//!
//! The launcher's schedule (`kda::schedule`, longest first) is a table of work-item records
//! (`layout::ITEM_WORDS` words each): worker `b`'s first item is record `b`, and each record names
//! the worker's next one, or `ITEM_LAST`. Every role of a CTA walks the same list, so producer and
//! consumer agree on the items without talking.

use crate::arch::sm80::block_idx_x_in_role;
use crate::layout::{
    CHUNK, ITEM_CHUNK_START, ITEM_H0_ROW, ITEM_HEAD, ITEM_HT_ROW, ITEM_KEY_HEAD, ITEM_LAST, ITEM_LEN, ITEM_NEXT,
    ITEM_NO_ROW, ITEM_NO_U, ITEM_TOKEN_START, ITEM_U_COL, ITEM_VCOL0, ITEM_WORDS,
};

/// The launcher's schedule table, for a batch of `heads` heads.
pub struct Work {
    records: *const Record,
    heads: usize,
}

/// One work-item record, read whole (three 16-byte loads).
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct Record([u32; ITEM_WORDS]);

impl Work {
    /// The table at `records` (`ITEM_WORDS` words per record, 16-byte aligned) of a batch of
    /// `heads` value heads.
    ///
    /// # Safety
    /// `records` holds a record for every worker of the grid, and every record's next word names
    /// a record of the table or is `ITEM_LAST`.
    pub unsafe fn new(records: *const u32, heads: usize) -> Self {
        Self { records: records.cast(), heads }
    }

    /// This CTA's items, in order, as warp role `ROLE` walks them (see
    /// [`block_idx_x_in_role`]: each role reads its CTA's index itself).
    pub fn items<const ROLE: u32>(&self) -> Items<'_> {
        Items { work: self, next: block_idx_x_in_role::<ROLE>() as u32 }
    }
}

/// The iterator of [`Work::items`]: follows the records' next words.
pub struct Items<'a> {
    work: &'a Work,
    next: u32,
}

impl Iterator for Items<'_> {
    type Item = Item;

    #[inline(always)]
    fn next(&mut self) -> Option<Item> {
        if self.next == ITEM_LAST {
            return None;
        }
        // SAFETY: `Work::new`'s contract: the record exists.
        let Record(r) = unsafe { *self.work.records.add(self.next as usize) };
        self.next = r[ITEM_NEXT];
        Some(Item {
            token_start: r[ITEM_TOKEN_START] as usize,
            len: r[ITEM_LEN] as usize,
            chunk_start: r[ITEM_CHUNK_START] as usize,
            h0_row: if r[ITEM_H0_ROW] == ITEM_NO_ROW { None } else { Some(r[ITEM_H0_ROW] as usize) },
            ht_row: if r[ITEM_HT_ROW] == ITEM_NO_ROW { None } else { Some(r[ITEM_HT_ROW] as usize) },
            head: r[ITEM_HEAD] as usize,
            key_head: r[ITEM_KEY_HEAD] as usize,
            heads: self.work.heads,
            vcol0: r[ITEM_VCOL0] as usize,
            u_col: if r[ITEM_U_COL] == ITEM_NO_U { None } else { Some(r[ITEM_U_COL] as usize) },
        })
    }
}

/// What every role needs to know about its work item: one block of value columns of one head of
/// one sequence, or of one segment of a split sequence.
#[derive(Clone, Copy)]
pub struct Item {
    /// The sequence's (segment's) first token.
    pub token_start: usize,
    /// The sequence's (segment's) length in tokens.
    pub len: usize,
    /// The sequence's (segment's) first chunk in `h`.
    pub chunk_start: usize,
    /// Row of this item's initial state in the `[rows][K][V]` view of `h0`, or `None` when it
    /// starts from no state (zeros; in the pre-scan, the identity's columns).
    pub h0_row: Option<usize>,
    /// Row of this item's final state in the `[rows][K][V]` view of `ht`, if it writes one.
    pub ht_row: Option<usize>,
    /// The (value) head.
    pub head: usize,
    /// The head of `k` this value head reads (itself when every key head has one value head).
    pub key_head: usize,
    /// Value heads of the batch.
    pub heads: usize,
    /// First value column of this item's block.
    pub vcol0: usize,
    /// First column of `u` it reads (`vcol0` except in the pre-scan), or `None` when its values
    /// are zero (the pre-scan's key columns).
    pub u_col: Option<usize>,
}

impl Item {
    /// Chunks of the sequence.
    #[inline(always)]
    pub fn chunks(&self) -> usize {
        self.len.div_ceil(CHUNK)
    }

    /// Valid rows of chunk `c`: `CHUNK`, or fewer in a partial last chunk.
    #[inline(always)]
    pub fn rows(&self, c: usize) -> usize {
        (self.len - c * CHUNK).min(CHUNK)
    }

    /// The first token of chunk `c`.
    #[inline(always)]
    pub fn first_token(&self, c: usize) -> usize {
        self.token_start + c * CHUNK
    }
}

/// Element strides of a token-major tensor's token and head dimensions (its last dimension is
/// contiguous).
#[derive(Clone, Copy)]
pub struct RowStrides {
    /// Elements from one token's row to the next token's.
    pub token: usize,
    /// Elements from one head's row to the next head's.
    pub head: usize,
}

impl RowStrides {
    /// The strides of kernel parameters `token` and `head`.
    #[inline(always)]
    pub fn new(token: u32, head: u32) -> Self {
        Self { token: token as usize, head: head as usize }
    }

    /// The strides of a packed `[T][heads][width]` tensor.
    #[inline(always)]
    pub fn packed(heads: usize, width: usize) -> Self {
        Self { token: heads * width, head: width }
    }

    /// Element offset of the row of token `t`, head `head`.
    #[inline(always)]
    pub fn row(self, t: usize, head: usize) -> usize {
        t * self.token + head * self.head
    }
}
