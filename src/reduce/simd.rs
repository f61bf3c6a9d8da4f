//! Which vector instructions the CPU reduction kernels use.
//!
//! A Rust build for x86-64 may only assume the baseline (SSE2) unless it is
//! built with `-C target-cpu`, which a library cannot ask of its users. The
//! kernels in `crate::reduce` are therefore compiled three times, for the
//! baseline, for AVX2 and for AVX-512, and each call takes the widest the
//! CPU has, found once per process (`is_x86_feature_detected!`). The three
//! compile the same elementwise source, so they give the same bits (up to
//! which NaN an addition or multiplication of NaNs returns, which Rust
//! leaves open; Min and Max return a canonical NaN, see `arith`).
//! FERROCCL_SIMD can lower the level (for comparisons, or a CPU that slows
//! its clock on wide vectors); it never raises it above what the CPU has.
//! Elsewhere than x86-64 there is one level, the baseline.

use std::sync::OnceLock;

/// An instruction-set level of the reduction kernels, ordered from
/// narrowest to widest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    /// What every CPU of the target has (SSE2 on x86-64).
    Baseline,
    /// AVX2 with FMA and F16C (x86-64-v3).
    Avx2,
    /// AVX-512 F, BW, DQ and VL on top of AVX2 (x86-64-v4).
    Avx512,
}

impl SimdLevel {
    /// Every level, narrowest first.
    pub const ALL: [SimdLevel; 3] = [SimdLevel::Baseline, SimdLevel::Avx2, SimdLevel::Avx512];

    /// The name FERROCCL_SIMD takes.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Baseline => "baseline",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
        }
    }

    /// Parse a FERROCCL_SIMD value (case-insensitive).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|l| l.name().eq_ignore_ascii_case(name.trim()))
    }

    /// The widest level this CPU runs, found once.
    pub fn detected() -> SimdLevel {
        static DETECTED: OnceLock<SimdLevel> = OnceLock::new();
        *DETECTED.get_or_init(detect)
    }

    /// The level the kernels use: FERROCCL_SIMD's where it is set and
    /// valid, never above `detected()`. Read once per process. (An invalid
    /// value is reported by `Config::from_env` when a communicator is made;
    /// here it counts as unset.)
    pub fn current() -> SimdLevel {
        static CURRENT: OnceLock<SimdLevel> = OnceLock::new();
        *CURRENT.get_or_init(|| {
            let cpu = Self::detected();
            std::env::var("FERROCCL_SIMD")
                .ok()
                .and_then(|v| Self::from_name(&v))
                .map_or(cpu, |wanted| wanted.min(cpu))
        })
    }
}

impl std::fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(target_arch = "x86_64")]
fn detect() -> SimdLevel {
    let avx2 = is_x86_feature_detected!("avx2")
        && is_x86_feature_detected!("fma")
        && is_x86_feature_detected!("f16c");
    let avx512 = avx2
        && is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512dq")
        && is_x86_feature_detected!("avx512vl");
    if avx512 {
        SimdLevel::Avx512
    } else if avx2 {
        SimdLevel::Avx2
    } else {
        SimdLevel::Baseline
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> SimdLevel {
    SimdLevel::Baseline
}

#[cfg(test)]
mod tests {
    use super::SimdLevel;

    #[test]
    fn names_round_trip_and_order_runs_narrow_to_wide() {
        for l in SimdLevel::ALL {
            assert_eq!(SimdLevel::from_name(l.name()), Some(l));
            assert_eq!(SimdLevel::from_name(&l.name().to_uppercase()), Some(l));
        }
        assert_eq!(SimdLevel::from_name("sse9"), None);
        assert!(SimdLevel::Baseline < SimdLevel::Avx2 && SimdLevel::Avx2 < SimdLevel::Avx512);
        assert!(SimdLevel::current() <= SimdLevel::detected());
    }
}
