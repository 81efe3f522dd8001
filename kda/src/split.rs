//! Splitting long sequences across the GPU (docs/CONTRACT.md#splitting-one-sequence): the
//! planner that decides whether and where to cut, the tables of the three GPU passes, and the f64
//! computation of a split batch that those passes follow.
//!
//! A sequence cut into segments runs in three passes. The **pre-scan** runs each segment but the
//! first and the last on the augmented state `[M | B]` (`K x (K + V)`) from `[I | 0]`, with the
//! values `[0 | u]`: the same recurrence over `K + V` value columns, so the kernel that runs
//! sequences runs it too; each segment's final state is its affine map,
//! `S_exit = M S_entry + B`. The first segment needs no map, its entry being known: in the same
//! launch it runs from `h0` over the map's `B` columns alone, `[0 | u]`'s value half, which then
//! hold its exit state, `entry(1)`, exactly as the main pass reaches it. The **merge** chains the
//! maps, one sequence and head at a time: `entry(0) = h0`, `entry(1)` the first segment's exit,
//! `entry(s + 1) = M_s entry(s) + B_s`. The **main pass** runs every segment from its entry
//! state, writing `h`, `v_new` and (the last segment) `ht` where the unsplit recurrence writes
//! them. In a split batch, the sequences that are not cut run in the main pass too, from their
//! `h0` (copied by the merge).
//!
//! The planner ([`SplitPlan::decide`]) weighs that extra work (the pre-scan's `K + V` columns,
//! the serial merge) against the idle SMs of a batch with too few chains.

use crate::model::{Gates, ModelView};
use crate::reference::model_reference;
use crate::schedule::Unit;
use crate::{KdaError, Outputs, Plan};
use half::bf16;
use kda_kernel::layout::{
    CHUNK, MERGE_FIRST_ENTRY, MERGE_FIRST_EXIT, MERGE_FIRST_MAP, MERGE_SEGMENTS, MERGE_SEQ, MERGE_WORDS,
};

/// Modelled cost of one item beyond its chunks, in chunk times (as [`crate::schedule`]'s).
const ITEM_OVERHEAD: u64 = crate::schedule::ITEM_OVERHEAD;
/// Modelled cost of one merge step (`M_s entry(s) + B_s` for one head, a `K x K` by `K x V`
/// product), in chunk times: measured on the H200 as about 5 us per step
/// (bench/history/2026-12-04-to-06-sessions.md, "Splitting sequences": the split sweeps), against
/// about 0.9 us per chunk of a lone chain; streaming the maps (a892c6b) took about 1.5 us off each
/// step on the H100, which leaves the rounded figure and the planner's choices on the sweeps'
/// shapes as they were.
pub const MERGE_STEP: u64 = 4;
/// Modelled cost of each extra launch a split adds (the pre-scan and the merge), in chunk times
/// (about 3.5 us each on the H200).
pub const LAUNCH_COST: u64 = 2;
/// Chains the memory system serves at the speed of a lone chain, in the recurrence: more chains
/// at once share its bandwidth. Measured on the H200: fixed_8192's 128 chains run a chunk in
/// 1.6 us where a lone chain takes 0.9 us, so 128 x 0.9 / 1.6 = 72.
pub const MAIN_CHAINS: f64 = 72.0;
/// [`MAIN_CHAINS`] for the pre-scan, whose chunks store nothing (no `h`, no `v_new`) and whose
/// column blocks of one head share their `k` and `w` reads through L2: fitted to the H200's split
/// sweeps of tp_long_h4 (a pre-scan chunk costs about 0.7 of a recurrence chunk's bandwidth).
pub const PRESCAN_CHAINS: f64 = 102.0;
/// A split is taken only when its modelled time is below this fraction of the unsplit one: the
/// model is coarse, and a split costs memory traffic the model does not see.
pub const MIN_GAIN: f64 = 0.85;
/// The shortest segment the planner cuts, in chunks: shorter ones pay the item overhead and the
/// merge for too little work.
pub const MIN_SEGMENT_CHUNKS: usize = 8;

/// The shortest segment the planner cuts a sequence into when that sequence gets more than two
/// segments and the batch has a per-key gate or none (a scalar gate alone is free of it). Two
/// segments need no map (the second starts from the first one's exit state, as exact as the
/// unsplit recurrence), but every later entry state is composed through the pre-scan's map
/// `[M | B]`, rounded to bf16 in its products (docs/DESIGN.md, "Splitting sequences"), and that
/// drift does not shrink with the sequence. Measured on the H100
/// (bench/history/2026-12-04-to-06-sessions.md, twelfth session): 8192-token KDA sequences forced
/// into segments of 32 and 16 chunks land at 2.1e-3 to 2.5e-3 relative in `h` against the
/// contract's 1.47e-3 (`1.5 x` their f32 floor), while the 256-chunk segments of tp_long_h4 and
/// tp_mixed_h8 stay inside it (2.72e-3 against 3.77e-3, 2.43e-3 against 3.18e-3: sequences long
/// enough for three such segments have an f32 floor above the drift). A scalar gate alone stays
/// below the contract's 1e-3 at 16 chunks (3.5e-4).
/// The f64 model of the passes (`split_reference`) reproduces those errors and shows the drift
/// growing with the number of segments (4: 2.05e-3, 8: 2.51e-3, 16: 2.71e-3, 32: 2.80e-3, at
/// 8192 to 32768 tokens) while the bound grows with the sequence (2.65e-3 at 32768 tokens): 128
/// chunks would keep random inputs inside by 15 to 25%; 256 keeps a wider margin for real ones.
pub const PRECISE_SEGMENT_CHUNKS: usize = 256;

/// One segment of a sequence: a run of whole chunks (the last segment may end in a partial one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// The sequence.
    pub seq: usize,
    /// Its place among the sequence's segments (0 is the first).
    pub index: usize,
    /// First token.
    pub token_start: usize,
    /// Length in tokens.
    pub len: usize,
    /// First chunk in `h`.
    pub chunk_start: usize,
}

impl Segment {
    /// Chunks of the segment.
    pub fn chunks(&self) -> usize {
        self.len.div_ceil(CHUNK)
    }
}

/// `auto`, `off` or a number of chunks: what [`SplitMode::Auto`] stands for in a plan made on a
/// device (for A/B runs of one build, the layer's recurrence included, which takes no split
/// argument).
pub const SPLIT_VAR: &str = "KDA_SPLIT";

/// Whether to split, for [`SplitPlan::decide`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SplitMode {
    /// The cost model decides, unless `KDA_SPLIT` ([`SPLIT_VAR`]) says otherwise.
    Auto,
    /// Never split.
    Off,
    /// Cut every sequence longer than this many chunks into segments of this many chunks (for
    /// tests and A/B runs; at least 1).
    Chunks(usize),
}

impl SplitMode {
    /// The mode `value` of `KDA_SPLIT` names: unset, empty or `auto` [`SplitMode::Auto`], `off`
    /// [`SplitMode::Off`], a positive number of chunks [`SplitMode::Chunks`]; anything else an
    /// error naming the variable.
    pub fn parse_env(value: Option<&str>) -> Result<Self, KdaError> {
        match value.unwrap_or_default() {
            "" | "auto" => Ok(SplitMode::Auto),
            "off" => Ok(SplitMode::Off),
            other => match other.parse::<usize>() {
                Ok(n) if n > 0 => Ok(SplitMode::Chunks(n)),
                _ => Err(KdaError::Argument {
                    name: SPLIT_VAR,
                    reason: format!("`{other}`: one of auto, off, or a number of chunks (at least 1)"),
                }),
            },
        }
    }

    /// `self`, with [`SplitMode::Auto`] replaced by the mode `KDA_SPLIT` names.
    pub fn or_env(self) -> Result<Self, KdaError> {
        match self {
            SplitMode::Auto => Self::parse_env(std::env::var(SPLIT_VAR).ok().as_deref()),
            forced => Ok(forced),
        }
    }
}

/// The head and size figures the cost model needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Work {
    /// Value heads `HV`.
    pub value_heads: usize,
    /// Key size `K`.
    pub key_dim: usize,
    /// Value size `V`.
    pub value_dim: usize,
    /// CTAs that run at once (SMs times CTAs per SM).
    pub workers: usize,
    /// Value columns per block of both passes (`hopper::BV`, or `hopper::NARROW_BV` for the
    /// narrow kernel).
    pub block_width: usize,
    /// The batch's gates: with a per-key gate or none, a sequence cut into more than two
    /// segments takes segments of [`PRECISE_SEGMENT_CHUNKS`] or more.
    pub gates: Gates,
}

impl Work {
    /// The figures of `shape`'s heads and sizes on `workers` CTAs in blocks of `block_width`
    /// value columns.
    pub fn of(shape: &crate::model::ModelShape, workers: usize, block_width: usize) -> Self {
        Self {
            value_heads: shape.value_heads,
            key_dim: shape.key_dim,
            value_dim: shape.value_dim,
            workers,
            block_width,
            gates: shape.gates,
        }
    }

    /// Whether the merge steps through composed maps drift past the contract on short segments
    /// ([`PRECISE_SEGMENT_CHUNKS`]): with a per-key gate or with none.
    fn merges_drift(&self) -> bool {
        self.gates.gk || !self.gates.g
    }

    /// Column blocks per head of the main pass.
    fn blocks(&self) -> u64 {
        self.value_dim.div_ceil(self.block_width) as u64
    }

    /// Column blocks per head of the pre-scan (`K + V` columns).
    fn prescan_blocks(&self) -> u64 {
        (self.key_dim + self.value_dim).div_ceil(self.block_width) as u64
    }
}

/// The segments of every sequence of a batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitPlan {
    segments: Vec<Segment>,
    /// Segments of sequence `n`: `segments[first[n]..first[n + 1]]`.
    first: Vec<usize>,
}

impl SplitPlan {
    /// One segment per sequence: no split.
    pub fn unsplit(plan: &Plan) -> Self {
        Self::cut(plan, usize::MAX)
    }

    /// Every sequence longer than `segment_chunks` chunks cut into segments of that many chunks
    /// (the last one what remains); the others whole. `segment_chunks` 0 counts as 1.
    pub fn cut(plan: &Plan, segment_chunks: usize) -> Self {
        let step = segment_chunks.max(1).saturating_mul(CHUNK);
        let mut segments = Vec::new();
        let mut first = Vec::with_capacity(plan.num_seqs() + 1);
        for (seq, d) in plan.seqs().iter().enumerate() {
            first.push(segments.len());
            let mut start = 0;
            loop {
                let len = (d.len - start).min(step);
                let chunk_start = d.chunk_start + start / CHUNK;
                let index = segments.len() - first[seq];
                segments.push(Segment { seq, index, token_start: d.token_start + start, len, chunk_start });
                start += len;
                if start >= d.len {
                    break;
                }
            }
        }
        first.push(segments.len());
        Self { segments, first }
    }

    /// The split `mode` asks for; with [`SplitMode::Auto`], the cheapest of no split and cuts at
    /// `MIN_SEGMENT_CHUNKS` to half the longest sequence (powers of two) that keep the
    /// contract's precision ([`PRECISE_SEGMENT_CHUNKS`]), by [`SplitPlan::modelled_cost`], taken
    /// only when it saves more than `1 - MIN_GAIN`. A forced length is obeyed as it is.
    ///
    /// ```
    /// use kda::Plan;
    /// use kda::model::Gates;
    /// use kda::split::{SplitMode, SplitPlan, Work};
    /// // An H200 (132 SMs), KDA's per-key gate, K = V = 128 in 64-column blocks.
    /// let gates = Gates { g: false, gk: true };
    /// let work = |value_heads| Work { value_heads, key_dim: 128, value_dim: 128, workers: 132, block_width: 64, gates };
    /// // Four heads of one 131072-token prompt: 8 chains for 132 SMs, so it splits.
    /// assert!(SplitPlan::decide(&Plan::from_lengths(&[131072]), &work(4), SplitMode::Auto).is_split());
    /// // Sixty-four heads fill the GPU already: never split.
    /// assert!(!SplitPlan::decide(&Plan::from_lengths(&[8192]), &work(64), SplitMode::Auto).is_split());
    /// // Four heads of 8192 tokens: short segments would leave the contract's precision, and two
    /// // halves gain nothing (the first half's pre-scan lasts as long as the main pass).
    /// assert!(!SplitPlan::decide(&Plan::from_lengths(&[8192]), &work(4), SplitMode::Auto).is_split());
    /// // With a scalar gate alone the same batch is cut short.
    /// let gdn = Work { gates: Gates { g: true, gk: false }, ..work(4) };
    /// assert!(SplitPlan::decide(&Plan::from_lengths(&[8192]), &gdn, SplitMode::Auto).segments().len() > 2);
    /// ```
    pub fn decide(plan: &Plan, work: &Work, mode: SplitMode) -> Self {
        match mode {
            SplitMode::Off => Self::unsplit(plan),
            SplitMode::Chunks(n) => Self::cut(plan, n),
            SplitMode::Auto => {
                let unsplit = Self::unsplit(plan);
                let base = unsplit.modelled_cost(work);
                let longest = plan.seqs().iter().map(|d| d.chunks()).max().unwrap_or(0);
                let candidates = std::iter::successors(Some(MIN_SEGMENT_CHUNKS), |&n| n.checked_mul(2))
                    .take_while(|&n| n.saturating_mul(2) <= longest);
                let best = candidates
                    .map(|n| Self::cut(plan, n))
                    .filter(|s| s.keeps_precision(work))
                    .min_by_key(|s| s.modelled_cost(work));
                match best {
                    Some(s) if (s.modelled_cost(work) as f64) < MIN_GAIN * base as f64 => s,
                    _ => unsplit,
                }
            }
        }
    }

    /// Whether every entry state of this plan stays inside the contract's precision on `work`'s
    /// batch: each sequence in at most two segments, or in segments of
    /// [`PRECISE_SEGMENT_CHUNKS`] or more, unless a scalar gate alone keeps every cut inside.
    pub fn keeps_precision(&self, work: &Work) -> bool {
        !work.merges_drift()
            || (0..self.first.len() - 1).all(|n| {
                let segs = self.segments_of(n);
                segs.len() <= 2 || segs[0].chunks() >= PRECISE_SEGMENT_CHUNKS
            })
    }

    /// Every segment, sequence by sequence.
    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// The segments of sequence `n`.
    pub fn segments_of(&self, n: usize) -> &[Segment] {
        &self.segments[self.first[n]..self.first[n + 1]]
    }

    /// Whether `seg` is its sequence's last segment.
    fn is_last(&self, seg: &Segment) -> bool {
        seg.index + 1 == self.segments_of(seg.seq).len()
    }

    /// Whether any sequence is cut.
    pub fn is_split(&self) -> bool {
        self.segments.len() + 1 > self.first.len()
    }

    /// The plan in words, for tables and `kda run --explain`: `whole` when nothing is cut, else
    /// how many sequences are cut into how many segments of how many chunks.
    pub fn summary(&self) -> String {
        let seqs = self.first.len() - 1;
        let cut: Vec<usize> = (0..seqs).filter(|&n| self.segments_of(n).len() > 1).collect();
        let Some(&n) = cut.first() else { return "whole".into() };
        let segments: usize = cut.iter().map(|&n| self.segments_of(n).len()).sum();
        let chunks = self.segments_of(n)[0].chunks();
        format!("{} of {seqs} sequences cut: {segments} segments of {chunks} chunks", cut.len())
    }

    /// The segments the pre-scan maps: every segment of a cut sequence but its last, in order
    /// (their index in this order is their map's).
    pub fn prescan_segments(&self) -> impl Iterator<Item = &Segment> {
        self.segments.iter().filter(|s| !self.is_last(s))
    }

    /// Maps of the pre-scan (per value head).
    pub fn maps(&self) -> usize {
        self.segments.len() - (self.first.len() - 1)
    }

    /// The pre-scan's units: each mapped segment, its final state written as its map (row
    /// `map * HV + head` of the maps, which are `[maps * HV][K][K + V]`). A first segment starts
    /// from its sequence's `h0` (and runs only the map's `B` columns,
    /// [`crate::schedule::UColumns::first_block`]), the others from no state.
    pub fn prescan_units(&self) -> Vec<Unit> {
        let unit = |(map, s): (usize, &Segment)| Unit {
            token_start: s.token_start,
            len: s.len,
            chunk_start: s.chunk_start,
            h0_state: (s.index == 0).then_some(s.seq),
            ht_state: Some(map),
        };
        self.prescan_segments().enumerate().map(unit).collect()
    }

    /// The main pass's units: every segment, from its entry state (entry `i` for the `i`-th
    /// segment of [`SplitPlan::segments`], `[segments * HV][K][V]`), the last segment of each
    /// sequence writing the sequence's final state.
    pub fn main_units(&self) -> Vec<Unit> {
        let unit = |(i, s): (usize, &Segment)| Unit {
            token_start: s.token_start,
            len: s.len,
            chunk_start: s.chunk_start,
            h0_state: Some(i),
            ht_state: if self.is_last(s) { Some(s.seq) } else { None },
        };
        self.segments.iter().enumerate().map(unit).collect()
    }

    /// The merge's table: per sequence, `MERGE_WORDS` words (its index, its first entry, its
    /// segment count, its first map, and 1: its first map is the first segment's exit state; see
    /// `kda_kernel::layout`). `None` when a number does not fit in 32 bits.
    pub fn merge_table(&self) -> Option<Vec<u32>> {
        let mut table = vec![0u32; (self.first.len() - 1) * MERGE_WORDS];
        let mut first_map = 0;
        for (n, r) in table.chunks_exact_mut(MERGE_WORDS).enumerate() {
            let segments = self.segments_of(n).len();
            r[MERGE_SEQ] = u32::try_from(n).ok()?;
            r[MERGE_FIRST_ENTRY] = u32::try_from(self.first[n]).ok()?;
            r[MERGE_SEGMENTS] = u32::try_from(segments).ok()?;
            r[MERGE_FIRST_MAP] = u32::try_from(first_map).ok()?;
            r[MERGE_FIRST_EXIT] = 1;
            first_map += segments - 1;
        }
        Some(table)
    }

    /// The modelled time of the batch, in chunk times of a lone chain (see `pass_time` for a
    /// pass); when split, the pre-scan (the first segments over `V` columns, the others over
    /// `K + V`), the merge's longest chain of steps (one per map after the first, which is a
    /// copy), the main pass and the two extra launches.
    pub fn modelled_cost(&self, work: &Work) -> u64 {
        let hv = work.value_heads as u64;
        let cost = |s: &Segment| s.chunks() as u64 + ITEM_OVERHEAD;
        let main_pass = |items: &mut dyn Iterator<Item = (u64, u64)>| pass_time(items, work.workers, MAIN_CHAINS);
        if !self.is_split() {
            return main_pass(&mut self.segments.iter().map(|s| (hv * work.blocks(), cost(s))));
        }
        // Pre-scan: every segment of a cut sequence but its last, the first over its V value
        // columns, the others over K + V.
        let blocks = |s: &Segment| if s.index == 0 { work.blocks() } else { work.prescan_blocks() };
        let prescan =
            pass_time(&mut self.prescan_segments().map(|s| (hv * blocks(s), cost(s))), work.workers, PRESCAN_CHAINS);
        // Merge steps of the longest chain: one per map after the first.
        let merge = (0..self.first.len() - 1).map(|n| (self.segments_of(n).len() as u64).saturating_sub(2)).max();
        let merge = merge.unwrap_or(0);
        let main = main_pass(&mut self.segments.iter().map(|s| (hv * work.blocks(), cost(s))));
        prescan + merge * MERGE_STEP + main + 2 * LAUNCH_COST
    }
}

/// The modelled time of one pass of the persistent grid over `workers` CTAs, its items given as
/// (count, cost in chunks) groups, in chunk times of a lone chain: the larger of
/// * the rounds: for every cost `c`, the items of cost `c` or more need `ceil(n / workers)`
///   rounds of at least `c` (240 equal items on 132 CTAs take two item times, not 1.8), and
/// * the bandwidth: the item-chunks of the pass over the `chains` that run at a lone chain's
///   speed together ([`MAIN_CHAINS`], [`PRESCAN_CHAINS`]).
pub(crate) fn pass_time(items: &mut dyn Iterator<Item = (u64, u64)>, workers: usize, chains: f64) -> u64 {
    let workers = workers.max(1) as u64;
    let mut groups: Vec<(u64, u64)> = items.filter(|&(count, _)| count > 0).collect();
    groups.sort_by_key(|&(_, c)| std::cmp::Reverse(c));
    let total = groups.iter().fold(0u64, |t, &(count, c)| t.saturating_add(count.saturating_mul(c)));
    let mut at_least = 0u64;
    let rounds = groups.iter().map(|&(count, c)| {
        at_least = at_least.saturating_add(count);
        at_least.div_ceil(workers).saturating_mul(c)
    });
    let bandwidth = (total as f64 / chains).ceil() as u64;
    rounds.max().unwrap_or(0).max(bandwidth)
}

/// `p` computed in f64 the way a split batch is (see the module): pre-scan, merge, main pass,
/// rounding to bf16 where the kernels would. Its outputs are the unsplit recurrence's up to the
/// roundings of the augmented state (docs/DESIGN.md, "Splitting sequences"); on an unsplit plan,
/// or one whose sequences have at most two segments, they are [`model_reference`]'s exactly.
/// States in `p`'s layout.
pub fn split_reference(p: &ModelView<'_>, split: &SplitPlan) -> Result<Outputs, KdaError> {
    p.validate()?;
    let s = p.shape;
    let (hv, kd, vd) = (s.value_heads, s.key_dim, s.value_dim);
    let state = kd * vd;
    let mut out = Outputs {
        h: vec![bf16::ZERO; p.plan.chunks() * hv * state],
        v_new: vec![bf16::ZERO; p.plan.tokens() * hv * vd],
        ht: vec![0.0; p.plan.num_seqs() * hv * state],
    };
    for n in 0..p.plan.num_seqs() {
        let segs = split.segments_of(n);
        // Merge: entry(0) = h0, entry(1) the first segment's exit state (its run from h0),
        // entry(s + 1) = M_s entry(s) + B_s from the pre-scan's maps.
        let mut entry = match p.h0 {
            Some(h0) => h0[n * hv * state..(n + 1) * hv * state].to_vec(),
            None => vec![0.0; hv * state],
        };
        let mut entries = Vec::with_capacity(segs.len());
        for (i, seg) in segs.iter().enumerate() {
            entries.push(entry.clone());
            if i + 1 == segs.len() {
                break;
            }
            entry = if i == 0 { run_segment(p, seg, &entry)?.ht } else { merge(&entry, &segment_maps(p, seg), p) };
        }
        // Main pass: every segment from its entry state; the last one's final state.
        for (seg, e) in segs.iter().zip(&entries) {
            let o = run_segment(p, seg, e)?;
            let (h_at, t_at) = (seg.chunk_start * hv * state, seg.token_start * hv * vd);
            out.h[h_at..h_at + o.h.len()].copy_from_slice(&o.h);
            out.v_new[t_at..t_at + o.v_new.len()].copy_from_slice(&o.v_new);
            if seg.index + 1 == segs.len() {
                out.ht[n * hv * state..(n + 1) * hv * state].copy_from_slice(&o.ht);
            }
        }
    }
    Ok(out)
}

/// The rows `tokens` of a token-major tensor with `row` elements per token.
fn rows<T>(x: &[T], tokens: std::ops::Range<usize>, row: usize) -> &[T] {
    &x[tokens.start * row..tokens.end * row]
}

/// Segment `seg` of `p` run as a one-sequence problem from `entry` (`[HV]` states in `p`'s
/// layout).
fn run_segment(p: &ModelView<'_>, seg: &Segment, entry: &[f32]) -> Result<Outputs, KdaError> {
    let s = p.shape;
    let t = seg.token_start..seg.token_start + seg.len;
    let plan = Plan::from_lengths(&[seg.len]);
    let view = ModelView {
        plan: &plan,
        shape: s,
        k: rows(p.k, t.clone(), s.heads * s.key_dim),
        w: rows(p.w, t.clone(), s.value_heads * s.key_dim),
        u: rows(p.u, t.clone(), s.value_heads * s.value_dim),
        g: p.g.map(|g| rows(g, t.clone(), s.value_heads)),
        gk: p.gk.map(|gk| rows(gk, t.clone(), s.value_heads * s.key_dim)),
        h0: Some(entry),
    };
    model_reference(&view)
}

/// The affine maps `[M | B]` (`[HV][K][K + V]`, key-first, f32) of segment `seg`: the
/// recurrence over `K + V` value columns, values `[0 | u]`, from `[I | 0]`, in f64 with the state
/// and the corrected values rounded to bf16 before the products, as a kernel rounds them.
fn segment_maps(p: &ModelView<'_>, seg: &Segment) -> Vec<f32> {
    let s = p.shape;
    let (h, hv, kd, vd) = (s.heads, s.value_heads, s.key_dim, s.value_dim);
    let wide = kd + vd;
    let f = |x: bf16| x.to_f64();
    let round = |x: f64| bf16::from_f32(x as f32).to_f64();
    let mut maps = vec![0.0f32; hv * kd * wide];
    for (i, out) in maps.chunks_exact_mut(kd * wide).enumerate() {
        let j = s.key_head(i);
        let mut x = vec![0.0f64; kd * wide];
        (0..kd).for_each(|a| x[a * wide + a] = 1.0);
        let mut t0 = seg.token_start;
        while t0 < seg.token_start + seg.len {
            let t1 = (t0 + CHUNK).min(seg.token_start + seg.len);
            let xr: Vec<f64> = x.iter().map(|&v| round(v)).collect();
            let g_last = p.g.map(|g| g[(t1 - 1) * hv + i] as f64);
            // Corrected values of the chunk's rows, scaled and rounded for product 2.
            let mut vr = vec![0.0f64; (t1 - t0) * wide];
            for t in t0..t1 {
                let w = &p.w[(t * hv + i) * kd..][..kd];
                let scale = g_last.zip(p.g).map_or(1.0, |(gl, g)| (gl - g[t * hv + i] as f64).exp2());
                for c in 0..wide {
                    let wx: f64 = (0..kd).map(|a| f(w[a]) * xr[a * wide + c]).sum();
                    let u = if c < kd { 0.0 } else { f(p.u[(t * hv + i) * vd + c - kd]) };
                    vr[(t - t0) * wide + c] = round((u - wx) * scale);
                }
            }
            for a in 0..kd {
                let mut decay = g_last.map_or(1.0, f64::exp2);
                if let Some(gk) = p.gk {
                    decay *= (gk[((t1 - 1) * hv + i) * kd + a] as f64).exp2();
                }
                for c in 0..wide {
                    let kv: f64 = (t0..t1).map(|t| f(p.k[(t * h + j) * kd + a]) * vr[(t - t0) * wide + c]).sum();
                    x[a * wide + c] = decay * x[a * wide + c] + kv;
                }
            }
            t0 = t1;
        }
        out.iter_mut().zip(&x).for_each(|(o, &v)| *o = v as f32);
    }
    maps
}

/// `M entry + B` per head, in f64 then rounded to f32 (the state's precision), in `p`'s layout.
fn merge(entry: &[f32], maps: &[f32], p: &ModelView<'_>) -> Vec<f32> {
    let s = p.shape;
    let (kd, vd) = (s.key_dim, s.value_dim);
    let wide = kd + vd;
    let mut next = vec![0.0f32; entry.len()];
    for ((out, e), m) in
        next.chunks_exact_mut(kd * vd).zip(entry.chunks_exact(kd * vd)).zip(maps.chunks_exact(kd * wide))
    {
        for i in 0..kd {
            for c in 0..vd {
                let me: f64 = (0..kd).map(|j| m[i * wide + j] as f64 * e[s.state_index(j, c)] as f64).sum();
                out[s.state_index(i, c)] = (me + m[i * wide + kd + c] as f64) as f32;
            }
        }
    }
    next
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kda_split_names_a_mode_or_is_refused() {
        assert_eq!(SplitMode::parse_env(None).unwrap(), SplitMode::Auto);
        assert_eq!(SplitMode::parse_env(Some("auto")).unwrap(), SplitMode::Auto);
        assert_eq!(SplitMode::parse_env(Some("off")).unwrap(), SplitMode::Off);
        assert_eq!(SplitMode::parse_env(Some("64")).unwrap(), SplitMode::Chunks(64));
        for bad in ["0", "-3", "wide"] {
            let err = SplitMode::parse_env(Some(bad)).unwrap_err();
            assert!(matches!(err, KdaError::Argument { name: SPLIT_VAR, .. }), "{bad}: {err}");
        }
        // A mode forced by the caller stays as it is.
        assert_eq!(SplitMode::Off.or_env().unwrap(), SplitMode::Off);
    }
    use kda_kernel::layout::hopper::BV;

    const H200_WORKERS: usize = 132;

    const KDA: Gates = Gates { g: false, gk: true };
    const GDN: Gates = Gates { g: true, gk: false };

    fn work(value_heads: usize) -> Work {
        Work { value_heads, key_dim: 128, value_dim: 128, workers: H200_WORKERS, block_width: BV, gates: KDA }
    }

    #[test]
    fn cuts_cover_each_sequence_in_whole_chunks() {
        let plan = Plan::from_lengths(&[1000, 0, 64, 129]);
        let s = SplitPlan::cut(&plan, 4);
        for (n, d) in plan.seqs().iter().enumerate() {
            let segs = s.segments_of(n);
            assert_eq!(segs.iter().map(|g| g.len).sum::<usize>(), d.len);
            assert_eq!(segs[0].token_start, d.token_start);
            for (i, g) in segs.iter().enumerate() {
                assert_eq!((g.seq, g.index), (n, i));
                assert_eq!(g.chunk_start, d.chunk_start + (g.token_start - d.token_start) / CHUNK);
                if i + 1 < segs.len() {
                    assert_eq!(g.len, 4 * CHUNK);
                }
            }
        }
        assert_eq!(s.segments_of(0).len(), 1000usize.div_ceil(256));
        assert_eq!((s.segments_of(1).len(), s.segments_of(2).len(), s.segments_of(3).len()), (1, 1, 1));
        assert!(s.is_split() && !SplitPlan::unsplit(&plan).is_split());
    }

    /// Batches that fill the GPU are never split; the few-head long prompts are.
    #[test]
    fn the_planner_splits_only_what_would_idle_the_gpu() {
        let auto = |lengths: &[usize], hv| SplitPlan::decide(&Plan::from_lengths(lengths), &work(hv), SplitMode::Auto);
        let mixed_6 = [1300, 547, 2048, 963, 271, 3063];
        for (lengths, hv) in [(&[8192][..], 64), (&mixed_6[..], 64), (&[128; 64][..], 64), (&[32768][..], 64)] {
            assert!(!auto(lengths, hv).is_split(), "{lengths:?} x {hv} heads split");
        }
        let tp_long_h4 = auto(&[131072], 4);
        assert!(tp_long_h4.is_split());
        let unsplit = SplitPlan::unsplit(&Plan::from_lengths(&[131072])).modelled_cost(&work(4));
        let cost = tp_long_h4.modelled_cost(&work(4));
        println!("tp_long_h4: {} segments, modelled {cost} against {unsplit}", tp_long_h4.segments().len());
        assert!((cost as f64) < 0.3 * unsplit as f64);
        // In a mixed batch only the long sequence is cut.
        let tp_mixed_h8 = auto(&[65536, 8192, 300], 8);
        assert!(tp_mixed_h8.segments_of(0).len() > 1 && tp_mixed_h8.segments_of(2).len() == 1);
        let gdn_auto = |lengths: &[usize], hv| {
            SplitPlan::decide(&Plan::from_lengths(lengths), &Work { gates: GDN, ..work(hv) }, SplitMode::Auto)
        };
        assert!(gdn_auto(&[65536], 4).is_split(), "tp_qwen3_next_h2's 4 value heads");
        // The segment lengths the H200's sweeps measured fastest
        // (bench/history/2026-12-04-to-06-sessions.md, "Splitting sequences"; the H100's sweeps in
        // bench/RESULTS.md agree).
        let chunks = |s: &SplitPlan| s.segments()[0].chunks();
        assert_eq!(chunks(&tp_long_h4), 256);
        assert_eq!(chunks(&tp_mixed_h8), 256);
        assert_eq!(chunks(&gdn_auto(&[65536], 4)), 128);
        // Batches short of chains but with nothing long to cut stay whole: the pre-scan's extra
        // columns cost more than the idle SMs (qwen3_next_8192, kda_k64_8192).
        assert!(!auto(&[8192], 32).is_split());
        let k64 =
            Work { value_heads: 64, key_dim: 64, value_dim: 64, workers: H200_WORKERS, block_width: BV, gates: KDA };
        assert!(!SplitPlan::decide(&Plan::from_lengths(&[8192]), &k64, SplitMode::Auto).is_split());
    }

    /// With a per-key gate (or none), a sequence gets more than two segments only in segments of
    /// `PRECISE_SEGMENT_CHUNKS` or more, where the composed maps' drift stays inside the
    /// contract; a scalar gate alone is cut as the cost model likes.
    #[test]
    fn the_planner_keeps_the_contracts_precision() {
        let gdn = |hv| Work { gates: GDN, ..work(hv) };
        let no_gate = |hv| Work { gates: Gates { g: false, gk: false }, ..work(hv) };
        for len in [4096, 8192, 16384, 32768, 65536, 131072, 262144] {
            for hv in [1, 2, 4, 8] {
                let plan = Plan::from_lengths(&[len, 300]);
                for w in [work(hv), no_gate(hv)] {
                    let s = SplitPlan::decide(&plan, &w, SplitMode::Auto);
                    let segs = s.segments_of(0);
                    assert!(s.keeps_precision(&w), "{len} x {hv}: {}", s.summary());
                    assert!(segs.len() <= 2 || segs[0].chunks() >= PRECISE_SEGMENT_CHUNKS, "{len} x {hv}");
                }
            }
        }
        // A scalar gate alone: short segments stay allowed (8 x 16 chunks for 8192 tokens x 2).
        let s = SplitPlan::decide(&Plan::from_lengths(&[8192]), &gdn(2), SplitMode::Auto);
        assert!(s.segments().len() > 2 && s.segments()[0].chunks() < PRECISE_SEGMENT_CHUNKS, "{}", s.summary());
        // Forced lengths are obeyed, and say when they leave the contract.
        let forced = SplitPlan::decide(&Plan::from_lengths(&[8192]), &work(4), SplitMode::Chunks(16));
        assert_eq!(forced.segments().len(), 8);
        assert!(!forced.keeps_precision(&work(4)) && forced.keeps_precision(&gdn(4)));
    }

    #[test]
    fn tables_of_a_split_batch() {
        // Sequence 0 (1000 tokens) cut into 4 segments of 4 chunks (the last partial), sequence 1
        // whole.
        let plan = Plan::from_lengths(&[1000, 100]);
        let s = SplitPlan::cut(&plan, 4);
        assert_eq!(s.summary(), "1 of 2 sequences cut: 4 segments of 4 chunks");
        assert_eq!(SplitPlan::unsplit(&plan).summary(), "whole");
        assert_eq!(s.maps(), 3);
        // The first segment from sequence 0's h0, the others from no state.
        let pre = s.prescan_units();
        assert_eq!(
            pre.iter().map(|u| (u.token_start, u.len, u.h0_state, u.ht_state)).collect::<Vec<_>>(),
            vec![(0, 256, Some(0), Some(0)), (256, 256, None, Some(1)), (512, 256, None, Some(2))]
        );
        let main = s.main_units();
        let rows: Vec<_> = main.iter().map(|u| (u.h0_state, u.ht_state, u.chunk_start)).collect();
        let from = |i| Some(i);
        assert_eq!(
            rows,
            vec![
                (from(0), None, 0),
                (from(1), None, 4),
                (from(2), None, 8),
                (from(3), Some(0), 12),
                (from(4), Some(1), 16)
            ]
        );
        // Per sequence: its index, first entry, segments, first map, first map an exit state.
        assert_eq!(s.merge_table().unwrap(), vec![0, 0, 4, 0, 1, 1, 4, 1, 3, 1]);
    }

    #[test]
    fn forced_modes_are_obeyed() {
        let plan = Plan::from_lengths(&[8192]);
        assert!(!SplitPlan::decide(&plan, &work(4), SplitMode::Off).is_split());
        assert_eq!(SplitPlan::decide(&plan, &work(64), SplitMode::Chunks(32)).segments().len(), 4);
        assert_eq!(SplitPlan::decide(&plan, &work(64), SplitMode::Chunks(0)).segments().len(), 128);
    }
}
