//! (host only, feature `sim`) A functional simulator of the portable kernels: the kernels'
//! own Rust source, compiled for the host, run with one OS thread per GPU thread.
//!
//! [`launch`] runs a grid CTA by CTA; every thread of a CTA is a host thread whose
//! thread-local CTA and index ([`with_thread`]) give the instruction wrappers of `arch::sm80` (the host version,
//! `arch/sim80.rs`) its `%tid.x`, `%ctaid.x` and CTA. Shared memory is one buffer per CTA at
//! [`SHARED_BASE`] in the shared window; global memory is the caller's host memory, addressed
//! by the pointers the kernel is given. Barriers block until their count arrives; warp-wide
//! instructions (`mma.sync`, `ldmatrix`, `vote`) exchange every lane's operands through the
//! warp's [`Warp`] and compute each lane's result as the PTX ISA's fragment layouts define it.
//!
//! What it checks that a GPU would not report: shared accesses out of the allocation or
//! misaligned, shared-memory races (two threads' accesses to the same bytes, one a write, that
//! no barrier orders: the `race` module), writes past the end of the allocation through generic
//! pointers (guard bytes), lanes of one warp running different warp-wide instructions, barriers
//! whose count never arrives (a deadlock, reported after [`DEADLOCK`]), and, in debug builds,
//! integer overflow.
//! Shared memory starts poisoned (all bits set: a NaN in f32 and bf16), so a read of a tile
//! nothing wrote shows up in the results. It does not model timing, memory ordering beyond
//! the barriers, or the Hopper-only instructions (TMA, mbarrier, wgmma).

extern crate std;

pub(crate) mod race;

use core::ptr::NonNull;
use race::{Access, Shadow, SyncClock};
use std::cell::{Cell, RefCell, UnsafeCell};
use std::collections::HashMap;
use std::collections::VecDeque;
use std::format;
use std::rc::Rc;
use std::string::{String, ToString};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use std::vec;
use std::vec::Vec;

/// The shared-window address of the dynamic shared memory (`SMEM`). Not 0, so that code which
/// mixes a shared address with an offset into the allocation fails here; 1024-aligned like the
/// GPU's symbol.
pub const SHARED_BASE: u32 = 0x400;

/// Shared memory a CTA may request (the sm_90 opt-in maximum, 227 KiB).
pub const MAX_SHARED_BYTES: usize = 227 * 1024;

/// Bytes after the allocation that are checked for writes through generic pointers.
const GUARD_BYTES: usize = 4096;

/// The value every byte of shared memory and of the guard starts as (all bits set: NaN as f32 or
/// bf16).
const POISON: u8 = 0xff;

/// How long a barrier may wait for its count before the launch is reported as deadlocked.
pub const DEADLOCK: Duration = Duration::from_secs(20);

/// How often a waiting thread wakes to look for a deadlock (a failing thread wakes every waiting
/// one at once; a lost wake-up costs at most this).
const POLL: Duration = Duration::from_secs(1);

/// Threads per warp.
pub const WARP: usize = 32;

/// Hardware named barriers per CTA (`bar.sync 0..15`).
const NAMED_BARRIERS: usize = 16;

/// 32-bit words of operands one lane hands to a warp-wide instruction (the largest is
/// `mma.sync`: 4 accumulators, 4 A and 2 B registers).
pub const LANE_WORDS: usize = 12;

/// The shape of a launch: `grid` CTAs of `block` threads with `shared_bytes` of dynamic shared
/// memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launch {
    /// CTAs (`gridDim.x`).
    pub grid: usize,
    /// Threads per CTA (`blockDim.x`), a multiple of [`WARP`].
    pub block: usize,
    /// Dynamic shared memory per CTA.
    pub shared_bytes: usize,
}

/// Why a simulated launch failed: the CTA and thread that failed first and what happened there.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimError {
    /// `%ctaid.x` of the failing CTA (`usize::MAX` when the launch's shape was rejected).
    pub cta: usize,
    /// `%tid.x` of the failing thread (`usize::MAX` when no single thread failed).
    pub thread: usize,
    /// What went wrong.
    pub message: String,
}

impl core::fmt::Display for SimError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match (self.cta, self.thread) {
            (usize::MAX, _) => write!(f, "launch rejected: {}", self.message),
            (cta, usize::MAX) => write!(f, "CTA {cta}: {}", self.message),
            (cta, thread) => write!(f, "CTA {cta}, thread {thread}: {}", self.message),
        }
    }
}

impl std::error::Error for SimError {}

/// One CTA's shared state: its shared memory, barriers and warps.
pub struct Cta {
    /// `%ctaid.x`.
    pub index: usize,
    /// `blockDim.x`.
    pub threads: usize,
    shared: SharedMemory,
    /// The stamps of the race check (`race`).
    shadow: Shadow,
    /// CTA-wide barriers completed (every thread of the CTA waiting at them): the race check's
    /// generation.
    generation: AtomicU32,
    barriers: Mutex<Barriers>,
    barrier_moved: Condvar,
    warps: Vec<Warp>,
    failed: AtomicBool,
}

/// The CTA's barriers and the race check's clocks of each: its named barriers, its warps'
/// `bar.warp.sync`, and its mbarriers by shared address.
struct Barriers {
    named: [Barrier; NAMED_BARRIERS],
    named_clocks: [SyncClock; NAMED_BARRIERS],
    warp_clocks: Vec<SyncClock>,
    mbarrier_clocks: HashMap<u32, SyncClock>,
}

/// The dynamic shared memory of one CTA: `bytes` usable, followed by the guard.
struct SharedMemory {
    ptr: *mut u8,
    bytes: usize,
}

// SAFETY: the buffer is only reached through the kernel's own accesses, which the kernel orders
// with barriers exactly as on the GPU; the allocation outlives every thread of the CTA.
unsafe impl Send for SharedMemory {}
// SAFETY: as above.
unsafe impl Sync for SharedMemory {}

impl SharedMemory {
    /// 1024-byte alignment, as the GPU's `SMEM` symbol is declared.
    const ALIGN: usize = 1024;

    fn layout(bytes: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(bytes + GUARD_BYTES, Self::ALIGN).expect("shared memory layout")
    }

    fn new(bytes: usize) -> Self {
        // SAFETY: the layout has a nonzero size (the guard).
        let ptr = unsafe { std::alloc::alloc(Self::layout(bytes)) };
        assert!(!ptr.is_null(), "out of host memory for {bytes} bytes of shared memory");
        // SAFETY: `ptr` addresses `bytes + GUARD_BYTES` writable bytes.
        unsafe { ptr.write_bytes(POISON, bytes + GUARD_BYTES) };
        Self { ptr, bytes }
    }

    /// Whether the guard after the allocation still holds the poison.
    fn guard_intact(&self) -> bool {
        // SAFETY: the guard lies inside the allocation; every thread has finished.
        let guard = unsafe { std::slice::from_raw_parts(self.ptr.add(self.bytes), GUARD_BYTES) };
        guard.iter().all(|&b| b == POISON)
    }
}

impl Drop for SharedMemory {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with the same layout.
        unsafe { std::alloc::dealloc(self.ptr, Self::layout(self.bytes)) }
    }
}

/// A named barrier: how many threads have arrived in its current phase, how many it expects,
/// whether one of them arrived without waiting (`bar.arrive`), and how many phases have
/// completed.
#[derive(Clone, Copy, Default)]
struct Barrier {
    arrived: usize,
    expected: usize,
    not_waiting: bool,
    phase: u64,
}

/// An mbarrier's state as the simulator keeps it in the object's 8 bytes of shared memory:
/// arrivals still missing in the current phase, arrivals per phase, and phases completed.
#[derive(Clone, Copy)]
struct Mbarrier {
    pending: u32,
    expected: u32,
    phase: u32,
}

/// One warp's exchange for warp-wide instructions: each lane deposits its operands, the last to
/// arrive completes the phase, and every lane then reads all 32 lanes' operands. Two buffers
/// alternate, so a lane that runs ahead into the next instruction never overwrites operands
/// another lane has yet to read: buffer `p % 2` is written only in phase `p`, by each lane into
/// its own slot, and read after phase `p` completes, before any lane can arrive in phase `p + 2`.
pub struct Warp {
    arrivals: Mutex<Arrivals>,
    phase: AtomicU64,
    slots: UnsafeCell<[[[u32; LANE_WORDS]; WARP]; 2]>,
    moved: Condvar,
}

// SAFETY: `slots` is accessed as the struct's documentation says: each lane writes its own slot
// under `arrivals`' lock, and the buffer is read only after the release store of `phase` that
// completes its phase, which every reader acquires.
unsafe impl Sync for Warp {}

/// Who has arrived in the current phase, and with which instruction.
struct Arrivals {
    count: usize,
    op: [&'static str; WARP],
}

/// How many times a lane yields its core, waiting for the rest of its warp, before it sleeps:
/// the lanes of a warp run the same code and arrive close together, so most exchanges complete
/// without the cost of a sleep and a wake-up.
const SPINS: usize = 64;

std::thread_local! {
    /// The CTA and `%tid.x` of the simulated thread on this host thread, while it runs its
    /// kernel. The CTA is owned by [`run_cta`], which joins the thread before dropping it.
    static CURRENT: Cell<Option<(NonNull<Cta>, usize)>> = const { Cell::new(None) };
    /// The simulated thread's `cp.async` copies not yet committed to a group ([`defer_copy`]).
    static PENDING: RefCell<Vec<PendingCopy>> = const { RefCell::new(Vec::new()) };
    /// Its committed groups not yet waited for, oldest first ([`commit_copies`]).
    static GROUPS: RefCell<VecDeque<Vec<PendingCopy>>> = const { RefCell::new(VecDeque::new()) };
}

/// An asynchronous copy in flight: `size` bytes to shared address `dst`, the first `src_bytes`
/// of them from `src`, the rest zeros; `issued`, the issuing thread's clock at the issue.
struct PendingCopy {
    dst: u32,
    src: *const u8,
    size: usize,
    src_bytes: usize,
    issued: Rc<race::IssueClock>,
}

/// Issues a `cp.async` of the simulated thread. It lands only when the thread waits for it
/// ([`land_copies`], `cp.async.wait_all`; or [`land_groups`], `cp.async.wait_group`, once its
/// group is old enough), so a kernel that reads the destination before waiting, or before the
/// barrier after the wait, reads what was there before (poison, or an older stage) and fails
/// its test; a thread that ends with copies in flight fails its launch.
///
/// # Safety
/// `src` addresses `src_bytes` readable bytes until the copy lands.
pub unsafe fn defer_copy(dst: u32, src: *const u8, size: usize, src_bytes: usize) {
    assert!(src_bytes <= size, "cp.async: {src_bytes} source bytes for a {size}-byte copy");
    assert!((src as usize).is_multiple_of(size), "cp.async: {src:?} is not {size}-byte aligned");
    // The destination is checked now, as the GPU faults at issue.
    let issued = with_thread(|cta, _| {
        cta.shared(dst, size);
        race::issue_clock(cta.generation.load(Ordering::SeqCst))
    });
    PENDING.with_borrow_mut(|p| p.push(PendingCopy { dst, src, size, src_bytes, issued }));
}

/// Closes the simulated thread's copies since its last commit into a group
/// (`cp.async.commit_group`).
pub fn commit_copies() {
    let group = PENDING.take();
    GROUPS.with_borrow_mut(|g| g.push_back(group));
}

/// Lands every committed group of the simulated thread but the `keep` most recent
/// (`cp.async.wait_group keep`).
pub fn land_groups(keep: usize) {
    while let Some(group) = GROUPS.with_borrow_mut(|g| if g.len() > keep { g.pop_front() } else { None }) {
        for c in group {
            let dst = with_thread(|cta, _| {
                let dst = cta.shared(c.dst, c.size);
                let generation = cta.generation.load(Ordering::SeqCst);
                cta.shadow.land(cta.offset(c.dst), c.dst, c.size, &c.issued, generation);
                dst
            });
            // SAFETY: `shared` checked the destination; `defer_copy`'s caller promised the source.
            unsafe {
                core::ptr::copy_nonoverlapping(c.src, dst, c.src_bytes);
                core::ptr::write_bytes(dst.add(c.src_bytes), 0, c.size - c.src_bytes);
            }
        }
    }
}

/// Lands every copy the simulated thread has in flight (`cp.async.wait_all`: a commit, then a
/// wait for every group).
pub fn land_copies() {
    commit_copies();
    land_groups(0);
}

/// Runs `f` with the CTA and `%tid.x` of the simulated thread on this host thread.
///
/// # Panics
/// Outside a [`launch`] (a kernel's instruction called from ordinary host code).
pub fn with_thread<R>(f: impl FnOnce(&Cta, usize) -> R) -> R {
    let (cta, tid) = CURRENT.get().expect("a kernel instruction ran outside kda_kernel::sim::launch");
    // SAFETY: set by `run_cta` for the duration of the kernel on this thread, while it holds the
    // CTA alive (see `CURRENT`).
    f(unsafe { cta.as_ref() }, tid)
}

impl Cta {
    fn new(index: usize, launch: &Launch) -> Self {
        let warps = (0..launch.block / WARP)
            .map(|_| Warp {
                arrivals: Mutex::new(Arrivals { count: 0, op: [""; WARP] }),
                phase: AtomicU64::new(0),
                slots: UnsafeCell::new([[[0; LANE_WORDS]; WARP]; 2]),
                moved: Condvar::new(),
            })
            .collect();
        Self {
            index,
            threads: launch.block,
            shared: SharedMemory::new(launch.shared_bytes),
            shadow: Shadow::new(launch.shared_bytes),
            generation: AtomicU32::new(0),
            barriers: Mutex::new(Barriers {
                named: [Barrier::default(); NAMED_BARRIERS],
                named_clocks: core::array::from_fn(|_| SyncClock::default()),
                warp_clocks: vec![SyncClock::default(); launch.block / WARP],
                mbarrier_clocks: HashMap::new(),
            }),
            barrier_moved: Condvar::new(),
            warps,
            failed: AtomicBool::new(false),
        }
    }

    /// The host pointer of shared address `addr` for an access of `size` bytes.
    ///
    /// # Panics
    /// If the access is misaligned or not inside the allocation.
    pub fn shared(&self, addr: u32, size: usize) -> *mut u8 {
        let offset = addr.checked_sub(SHARED_BASE).map(|o| o as usize);
        match offset {
            Some(o) if o + size <= self.shared.bytes && (addr as usize).is_multiple_of(size) => {
                // SAFETY: inside the allocation (checked above).
                unsafe { self.shared.ptr.add(o) }
            }
            Some(o) if o + size <= self.shared.bytes => {
                panic!("misaligned shared access: {size} bytes at 0x{addr:x}")
            }
            _ => panic!(
                "shared access out of bounds: {size} bytes at 0x{addr:x}, the allocation is 0x{SHARED_BASE:x}..0x{:x}",
                SHARED_BASE as usize + self.shared.bytes
            ),
        }
    }

    /// [`Cta::shared`] for an access of the calling thread, checked and stamped by the race
    /// check.
    ///
    /// # Panics
    /// As [`Cta::shared`], and on a race.
    pub(crate) fn shared_access(&self, addr: u32, size: usize, access: Access) -> *mut u8 {
        let p = self.shared(addr, size);
        self.shadow.access(self.offset(addr), addr, size, access, self.generation.load(Ordering::SeqCst));
        p
    }

    /// The byte offset in the allocation of shared address `addr` (checked by [`Cta::shared`]).
    fn offset(&self, addr: u32) -> usize {
        (addr - SHARED_BASE) as usize
    }

    /// The generic (host) pointer to the start of the dynamic shared memory.
    pub fn shared_generic(&self) -> *mut u8 {
        self.shared.ptr
    }

    /// `bar.sync id, threads`: blocks until `threads` threads have arrived at barrier `id`.
    pub fn barrier(&self, id: usize, threads: usize) {
        let (phase, completed) = self.arrive_at(id, threads, true);
        let bars = if completed {
            self.barriers.lock().unwrap_or_else(|e| e.into_inner())
        } else {
            self.wait(
                self.barriers.lock().unwrap_or_else(|e| e.into_inner()),
                &self.barrier_moved,
                |bars| bars.named[id].phase != phase,
                |bars| format!("bar.sync {id}: {} of {threads} threads arrived", bars.named[id].arrived),
            )
        };
        bars.named_clocks[id].acquire(phase);
    }

    /// `bar.arrive id, threads` for one thread: counts its arrival (without waiting).
    pub fn arrive(&self, id: usize, threads: usize) {
        self.arrive_at(id, threads, false);
    }

    /// One thread's arrival at barrier `id` of `threads`, waiting there or not (`waits`):
    /// returns the phase it arrived in and whether its arrival completed it. A phase every
    /// thread of the CTA waited at starts a new generation of the race check.
    fn arrive_at(&self, id: usize, threads: usize, waits: bool) -> (u64, bool) {
        assert!(id < NAMED_BARRIERS, "bar.sync {id}: only {NAMED_BARRIERS} named barriers exist");
        assert!(
            threads > 0 && threads <= self.threads && threads.is_multiple_of(WARP),
            "bar.sync {id}, {threads}: the count must be a multiple of {WARP} up to the CTA's {} threads",
            self.threads
        );
        let mut bars = self.barriers.lock().unwrap_or_else(|e| e.into_inner());
        let phase = bars.named[id].phase;
        bars.named_clocks[id].release(phase);
        let b = &mut bars.named[id];
        if b.arrived == 0 {
            b.expected = threads;
            b.not_waiting = false;
        }
        assert_eq!(b.expected, threads, "bar.sync {id}: threads arrive with different counts");
        b.arrived += 1;
        b.not_waiting |= !waits;
        if b.arrived == threads {
            if threads == self.threads && !b.not_waiting {
                self.generation.fetch_add(1, Ordering::SeqCst);
            }
            b.arrived = 0;
            b.phase += 1;
            self.barrier_moved.notify_all();
            return (phase, true);
        }
        (phase, false)
    }

    /// `bar.warp.sync -1` of thread `tid`: its warp's lanes meet, and each is ordered after the
    /// others' accesses before it.
    pub fn warp_barrier(&self, tid: usize) {
        let warp = tid / WARP;
        // This lane has not arrived, so the warp's phase cannot move until it does.
        let phase = self.warps[warp].phase.load(Ordering::Acquire);
        self.barriers.lock().unwrap_or_else(|e| e.into_inner()).warp_clocks[warp].release(phase);
        self.warp_exchange(tid, "bar.warp.sync", [0; LANE_WORDS]);
        self.barriers.lock().unwrap_or_else(|e| e.into_inner()).warp_clocks[warp].acquire(phase);
    }

    /// `mbarrier.init`: the barrier object at shared address `bar` (its 8 bytes hold the state,
    /// so a tile that overlaps it corrupts it, as on the GPU) completes a phase on `count`
    /// arrivals.
    pub fn mbarrier_init(&self, bar: u32, count: u32) {
        assert!(count > 0 && count < 1 << 16, "mbarrier.init: count {count}");
        let _bars = self.barriers.lock().unwrap_or_else(|e| e.into_inner());
        self.store_mbarrier(bar, Mbarrier { pending: count, expected: count, phase: 0 });
    }

    /// One arrival on the mbarrier at `bar`; returns the phase it arrived on (the token).
    pub fn mbarrier_arrive(&self, bar: u32) -> u64 {
        let mut bars = self.barriers.lock().unwrap_or_else(|e| e.into_inner());
        let mut m = self.load_mbarrier(bar);
        assert!(m.pending > 0 && m.expected > 0, "mbarrier.arrive on 0x{bar:x}: not an initialised barrier");
        let token = u64::from(m.phase);
        bars.mbarrier_clocks.entry(bar).or_default().release(token);
        m.pending -= 1;
        if m.pending == 0 {
            m.pending = m.expected;
            m.phase = m.phase.wrapping_add(1);
            self.barrier_moved.notify_all();
        }
        self.store_mbarrier(bar, m);
        token
    }

    /// Blocks until the phase `token` of the mbarrier at `bar` has completed.
    pub fn mbarrier_wait(&self, bar: u32, token: u64) {
        let bars = self.wait(
            self.barriers.lock().unwrap_or_else(|e| e.into_inner()),
            &self.barrier_moved,
            |_| u64::from(self.load_mbarrier(bar).phase) != token,
            |_| {
                format!(
                    "mbarrier 0x{bar:x}: phase {token} incomplete, {} arrivals missing",
                    self.load_mbarrier(bar).pending
                )
            },
        );
        if let Some(clock) = bars.mbarrier_clocks.get(&bar) {
            clock.acquire(token);
        }
    }

    fn load_mbarrier(&self, bar: u32) -> Mbarrier {
        // SAFETY: `shared` checks the 8 bytes lie in the allocation, 8-byte aligned; the caller
        // holds the barriers' lock, which every mbarrier access takes.
        let words = unsafe { (self.shared(bar, 8) as *const [u32; 2]).read() };
        Mbarrier { pending: words[0] & 0xffff, expected: words[0] >> 16, phase: words[1] }
    }

    fn store_mbarrier(&self, bar: u32, m: Mbarrier) {
        // SAFETY: as `load_mbarrier`.
        unsafe { (self.shared(bar, 8) as *mut [u32; 2]).write([m.pending | m.expected << 16, m.phase]) }
    }

    /// The first named barrier left with arrivals in an unfinished phase, as a message (a CTA
    /// that ends so has lost a handoff: a `bar.arrive` nobody waited for, or the reverse).
    fn unfinished_barrier(&self) -> Option<String> {
        let bars = self.barriers.lock().unwrap_or_else(|e| e.into_inner());
        bars.named.iter().enumerate().find(|(_, b)| b.arrived != 0).map(|(id, b)| {
            format!("ended with {} of barrier {id}'s {} threads arrived in an unfinished phase", b.arrived, b.expected)
        })
    }

    /// A warp-wide instruction `op` of lane `lane` with operands `mine`: returns every lane's
    /// operands once the whole warp has arrived.
    pub fn warp_exchange(
        &self,
        lane_of_cta: usize,
        op: &'static str,
        mine: [u32; LANE_WORDS],
    ) -> [[u32; LANE_WORDS]; WARP] {
        let (warp, lane) = (&self.warps[lane_of_cta / WARP], lane_of_cta % WARP);
        let mut a = warp.arrivals.lock().unwrap_or_else(|e| e.into_inner());
        let phase = warp.phase.load(Ordering::Relaxed); // only changed under `arrivals`
        let buffer = (phase % 2) as usize;
        // SAFETY: this lane's own slot of the current phase's buffer, under the lock (see `Warp`).
        unsafe { (*warp.slots.get())[buffer][lane] = mine };
        a.op[lane] = op;
        a.count += 1;
        if a.count == WARP {
            if let Some(&other) = a.op.iter().find(|&&o| o != op) {
                drop(a);
                self.fail();
                panic!("warp {}: lanes ran different warp-wide instructions ({op} and {other})", lane_of_cta / WARP);
            }
            a.count = 0;
            warp.phase.store(phase + 1, Ordering::Release);
            warp.moved.notify_all();
        } else {
            drop(a);
            let done = || warp.phase.load(Ordering::Acquire) != phase;
            for _ in 0..SPINS {
                if done() {
                    break;
                }
                std::thread::yield_now();
            }
            if !done() {
                let a = warp.arrivals.lock().unwrap_or_else(|e| e.into_inner());
                drop(self.wait(
                    a,
                    &warp.moved,
                    |_| done(),
                    |a| format!("{op}: {} of the warp's {WARP} lanes arrived", a.count),
                ));
            }
        }
        // SAFETY: the phase completed (acquired above, or stored by this lane): every lane's
        // operands are in the buffer, and none is rewritten before this lane arrives again.
        unsafe { (*warp.slots.get())[buffer] }
    }

    /// Marks the CTA failed and wakes every waiting thread, which then stops.
    fn fail(&self) {
        self.failed.store(true, Ordering::SeqCst);
        self.barrier_moved.notify_all();
        for w in &self.warps {
            w.moved.notify_all();
        }
    }

    /// Waits on `cond` until `done` holds, failing on a deadlock or when another thread failed.
    fn wait<'a, T>(
        &self,
        mut guard: MutexGuard<'a, T>,
        cond: &Condvar,
        done: impl Fn(&T) -> bool,
        describe: impl Fn(&T) -> String,
    ) -> MutexGuard<'a, T> {
        let start = Instant::now();
        while !done(&guard) {
            if self.failed.load(Ordering::SeqCst) {
                drop(guard);
                panic!("{ABORTED}");
            }
            if start.elapsed() > DEADLOCK {
                let what = describe(&guard);
                drop(guard);
                self.fail();
                panic!("deadlock: waited {DEADLOCK:?} at {what}");
            }
            guard = cond.wait_timeout(guard, POLL).unwrap_or_else(|e| e.into_inner()).0;
        }
        guard
    }
}

/// The message of a thread that stopped because another thread of its CTA failed.
const ABORTED: &str = "aborted: another thread of the CTA failed";

/// CTAs simulated at once. The simulation is bound by how fast the host wakes the threads of a
/// warp, not by its cores: more CTAs at once measured no faster.
const CTAS_AT_ONCE: usize = 2;

/// Host threads' stack: the kernels keep their register arrays on it (larger in debug builds).
const STACK_BYTES: usize = 1 << 20;

/// Runs `kernel` on every thread of a `launch.grid`-CTA grid, several CTAs at a time, and
/// reports the first failure. `kernel` is the kernel entry called with its arguments (a closure
/// over the host pointers the kernel reads and writes).
///
/// # Safety
/// As the kernel's own safety contract: every pointer it is given addresses host memory of the
/// sizes the kernel reads and writes for this launch.
pub unsafe fn launch(launch: Launch, kernel: impl Fn() + Sync) -> Result<(), SimError> {
    let reject = |message: String| Err(SimError { cta: usize::MAX, thread: usize::MAX, message });
    if launch.block == 0 || !launch.block.is_multiple_of(WARP) || launch.block > 1024 {
        return reject(format!("{} threads per CTA: a multiple of {WARP} up to 1024", launch.block));
    }
    if launch.shared_bytes > MAX_SHARED_BYTES {
        return reject(format!("{} bytes of shared memory: at most {MAX_SHARED_BYTES}", launch.shared_bytes));
    }
    let next = AtomicUsize::new(0);
    let first_error: Mutex<Option<SimError>> = Mutex::new(None);
    let runners = CTAS_AT_ONCE.min(launch.grid).max(1);
    std::thread::scope(|scope| {
        for _ in 0..runners {
            scope.spawn(|| {
                loop {
                    let cta = next.fetch_add(1, Ordering::SeqCst);
                    if cta >= launch.grid || first_error.lock().unwrap_or_else(|e| e.into_inner()).is_some() {
                        break;
                    }
                    if let Err(e) = run_cta(cta, &launch, &kernel) {
                        first_error.lock().unwrap_or_else(|e| e.into_inner()).get_or_insert(e);
                    }
                }
            });
        }
    });
    match first_error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Runs one CTA: `launch.block` host threads, joined; the first real failure (not a thread that
/// stopped because of it) is reported.
fn run_cta(index: usize, launch: &Launch, kernel: &(impl Fn() + Sync)) -> Result<(), SimError> {
    let cta = Cta::new(index, launch);
    let mut failures: Vec<(usize, String)> = Vec::new();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..launch.block)
            .map(|tid| {
                let cta = &cta;
                std::thread::Builder::new()
                    .stack_size(STACK_BYTES)
                    .spawn_scoped(scope, move || {
                        CURRENT.set(Some((NonNull::from(cta), tid)));
                        race::start_thread(tid, launch.block);
                        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            kernel();
                            let in_flight = PENDING.with_borrow(Vec::len)
                                + GROUPS.with_borrow(|g| g.iter().map(Vec::len).sum::<usize>());
                            assert!(in_flight == 0, "ended with {in_flight} cp.async copies never waited for");
                        }));
                        PENDING.take();
                        GROUPS.take();
                        race::end_thread();
                        CURRENT.set(None);
                        if result.is_err() {
                            cta.fail();
                        }
                        result
                    })
                    .expect("spawn a simulated thread")
            })
            .collect();
        for (tid, h) in handles.into_iter().enumerate() {
            if let Err(payload) = h.join().unwrap_or_else(Err) {
                failures.push((tid, panic_message(payload.as_ref())));
            }
        }
    });
    let real = failures.iter().find(|(_, m)| m != ABORTED).or(failures.first());
    if let Some((thread, message)) = real {
        return Err(SimError { cta: index, thread: *thread, message: message.clone() });
    }
    if let Some(message) = cta.unfinished_barrier() {
        return Err(SimError { cta: index, thread: usize::MAX, message });
    }
    if !cta.shared.guard_intact() {
        return Err(SimError {
            cta: index,
            thread: usize::MAX,
            message: format!("wrote past the end of its {} bytes of shared memory", launch.shared_bytes),
        });
    }
    Ok(())
}

/// The text of a panic payload.
fn panic_message(payload: &(dyn core::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "panicked".to_string()
    }
}

/// Boxes a value for a closure that crosses the simulated threads: raw pointers are not `Sync`,
/// so a kernel's pointer arguments travel as this.
#[derive(Debug)]
pub struct Ptr<T>(pub *mut T);

// (By hand: a derive would ask `T: Copy`, and a pointer copies whatever it points to.)
impl<T> Clone for Ptr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Ptr<T> {}

// SAFETY: the pointer is only dereferenced by the kernel, under its own contract (see `launch`).
unsafe impl<T> Send for Ptr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Ptr<T> {}

impl<T> Ptr<T> {
    /// The pointer, for writing.
    pub fn mut_ptr(self) -> *mut T {
        self.0
    }

    /// The pointer, for reading.
    pub fn ptr(self) -> *const T {
        self.0
    }

    /// A null pointer (an optional tensor left out).
    pub fn null() -> Self {
        Self(core::ptr::null_mut())
    }
}

/// A pointer to a host slice's data, to hand to a simulated kernel.
pub fn ptr<T>(s: &[T]) -> Ptr<T> {
    Ptr(s.as_ptr() as *mut T)
}

/// A pointer to a host slice's data, for a kernel to write.
pub fn ptr_mut<T>(s: &mut [T]) -> Ptr<T> {
    Ptr(s.as_mut_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::sm80::{
        bf16_to_f32, f32_to_bf16, ld_shared_u32, ldmatrix_x4, ldmatrix_x4_trans, mma_m16n8k16_bf16, smem_base_generic,
        smem_base_shared, st_shared_u16, sync_threads, sync_warp, thread_idx_x, vote_any,
    };
    use std::vec;

    fn one_warp(shared_bytes: usize) -> Launch {
        Launch { grid: 1, block: WARP, shared_bytes }
    }

    /// A 16 x 16 tile times a 16 x 16 tile through the canonical sm_80 sequence: A by `ldmatrix`
    /// (lane `l` names row `l % 16` of column block `l / 16`), B by `ldmatrix.trans` from its
    /// row-major `[k][n]` storage, two `mma.m16n8k16` (one per 8-column block), the accumulator
    /// fragments scattered as the PTX ISA lays them out. Passes only if the three instructions'
    /// fragment layouts agree with one another and with the product.
    #[test]
    fn ldmatrix_feeds_mma_the_product() {
        const N: usize = 16;
        let value = |i: usize| ((i * 37 % 23) as f32 - 11.0) / 8.0;
        let a: Vec<u16> = (0..N * N).map(|i| f32_to_bf16(value(i))).collect();
        let b: Vec<u16> = (0..N * N).map(|i| f32_to_bf16(value(i + 5) * 0.5)).collect();
        let mut d = vec![f32::NAN; N * N];
        let (pa, pb, pd) = (ptr(&a), ptr(&b), ptr_mut(&mut d));
        // SAFETY: the kernel reads `a`, `b` (N * N each) and writes `d` (N * N).
        unsafe {
            launch(one_warp(2 * N * N * 2), || {
                let lane = thread_idx_x();
                let (base, b_base) = (smem_base_shared(), smem_base_shared() + (N * N * 2) as u32);
                for i in (lane..N * N).step_by(WARP) {
                    st_shared_u16(base + 2 * i as u32, *pa.ptr().add(i));
                    st_shared_u16(b_base + 2 * i as u32, *pb.ptr().add(i));
                }
                sync_warp();
                let a_row = |row: usize, col: usize| base + (2 * (row * N + col)) as u32;
                let b_row = |row: usize, col: usize| b_base + (2 * (row * N + col)) as u32;
                let frag_a = ldmatrix_x4(a_row(lane % 16, 8 * (lane / 16)));
                // Matrices of B: (k 0-7, n 0-7), (k 8-15, n 0-7), (k 0-7, n 8-15), (k 8-15, n 8-15).
                let frag_b = ldmatrix_x4_trans(b_row(lane % 16, 8 * (lane / 16)));
                let (g, t) = (lane / 4, lane % 4);
                for nb in 0..2 {
                    let mut acc = [0.0f32; 4];
                    mma_m16n8k16_bf16(&mut acc, frag_a, [frag_b[2 * nb], frag_b[2 * nb + 1]]);
                    for (i, v) in acc.iter().enumerate() {
                        let (row, col) = (g + 8 * (i / 2), 8 * nb + 2 * t + i % 2);
                        *pd.mut_ptr().add(row * N + col) = *v;
                    }
                }
            })
        }
        .unwrap();
        for r in 0..N {
            for c in 0..N {
                let want: f64 =
                    (0..N).map(|k| bf16_to_f32(a[r * N + k]) as f64 * bf16_to_f32(b[k * N + c]) as f64).sum();
                assert!(
                    (d[r * N + c] as f64 - want).abs() <= 1e-5 * want.abs().max(1.0),
                    "({r}, {c}): {} != {want}",
                    d[r * N + c]
                );
            }
        }
    }

    #[test]
    fn barriers_order_shared_memory_and_votes_see_every_lane() {
        let mut out = vec![0u32; 2 * WARP];
        let o = ptr_mut(&mut out);
        // SAFETY: the kernel writes 2 * WARP words of `out`.
        unsafe {
            launch(Launch { grid: 1, block: 2 * WARP, shared_bytes: 2 * WARP * 4 }, || {
                let t = thread_idx_x();
                crate::arch::sm80::st_shared_u32(smem_base_shared() + 4 * t as u32, t as u32 * 3);
                sync_threads();
                let other = ld_shared_u32(smem_base_shared() + 4 * ((t + WARP) % (2 * WARP)) as u32);
                let any = vote_any(t == 5);
                *o.mut_ptr().add(t) = other + if any { 1000 } else { 0 };
            })
        }
        .unwrap();
        for (t, v) in out.iter().enumerate() {
            let warp_has_5 = t < WARP;
            assert_eq!(*v, ((t + WARP) % (2 * WARP)) as u32 * 3 + if warp_has_5 { 1000 } else { 0 }, "thread {t}");
        }
    }

    /// A warp-role handoff as the portable kernel runs it: the second warp copies a value into
    /// shared memory with `cp.async` (and a zero-filled word beside it), waits for its copies and
    /// arrives on a named barrier; the first warp waits there and reads both. A copy is not in
    /// shared memory before the issuing thread waits for it.
    #[test]
    fn async_copies_land_at_the_wait_and_named_barriers_hand_them_over() {
        use crate::arch::sm80::{cp_async_4, cp_async_wait_all, named_barrier, named_barrier_arrive};
        let src = [0x1234_5678u32, 0x9abc_def0];
        let mut out = vec![0u32; 3 * WARP];
        let (ps, o) = (ptr(&src), ptr_mut(&mut out));
        // SAFETY: the kernel reads `src` (2 words) and writes 3 * WARP words of `out`.
        unsafe {
            launch(Launch { grid: 1, block: 2 * WARP, shared_bytes: 2 * WARP * 4 }, || {
                let t = thread_idx_x();
                let (base, lane) = (smem_base_shared(), (t % WARP) as u32);
                if t >= WARP {
                    let from = ps.ptr().add(lane as usize % 2) as *const u8;
                    cp_async_4(base + 8 * lane, from, 4);
                    cp_async_4(base + 8 * lane + 4, from, 0);
                    *o.mut_ptr().add(2 * WARP + lane as usize) = ld_shared_u32(base + 8 * lane);
                    cp_async_wait_all();
                    named_barrier_arrive(1, 2 * WARP as u32);
                } else {
                    named_barrier(1, 2 * WARP as u32);
                    *o.mut_ptr().add(2 * t) = ld_shared_u32(base + 8 * ((t as u32 + 1) % WARP as u32));
                    *o.mut_ptr().add(2 * t + 1) = ld_shared_u32(base + 8 * lane + 4);
                }
            })
        }
        .unwrap();
        for t in 0..WARP {
            assert_eq!(out[2 * t], src[(t + 1) % 2], "thread {t}: the copied word");
            assert_eq!(out[2 * t + 1], 0, "thread {t}: the zero-filled word");
            assert_eq!(out[2 * WARP + t], u32::MAX, "lane {t}: read its copy before waiting, saw it landed");
        }
    }

    /// The race check fails a launch whose threads touch the same shared bytes, one of them
    /// writing, with nothing ordering them, and passes the same accesses ordered by
    /// `bar.warp.sync` (within a warp), `bar.sync`, or a `cp.async` issued after the barrier that
    /// follows the other thread's read.
    #[test]
    fn unordered_shared_accesses_are_races() {
        use crate::arch::sm80::{cp_async_4, cp_async_wait_all, st_shared_u32};
        let word = [7u32];
        let from = ptr(&word);
        let run = |kernel: &(dyn Fn() + Sync)| {
            // SAFETY: the kernels below touch shared memory and read `word`.
            unsafe { launch(Launch { grid: 1, block: 2 * WARP, shared_bytes: 64 }, kernel) }
        };
        let x = || smem_base_shared();
        let race = |e: SimError| assert!(e.message.contains("shared-memory race at 0x400"), "{e}");
        // A write and another thread's read (in whichever order the host runs them), in one
        // warp or across warps.
        for reader in [1, WARP] {
            race(
                run(&|| unsafe {
                    let t = thread_idx_x();
                    if t == 0 {
                        st_shared_u32(x(), 1);
                    }
                    if t == reader {
                        ld_shared_u32(x());
                    }
                })
                .unwrap_err(),
            );
        }
        // A read and another thread's write, in another warp.
        race(
            run(&|| unsafe {
                match thread_idx_x() {
                    3 => drop(ld_shared_u32(x())),
                    40 => st_shared_u32(x(), 2),
                    _ => {}
                }
            })
            .unwrap_err(),
        );
        // Ordered: `bar.warp.sync` within the warp, `bar.sync` across warps.
        run(&|| unsafe {
            let t = thread_idx_x();
            if t == 0 {
                st_shared_u32(x(), 1);
            }
            sync_warp();
            if t == 1 {
                ld_shared_u32(x());
            }
            sync_threads();
            if t == 40 {
                st_shared_u32(x(), 2);
            }
        })
        .unwrap();
        // A copy issued before the barrier that orders another thread's read of its destination
        // may land before that read: a race. Issued after it: ordered.
        for issue_after in [false, true] {
            let result = run(&|| unsafe {
                let t = thread_idx_x();
                if t == 0 {
                    ld_shared_u32(x());
                }
                if t == WARP && !issue_after {
                    cp_async_4(x(), from.ptr() as *const u8, 4);
                }
                sync_threads();
                if t == WARP {
                    if issue_after {
                        cp_async_4(x(), from.ptr() as *const u8, 4);
                    }
                    cp_async_wait_all();
                }
            });
            if issue_after { result.unwrap() } else { race(result.unwrap_err()) }
        }
    }

    /// Every misuse the simulator checks comes back as an error naming the CTA, the thread and
    /// what went wrong.
    #[test]
    fn misuse_is_reported_not_run() {
        let fail = |shared: usize, kernel: &(dyn Fn() + Sync)| {
            // SAFETY: the kernels below touch only shared memory.
            unsafe { launch(one_warp(shared), kernel) }.unwrap_err()
        };
        let e = fail(64, &|| unsafe {
            ld_shared_u32(smem_base_shared() + 64);
        });
        assert!(e.message.contains("out of bounds"), "{e}");
        let e = fail(64, &|| unsafe {
            ld_shared_u32(smem_base_shared() + 2);
        });
        assert!(e.message.contains("misaligned"), "{e}");
        let e = fail(64, &|| unsafe {
            if thread_idx_x() == 3 {
                vote_any(true);
            } else {
                ldmatrix_x4(smem_base_shared());
            }
        });
        assert!(e.message.contains("different warp-wide instructions"), "{e}");
        let e = fail(64, &|| unsafe {
            if thread_idx_x() == 7 {
                *smem_base_generic().add(64) = 1;
            }
        });
        assert!(e.message.contains("past the end") && e.thread == usize::MAX, "{e}");
        let e = fail(64, &|| {
            if thread_idx_x() == 9 {
                crate::arch::sm80::trap();
            }
            sync_warp();
        });
        assert_eq!((e.cta, e.thread, e.message.as_str()), (0, 9, "trap"), "{e}");
        let word = [7u32];
        let from = ptr(&word);
        let e = fail(64, &|| unsafe {
            crate::arch::sm80::cp_async_4(smem_base_shared() + 4 * thread_idx_x() as u32, from.ptr() as *const u8, 4);
        });
        assert!(e.message.contains("never waited for"), "{e}");
        let two_warps = Launch { grid: 1, block: 2 * WARP, shared_bytes: 0 };
        let e = unsafe {
            launch(two_warps, || {
                if thread_idx_x() >= WARP {
                    crate::arch::sm80::named_barrier_arrive(2, 2 * WARP as u32);
                }
            })
        }
        .unwrap_err();
        assert!(e.message.contains("unfinished phase") && e.thread == usize::MAX, "{e}");
        let e = unsafe { launch(Launch { grid: 1, block: 33, shared_bytes: 0 }, || {}) }.unwrap_err();
        assert!(e.to_string().starts_with("launch rejected"), "{e}");
    }
}
