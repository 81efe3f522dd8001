//! Checks of the embedded PTX without a GPU: it assembles with ptxas for its architecture, no
//! kernel spills or uses a stack, register use allows the occupancy the launch shapes assume, and
//! the SASS holds the instructions the kernels' design relies on.
//!
//! Needs NVIDIA's `ptxas` and `cuobjdump` (`.ci/setup` installs them from PyPI into `.venv-cuda`;
//! `$KDA_CUDA_BIN` overrides). Without them these tests fail with that instruction.

use kda::ptx::{SM80, SM90A};
use kda_cli::cuda_tool;
use kda_kernel::abi::{
    ADVANCE, BASELINE, DECODE, DECODE_MAX_REGISTERS, HOPPER, HOPPER_FUSED, HOPPER_K64, HOPPER_K64_FUSED,
    HOPPER_K64_NARROW, HOPPER_K64_NARROW_FUSED, HOPPER_K256_NARROW, HOPPER_NARROW, HOPPER_NARROW_FUSED, KERNELS,
    LAYER_OUTPUT, LAYER_PREPARE, LAYER_PREPARE_FUSED, LAYER_PREPARE_FUSED_SCALAR, MERGE, PORTABLE_ENTRIES,
    REGISTERS_PER_SM,
};
use kda_kernel::layout::decode;
use std::path::{Path, PathBuf};
use std::process::Command;

/// CTAs of the baseline each SM should hold at once (the tiles are sized for two).
const BASELINE_CTAS_PER_SM: usize = 2;
/// Bytes the decode step may spill under its register budget: a few words of the token loop's
/// and the tree's rebuild path's bookkeeping (ptxas for sm_80 to sm_89 spills 28 to 32 bytes of
/// 64-bit row offsets at 128 registers, 52 to 68 reloaded; for sm_90 and later none); never the
/// state, which is 256 bytes per thread.
const DECODE_SPILL_LIMIT: usize = 96;

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn tool(name: &str) -> PathBuf {
    cuda_tool(&workspace_root(), name)
}

fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("cannot run {:?}: {e}; install NVIDIA's PTX tools with `bash .ci/setup`", cmd.get_program())
    });
    assert!(out.status.success(), "{:?} failed:\n{}", cmd.get_program(), String::from_utf8_lossy(&out.stderr));
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// Assembles `ptx` for `arch`; returns the cubin path and ptxas's `-v` report.
fn assemble(ptx: &str, arch: &str) -> (PathBuf, String) {
    assemble_as(ptx, arch, arch)
}

/// [`assemble`] into files named `name` (tests running at once each use their own).
fn assemble_as(ptx: &str, arch: &str, name: &str) -> (PathBuf, String) {
    let dir = std::env::temp_dir().join(format!("kda-ptx-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join(format!("{name}.ptx"));
    let cubin = dir.join(format!("{name}.cubin"));
    std::fs::write(&src, ptx).unwrap();
    let report = run(Command::new(tool("ptxas")).args(["-v", &format!("-arch={arch}"), "-o"]).arg(&cubin).arg(&src));
    (cubin, report)
}

/// Resource use of one kernel in a ptxas `-v` report.
#[derive(Debug)]
struct Resources {
    registers: usize,
    stack: usize,
    spill_stores: usize,
    spill_loads: usize,
}

fn number_before(line: &str, unit: &str) -> usize {
    let head = &line[..line.find(unit).unwrap_or_else(|| panic!("no `{unit}` in `{line}`"))];
    head.split_whitespace()
        .last()
        .and_then(|w| w.parse().ok())
        .unwrap_or_else(|| panic!("no number before `{unit}` in `{line}`"))
}

fn resources(report: &str, kernel: &str) -> Resources {
    // The whole name (`kda_layer_prepare` is a prefix of `kda_layer_prepare_fused`).
    let start = report
        .find(&format!("Function properties for {kernel}\n"))
        .unwrap_or_else(|| panic!("{kernel} not in the ptxas report:\n{report}"));
    let mut lines = report[start..].lines().skip(1);
    let frame = lines.next().unwrap();
    let used = lines.next().unwrap();
    Resources {
        stack: number_before(frame, "bytes stack frame"),
        spill_stores: number_before(frame, "bytes spill stores"),
        spill_loads: number_before(frame, "bytes spill loads"),
        registers: number_before(used, "registers"),
    }
}

fn sass(cubin: &Path) -> String {
    run(Command::new(tool("cuobjdump")).arg("-sass").arg(cubin))
}

/// The SASS of kernel `entry` in a cubin's disassembly.
fn function_sass<'a>(code: &'a str, entry: &str) -> &'a str {
    code.split("Function : ")
        .find(|f| f.split_whitespace().next() == Some(entry))
        .unwrap_or_else(|| panic!("{entry} in the SASS"))
}

/// Whether `ctas` CTAs of `threads` threads at `registers` registers per thread fit one SM's
/// register file. It is split among the SM's four schedulers (a quarter of `REGISTERS_PER_SM`
/// each), a warp's registers lie in its scheduler's quarter (allocated 8 per thread at a time),
/// and the warps are dealt over the four, so the fullest quarter holds `ceil(warps / 4)` of them.
/// The plain product (`registers * threads <= REGISTERS_PER_SM`) let 544 threads at 120
/// registers through, a launch the H100 refused (`CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`).
fn fits_sm(registers: usize, threads: usize, ctas: usize) -> bool {
    const SCHEDULERS: usize = 4;
    const ALLOCATION: usize = 8;
    let warps = ctas * threads.div_ceil(32);
    warps.div_ceil(SCHEDULERS) * registers.next_multiple_of(ALLOCATION) * 32 <= REGISTERS_PER_SM / SCHEDULERS
}

/// [`fits_sm`] agrees with the driver's maximum threads per CTA (`CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK`)
/// as the H100 reported it on 2026-12-07: 512 at 119 and 120 registers, 384 at 130 and 168.
#[test]
fn the_register_rule_agrees_with_the_driver() {
    let most = |registers: usize| (1..=32).filter(|&w| fits_sm(registers, 32 * w, 1)).max().unwrap_or(0) * 32;
    assert_eq!([most(119), most(120), most(130), most(168)], [512, 512, 384, 384]);
    assert!(!fits_sm(120, 544, 1), "the launch the H100 refused");
    assert!(fits_sm(80, 256, 3) && !fits_sm(80, 256, 4), "three CTAs of 256 threads at 80, a fourth needs 64");
    assert!(fits_sm(64, 256, 4));
    assert!(fits_sm(128, 128, 4) && !fits_sm(136, 128, 4), "the decode step: four CTAs of 128 threads at 128");
}

#[test]
fn baseline_assembles_without_spills_for_both_targets() {
    for (ptx, arch) in [(SM90A, "sm_90a"), (SM80, "sm_80")] {
        let (_, report) = assemble(ptx, arch);
        let r = resources(&report, BASELINE.entry);
        println!("{arch} {}: {r:?}", BASELINE.entry);
        assert_eq!((r.stack, r.spill_stores, r.spill_loads), (0, 0, 0), "{arch}: {r:?}");
        assert!(
            fits_sm(r.registers, BASELINE.threads, BASELINE_CTAS_PER_SM),
            "{arch}: {} registers leave room for fewer than {BASELINE_CTAS_PER_SM} CTAs per SM",
            r.registers
        );
    }
}

/// Every kernel of the portable module asks for no more shared memory than every sm_80+ GPU
/// gives a CTA (99 KB on sm_86, sm_89 and sm_120): the layer, decode and the recurrence run on
/// all of them. The entries the launcher loads only where the GPU gives a CTA more (and plans
/// for only there) fit their class: the two-group recurrence entries, the fused layer pass's
/// one-group entries and its prepare kernel the A100's 163 KB, its two-group entries the H100's
/// 227 KB.
#[test]
fn every_portable_kernel_fits_every_sm80_gpu() {
    use kda_kernel::abi::{
        PORTABLE_FUSED, PORTABLE_FUSED_K64, PORTABLE_FUSED_K64_WIDE, PORTABLE_FUSED_WIDE, PORTABLE_K64_WIDE,
        PORTABLE_WIDE,
    };
    use kda_kernel::layout::portable::{HOPPER_CLASS_SMEM_LIMIT, WIDE_SMEM_LIMIT};
    let a100 = [PORTABLE_K64_WIDE.entry, PORTABLE_WIDE.entry, PORTABLE_FUSED_K64.entry, PORTABLE_FUSED.entry];
    let a100 = [&a100[..], &[LAYER_PREPARE_FUSED.entry]].concat();
    let h100 = [PORTABLE_FUSED_K64_WIDE.entry, PORTABLE_FUSED_WIDE.entry];
    for k in KERNELS.iter().filter(|k| k.targets.contains(&kda_kernel::abi::SM80)) {
        let limit = if h100.contains(&k.entry) {
            HOPPER_CLASS_SMEM_LIMIT
        } else if a100.contains(&k.entry) {
            WIDE_SMEM_LIMIT
        } else {
            kda_kernel::layout::SM80_SMEM_PER_CTA
        };
        println!("{}: {} bytes of dynamic shared memory (limit {limit})", k.entry, k.smem_bytes);
        assert!(k.smem_bytes <= limit, "{}: {} bytes", k.entry, k.smem_bytes);
    }
}

/// The GPUs the driver JIT-compiles the portable module for (compute capability 8.0 and newer
/// other than 9.x takes it; sm_90 is included as the generic Hopper target): A100, A10 / RTX 30xx,
/// L4 / L40S / RTX 40xx, H100 / H200, B200, RTX 50xx.
const JIT_TARGETS: [&str; 6] = ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"];

/// Shared memory per SM on `arch` (one of [`JIT_TARGETS`]): 100 KB on the sm_86, sm_89 and
/// sm_120 parts, 164 KB on the A100, 228 KB on 9.x and sm_100.
fn smem_per_sm(arch: &str) -> usize {
    match arch {
        "sm_86" | "sm_89" | "sm_120" => 100 * 1024,
        "sm_80" => 164 * 1024,
        _ => 228 * 1024,
    }
}

/// Dynamic shared memory a CTA may opt in to on `arch`: the SM's less what the driver reserves
/// per CTA (99 KB, 163 KB, 227 KB).
fn optin_smem(arch: &str) -> usize {
    smem_per_sm(arch) - kda_kernel::layout::portable::RESERVED_SMEM_PER_CTA
}

#[test]
fn the_portable_ptx_assembles_without_spills_for_every_gpu_it_serves() {
    let portable: Vec<_> = KERNELS.iter().filter(|k| k.targets.contains(&kda_kernel::abi::SM80)).collect();
    assert!(portable.len() >= 2, "the portable module holds the baseline and the merge");
    for arch in JIT_TARGETS {
        let (_, report) = assemble_as(SM80, arch, &format!("jit-{arch}"));
        for k in &portable {
            let r = resources(&report, k.entry);
            if k.entry == DECODE.entry || k.entry == ADVANCE.entry {
                continue; // `the_decode_step_keeps_its_state_in_registers_for_every_gpu`
            }
            if k.smem_bytes > optin_smem(arch) {
                continue; // never loaded there (the launcher's `fits_device`)
            }
            // The portable kernel's persistent grid counts on as many CTAs per SM as its layout
            // says (`layout::portable::workers_of`): their registers must let them run at once.
            let ctas = PORTABLE_ENTRIES
                .iter()
                .zip(kda_kernel::layout::portable::VARIANTS)
                .find(|(abi, _)| abi.entry == k.entry)
                .map_or(1, |(abi, (key_dim, groups))| {
                    kda_kernel::layout::portable::workers_of(abi.smem_bytes, key_dim, groups, 1, smem_per_sm(arch))
                });
            println!(
                "{arch} {}: {} registers, {} bytes of dynamic shared memory, {ctas} CTAs per SM",
                k.entry, r.registers, k.smem_bytes
            );
            assert_eq!((r.stack, r.spill_stores, r.spill_loads), (0, 0, 0), "{arch} {}: {r:?}", k.entry);
            assert!(
                fits_sm(r.registers, k.threads, ctas),
                "{arch} {}: {} registers for {ctas} CTAs",
                k.entry,
                r.registers
            );
        }
    }
}

#[test]
fn baseline_sass_uses_the_hardware_conversions() {
    let (cubin, _) = assemble(SM90A, "sm_90a");
    let code = sass(&cubin);
    // exp2 of the gate on the SFU, and bf16 rounding of S and Vn as one packed conversion.
    for op in ["MUFU.EX2", "F2FP.BF16.F32.PACK_AB"] {
        assert!(code.contains(op), "baseline SASS lacks {op}");
    }
    // The PTX must not call anything: every helper is inlined.
    assert!(!code.contains("CALL."), "baseline SASS holds a call");
}

/// A portable consumer warp's share of a chunk at key size `key_dim`: its n8 tiles of the group's
/// four in `Vn` (and `o`), and its m16 tiles of state rows.
fn warp_share(key_dim: usize) -> (usize, usize) {
    use kda_kernel::layout::portable::{MMA_M, N_TILES, VN_ROW_BLOCKS, WARPS_PER_GROUP};
    let warps = WARPS_PER_GROUP;
    (N_TILES * VN_ROW_BLOCKS / warps, key_dim / (MMA_M * warps))
}

/// The portable tensor-core kernel, every key size's entry: both products on the tensor cores
/// (`HMMA` per chunk and warp: `K / 16` k-steps x 4 column tiles for `Vn`, 4 k-steps x 4 column
/// tiles x `K / 64` row tiles for `S`; the loops are unrolled) with their operands read by `ldmatrix`
/// (`LDSM`, as stored and transposed), the chunks copied by `cp.async` (`LDGSTS`, 16-byte ones
/// bypassing L1) and announced by the hardware once landed (`ARRIVES.LDGSTSBAR`), the stages
/// handed back on named barriers (`BAR.ARV` by the consumers), `h` and `v_new` stored 16
/// bytes at a time (`STG.E.128`), every
/// shared access explicit (`LDS`/`STS`, no generic `LD`/`ST`), no local memory, no call; and
/// room in registers for the CTAs per SM the launcher's schedule counts on
/// (`layout::portable::max_ctas_per_sm`).
#[test]
fn portable_sass_runs_both_products_on_the_tensor_cores() {
    for (ptx, arch) in [(SM90A, "sm_90a"), (SM80, "sm_80")] {
        let (cubin, report) = assemble_as(ptx, arch, &format!("portable-{arch}"));
        let code = sass(&cubin);
        for (abi, (key_dim, groups)) in PORTABLE_ENTRIES.iter().zip(kda_kernel::layout::portable::VARIANTS) {
            let r = resources(&report, abi.entry);
            let ctas = kda_kernel::layout::portable::max_ctas_per_sm(key_dim, groups);
            println!("{arch} {}: {r:?}, {} bytes of shared memory, {ctas} CTAs per SM", abi.entry, abi.smem_bytes);
            assert!(fits_sm(r.registers, abi.threads, ctas), "{arch} {}: {r:?}", abi.entry);
            let code = function_sass(&code, abi.entry);
            let count = |op: &str| code.lines().filter(|l| l.contains(op)).count();
            // The loops are the same for every group: one copy of them.
            use kda_kernel::layout::portable::N_TILES;
            let (vn_tiles, state_tiles) = warp_share(key_dim);
            let hmma = (key_dim / 16) * vn_tiles + 4 * N_TILES * state_tiles;
            assert_eq!(count("HMMA.16816.F32.BF16"), hmma, "{arch} {}: the chunk's two products", abi.entry);
            assert!(count("LDS") > 0 && count("STS") > 0, "{arch}: shared accesses");
            for op in ["LDSM.16.M88.4", "LDSM.16.MT88.4", "LDGSTS.E.BYPASS.128", "BAR.ARV", "BAR.SYNC"] {
                assert!(count(op) > 0, "{arch} {}: portable SASS lacks {op}", abi.entry);
            }
            // A stage is announced by the hardware once the copies have landed
            // (`cp.async.mbarrier.arrive`), and `h` and `v_new` leave in 16-byte stores.
            for op in ["ARRIVES.LDGSTSBAR.64", "STG.E.128"] {
                assert!(count(op) > 0, "{arch} {}: portable SASS lacks {op}", abi.entry);
            }
            for op in [" LD.", " ST.", "LDL", "STL"] {
                assert_eq!(count(op), 0, "{arch} {}: portable SASS holds {op}", abi.entry);
            }
            // ptxas's `CALL.REL.NOINC` to the next instruction (sm_80's loop-convergence idiom)
            // is no call; anything else is.
            assert_eq!(count("CALL.") - count("CALL.REL.NOINC"), 0, "{arch} {}: portable SASS holds a call", abi.entry);
        }
    }
}

/// The fused layer pass's portable entries: the recurrence's products and the output's two
/// beside them on the tensor cores (`HMMA` per chunk and warp: `2 K / 16` k-steps x 4 column
/// tiles for `Vn` and `q Γ S`, 4 k-steps x 4 column tiles x `K / 64` row tiles for `S`, 4
/// k-steps x 4 column tiles for `P Vn`; with eight warps per group 2 column tiles for `Vn`,
/// `q Γ S` and `P Vn`, `K / 128` row tiles for `S`), the chunk's `q Γ` and `P` rows copied with the others by `cp.async`,
/// `o` stored to global memory (`STG.E`) and never `h` or `v_new` (no 16-byte stores), no local
/// memory, no generic access, no call, and registers for the CTAs per SM the grid counts on.
#[test]
fn the_portable_fused_pass_runs_its_four_products_on_the_tensor_cores() {
    use kda_kernel::abi::PORTABLE_FUSED_ENTRIES;
    use kda_kernel::layout::portable::{FUSED_VARIANTS, max_ctas_per_sm};
    for (ptx, arch) in [(SM90A, "sm_90a"), (SM80, "sm_80")] {
        let (cubin, report) = assemble_as(ptx, arch, &format!("portable-fused-{arch}"));
        let code = sass(&cubin);
        for (abi, (key_dim, groups)) in PORTABLE_FUSED_ENTRIES.iter().zip(FUSED_VARIANTS) {
            let r = resources(&report, abi.entry);
            println!("{arch} {}: {r:?}, {} bytes of shared memory", abi.entry, abi.smem_bytes);
            assert_eq!((r.stack, r.spill_stores, r.spill_loads), (0, 0, 0), "{arch} {}: {r:?}", abi.entry);
            // CTAs per SM: as the registers allow, and the shared memory of the largest SM (228 KB).
            const LARGEST_SMEM_PER_SM: usize = 228 * 1024;
            let ctas =
                kda_kernel::layout::portable::workers_of(abi.smem_bytes, key_dim, groups, 1, LARGEST_SMEM_PER_SM);
            assert!(ctas <= max_ctas_per_sm(key_dim, groups));
            assert!(fits_sm(r.registers, abi.threads, ctas), "{arch} {}: {r:?}", abi.entry);
            let code = function_sass(&code, abi.entry);
            let count = |op: &str| code.lines().filter(|l| l.contains(op)).count();
            use kda_kernel::layout::portable::N_TILES;
            let (vn_tiles, state_tiles) = warp_share(key_dim);
            let hmma = 2 * (key_dim / 16) * vn_tiles + 4 * N_TILES * state_tiles + 4 * vn_tiles;
            assert_eq!(count("HMMA.16816.F32.BF16"), hmma, "{arch} {}: the chunk's four products", abi.entry);
            for op in ["LDSM.16.M88.4", "LDSM.16.MT88.4", "LDGSTS.E.BYPASS.128", "ARRIVES.LDGSTSBAR.64", "STG.E"] {
                assert!(count(op) > 0, "{arch} {}: fused SASS lacks {op}", abi.entry);
            }
            for op in ["STG.E.128", " LD.", " ST.", "LDL", "STL"] {
                assert_eq!(count(op), 0, "{arch} {}: fused SASS holds {op}", abi.entry);
            }
            assert_eq!(count("CALL.") - count("CALL.REL.NOINC"), 0, "{arch} {}: fused SASS holds a call", abi.entry);
        }
    }
}

/// Consumer variants each Hopper entry holds: scalar gate or not, x key-first or value-first
/// states, for the recurrence and for the pre-scan of split sequences (whose first segments read
/// `h0` in its layout) (`hopper::consumer::run` dispatches once to each).
const CONSUMER_VARIANTS: usize = 8;
/// Consumer variants of the fused layer pass's entries: no pre-scan.
const FUSED_CONSUMER_VARIANTS: usize = 4;

#[test]
fn the_split_merge_assembles_without_spills_for_both_targets() {
    for (ptx, arch) in [(SM90A, "sm_90a"), (SM80, "sm_80")] {
        let (cubin, report) = assemble(ptx, arch);
        let r = resources(&report, MERGE.entry);
        println!("{arch} {}: {r:?}", MERGE.entry);
        assert_eq!((r.stack, r.spill_stores, r.spill_loads), (0, 0, 0), "{arch}: {r:?}");
        let code = sass(&cubin);
        let body = function_sass(&code, MERGE.entry);
        // f32 FMAs over the shared entry block and the maps' stages, which `cp.async` fills
        // (`LDGSTS`) ahead of the products; `h0` by 16-byte loads.
        for op in ["FFMA", "LDGSTS", "LDG.E.128", "LDS.128"] {
            assert!(body.contains(op), "{arch} {} SASS lacks {op}", MERGE.entry);
        }
        // ptxas's `CALL.REL.NOINC` to the next instruction (its loop-convergence idiom on sm_80)
        // is no call; anything else is.
        let calls = body.lines().filter(|l| l.contains("CALL.") && !l.contains("CALL.REL.NOINC")).count();
        assert_eq!(calls, 0, "{arch} {} SASS holds a call", MERGE.entry);
    }
}

#[test]
fn hopper_kernel_assembles_without_spills_and_uses_tma_wgmma_and_mbarriers() {
    let (cubin, report) = assemble(SM90A, "sm_90a");
    let code = sass(&cubin);
    // Per key size and block width: its entry, the shapes of its two products and their MMAs
    // per chunk. Wide: product 1 is m64n64 with K / 16 k-steps, product 2 m64nK with 4. Narrow:
    // product 1 is m64n32 with K / 16 k-steps, product 2 K / 64 tiles of m64n32 with 4 each.
    let wide = |k: usize| k / 16 + 4;
    let narrow = |k: usize| k / 16 + 4 * (k / 64);
    // The fused layer pass: the wide products and the output's two, m64n64 with K / 16 and 4
    // k-steps.
    let fused = |k: usize| wide(k) + k / 16 + 4;
    // In narrow blocks the output's two products are m64n32, with K / 16 and 4 k-steps.
    let narrow_fused = |k: usize| narrow(k) + k / 16 + 4;
    let (all, only_fused) = (CONSUMER_VARIANTS, FUSED_CONSUMER_VARIANTS);
    for (abi, products, mmas_per_chunk, variants) in [
        (&HOPPER, ["HGMMA.64x64x16.F32.BF16", "HGMMA.64x128x16.F32.BF16"], wide(128), all),
        (&HOPPER_K64, ["HGMMA.64x64x16.F32.BF16", "HGMMA.64x64x16.F32.BF16"], wide(64), all),
        (&HOPPER_NARROW, ["HGMMA.64x32x16.F32.BF16", "HGMMA.64x32x16.F32.BF16"], narrow(128), all),
        (&HOPPER_K64_NARROW, ["HGMMA.64x32x16.F32.BF16", "HGMMA.64x32x16.F32.BF16"], narrow(64), all),
        (&HOPPER_K256_NARROW, ["HGMMA.64x32x16.F32.BF16", "HGMMA.64x32x16.F32.BF16"], narrow(256), all),
        (&HOPPER_FUSED, ["HGMMA.64x64x16.F32.BF16", "HGMMA.64x128x16.F32.BF16"], fused(128), only_fused),
        (&HOPPER_K64_FUSED, ["HGMMA.64x64x16.F32.BF16", "HGMMA.64x64x16.F32.BF16"], fused(64), only_fused),
        (&HOPPER_NARROW_FUSED, ["HGMMA.64x32x16.F32.BF16", "HGMMA.64x32x16.F32.BF16"], narrow_fused(128), only_fused),
        (
            &HOPPER_K64_NARROW_FUSED,
            ["HGMMA.64x32x16.F32.BF16", "HGMMA.64x32x16.F32.BF16"],
            narrow_fused(64),
            only_fused,
        ),
    ] {
        let r = resources(&report, abi.entry);
        println!("sm_90a {}: {r:?}", abi.entry);
        assert_eq!((r.stack, r.spill_stores, r.spill_loads), (0, 0, 0), "{r:?}: the state must stay in registers");
        assert!(fits_sm(r.registers, abi.threads, 1), "{} registers: not even one CTA fits", r.registers);
        let body = function_sass(&code, abi.entry);
        // Tensor-core MMAs of both products, TMA tile loads and output stores, and the mbarrier ring.
        for op in [products[0], products[1], "UTMALDG.3D", "UTMASTG.3D", "SYNCS.ARRIVE", "SYNCS.PHASECHK"] {
            assert!(body.contains(op), "{} SASS lacks {op}", abi.entry);
        }
        // Every consumer variant keeps its own chunk loop.
        let mmas = body.matches("HGMMA.").count();
        assert_eq!(mmas, variants * mmas_per_chunk, "{}: {mmas} HGMMA", abi.entry);
        assert!(!body.contains("CALL."), "{} SASS holds a call", abi.entry);
        assert!(!SM80.contains(abi.entry), "the portable PTX must not contain {}", abi.entry);
    }
    // ptxas reports (C7517, C7515) when it had to add a wgmma wait or serialize the wgmma
    // pipeline: the kernel's overlap of stores with the MMAs would then be gone.
    for note in ["warpgroup.wait is injected", "wgmma.mma_async instructions are serialized"] {
        assert!(!report.contains(note), "ptxas: {note}:\n{report}");
    }
}

/// The layer's token-parallel kernels in the sm_90a module: no spills or stack under their
/// register budget, two CTAs per SM by registers and shared memory (the fused prepare kernel's
/// 110 KB included; three for its scalar-gate variant), their products on the tensor cores
/// (`HMMA`) and their tiles read and written 16 bytes at a time.
#[test]
fn the_layer_kernels_keep_two_ctas_per_sm_on_hopper() {
    use kda_kernel::layout::layer::{SM90_THREE_CTA_SMEM, SM90_TWO_CTA_SMEM};
    let (cubin, report) = assemble(SM90A, "sm_90a");
    let code = sass(&cubin);
    for (abi, ctas) in
        [(&LAYER_PREPARE, 2), (&LAYER_OUTPUT, 2), (&LAYER_PREPARE_FUSED, 2), (&LAYER_PREPARE_FUSED_SCALAR, 3)]
    {
        let r = resources(&report, abi.entry);
        println!("sm_90a {}: {r:?}, {} bytes of shared memory", abi.entry, abi.smem_bytes);
        assert_eq!((r.stack, r.spill_stores, r.spill_loads), (0, 0, 0), "{}: {r:?}", abi.entry);
        assert!(r.registers <= abi.max_registers.unwrap() as usize, "{}: {r:?}", abi.entry);
        assert!(fits_sm(r.registers, abi.threads, ctas), "{}: {ctas} CTAs by registers", abi.entry);
        let smem = if ctas == 3 { SM90_THREE_CTA_SMEM } else { SM90_TWO_CTA_SMEM };
        assert!(abi.smem_bytes <= smem, "{}: {ctas} CTAs by shared memory", abi.entry);
        let body = function_sass(&code, abi.entry);
        // (The output kernel writes `o` a pair of bf16 per store, from its accumulators.)
        let store = if abi.entry == LAYER_OUTPUT.entry { "STG.E" } else { "STG.E.128" };
        for op in ["HMMA.", "LDG.E.128", store, "LDS.128"] {
            assert!(body.contains(op), "{} SASS lacks {op}", abi.entry);
        }
    }
    // The portable module has the fused prepare kernel too, for the portable kernel's fused pass.
    assert!(SM80.contains(LAYER_PREPARE_FUSED.entry), "the portable module lacks the fused prepare kernel");
}

/// The launch bounds the builder writes into each entry are the ABI's: `.maxntid` is the block
/// size the launcher uses, `.maxnreg` the register budget (and no bounds where the ABI has none).
#[test]
fn entry_directives_match_the_abi() {
    for kernel in KERNELS {
        for ptx in kda::ptx::modules_of(&kernel) {
            let start = ptx.find(&format!(".entry {}(", kernel.entry)).expect("entry in the PTX");
            let body = &ptx[start..];
            let header = &body[..body.find('{').expect("entry body")];
            match kernel.max_registers {
                Some(regs) => {
                    for directive in [format!(".maxntid {}, 1, 1", kernel.threads), format!(".maxnreg {regs}")] {
                        assert!(header.contains(&directive), "{} lacks `{directive}`:\n{header}", kernel.entry);
                    }
                }
                None => assert!(!header.contains(".maxn"), "{} has launch bounds:\n{header}", kernel.entry),
            }
        }
    }
}

/// The decode step and the checkpoint kernel on every GPU they serve: four CTAs per SM under
/// their register budget, at most a few words spilled, and in the SASS the state's vector loads
/// and stores, the warp's shuffles (a token's sums) and their barriers.
#[test]
fn the_decode_step_keeps_its_state_in_registers_for_every_gpu() {
    assert!(fits_sm(DECODE_MAX_REGISTERS as usize, DECODE.threads, decode::CTAS_PER_SM));
    let targets = [(SM90A, "sm_90a")].into_iter().chain(JIT_TARGETS.map(|arch| (SM80, arch)));
    for (ptx, arch) in targets {
        let (cubin, report) = assemble_as(ptx, arch, &format!("decode-{arch}"));
        let code = sass(&cubin);
        // Once each in the code: the decode step's two barriers of staging every token's
        // copied rows (a token's sums stay inside each warp: no barrier of its own); the
        // checkpoint kernel's one per token (its loaded inputs).
        for (abi, barriers) in [(&DECODE, 2), (&ADVANCE, 1)] {
            let r = resources(&report, abi.entry);
            println!("{arch} {}: {r:?}", abi.entry);
            assert!(r.registers <= DECODE_MAX_REGISTERS as usize, "{arch} {}: {r:?}", abi.entry);
            let spills = r.spill_stores <= DECODE_SPILL_LIMIT && r.spill_loads <= DECODE_SPILL_LIMIT;
            assert!(spills, "{arch} {}: {r:?}", abi.entry);
            let body = function_sass(&code, abi.entry);
            let store = if abi.entry == DECODE.entry { "STG.E.128" } else { "STG.E" };
            for op in ["LDG.E", store, "SHFL.BFLY"] {
                assert!(body.contains(op), "{arch} {} SASS lacks {op}", abi.entry);
            }
            assert_eq!(
                body.matches("BAR.SYNC").count(),
                barriers,
                "{arch} {}: its barriers, once each in the code",
                abi.entry
            );
        }
        let decode = function_sass(&code, DECODE.entry);
        assert!(decode.contains("LDG.E.128"), "{arch}: the decode step reads the f32 state as 16-byte vectors");
        assert!(decode.contains("LDGSTS"), "{arch}: the decode step copies its tokens' rows with cp.async");
    }
}
