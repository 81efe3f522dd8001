//! The shared-memory ring between a producer and a consumer, in the vocabulary of CUTLASS's sm90
//! pipelines.
//!
//! A ring of `stages` buffers has, per stage, a **full** mbarrier (the producer's data has landed)
//! and an **empty** mbarrier (the consumer is done with the buffer). Both sides walk the stages in
//! the same order with a [`PipelineState`]: the stage index and the parity of the barrier phase
//! they wait for, flipped each time the index wraps. One round of the ring is:
//!
//! | producer | consumer |
//! |---|---|
//! | [`Pipeline::producer_acquire`]: wait until the stage is empty | |
//! | [`Pipeline::producer_commit_tx`]: arrive on full, announcing the bytes the copies deliver | |
//! | issue the copies (TMA), completing on [`Pipeline::full`] | [`Pipeline::consumer_wait`]: wait until the stage is full |
//! | | read the stage |
//! | | [`Pipeline::consumer_release`]: arrive on empty |
//!
//! The same type serves a one-slot handoff (`stages = 1`), as the Hopper kernel's initial-state
//! slot uses it.

use crate::arch::sm90::{mbarrier_arrive, mbarrier_arrive_expect_tx, mbarrier_init, mbarrier_wait};

/// Bytes of one mbarrier in shared memory.
pub const MBARRIER_BYTES: u32 = 8;

/// A position in a ring of `stages` stages: the stage index and the parity of the barrier phase
/// a wait at this position is for. (The depth is a value, not a type parameter, so that each key
/// size's kernel can have its own; it is a constant wherever the kernel is instantiated, and
/// folds away.)
#[derive(Clone, Copy)]
pub struct PipelineState {
    index: u32,
    phase: u32,
    stages: u32,
}

impl PipelineState {
    /// The consumer's first position in a ring of `stages`: stage 0, waiting for the first
    /// completion (phase 0) of its `full` barrier.
    pub const fn consumer_start(stages: usize) -> Self {
        Self { index: 0, phase: 0, stages: stages as u32 }
    }

    /// The producer's first position in a ring of `stages`: stage 0, phase 1. A freshly
    /// initialised mbarrier counts as having completed the phase before its first, so the
    /// producer's first wait on each `empty` barrier (parity 1) returns at once: every stage
    /// starts free.
    pub const fn producer_start(stages: usize) -> Self {
        Self { index: 0, phase: 1, stages: stages as u32 }
    }

    /// The stage index, `0 .. stages`.
    #[inline(always)]
    pub fn index(self) -> usize {
        self.index as usize
    }

    /// The next position: the next stage, and the other phase after the last stage.
    #[inline(always)]
    pub fn advance(&mut self) {
        // Selects, not a branch: the compiler cannot prove the condition warp-uniform, and a
        // branch would cost a reconvergence point per chunk.
        let next = self.index + 1;
        let wrap = next == self.stages;
        self.index = if wrap { 0 } else { next };
        self.phase ^= wrap as u32;
    }
}

/// The `full` and `empty` mbarriers of a ring of `stages` stages: two arrays of `stages`
/// mbarriers at shared addresses `full` and `empty`.
#[derive(Clone, Copy)]
pub struct Pipeline {
    full: u32,
    empty: u32,
    stages: u32,
}

impl Pipeline {
    /// The ring of `stages` whose barrier arrays start at shared addresses `full` and `empty`.
    pub const fn new(full: u32, empty: u32, stages: usize) -> Self {
        Self { full, empty, stages: stages as u32 }
    }

    /// Stages of the ring.
    #[inline(always)]
    pub fn stages(self) -> usize {
        self.stages as usize
    }

    /// The `full` barrier of `state`'s stage: the one the producer's copies complete on.
    #[inline(always)]
    pub fn full(self, state: PipelineState) -> u32 {
        self.full + state.index * MBARRIER_BYTES
    }

    #[inline(always)]
    fn empty(self, state: PipelineState) -> u32 {
        self.empty + state.index * MBARRIER_BYTES
    }

    /// Initialises every barrier: a `full` phase completes on `producers` arrivals (one of them
    /// announcing the bytes the copies deliver, [`Self::producer_commit_tx`], the others
    /// [`Self::producer_arrive`]) and those bytes, an `empty` phase on `consumers` arrivals.
    ///
    /// # Safety
    /// One thread of the CTA calls it, on 8-byte-aligned shared addresses no one uses yet, then
    /// [`crate::arch::sm90::fence_mbarrier_init`] and a CTA barrier publish the barriers.
    #[inline(always)]
    pub unsafe fn init(self, producers: u32, consumers: u32) {
        for i in 0..self.stages {
            // SAFETY: see the function's contract.
            unsafe {
                mbarrier_init(self.full + i * MBARRIER_BYTES, producers);
                mbarrier_init(self.empty + i * MBARRIER_BYTES, consumers);
            }
        }
    }

    /// Waits until the consumer has released `state`'s stage.
    ///
    /// # Safety
    /// The barriers are initialised; `state` is the producer's position.
    #[inline(always)]
    pub unsafe fn producer_acquire(self, state: PipelineState) {
        // SAFETY: see the function's contract.
        unsafe { mbarrier_wait(self.empty(state), state.phase) }
    }

    /// A producer thread's arrival on `state`'s `full` barrier, announcing the `bytes` its
    /// copies will deliver: the phase completes when they have landed (and every producer thread
    /// has arrived). Ordinary shared-memory writes the arriving thread made before are visible to
    /// the consumer once its wait returns (release at CTA scope).
    ///
    /// # Safety
    /// One producer thread per stage round, the others calling [`Self::producer_arrive`];
    /// exactly `bytes` of copies complete on [`Self::full`] of `state`.
    #[inline(always)]
    pub unsafe fn producer_commit_tx(self, state: PipelineState, bytes: u32) {
        // SAFETY: see the function's contract.
        unsafe { mbarrier_arrive_expect_tx(self.full(state), bytes) }
    }

    /// A producer thread's arrival on `state`'s `full` barrier without copies: its ordinary
    /// shared-memory writes to the stage (decay rows, zeroed rows) are visible to the consumer
    /// once its wait returns.
    ///
    /// # Safety
    /// Each producer thread but the one that commits the bytes calls it once per stage round.
    #[inline(always)]
    pub unsafe fn producer_arrive(self, state: PipelineState) {
        // SAFETY: see the function's contract.
        unsafe { mbarrier_arrive(self.full(state)) }
    }

    /// Waits until `state`'s stage is full.
    ///
    /// # Safety
    /// The barriers are initialised; `state` is the consumer's position.
    #[inline(always)]
    pub unsafe fn consumer_wait(self, state: PipelineState) {
        // SAFETY: see the function's contract.
        unsafe { mbarrier_wait(self.full(state), state.phase) }
    }

    /// This thread's arrival on `state`'s `empty` barrier: once every consumer thread has
    /// arrived, the producer may overwrite the stage.
    ///
    /// # Safety
    /// Each consumer thread calls it once per stage round, after its last read of the stage.
    #[inline(always)]
    pub unsafe fn consumer_release(self, state: PipelineState) {
        // SAFETY: see the function's contract.
        unsafe { mbarrier_arrive(self.empty(state)) }
    }
}
