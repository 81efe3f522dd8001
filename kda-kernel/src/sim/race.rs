//! (host only, feature `sim`) The simulator's check for shared-memory races: two accesses to
//! the same bytes by different threads, at least one a write, with no synchronisation ordering
//! them, which a GPU may run in either order (what `compute-sanitizer --tool racecheck` looks
//! for, here on every simulated launch).
//!
//! Happens-before with vector clocks: each simulated thread carries a clock of every thread of
//! its CTA ([`Clock`]). A synchronisation that orders memory is a release into a
//! [`SyncClock`] by each thread that arrives (its clock joined into the object's, then its own
//! epoch advanced) and an acquire by each thread it lets through (the object's clock joined
//! into the thread's): `bar.sync` and `bar.arrive` (named barriers), `bar.warp.sync` (a warp's
//! lanes), mbarrier arrivals and waits. The other warp-wide instructions (`shfl`, `vote`,
//! `ldmatrix`, `mma`) converge the warp but order no memory, so lanes that hand values through
//! shared memory need `bar.warp.sync` between, as the PTX memory model says.
//!
//! Each 2-byte unit of shared memory (the narrowest access) remembers its last write and the
//! reads since, as (thread, epoch) stamps; an access that conflicts with a stamp the accessing
//! thread's clock does not cover is a race and fails the launch, naming both threads and the
//! address. A barrier of the whole CTA orders everything before it with everything after, so a
//! unit's stamps older than the last such barrier are dropped (its generation). A `cp.async`
//! copy writes its destination at some time between its issue and the wait that lands it: its
//! write is checked against the issuing thread's clock at the issue, and stamped when it lands.

extern crate std;

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Mutex;
use std::vec;
use std::vec::Vec;

/// Bytes per tracked unit: the narrowest shared access (`ld.shared.b16`).
const UNIT_BYTES: usize = 2;

/// Units per lock: a 64-byte line, which no aligned access of up to 16 bytes crosses.
const LINE_UNITS: usize = 32;

/// One access's place in time: its thread and that thread's epoch when it ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    tid: u32,
    epoch: u32,
}

impl Stamp {
    /// Whether a thread with clock `clock` is ordered after this access.
    fn before(self, clock: &[u32]) -> bool {
        self.epoch <= clock[self.tid as usize]
    }
}

/// What one unit of shared memory remembers of its accesses since the last CTA-wide barrier.
#[derive(Clone, Default)]
struct Unit {
    /// The CTA-wide barriers completed when these stamps were taken.
    generation: u32,
    write: Option<Stamp>,
    /// The latest read of each thread that read since the write.
    reads: Vec<Stamp>,
}

/// The stamps of a CTA's shared memory, one lock per 64-byte line.
pub(super) struct Shadow {
    lines: Vec<Mutex<Vec<Unit>>>,
}

/// An access the shadow checks: its kind and, for a message, its instruction.
#[derive(Clone, Copy)]
pub(crate) enum Access {
    Read(&'static str),
    Write(&'static str),
}

impl Shadow {
    /// The stamps of `bytes` of shared memory, none taken yet.
    pub(super) fn new(bytes: usize) -> Self {
        let units = bytes.div_ceil(UNIT_BYTES);
        let lines = units.div_ceil(LINE_UNITS);
        Self { lines: (0..lines).map(|_| Mutex::new(vec![Unit::default(); LINE_UNITS])).collect() }
    }

    /// Checks and stamps an access of `size` bytes at byte `offset` of the allocation (shared
    /// address `addr`) by the calling thread, in CTA-wide barrier generation `generation`.
    ///
    /// # Panics
    /// On a race with an earlier access.
    pub(super) fn access(&self, offset: usize, addr: u32, size: usize, access: Access, generation: u32) {
        CLOCK.with_borrow(|c| {
            let c = c.as_ref().expect("a shared access outside a simulated thread");
            self.each_unit(offset, size, |unit, at| {
                unit.renew(generation);
                let me = c.stamp();
                let raced = match access {
                    Access::Read(_) => unit.write.filter(|w| w.tid != me.tid && !w.before(&c.clock)).map(|w| (w, true)),
                    Access::Write(_) => unit.conflict(me.tid, &c.clock),
                };
                if let Some((other, was_write)) = raced {
                    race(addr + at as u32, access, me, other, was_write);
                }
                unit.stamp(me, matches!(access, Access::Write(_)));
            });
        });
    }

    /// Checks and stamps the landing of a `cp.async` copy of `size` bytes at byte `offset`
    /// (shared address `addr`) by the calling thread: every earlier access must be ordered
    /// before the copy's issue (`issued`, the thread's clock then).
    ///
    /// # Panics
    /// On a race with an earlier access.
    pub(super) fn land(&self, offset: usize, addr: u32, size: usize, issued: &IssueClock, generation: u32) {
        CLOCK.with_borrow(|c| {
            let c = c.as_ref().expect("a cp.async landed outside a simulated thread");
            let me = c.stamp();
            self.each_unit(offset, size, |unit, at| {
                // Stamps from before a CTA-wide barrier that followed the issue are still
                // checked; older ones were ordered before the issue.
                if unit.generation >= issued.generation
                    && let Some((other, was_write)) = unit.conflict(me.tid, &issued.clock)
                {
                    race(addr + at as u32, Access::Write("cp.async"), me, other, was_write);
                }
                unit.renew(generation);
                unit.stamp(me, true);
            });
        });
    }

    /// `f` on each unit of `size` bytes at byte `offset` (under its line's lock) with the unit's
    /// byte offset from `offset`.
    fn each_unit(&self, offset: usize, size: usize, mut f: impl FnMut(&mut Unit, usize)) {
        let first = offset / UNIT_BYTES;
        let line = first / LINE_UNITS;
        let mut units = self.lines[line].lock().unwrap_or_else(|e| e.into_inner());
        for u in first..(offset + size).div_ceil(UNIT_BYTES) {
            assert_eq!(u / LINE_UNITS, line, "a shared access of {size} bytes crosses a 64-byte line");
            f(&mut units[u % LINE_UNITS], (u - first) * UNIT_BYTES);
        }
    }
}

impl Unit {
    /// Drops the stamps taken before the CTA-wide barrier `generation` counts.
    fn renew(&mut self, generation: u32) {
        if self.generation != generation {
            self.generation = generation;
            self.write = None;
            self.reads.clear();
        }
    }

    /// The first stamp a write by thread `tid` with clock `clock` is not ordered after: the last
    /// write (`true`) or a read since (`false`).
    fn conflict(&self, tid: u32, clock: &[u32]) -> Option<(Stamp, bool)> {
        let unordered = |s: &Stamp| s.tid != tid && !s.before(clock);
        self.write
            .filter(unordered)
            .map(|w| (w, true))
            .or_else(|| self.reads.iter().copied().find(unordered).map(|r| (r, false)))
    }

    /// Records an access stamped `me`.
    fn stamp(&mut self, me: Stamp, write: bool) {
        if write {
            self.write = Some(me);
            self.reads.clear();
        } else if let Some(r) = self.reads.iter_mut().find(|r| r.tid == me.tid) {
            r.epoch = me.epoch;
        } else {
            self.reads.push(me);
        }
    }
}

/// Fails the launch on a race of `access` by `me` at `addr` with the earlier access `other`.
fn race(addr: u32, access: Access, me: Stamp, other: Stamp, other_wrote: bool) -> ! {
    let (kind, op) = match access {
        Access::Read(op) => ("reads", op),
        Access::Write(op) => ("writes", op),
    };
    let theirs = if other_wrote { "wrote" } else { "read" };
    panic!(
        "shared-memory race at 0x{addr:x}: thread {} {kind} it ({op}) unordered with thread {}, which {theirs} it \
         before with no barrier between",
        me.tid, other.tid
    )
}

/// A simulated thread's vector clock: for every thread of its CTA, the latest epoch of that
/// thread it is ordered after (its own: its current epoch).
struct Clock {
    tid: u32,
    clock: Vec<u32>,
    /// The clock as it stood at the thread's last `cp.async` issue, kept while unchanged (one
    /// copy for all the copies of an epoch).
    issued: Option<Rc<IssueClock>>,
}

impl Clock {
    fn stamp(&self) -> Stamp {
        Stamp { tid: self.tid, epoch: self.clock[self.tid as usize] }
    }
}

/// A thread's clock at a `cp.async` issue, and the CTA-wide barriers completed then.
pub(super) struct IssueClock {
    clock: Vec<u32>,
    generation: u32,
}

std::thread_local! {
    /// The clock of the simulated thread on this host thread.
    static CLOCK: RefCell<Option<Clock>> = const { RefCell::new(None) };
}

/// Starts the clock of thread `tid` of a CTA of `threads`: ordered after nothing, in epoch 1.
pub(super) fn start_thread(tid: usize, threads: usize) {
    let mut clock = vec![0; threads];
    clock[tid] = 1;
    CLOCK.set(Some(Clock { tid: tid as u32, clock, issued: None }));
}

/// Ends the simulated thread's clock.
pub(super) fn end_thread() {
    CLOCK.set(None);
}

/// The calling thread's clock now, for a `cp.async` it issues in CTA-wide barrier generation
/// `generation`.
pub(super) fn issue_clock(generation: u32) -> Rc<IssueClock> {
    CLOCK.with_borrow_mut(|c| {
        let c = c.as_mut().expect("a cp.async outside a simulated thread");
        match &c.issued {
            Some(i) if i.generation == generation && i.clock == c.clock => Rc::clone(i),
            _ => {
                let i = Rc::new(IssueClock { clock: c.clock.clone(), generation });
                c.issued = Some(Rc::clone(&i));
                i
            }
        }
    })
}

/// A synchronisation object's clocks, one per phase parity: the join of every clock released
/// into that phase. A phase's clock is read by the threads it lets through before any thread
/// can arrive two phases on, so two alternate; joins only grow, so a clock left from an older
/// phase adds nothing a thread does not already hold.
#[derive(Clone, Default)]
pub(super) struct SyncClock {
    phases: [Vec<u32>; 2],
}

impl SyncClock {
    /// The calling thread's release into phase `phase`: its clock joined into the phase's, then
    /// its own epoch advanced (its later accesses are not ordered by this phase).
    pub(super) fn release(&mut self, phase: u64) {
        CLOCK.with_borrow_mut(|c| {
            let c = c.as_mut().expect("a synchronisation outside a simulated thread");
            let acc = &mut self.phases[(phase % 2) as usize];
            if acc.len() < c.clock.len() {
                acc.resize(c.clock.len(), 0);
            }
            for (a, &x) in acc.iter_mut().zip(&c.clock) {
                *a = (*a).max(x);
            }
            c.clock[c.tid as usize] += 1;
        });
    }

    /// The calling thread's acquire of phase `phase` once it has completed: the phase's clock
    /// joined into the thread's.
    pub(super) fn acquire(&self, phase: u64) {
        CLOCK.with_borrow_mut(|c| {
            let c = c.as_mut().expect("a synchronisation outside a simulated thread");
            for (x, &a) in c.clock.iter_mut().zip(&self.phases[(phase % 2) as usize]) {
                *x = (*x).max(a);
            }
        });
    }
}
