//! State pools (`../shared/LAYER.md`, "Decode"): serving engines keep every sequence's recurrent
//! state in a pool of slots, `[slots, HV, K, V]` (or `[slots, HV, V, K]`) f32, and hand each call
//! one slot index per sequence. The state is read from the slot and the final state written back
//! to it, in place; a negative index is padding (the sequence is skipped: nothing read or
//! written, its outputs untouched), and a sequence may start from zeros instead of its slot (a new
//! sequence). Two sequences of one call may not name the same slot.
//!
//! This module holds the slot rules and their offsets (64-bit: a pool of 4096 slots of 32 heads of
//! `128 x 128` passes 2^31 elements); [`layer_reference_pooled`] is the f64 layer
//! over a pool, for prefill and decode alike.

use crate::KdaError;
use crate::layer::{LayerProblem, LayerShape, layer_reference};
use crate::model::StateLayout;

/// A pool of recurrent states.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolShape {
    /// Slots.
    pub slots: usize,
    /// Value heads `HV` per state.
    pub value_heads: usize,
    /// Key size `K`.
    pub key_dim: usize,
    /// Value size `V`.
    pub value_dim: usize,
    /// `[K, V]` or `[V, K]` per head, named explicitly (never inferred from a shape).
    pub layout: StateLayout,
    /// The states' element type, named explicitly.
    pub dtype: StateDtype,
}

/// The element type of a pool's states: f32, or bf16 (half the memory and traffic; the state is
/// rounded to bf16 each time it is written back, and read back exactly).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateDtype {
    /// f32.
    F32,
    /// bf16 (round to nearest even on every write).
    Bf16,
}

/// A pool's element type on the device, as a launch takes the pool: `f32` or `bf16`.
pub trait PoolElement: cudarc::driver::DeviceRepr {
    /// The dtype a pool of these elements has.
    const DTYPE: StateDtype;
}

impl PoolElement for f32 {
    const DTYPE: StateDtype = StateDtype::F32;
}

impl PoolElement for half::bf16 {
    const DTYPE: StateDtype = StateDtype::Bf16;
}

impl StateDtype {
    /// The code the kernels take (`kda_kernel::abi::StateDtypeCode`).
    pub fn code(self) -> u32 {
        use kda_kernel::abi::StateDtypeCode;
        match self {
            StateDtype::F32 => StateDtypeCode::F32 as u32,
            StateDtype::Bf16 => StateDtypeCode::Bf16 as u32,
        }
    }

    /// `x` as the pool stores it: itself for f32, rounded to the nearest bf16 for bf16.
    pub fn stored(self, x: f32) -> f32 {
        match self {
            StateDtype::F32 => x,
            StateDtype::Bf16 => half::bf16::from_f32(x).to_f32(),
        }
    }
}

impl PoolShape {
    /// A pool of `slots` states of `shape`'s value heads and sizes, in `layout` and `dtype`
    /// (both named: never inferred).
    pub fn for_layer(shape: &LayerShape, slots: usize, layout: StateLayout, dtype: StateDtype) -> Self {
        Self {
            slots,
            value_heads: shape.value_heads,
            key_dim: shape.key_dim,
            value_dim: shape.value_dim,
            layout,
            dtype,
        }
    }

    /// Refuses, naming `pool`, a pool whose states are not `shape`'s (value heads, `K`, `V`).
    pub fn check_holds(&self, shape: &LayerShape) -> Result<(), KdaError> {
        if (self.value_heads, self.key_dim, self.value_dim) == (shape.value_heads, shape.key_dim, shape.value_dim) {
            return Ok(());
        }
        Err(KdaError::Argument {
            name: "pool",
            reason: format!("{self:?} does not hold the layer's states ({shape:?})"),
        })
    }

    /// Refuses a device view of `E` for this pool unless `E` is the pool's element type.
    pub fn check_element<E: PoolElement>(&self) -> Result<(), KdaError> {
        if E::DTYPE == self.dtype {
            return Ok(());
        }
        Err(KdaError::Argument {
            name: "pool",
            reason: format!(
                "a {:?} view of a {:?} pool: the pool's dtype is named by PoolShape::dtype",
                E::DTYPE,
                self.dtype
            ),
        })
    }

    /// Elements of one head's state.
    pub fn state_len(&self) -> usize {
        self.key_dim * self.value_dim
    }

    /// Elements of the whole pool, or `TooLarge` when that overflows.
    pub fn len(&self) -> Result<usize, KdaError> {
        (self.slots.checked_mul(self.value_heads))
            .and_then(|n| n.checked_mul(self.state_len()))
            .ok_or_else(|| KdaError::TooLarge { tensor: "pool", shape: format!("{self:?}") })
    }

    /// Whether the pool has no slots.
    pub fn is_empty(&self) -> bool {
        self.slots == 0
    }

    /// Element offset of head `head`'s state in slot `slot` (`None` past the pool).
    pub fn offset(&self, slot: usize, head: usize) -> Option<usize> {
        if slot >= self.slots || head >= self.value_heads {
            return None;
        }
        slot.checked_mul(self.value_heads)?.checked_add(head)?.checked_mul(self.state_len())
    }
}

/// What one sequence of a call does with the pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotUse {
    /// Skipped: nothing read or written.
    Padding,
    /// Starts from the state in the slot and writes its final state back there.
    Continue(usize),
    /// Starts from zeros (a new sequence) and writes its final state to the slot.
    Start(usize),
}

impl SlotUse {
    /// The per-sequence tables the decode kernel reads: the slot (`-1`: padding) and whether
    /// the sequence starts from zeros (1) or from its slot (0), each with one padding entry after
    /// the last sequence (the device buffers are never empty).
    pub fn decode_tables(uses: &[SlotUse]) -> (Vec<i64>, Vec<u32>) {
        let slots = uses.iter().map(|u| u.slot().map_or(-1, |s| s as i64)).chain([-1]).collect();
        let fresh = uses.iter().map(|u| matches!(u, SlotUse::Start(_)) as u32).chain([0]).collect();
        (slots, fresh)
    }

    /// The slot read or written, if any.
    pub fn slot(self) -> Option<usize> {
        match self {
            SlotUse::Padding => None,
            SlotUse::Continue(s) | SlotUse::Start(s) => Some(s),
        }
    }
}

/// The uses of a call's slot `indices` (one per sequence: negative for padding), with `fresh[n]`
/// marking a new sequence (starting from zeros). Fails, naming the sequence, when an index is
/// past the pool, when two sequences name one slot, or when the lengths differ.
///
/// ```
/// use kda::StateLayout;
/// use kda::pool::{PoolShape, SlotUse, slot_uses};
/// let pool = PoolShape { slots: 8, value_heads: 32, key_dim: 128, value_dim: 128, layout: StateLayout::KeyFirst, dtype: kda::pool::StateDtype::F32 };
/// // Sequence 0 continues slot 5, sequence 1 is padding, sequence 2 starts fresh in slot 0.
/// let uses = slot_uses(&[5, -1, 0], &[false, false, true], &pool)?;
/// assert_eq!(uses, [SlotUse::Continue(5), SlotUse::Padding, SlotUse::Start(0)]);
/// assert!(slot_uses(&[5, 5], &[false, false], &pool).is_err()); // one slot, two final states
/// # Ok::<(), kda::KdaError>(())
/// ```
pub fn slot_uses(indices: &[i64], fresh: &[bool], pool: &PoolShape) -> Result<Vec<SlotUse>, KdaError> {
    if indices.len() != fresh.len() {
        return Err(KdaError::Argument {
            name: "fresh",
            reason: format!("{} flags for {} slot indices: one per sequence", fresh.len(), indices.len()),
        });
    }
    let mut owner = std::collections::HashMap::new();
    let mut uses = Vec::with_capacity(indices.len());
    for (n, (&index, &start)) in indices.iter().zip(fresh).enumerate() {
        let Ok(slot) = usize::try_from(index) else {
            uses.push(SlotUse::Padding);
            continue;
        };
        if slot >= pool.slots {
            return Err(KdaError::Argument {
                name: "slot_indices",
                reason: format!("sequence {n}: slot {slot} is past the pool's {} slots", pool.slots),
            });
        }
        if let Some(first) = owner.insert(slot, n) {
            return Err(KdaError::Argument {
                name: "slot_indices",
                reason: format!("sequences {first} and {n} both name slot {slot}: their final states would collide"),
            });
        }
        uses.push(if start { SlotUse::Start(slot) } else { SlotUse::Continue(slot) });
    }
    Ok(uses)
}

/// The most draft tokens per sequence one verify call runs (`kda_kernel::layout::decode::MAX_DRAFT`).
pub const MAX_DRAFT: usize = kda_kernel::layout::decode::MAX_DRAFT;

/// How a call's tokens continue one another and where their states go, checked: what the decode
/// kernel reads besides the slots (`parents` and `token_slots`, `[N * draft]` each, empty for a
/// plain step).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DraftTables {
    /// Tokens per sequence.
    pub draft: usize,
    /// Each token's parent (an earlier token of its sequence, or -1: the initial state); empty
    /// for chains.
    pub parents: Vec<i64>,
    /// The slot each token's state is written to (-1: none); empty when only the last token's
    /// state goes back to the sequence's slot.
    pub token_slots: Vec<i64>,
}

/// Checks a call of `draft` tokens per sequence over `uses` (from [`slot_uses`]): `parents`
/// (`None`: each token continues the previous one) names for each token an earlier token of its
/// sequence or a negative value (the sequence's initial state); `token_slots` (`None`: the last
/// token's state goes back to the sequence's slot) names where each token's state is written
/// (negative: nowhere). A tree (any token whose parent is not the previous one) needs
/// `token_slots`. A token slot must lie in the pool, be named once, and not be another live
/// sequence's slot (which that sequence reads), nor, in a tree, its own sequence's (the kernel
/// reads the initial state again to rebuild a branch); a padding sequence's tokens are ignored.
///
/// ```
/// use kda::StateLayout;
/// use kda::pool::{PoolShape, draft_tables, slot_uses};
/// let pool = PoolShape { slots: 16, value_heads: 2, key_dim: 64, value_dim: 64, layout: StateLayout::KeyFirst, dtype: kda::pool::StateDtype::F32 };
/// let uses = slot_uses(&[0, 1], &[false, false], &pool)?;
/// // Two sequences of three draft tokens; sequence 0 is a tree (token 2 branches off token 0).
/// let parents = [-1, 0, 0, -1, 0, 1];
/// let token_slots = [2, 3, 4, 5, 6, 7];
/// let t = draft_tables(&uses, 3, Some(&parents), Some(&token_slots), &pool)?;
/// assert_eq!(t.parents, parents);
/// assert!(draft_tables(&uses, 3, Some(&parents), None, &pool).is_err()); // a tree needs token slots
/// assert!(draft_tables(&uses, 3, None, Some(&[2, 3, 1, 5, 6, 7]), &pool).is_err()); // slot 1 is read
/// // A chain may end in its own slot; a tree may not write it.
/// assert!(draft_tables(&uses, 3, None, Some(&[2, 3, 0, 5, 6, 1]), &pool).is_ok());
/// assert!(draft_tables(&uses, 3, Some(&parents), Some(&[2, 3, 0, 5, 6, 7]), &pool).is_err());
/// # Ok::<(), kda::KdaError>(())
/// ```
pub fn draft_tables(
    uses: &[SlotUse],
    draft: usize,
    parents: Option<&[i64]>,
    token_slots: Option<&[i64]>,
    pool: &PoolShape,
) -> Result<DraftTables, KdaError> {
    let bad = |name: &'static str, reason: String| Err(KdaError::Argument { name, reason });
    if draft == 0 || draft > MAX_DRAFT {
        return bad("draft", format!("{draft} tokens per sequence: 1 to {MAX_DRAFT}"));
    }
    let rows = uses.len() * draft;
    for (name, table) in [("parents", parents), ("token_slots", token_slots)] {
        if let Some(t) = table.filter(|t| t.len() != rows) {
            return Err(KdaError::Shape {
                tensor: name,
                expected: format!("[N = {}, draft = {draft}]", uses.len()),
                expected_len: rows,
                actual: format!("{} elements", t.len()),
            });
        }
    }
    let mut tree = false;
    if let Some(parents) = parents {
        for (row, &p) in parents.iter().enumerate() {
            let (n, t) = (row / draft, (row % draft) as i64);
            if p >= t {
                return bad("parents", format!("sequence {n}, token {t}: parent {p} is not an earlier token"));
            }
            tree |= p.max(-1) != t - 1;
        }
    }
    if tree && token_slots.is_none() {
        return bad("token_slots", "a tree of draft tokens has no last state: name each token's slot".into());
    }
    if let Some(token_slots) = token_slots {
        let read: std::collections::HashMap<usize, usize> =
            uses.iter().enumerate().filter_map(|(n, u)| u.slot().map(|s| (s, n))).collect();
        let mut written = std::collections::HashMap::new();
        for (row, &index) in token_slots.iter().enumerate() {
            let n = row / draft;
            let (Ok(slot), Some(_)) = (usize::try_from(index), uses[n].slot()) else { continue };
            if slot >= pool.slots {
                return bad(
                    "token_slots",
                    format!("sequence {n}: slot {slot} is past the pool's {} slots", pool.slots),
                );
            }
            if let Some(&other) = read.get(&slot).filter(|&&m| m != n || tree) {
                let whose = if other == n {
                    "its own initial state, which a tree rebuilds branches from".to_string()
                } else {
                    format!("which sequence {other} reads")
                };
                return bad("token_slots", format!("sequence {n} writes slot {slot}, {whose}"));
            }
            if let Some(first) = written.insert(slot, row) {
                return bad("token_slots", format!("rows {first} and {row} both write slot {slot}"));
            }
        }
    }
    let normalise = |t: &[i64]| t.iter().map(|&x| x.max(-1)).collect();
    Ok(DraftTables {
        draft,
        parents: parents.map_or_else(Vec::new, normalise),
        token_slots: token_slots.map_or_else(Vec::new, normalise),
    })
}

/// One checkpoint for prefix caching: the state of `sequence` (an index into a prefill's batch)
/// after its first `position` tokens, written to `slot` of a pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    /// The sequence, an index into the batch.
    pub sequence: usize,
    /// Tokens from the sequence's start: 1 up to its length.
    pub position: usize,
    /// The pool slot the state goes to.
    pub slot: usize,
}

/// Checkpoints as the checkpoint kernel takes them: per checkpoint, the chunk (index into a
/// layer's `h`) whose entry state it starts from, its first token row, its tokens (1 to the
/// chunk size) and its slot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointTables {
    /// Source chunk per checkpoint.
    pub sources: Vec<i64>,
    /// First token row per checkpoint.
    pub first_rows: Vec<i64>,
    /// Tokens per checkpoint.
    pub counts: Vec<u32>,
    /// Slot per checkpoint.
    pub slots: Vec<i64>,
}

/// Checks `checkpoints` of `batch` against `pool` and lays them out for the kernel: the state
/// after `p` tokens is the entry state of the chunk holding token `p - 1`, advanced through that
/// chunk's first tokens up to `p`. Refuses, with typed errors naming `checkpoints`, a sequence
/// past the batch, a position outside `1..=len` (the state after 0 tokens is the caller's own
/// initial state), a slot past the pool or named twice.
pub fn checkpoint_tables(
    batch: &crate::Plan,
    checkpoints: &[Checkpoint],
    pool: &PoolShape,
) -> Result<CheckpointTables, KdaError> {
    let chunk = kda_kernel::layout::CHUNK;
    let bad = |m: usize, reason: String| KdaError::Argument {
        name: "checkpoints",
        reason: format!("checkpoint {m}: {reason}"),
    };
    let mut owner = std::collections::HashMap::new();
    let mut t = CheckpointTables { sources: Vec::new(), first_rows: Vec::new(), counts: Vec::new(), slots: Vec::new() };
    for (m, c) in checkpoints.iter().enumerate() {
        let seq = batch
            .seqs()
            .get(c.sequence)
            .ok_or_else(|| bad(m, format!("sequence {} is past the batch's {}", c.sequence, batch.num_seqs())))?;
        if c.position == 0 || c.position > seq.len {
            return Err(bad(
                m,
                format!("position {} is outside 1..={} (sequence {})", c.position, seq.len, c.sequence),
            ));
        }
        if c.slot >= pool.slots {
            return Err(bad(m, format!("slot {} is past the pool's {} slots", c.slot, pool.slots)));
        }
        if let Some(first) = owner.insert(c.slot, m) {
            return Err(bad(m, format!("slot {} is named by checkpoint {first} too", c.slot)));
        }
        let within = (c.position - 1) / chunk;
        // (Every index is below the batch's tokens, chunks or the pool's slots: far below 2^63.)
        t.sources.push((seq.chunk_start + within) as i64);
        t.first_rows.push((seq.token_start + within * chunk) as i64);
        t.counts.push((c.position - within * chunk) as u32);
        t.slots.push(c.slot as i64);
    }
    Ok(t)
}

/// The states sequences of `uses` start from, gathered from `pool` as a key-first `h0`
/// (`[uses.len(), HV, K, V]` f32): a continuing sequence's slot, read exactly whatever the pool's
/// layout; zeros for a fresh or a padding one. Fails when `pool` does not hold `shape` or a slot
/// lies past it.
///
/// ```
/// use kda::StateLayout;
/// use kda::pool::{PoolShape, SlotUse, StateDtype, initial_states};
/// let shape = PoolShape { slots: 2, value_heads: 1, key_dim: 64, value_dim: 64, layout: StateLayout::KeyFirst, dtype: StateDtype::F32 };
/// let pool: Vec<f32> = (0..2 * 64 * 64).map(|x| x as f32).collect();
/// let h0 = initial_states(&pool, &shape, &[SlotUse::Continue(1), SlotUse::Start(0)])?;
/// assert_eq!(&h0[..64 * 64], &pool[64 * 64..]); // slot 1's state
/// assert!(h0[64 * 64..].iter().all(|&x| x == 0.0)); // a fresh sequence starts from zeros
/// # Ok::<(), kda::KdaError>(())
/// ```
pub fn initial_states(pool: &[f32], shape: &PoolShape, uses: &[SlotUse]) -> Result<Vec<f32>, KdaError> {
    let len = shape.len()?;
    if pool.len() != len {
        return Err(KdaError::Shape {
            tensor: "pool",
            expected: format!("{shape:?}"),
            expected_len: len,
            actual: format!("{} elements", pool.len()),
        });
    }
    let (hv, kd, vd) = (shape.value_heads, shape.key_dim, shape.value_dim);
    let state = kd * vd;
    let mut h0 = vec![0f32; uses.len() * hv * state];
    for (n, u) in uses.iter().enumerate() {
        if let SlotUse::Continue(slot) = *u {
            for i in 0..hv {
                let base = shape.offset(slot, i).ok_or_else(|| KdaError::Argument {
                    name: "slot_indices",
                    reason: format!("sequence {n}: slot {slot} is past the pool's {} slots", shape.slots),
                })?;
                let dst = &mut h0[(n * hv + i) * state..][..state];
                for a in 0..kd {
                    for c in 0..vd {
                        dst[a * vd + c] = pool[base + shape.layout.index(kd, vd, a, c)];
                    }
                }
            }
        }
    }
    Ok(h0)
}

/// The layer by its definition over a state pool, as serving runs it (a prefill,
/// or a decode step of one or a few tokens per sequence): sequence `n` starts from its slot's
/// state (`uses[n]`: zeros when it starts fresh) and writes its final state back to the slot; a
/// padding sequence reads and writes nothing, and its rows of `o` are `None`. `p.h0` must be
/// `None` (the pool holds the states). A bf16 pool (`shape.dtype`) is held here as f32 values
/// that bf16 represents; the final states are rounded to bf16 as they are written. Returns `o`
/// per sequence (`[len][HV][V]` rows).
pub fn layer_reference_pooled(
    p: &LayerProblem,
    pool: &mut [f32],
    shape: &PoolShape,
    uses: &[SlotUse],
) -> Result<Vec<Option<Vec<f32>>>, KdaError> {
    p.validate()?;
    let s = p.shape;
    let bad = |name, reason: String| Err(KdaError::Argument { name, reason });
    if p.h0.is_some() {
        return bad("h0", "a pooled call reads its states from the pool".into());
    }
    if uses.len() != p.plan.num_seqs() {
        return bad("slot_indices", format!("{} uses for {} sequences", uses.len(), p.plan.num_seqs()));
    }
    shape.check_holds(&s)?;
    let (hv, kd, vd) = (s.value_heads, s.key_dim, s.value_dim);
    let state = kd * vd;
    // The pooled states in, as the key-first `h0` of the live sequences' sub-problem.
    let live: Vec<usize> = (0..uses.len()).filter(|&n| uses[n] != SlotUse::Padding).collect();
    let live_uses: Vec<SlotUse> = live.iter().map(|&n| uses[n]).collect();
    let h0 = initial_states(pool, shape, &live_uses)?;
    let seqs = p.plan.seqs();
    let spans: Vec<(usize, std::ops::Range<usize>)> = live.iter().map(|&n| (n, 0..seqs[n].len)).collect();
    let sub = LayerProblem { h0: Some(h0), ..p.select(&spans) };
    let out = layer_reference(&sub)?;
    // Final states back to their slots; `o` per sequence.
    let mut o = vec![None; uses.len()];
    let mut token = 0;
    for (m, &n) in live.iter().enumerate() {
        let slot = uses[n].slot().expect("a live sequence has a slot");
        for i in 0..hv {
            let base = shape.offset(slot, i).expect("slot_uses checked the slot");
            let src = &out.ht[(m * hv + i) * state..][..state];
            for a in 0..kd {
                for c in 0..vd {
                    pool[base + shape.layout.index(kd, vd, a, c)] = shape.dtype.stored(src[a * vd + c]);
                }
            }
        }
        let len = seqs[n].len;
        o[n] = Some(out.o[token * hv * vd..(token + len) * hv * vd].to_vec());
        token += len;
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(slots: usize) -> PoolShape {
        PoolShape {
            slots,
            value_heads: 2,
            key_dim: 4,
            value_dim: 8,
            layout: StateLayout::KeyFirst,
            dtype: crate::pool::StateDtype::F32,
        }
    }

    #[test]
    fn indices_become_uses() {
        let uses = slot_uses(&[3, -1, 0, 5], &[false, false, true, false], &pool(6)).unwrap();
        assert_eq!(uses, vec![SlotUse::Continue(3), SlotUse::Padding, SlotUse::Start(0), SlotUse::Continue(5)]);
        assert_eq!(uses.iter().filter_map(|u| u.slot()).collect::<Vec<_>>(), vec![3, 0, 5]);
    }

    #[test]
    fn bad_indices_are_named_errors() {
        let err = |indices: &[i64], fresh: &[bool]| slot_uses(indices, fresh, &pool(4)).unwrap_err().to_string();
        assert!(err(&[1, 2, 1], &[false; 3]).contains("sequences 0 and 2 both name slot 1"));
        assert!(err(&[4], &[false]).contains("sequence 0: slot 4 is past the pool's 4 slots"));
        assert!(err(&[0, 1], &[false]).contains("1 flags for 2 slot indices"));
        // Padding may repeat.
        assert!(slot_uses(&[-1, -1, -7], &[false; 3], &pool(4)).is_ok());
    }

    #[test]
    fn offsets_are_64_bit() {
        // 4096 slots x 32 heads x 128 x 128 f32: 2^31 elements.
        let big = PoolShape {
            slots: 4096,
            value_heads: 32,
            key_dim: 128,
            value_dim: 128,
            layout: StateLayout::KeyFirst,
            dtype: crate::pool::StateDtype::F32,
        };
        assert_eq!(big.len().unwrap(), 1 << 31);
        assert_eq!(big.offset(4095, 31), Some((1usize << 31) - 128 * 128));
        assert_eq!((big.offset(4096, 0), big.offset(0, 32)), (None, None));
        let huge = PoolShape { slots: usize::MAX, ..big };
        assert!(huge.len().is_err());
        assert_eq!(huge.offset(usize::MAX - 1, 1), None);
    }

    #[test]
    fn every_bad_draft_table_is_refused_naming_its_argument() {
        let p = pool(16);
        let uses = slot_uses(&[0, -1, 1], &[false, false, true], &p).unwrap();
        let refused = |draft, parents: Option<&[i64]>, slots: Option<&[i64]>| match draft_tables(
            &uses, draft, parents, slots, &p,
        ) {
            Err(KdaError::Argument { name, .. }) => name,
            Err(KdaError::Shape { tensor, .. }) => tensor,
            other => panic!("{other:?}"),
        };
        assert_eq!(refused(0, None, None), "draft");
        assert_eq!(refused(MAX_DRAFT + 1, None, None), "draft");
        assert_eq!(refused(2, Some(&[-1, 0, -1]), None), "parents");
        assert_eq!(refused(2, None, Some(&[2, 3])), "token_slots");
        assert_eq!(refused(2, Some(&[-1, 1, -1, 0, -1, 0]), None), "parents"); // its own parent
        assert_eq!(refused(2, Some(&[-1, -1, -1, 0, -1, 0]), None), "token_slots"); // a tree, no slots
        assert_eq!(refused(2, None, Some(&[2, 16, -1, -1, 4, 5])), "token_slots"); // past the pool
        assert_eq!(refused(2, None, Some(&[2, 3, -1, -1, 3, 5])), "token_slots"); // written twice
        // A padding sequence's tokens are ignored, whatever they name.
        let t = draft_tables(&uses, 2, None, Some(&[2, 3, 1, 99, 4, 5]), &p).unwrap();
        assert_eq!((t.draft, t.parents.len(), t.token_slots), (2, 0, vec![2, 3, 1, 99, 4, 5]));
        // Parents below -1 mean the initial state, as -1 does.
        let t = draft_tables(&uses, 2, Some(&[-7, 0, -1, 0, -2, 0]), None, &p).unwrap();
        assert_eq!(t.parents, [-1, 0, -1, 0, -1, 0]);
    }

    #[test]
    fn a_checkpoint_starts_from_the_chunk_holding_its_last_token() {
        // Sequences of 10, 0 and 150 tokens: the last starts at token 10, chunk 1.
        let batch = crate::Plan::from_lengths(&[10, 0, 150]);
        let pool = PoolShape {
            slots: 8,
            value_heads: 2,
            key_dim: 64,
            value_dim: 64,
            layout: StateLayout::KeyFirst,
            dtype: StateDtype::F32,
        };
        let at = |sequence, position, slot| Checkpoint { sequence, position, slot };
        let t =
            checkpoint_tables(&batch, &[at(2, 1, 0), at(2, 64, 1), at(2, 65, 2), at(2, 150, 3), at(0, 10, 4)], &pool)
                .unwrap();
        assert_eq!(t.sources, [1, 1, 2, 3, 0]);
        assert_eq!(t.first_rows, [10, 10, 74, 138, 0]);
        assert_eq!(t.counts, [1, 64, 1, 22, 10]);
        assert_eq!(t.slots, [0, 1, 2, 3, 4]);
        let refused = |c: &[Checkpoint]| match checkpoint_tables(&batch, c, &pool) {
            Err(KdaError::Argument { name: "checkpoints", reason }) => reason,
            other => panic!("{c:?}: {other:?}"),
        };
        assert!(refused(&[at(3, 1, 0)]).contains("past the batch"));
        assert!(refused(&[at(2, 0, 0)]).contains("outside 1..=150"));
        assert!(refused(&[at(1, 1, 0)]).contains("outside 1..=0"));
        assert!(refused(&[at(2, 151, 0)]).contains("outside"));
        assert!(refused(&[at(2, 5, 8)]).contains("past the pool"));
        assert!(refused(&[at(2, 5, 1), at(0, 3, 1)]).contains("named by checkpoint 0"));
        assert!(checkpoint_tables(&batch, &[], &pool).unwrap().sources.is_empty());
    }
}
