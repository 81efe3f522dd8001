//! State pools (`../shared/LAYER.md`, "Decode"): serving engines keep every sequence's recurrent
//! state in a pool of slots, `[slots, HV, K, V]` (or `[slots, HV, V, K]`) f32, and hand each call
//! one slot index per sequence. The state is read from the slot and the final state written back
//! to it, in place; a negative index is padding (the sequence is skipped: nothing read or
//! written, its outputs untouched), and a sequence may start from zeros instead of its slot (a new
//! sequence). Two sequences of one call may not name the same slot.
//!
//! This module holds the slot rules and their offsets (64-bit: a pool of 4096 slots of 32 heads of
//! `128 x 128` passes 2^31 elements); [`crate::layer::layer_reference_pooled`] is the f64 layer
//! over a pool, for prefill and decode alike.

use crate::KdaError;
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
}

impl PoolShape {
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
/// let pool = PoolShape { slots: 8, value_heads: 32, key_dim: 128, value_dim: 128, layout: StateLayout::KeyFirst };
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(slots: usize) -> PoolShape {
        PoolShape { slots, value_heads: 2, key_dim: 4, value_dim: 8, layout: StateLayout::KeyFirst }
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
        let big =
            PoolShape { slots: 4096, value_heads: 32, key_dim: 128, value_dim: 128, layout: StateLayout::KeyFirst };
        assert_eq!(big.len().unwrap(), 1 << 31);
        assert_eq!(big.offset(4095, 31), Some((1usize << 31) - 128 * 128));
        assert_eq!((big.offset(4096, 0), big.offset(0, 32)), (None, None));
        let huge = PoolShape { slots: usize::MAX, ..big };
        assert!(huge.len().is_err());
        assert_eq!(huge.offset(usize::MAX - 1, 1), None);
    }
}
