//! Compiles every reduction kernel and every device-executor kernel with
//! NVRTC for sm_80 and sm_90 and fails on any error, warning or register
//! spill; and checks that the checker
//! itself catches a broken source, a warning and a forced spill.
//!
//! Needs libnvrtc on the loader's path (docs/cuda.md). Without it each test
//! says why it skipped and passes, unless `FERROCCL_REQUIRE_NVRTC=1`, then
//! it fails (CI sets it).

use ferroccl_cuda::nvrtc::{self, Cubin};
use ferroccl_cuda::CudaError;
use ferroccl_cuda::{executor, kernels};

/// Whether NVRTC is here; if not, whether that is allowed (skip) or not
/// (panic).
fn nvrtc_here(test: &str) -> bool {
    match nvrtc::version() {
        Ok(_) => true,
        Err(e) => {
            if std::env::var("FERROCCL_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
                panic!("{test}: FERROCCL_REQUIRE_NVRTC=1 but NVRTC is unusable: {e}");
            }
            eprintln!("{test}: skipped, NVRTC is unusable: {e}");
            false
        }
    }
}

fn report(c: &Cubin) {
    eprintln!(
        "NVRTC {}.{} {}: {} bytes of CUBIN in {:.2?}",
        c.version.0,
        c.version.1,
        c.arch,
        c.image.len(),
        c.elapsed
    );
    for k in &c.kernels {
        eprintln!(
            "  {:<32} {:>3} registers, {} bytes stack, {}/{} bytes spill stores/loads",
            k.name, k.registers, k.stack_bytes, k.spill_stores, k.spill_loads
        );
    }
}

fn compiles_every_kernel_for(arch: &str) {
    if !nvrtc_here(arch) {
        return;
    }
    let c = nvrtc::compile_kernels(arch).unwrap_or_else(|e| panic!("{e}"));
    report(&c);
    assert_eq!(c.arch, arch);
    // An ELF image.
    assert_eq!(&c.image[..4], b"\x7fELF", "not a CUBIN");
    // ptxas reported on exactly the kernels of the table, none spilling.
    let mut reported: Vec<&str> = c.kernels.iter().map(|k| k.name.as_str()).collect();
    let mut want: Vec<&str> = kernels::names().iter().map(String::as_str).collect();
    reported.sort_unstable();
    want.sort_unstable();
    assert_eq!(reported, want);
    for k in &c.kernels {
        assert!(k.registers > 0, "{k:?}");
        assert_eq!((k.spill_stores, k.spill_loads), (0, 0), "{k:?}");
        // The kernel's name is in the image's symbol table.
        let found = c
            .image
            .windows(k.name.len() + 1)
            .any(|w| &w[..k.name.len()] == k.name.as_bytes() && w[k.name.len()] == 0);
        assert!(found, "{} not in the CUBIN", k.name);
    }
    assert_eq!(nvrtc::check_log(&c.log), Ok(()));
}

#[test]
fn every_kernel_compiles_for_sm_80_without_warning_or_spill() {
    compiles_every_kernel_for("sm_80");
}

#[test]
fn every_kernel_compiles_for_sm_90_without_warning_or_spill() {
    compiles_every_kernel_for("sm_90");
}

/// The device executor's 80 kernels (`kernels/executor.cu`): no error,
/// warning or spill, at most 128 registers (512 threads a block).
fn compiles_every_executor_kernel_for(arch: &str, extra: &[&str]) {
    if !nvrtc_here(arch) {
        return;
    }
    let c = nvrtc::compile(executor::source(), arch, extra).unwrap_or_else(|e| panic!("{e}"));
    report(&c);
    assert_eq!(&c.image[..4], b"\x7fELF", "not a CUBIN");
    let mut reported: Vec<&str> = c
        .kernels
        .iter()
        .map(|k| k.name.as_str())
        .filter(|n| n.starts_with("ferroccl_exec_"))
        .collect();
    let mut want: Vec<&str> = executor::names().iter().map(String::as_str).collect();
    reported.sort_unstable();
    want.sort_unstable();
    assert_eq!(reported, want);
    for k in &c.kernels {
        assert_eq!((k.spill_stores, k.spill_loads), (0, 0), "{k:?}");
        assert!(k.registers <= 128, "{k:?}");
    }
    assert_eq!(nvrtc::check_log(&c.log), Ok(()));
}

#[test]
fn executor_kernels_compile_for_sm_80_without_warning_or_spill() {
    compiles_every_executor_kernel_for("sm_80", &[]);
}

#[test]
fn executor_kernels_compile_for_sm_90_without_warning_or_spill() {
    compiles_every_executor_kernel_for("sm_90", &[]);
}

/// The other unrolls FERROCCL_EXEC_UNROLL may ask for to be measured
/// (the default, 4, is the test above): without spills within the 128
/// registers, as the launcher's compile requires.
#[test]
fn executor_kernels_compile_unrolled_1_and_2_without_spill() {
    for u in ["1", "2"] {
        let option = executor::unroll_option(Some(u)).unwrap().expect("a define");
        compiles_every_executor_kernel_for("sm_90", &[option.as_str()]);
    }
}

fn compile_error(src: &str, extra: &[&str]) -> String {
    match nvrtc::compile(src, "sm_90", extra) {
        Err(CudaError::Compile(log)) => log,
        Ok(c) => panic!("compiled, log:\n{}", c.log),
        Err(other) => panic!("{other:?}"),
    }
}

#[test]
fn a_broken_source_is_an_error_with_the_log() {
    if !nvrtc_here("broken source") {
        return;
    }
    // The real source with one kernel's body cut short.
    let src = kernels::source().replacen("(dst, a, b, count); }", "(dst, a, b, count); ", 1);
    let log = compile_error(&src, &[]);
    assert!(log.contains("nvrtcCompileProgram"), "{log}");
    assert!(log.contains("error"), "{log}");
}

#[test]
fn a_warning_is_an_error() {
    if !nvrtc_here("warning") {
        return;
    }
    let src = "extern \"C\" __global__ void k(float* p) { int unused = 1; p[0] = 1.0f; }";
    let log = compile_error(src, &[]);
    assert!(log.contains("warning"), "{log}");
    // And the same kernel without the warning compiles.
    let ok = nvrtc::compile(
        "extern \"C\" __global__ void k(float* p) { p[0] = 1.0f; }",
        "sm_90",
        &[],
    );
    assert!(ok.is_ok(), "{ok:?}");
}

#[test]
fn a_forced_spill_is_an_error() {
    if !nvrtc_here("spill") {
        return;
    }
    // 64 values live at once, in at most 16 registers: ptxas must spill.
    let src = r#"
extern "C" __global__ void hungry(float* p, const float* q) {
    float v[64];
#pragma unroll
    for (int i = 0; i < 64; i++) v[i] = q[i * 977 + threadIdx.x];
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 64; i++) s += v[i] * v[63 - i] * v[(i * 7) & 63];
    p[threadIdx.x] = s;
}
"#;
    let fine = nvrtc::compile(src, "sm_90", &[]).unwrap_or_else(|e| panic!("{e}"));
    assert!(fine.kernels[0].registers > 16, "{:?}", fine.kernels);
    let log = compile_error(src, &["--maxrregcount=16"]);
    assert!(log.contains("spill"), "{log}");
}

// ---------------------------------------------------------------------------
// The kernels' arithmetic, run on the host: the very source NVRTC compiles,
// built by the host's C++ compiler under a few lines that stand in for the
// CUDA built-ins (one IEEE operation each on x86-64/aarch64, no contraction),
// every thread of a small grid run in turn. Checked bit for bit against a
// reference written here from the rules (docs/cuda.md), for every kernel,
// aligned, equally misaligned, differently misaligned, in place, short and
// over-sized grids. Needs no GPU and no NVRTC; skipped without `c++`.

/// The qualifiers, built-ins and thread indices of the host build: the
/// same header the device executor's host run uses.
const HOST_SHIM: &str = ferroccl_cuda::executor::HOST_EMULATION_H;

const HOST_DRIVER: &str = r#"
typedef unsigned long long u64;
static void launch_grid(unsigned grid, unsigned block, void (*body)(void*), void* ctx) {
    gridDim.x = grid; blockDim.x = block;
    for (unsigned g = 0; g < grid; g++)
        for (unsigned t = 0; t < block; t++) { blockIdx.x = g; threadIdx.x = t; body(ctx); }
}
struct Job { void* k; void* d; const void* a; const void* b; u64 count; u64 n; };
template <class T> static void call_reduce(void* c) {
    Job* j = (Job*)c;
    ((void (*)(T*, const T*, const T*, u64))j->k)((T*)j->d, (const T*)j->a, (const T*)j->b, j->count);
}
template <class T> static void call_finish(void* c) {
    Job* j = (Job*)c;
    ((void (*)(T*, u64, u64))j->k)((T*)j->d, j->count, j->n);
}
template <class T> static void (*reduce_of(void (*)(T*, const T*, const T*, u64)))(void*) { return call_reduce<T>; }
template <class T> static void (*finish_of(void (*)(T*, u64, u64)))(void*) { return call_finish<T>; }
static unsigned char* read_file(const char* path, size_t len) {
    unsigned char* p = (unsigned char*)malloc(len + 1);
    FILE* f = fopen(path, "rb");
    if (!f || fread(p, 1, len, f) != len) { fprintf(stderr, "cannot read %s\n", path); exit(2); }
    fclose(f);
    return p;
}
// args: name size count off_d off_a off_b in_place n grid block a.bin b.bin out.bin
int main(int argc, char** argv) {
    if (argc != 14) { fprintf(stderr, "usage\n"); return 2; }
    const char* name = argv[1];
    size_t size = strtoull(argv[2], 0, 10);
    u64 count = strtoull(argv[3], 0, 10);
    size_t od = strtoull(argv[4], 0, 10), oa = strtoull(argv[5], 0, 10), ob = strtoull(argv[6], 0, 10);
    int in_place = atoi(argv[7]);
    u64 n = strtoull(argv[8], 0, 10);
    unsigned grid = atoi(argv[9]), block = atoi(argv[10]);
    size_t bytes = count * size, room = bytes + 64;
    unsigned char* A = (unsigned char*)aligned_alloc(16, room);
    unsigned char* B = (unsigned char*)aligned_alloc(16, room);
    unsigned char* D = (unsigned char*)aligned_alloc(16, room);
    memset(A, 0x5a, room); memset(B, 0x5a, room); memset(D, 0x5a, room);
    unsigned char* a = A + oa * size; unsigned char* b = B + ob * size;
    unsigned char* d = in_place ? a : D + od * size;
    unsigned char* dbase = in_place ? A : D;
    unsigned char* ta = read_file(argv[11], bytes); memcpy(a, ta, bytes);
    unsigned char* tb = read_file(argv[12], bytes); memcpy(b, tb, bytes);
    Job j = { 0, d, a, b, count, n };
    void (*body)(void*) = 0;
#include "dispatch.inc"
    if (!body) { fprintf(stderr, "no kernel %s\n", name); return 2; }
    // The finishing kernel works in place: on a copy of a in dst.
    if (!strncmp(name, "ferroccl_avg_finish_", 20)) memmove(d, a, bytes);
    launch_grid(grid, block, body, &j);
    for (unsigned char* p = dbase; p < dbase + room; p++)
        if ((p < d || p >= d + bytes) && *p != 0x5a) { fprintf(stderr, "wrote outside dst at %td\n", p - d); return 3; }
    FILE* f = fopen(argv[13], "wb");
    if (!f || fwrite(d, 1, bytes, f) != bytes) { fprintf(stderr, "cannot write\n"); return 2; }
    fclose(f);
    return 0;
}
"#;

use ferroccl_cuda::{DataType, ReduceOp};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds the host stand-in of the module, or says why not.
fn build_host_module(dir: &Path) -> Result<PathBuf, String> {
    let mut dispatch = String::new();
    for name in kernels::names() {
        let of = if name.starts_with("ferroccl_avg_finish_") {
            "finish_of"
        } else {
            "reduce_of"
        };
        dispatch.push_str(&format!(
            "if (!strcmp(name, \"{name}\")) {{ j.k = (void*){name}; body = {of}({name}); }}\n"
        ));
    }
    std::fs::write(dir.join("dispatch.inc"), dispatch).unwrap();
    let src = format!("{HOST_SHIM}\n{}\n{HOST_DRIVER}", kernels::source());
    std::fs::write(dir.join("host.cpp"), src).unwrap();
    let exe = dir.join("host");
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let out = Command::new(&cxx)
        .args([
            "-std=c++20",
            "-O1",
            "-pthread",
            "-ffp-contract=off",
            "-fno-fast-math",
        ])
        .args(["-Wall", "-Wno-unknown-pragmas", "-Werror", "-o"])
        .arg(&exe)
        .arg(dir.join("host.cpp"))
        .output()
        .map_err(|e| format!("cannot run {cxx}: {e}"))?;
    if !out.status.success() {
        panic!(
            "the kernel source does not build on the host:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(exe)
}

/// Element bits (in a u64) of one type.
fn bits_of(ty: DataType, raw: &[u8]) -> Vec<u64> {
    raw.chunks(ty.size())
        .map(|c| {
            let mut b = [0u8; 8];
            b[..c.len()].copy_from_slice(c);
            u64::from_le_bytes(b)
        })
        .collect()
}

fn raw_of(ty: DataType, bits: &[u64]) -> Vec<u8> {
    bits.iter()
        .flat_map(|b| b.to_le_bytes()[..ty.size()].to_vec())
        .collect()
}

fn mask(ty: DataType) -> u64 {
    if ty.size() == 8 {
        u64::MAX
    } else {
        (1u64 << (8 * ty.size())) - 1
    }
}

fn is_nan(ty: DataType, b: u64) -> bool {
    match ty {
        DataType::F32 => (b & 0x7fff_ffff) > 0x7f80_0000,
        DataType::F64 => (b & 0x7fff_ffff_ffff_ffff) > 0x7ff0_0000_0000_0000,
        DataType::F16 => (b & 0x7fff) > 0x7c00,
        DataType::Bf16 => (b & 0x7fff) > 0x7f80,
        _ => false,
    }
}

fn canonical_nan(ty: DataType) -> u64 {
    match ty {
        DataType::F32 => 0x7fc0_0000,
        DataType::F64 => 0x7ff8_0000_0000_0000,
        DataType::F16 => 0x7e00,
        DataType::Bf16 => 0x7fc0,
        _ => unreachable!(),
    }
}

/// (mantissa bits, exponent bias) of a half type.
fn half_format(ty: DataType) -> (u32, i32) {
    match ty {
        DataType::F16 => (10, 15),
        DataType::Bf16 => (7, 127),
        _ => unreachable!(),
    }
}

/// The value of a non-negative half bit pattern, finite or the first
/// pattern past the largest finite one (Inf), which stands for 2^(emax+1):
/// rounding to it is overflow.
fn half_magnitude(ty: DataType, h: u64) -> f64 {
    let (m, bias) = half_format(ty);
    let e = (h >> m) as i32;
    let man = (h & ((1 << m) - 1)) as f64;
    if e == 0 {
        man * 2f64.powi(1 - bias - m as i32)
    } else {
        (man + (1u64 << m) as f64) * 2f64.powi(e - bias - m as i32)
    }
}

fn half_to_f32(ty: DataType, h: u64) -> f32 {
    if is_nan(ty, h) {
        return f32::NAN;
    }
    let inf = if ty == DataType::F16 { 0x7c00 } else { 0x7f80 };
    let v = if h & 0x7fff == inf {
        f32::INFINITY
    } else {
        half_magnitude(ty, h & 0x7fff) as f32 // exact
    };
    if h & 0x8000 != 0 {
        -v
    } else {
        v
    }
}

/// Round an f32 to the nearest half value, ties to the even pattern, by
/// search over the ordered patterns (not the kernels' bit arithmetic).
fn f32_to_half(ty: DataType, x: f32) -> u64 {
    if x.is_nan() {
        return canonical_nan(ty); // any NaN: compared as NaN
    }
    let sign = if x.is_sign_negative() { 0x8000 } else { 0 };
    let ax = (x as f64).abs();
    let inf = if ty == DataType::F16 { 0x7c00 } else { 0x7f80 };
    if ax.is_infinite() {
        return sign | inf;
    }
    // The largest pattern whose value is <= ax, in 0 ..= inf.
    let (mut lo, mut hi) = (0u64, inf);
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if half_magnitude(ty, mid) <= ax {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let r = if lo == inf || half_magnitude(ty, lo) == ax {
        lo
    } else {
        let (d1, d2) = (ax - half_magnitude(ty, lo), half_magnitude(ty, lo + 1) - ax);
        if d1 < d2 || (d1 == d2 && lo % 2 == 0) {
            lo
        } else {
            lo + 1
        }
    };
    sign | r
}

/// A float element as f64 (exact), for comparisons.
fn float_value(ty: DataType, b: u64) -> f64 {
    match ty {
        DataType::F32 => f32::from_bits(b as u32) as f64,
        DataType::F64 => f64::from_bits(b),
        _ => half_to_f32(ty, b) as f64,
    }
}

/// An integer element, sign-extended for signed types.
fn int_value(ty: DataType, b: u64) -> i128 {
    let bits = 8 * ty.size() as u32;
    match ty {
        DataType::I8 | DataType::I32 | DataType::I64 => {
            ((b << (64 - bits)) as i64 >> (64 - bits)) as i128
        }
        _ => b as i128,
    }
}

/// What `a op b` must be (float NaN results of Sum and Prod: any NaN).
fn expect_reduce(op: ReduceOp, ty: DataType, a: u64, b: u64) -> u64 {
    if !ty.is_float() {
        let (x, y) = (int_value(ty, a), int_value(ty, b));
        let r = match op {
            ReduceOp::Sum | ReduceOp::Avg => x.wrapping_add(y),
            ReduceOp::Prod => x.wrapping_mul(y),
            ReduceOp::Min => x.min(y),
            ReduceOp::Max => x.max(y),
        };
        return r as u64 & mask(ty);
    }
    if matches!(op, ReduceOp::Min | ReduceOp::Max) {
        if is_nan(ty, a) || is_nan(ty, b) {
            return canonical_nan(ty);
        }
        let (x, y) = (float_value(ty, a), float_value(ty, b));
        return match (op, x.partial_cmp(&y).unwrap()) {
            (ReduceOp::Min, std::cmp::Ordering::Less)
            | (ReduceOp::Max, std::cmp::Ordering::Greater) => a,
            (_, std::cmp::Ordering::Equal) if op == ReduceOp::Min => a | b,
            (_, std::cmp::Ordering::Equal) => a & b,
            _ => b,
        };
    }
    let mul = op == ReduceOp::Prod;
    match ty {
        DataType::F32 => {
            let (x, y) = (f32::from_bits(a as u32), f32::from_bits(b as u32));
            (if mul { x * y } else { x + y }).to_bits() as u64
        }
        DataType::F64 => {
            let (x, y) = (f64::from_bits(a), f64::from_bits(b));
            (if mul { x * y } else { x + y }).to_bits()
        }
        _ => {
            let (x, y) = (half_to_f32(ty, a), half_to_f32(ty, b));
            f32_to_half(ty, if mul { x * y } else { x + y })
        }
    }
}

/// What the Avg finish must make of `v` on `n` ranks.
fn expect_finish(ty: DataType, v: u64, n: u64) -> u64 {
    match ty {
        DataType::F32 => (f32::from_bits(v as u32) / n as f32).to_bits() as u64,
        DataType::F64 => (f64::from_bits(v) / n as f64).to_bits(),
        DataType::F16 | DataType::Bf16 => f32_to_half(ty, half_to_f32(ty, v) / n as f32),
        _ => (int_value(ty, v) / n as i128) as u64 & mask(ty),
    }
}

fn specials(ty: DataType) -> Vec<u64> {
    match ty {
        DataType::F32 => vec![
            0,
            0x8000_0000,
            0x3f80_0000,
            0xbf80_0000,
            0x3fc0_0000,
            0x7f7f_ffff,
            0xff7f_ffff,
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_0000,
            0xffc0_0001,
            0x7f80_0001,
            1,
            0x8000_0001,
            0x007f_ffff,
            0x0080_0000,
            0x3f80_0001,
            0x4b00_0001,
            0x3400_0000,
        ],
        DataType::F64 => vec![
            0,
            1 << 63,
            0x3ff0 << 48,
            0xbff0 << 48,
            0x3ff8 << 48,
            0x7fef_ffff_ffff_ffff,
            0xffef_ffff_ffff_ffff,
            0x7ff0 << 48,
            0xfff0 << 48,
            0x7ff8 << 48,
            0xfff8_0000_0000_0001,
            0x7ff0_0000_0000_0001,
            1,
            (1 << 63) | 1,
            0x000f_ffff_ffff_ffff,
            0x0010 << 48,
            (0x3ff0 << 48) | 1,
            0x3ca0 << 48,
        ],
        DataType::F16 => vec![
            0, 0x8000, 0x3c00, 0xbc00, 0x3e00, 0x7bff, 0xfbff, 0x7c00, 0xfc00, 0x7e00, 0xfe01,
            0x7c01, 1, 0x8001, 0x03ff, 0x0400, 0x3c01, 0x7bfe, 0x1400, 0x6800,
        ],
        DataType::Bf16 => vec![
            0, 0x8000, 0x3f80, 0xbf80, 0x3fc0, 0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x7fc0, 0xffc1,
            0x7f81, 1, 0x8001, 0x007f, 0x0080, 0x3f81, 0x7f7e, 0x3b80,
        ],
        _ => {
            let m = mask(ty);
            let top = (m >> 1) + 1;
            vec![
                0,
                1,
                2,
                3,
                m,
                m - 1,
                top,
                top - 1,
                top + 1,
                0x55 & m,
                200 & m,
                100,
            ]
        }
    }
}

/// Random element bits: half of them raw, half (floats) of moderate
/// magnitude, where sums and products round.
fn random_bits(ty: DataType, state: &mut u64) -> u64 {
    *state = state
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let r = *state ^ (*state >> 29);
    if r & 1 == 0 || !ty.is_float() {
        return (r >> 1) & mask(ty);
    }
    match ty {
        DataType::F32 => (r >> 1) & 0x807f_ffff | ((124 + (r >> 40) % 8) << 23),
        DataType::F64 => (r >> 1) & 0x800f_ffff_ffff_ffff | ((1020 + (r >> 40) % 8) << 52),
        DataType::F16 => (r >> 1) & 0x83ff | ((12 + (r >> 40) % 8) << 10),
        _ => (r >> 1) & 0x807f | ((124 + (r >> 40) % 8) << 7),
    }
}

/// Inputs: every pair of the specials, then random elements.
fn inputs(ty: DataType, seed: u64) -> (Vec<u64>, Vec<u64>) {
    let s = specials(ty);
    let mut a = Vec::new();
    let mut b = Vec::new();
    for &x in &s {
        for &y in &s {
            a.push(x);
            b.push(y);
        }
    }
    let mut st = seed;
    for _ in 0..611 {
        a.push(random_bits(ty, &mut st));
        b.push(random_bits(ty, &mut st));
    }
    (a, b)
}

fn parse_kernel(name: &str) -> (Option<ReduceOp>, DataType) {
    let ty_of = |t: &str| {
        DataType::ALL
            .into_iter()
            .find(|ty| ty.short_name() == t)
            .unwrap()
    };
    if let Some(t) = name.strip_prefix("ferroccl_avg_finish_") {
        return (None, ty_of(t));
    }
    let rest = name.strip_prefix("ferroccl_reduce_").unwrap();
    let (op, t) = rest.split_once('_').unwrap();
    let op = ReduceOp::ALL.into_iter().find(|o| o.name() == op).unwrap();
    (Some(op), ty_of(t))
}

struct Case {
    count: usize,
    off: (usize, usize, usize),
    in_place: bool,
    grid: (u32, u32),
    n: u64,
}

#[test]
fn every_kernel_computes_the_host_results_bit_for_bit() {
    let dir = std::env::temp_dir().join(format!("ferroccl-kernels-host-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let exe = match build_host_module(&dir) {
        Ok(exe) => exe,
        Err(why) => {
            eprintln!("host run of the kernels skipped: {why}");
            return;
        }
    };
    let cases = [
        // Aligned: the vector path.
        Case {
            count: 0,
            off: (0, 0, 0),
            in_place: false,
            grid: (3, 5),
            n: 2,
        },
        // Equally misaligned: head, vectors, tail.
        Case {
            count: 0,
            off: (1, 1, 1),
            in_place: false,
            grid: (3, 5),
            n: 3,
        },
        // Differently misaligned: one at a time.
        Case {
            count: 0,
            off: (0, 1, 2),
            in_place: false,
            grid: (2, 7),
            n: 7,
        },
        // In place (dst = a), misaligned.
        Case {
            count: 0,
            off: (3, 3, 3),
            in_place: true,
            grid: (1, 4),
            n: 256,
        },
        // Fewer elements than the head before the first boundary.
        Case {
            count: 3,
            off: (1, 1, 1),
            in_place: false,
            grid: (3, 5),
            n: 1,
        },
        // More threads than elements.
        Case {
            count: 37,
            off: (0, 0, 0),
            in_place: false,
            grid: (64, 32),
            n: 1000,
        },
        Case {
            count: 1,
            off: (0, 0, 0),
            in_place: true,
            grid: (1, 1),
            n: 5,
        },
    ];
    let mut failures = Vec::new();
    for (k, name) in kernels::names().iter().enumerate() {
        let (op, ty) = parse_kernel(name);
        let (a, b) = inputs(ty, 0x5eed ^ k as u64);
        for (c, case) in cases.iter().enumerate() {
            let count = if case.count == 0 { a.len() } else { case.count };
            let (a, b) = (&a[..count], &b[..count]);
            let (pa, pb, po) = (dir.join("a.bin"), dir.join("b.bin"), dir.join("out.bin"));
            std::fs::write(&pa, raw_of(ty, a)).unwrap();
            std::fs::write(&pb, raw_of(ty, b)).unwrap();
            let out = Command::new(&exe)
                .arg(name)
                .args([ty.size(), count, case.off.0, case.off.1, case.off.2].map(|v| v.to_string()))
                .arg(if case.in_place { "1" } else { "0" })
                .arg(case.n.to_string())
                .args([case.grid.0, case.grid.1].map(|v| v.to_string()))
                .args([&pa, &pb, &po])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{name} case {c}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let got = bits_of(ty, &std::fs::read(&po).unwrap());
            assert_eq!(got.len(), count);
            for i in 0..count {
                let want = match op {
                    Some(op) => expect_reduce(op, ty, a[i], b[i]),
                    None => expect_finish(ty, a[i], case.n),
                };
                let exact = matches!(op, Some(ReduceOp::Min | ReduceOp::Max)) || !is_nan(ty, want);
                let ok = if exact {
                    got[i] == want
                } else {
                    is_nan(ty, got[i])
                };
                if !ok && failures.len() < 20 {
                    failures.push(format!(
                        "{name} case {c} [{i}]: a {:#x} b {:#x} n {}: got {:#x}, want {:#x}",
                        a[i], b[i], case.n, got[i], want
                    ));
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The reference itself, on values whose rounding is known.
#[test]
fn the_reference_rounds_halves_to_nearest_even() {
    // f16: 1 + 2^-11 is the tie between 1 and 1 + 2^-10: to the even, 1.
    assert_eq!(f32_to_half(DataType::F16, 1.0 + 2f32.powi(-11)), 0x3c00);
    assert_eq!(
        f32_to_half(DataType::F16, 1.0 + 3.0 * 2f32.powi(-11)),
        0x3c02
    );
    assert_eq!(f32_to_half(DataType::F16, 65504.0), 0x7bff);
    assert_eq!(f32_to_half(DataType::F16, 65519.0), 0x7bff);
    assert_eq!(f32_to_half(DataType::F16, 65520.0), 0x7c00);
    assert_eq!(f32_to_half(DataType::F16, -(2f32.powi(-24))), 0x8001);
    assert_eq!(f32_to_half(DataType::F16, 2f32.powi(-25)), 0);
    assert_eq!(f32_to_half(DataType::F16, 1.5 * 2f32.powi(-25)), 1);
    assert_eq!(f32_to_half(DataType::Bf16, 1.0 + 2f32.powi(-8)), 0x3f80);
    assert_eq!(f32_to_half(DataType::Bf16, f32::MAX), 0x7f80);
    assert_eq!(half_to_f32(DataType::F16, 0x0001), 2f32.powi(-24));
    assert_eq!(half_to_f32(DataType::Bf16, 0xbf80), -1.0);
    assert_eq!(half_to_f32(DataType::F16, 0xfc00), f32::NEG_INFINITY);
    assert_eq!(half_to_f32(DataType::Bf16, 0x7f80), f32::INFINITY);
    assert_eq!(expect_finish(DataType::U8, 44, 2), 22);
    assert_eq!(expect_finish(DataType::I8, 0xfd, 2), 0xff); // -3 / 2 = -1
    assert_eq!(
        expect_reduce(ReduceOp::Min, DataType::F32, 0, 0x8000_0000),
        0x8000_0000
    );
    assert_eq!(
        expect_reduce(ReduceOp::Max, DataType::F32, 0x8000_0000, 0),
        0
    );
    assert_eq!(
        expect_reduce(ReduceOp::Max, DataType::Bf16, 0x3f80, 0xffc1),
        0x7fc0
    );
}
