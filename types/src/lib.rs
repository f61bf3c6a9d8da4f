//! The vocabulary every crate of ferroccl shares: the element types a
//! collective carries ([`DataType`]) and the reduction operators
//! ([`ReduceOp`]).
//!
//! One definition for the host library (`ferroccl`, which re-exports both),
//! the CUDA kernels and their stand-in (`ferroccl-cuda`, whose kernel table
//! is indexed by them) and the NCCL ABI (`ferroccl-nccl`, which maps
//! `ncclDataType_t` and `ncclRedOp_t` onto them). The Rust types behind a
//! `DataType` (f32, `half::f16`, ...) and the kernels that reduce them are
//! the host library's (`ferroccl::Element`); this crate is names only and
//! depends on nothing.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

/// Reduction operators.
///
/// Min and Max, and every integer result, are exact: the same bits
/// whatever the algorithm, SIMD level or run. Float Sum, Prod and Avg
/// round in the order the algorithm combines the ranks, and the bits of a
/// NaN they give are unspecified. On one rank the result is the input,
/// unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Elementwise sum. Integers wrap on overflow (two's complement,
    /// modulo 2^bits, as NCCL does). Floats: a NaN on any rank gives a NaN
    /// whose bits are unspecified; f16 and bf16 add in f32, rounding back
    /// after each combination.
    Sum,
    /// Elementwise product. Integers wrap on overflow, as in `Sum`; floats
    /// as in `Sum`.
    Prod,
    /// Elementwise minimum. Floats: IEEE 754-2019 `minimum` (as
    /// `torch.minimum`): if any rank's element is NaN the result is the
    /// type's canonical NaN, positive, quiet and without payload (f32
    /// `0x7fc0_0000`, f64 `0x7ff8_0000_0000_0000`, f16 `0x7e00`, bf16
    /// `0x7fc0`) whatever the sign and payload of the ranks' NaNs, so which
    /// rank held one and the order of combination cannot show; and -0 is
    /// below +0.
    Min,
    /// Elementwise maximum. Floats: IEEE 754-2019 `maximum`, with the
    /// canonical NaN of `Min` wherever any rank's element is NaN; +0 is
    /// above -0.
    Max,
    /// Sum divided by the number of ranks, once, at the end. Integers: the
    /// wrapped sum (as in `Sum`) divided by the rank count, truncated
    /// toward zero, so on two ranks u8 200 and 100 give (300 mod 256) / 2
    /// = 22 and i8 -1 and -2 give -1. Floats: the sum as in `Sum`, divided
    /// once (rounded once).
    Avg,
}

impl ReduceOp {
    /// All operators, for tests and tools.
    pub const ALL: [ReduceOp; 5] = [
        ReduceOp::Sum,
        ReduceOp::Prod,
        ReduceOp::Min,
        ReduceOp::Max,
        ReduceOp::Avg,
    ];

    /// nccl-tests name of the operator.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Min => "min",
            ReduceOp::Max => "max",
            ReduceOp::Avg => "avg",
        }
    }

    /// Parse an nccl-tests operator name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|op| op.name().eq_ignore_ascii_case(name))
    }

    /// The operator's byte on the wire (call fingerprints, encoded
    /// algorithms): 1 to 5, never 0. Stable across versions.
    pub fn code(self) -> u8 {
        match self {
            ReduceOp::Sum => 1,
            ReduceOp::Prod => 2,
            ReduceOp::Min => 3,
            ReduceOp::Max => 4,
            ReduceOp::Avg => 5,
        }
    }

    /// The operator of a wire byte ([`ReduceOp::code`]); `None` for any
    /// other byte.
    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|op| op.code() == code)
    }

    /// The operator applied while data moves; Avg moves as Sum and divides
    /// once at the end.
    pub fn combining(self) -> ReduceOp {
        match self {
            ReduceOp::Avg => ReduceOp::Sum,
            other => other,
        }
    }
}

impl std::fmt::Display for ReduceOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Element type names, as nccl-tests prints them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DataType {
    /// `f32`
    F32,
    /// `f64`
    F64,
    /// `half::f16`
    F16,
    /// `half::bf16`
    Bf16,
    /// `i8`
    I8,
    /// `u8`
    U8,
    /// `i32`
    I32,
    /// `u32`
    U32,
    /// `i64`
    I64,
    /// `u64`
    U64,
}

impl DataType {
    /// All element types.
    pub const ALL: [DataType; 10] = [
        DataType::F32,
        DataType::F64,
        DataType::F16,
        DataType::Bf16,
        DataType::I8,
        DataType::U8,
        DataType::I32,
        DataType::U32,
        DataType::I64,
        DataType::U64,
    ];

    /// nccl-tests name ("float", "half", "bfloat16", "int32", ...).
    pub fn name(self) -> &'static str {
        match self {
            DataType::F32 => "float",
            DataType::F64 => "double",
            DataType::F16 => "half",
            DataType::Bf16 => "bfloat16",
            DataType::I8 => "int8",
            DataType::U8 => "uint8",
            DataType::I32 => "int32",
            DataType::U32 => "uint32",
            DataType::I64 => "int64",
            DataType::U64 => "uint64",
        }
    }

    /// Parse an nccl-tests type name (also accepts Rust names like "f32").
    pub fn from_name(name: &str) -> Option<Self> {
        let lower = name.to_ascii_lowercase();
        let alias = match lower.as_str() {
            "f32" | "float32" => "float",
            "f64" | "float64" => "double",
            "f16" | "float16" => "half",
            "bf16" => "bfloat16",
            "i8" => "int8",
            "u8" => "uint8",
            "i32" | "int" => "int32",
            "u32" => "uint32",
            "i64" => "int64",
            "u64" => "uint64",
            other => other,
        };
        Self::ALL.into_iter().find(|t| t.name() == alias)
    }

    /// The Rust name of the type (`f32`, `bf16`, `u64`): the one kernel
    /// names and the device path's messages use.
    pub const fn short_name(self) -> &'static str {
        match self {
            DataType::F32 => "f32",
            DataType::F64 => "f64",
            DataType::F16 => "f16",
            DataType::Bf16 => "bf16",
            DataType::I8 => "i8",
            DataType::U8 => "u8",
            DataType::I32 => "i32",
            DataType::U32 => "u32",
            DataType::I64 => "i64",
            DataType::U64 => "u64",
        }
    }

    /// Whether the type is a floating-point one (has NaN).
    pub const fn is_float(self) -> bool {
        matches!(
            self,
            DataType::F32 | DataType::F64 | DataType::F16 | DataType::Bf16
        )
    }

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::F32 | DataType::I32 | DataType::U32 => 4,
            DataType::F64 | DataType::I64 | DataType::U64 => 8,
        }
    }

    /// The type's byte on the wire (call fingerprints, encoded
    /// algorithms): 1 to 10, never 0. Stable across versions.
    pub fn code(self) -> u8 {
        match self {
            DataType::F32 => 1,
            DataType::F64 => 2,
            DataType::F16 => 3,
            DataType::Bf16 => 4,
            DataType::I8 => 5,
            DataType::U8 => 6,
            DataType::I32 => 7,
            DataType::U32 => 8,
            DataType::I64 => 9,
            DataType::U64 => 10,
        }
    }

    /// The type of a wire byte ([`DataType::code`]); `None` for any other
    /// byte.
    pub fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.code() == code)
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::{DataType, ReduceOp};

    #[test]
    fn names_and_codes_round_trip() {
        for t in DataType::ALL {
            assert_eq!(DataType::from_name(t.name()), Some(t));
            assert_eq!(DataType::from_name(t.short_name()), Some(t));
            assert_eq!(DataType::from_code(t.code()), Some(t));
        }
        for op in ReduceOp::ALL {
            assert_eq!(ReduceOp::from_name(op.name()), Some(op));
            assert_eq!(ReduceOp::from_code(op.code()), Some(op));
        }
        assert_eq!(DataType::from_code(0), None);
        assert_eq!(ReduceOp::from_code(0), None);
    }

    #[test]
    fn sizes_match_the_rust_types() {
        let rust = [
            (DataType::F32, std::mem::size_of::<f32>()),
            (DataType::F64, std::mem::size_of::<f64>()),
            (DataType::F16, 2),
            (DataType::Bf16, 2),
            (DataType::I8, std::mem::size_of::<i8>()),
            (DataType::U8, std::mem::size_of::<u8>()),
            (DataType::I32, std::mem::size_of::<i32>()),
            (DataType::U32, std::mem::size_of::<u32>()),
            (DataType::I64, std::mem::size_of::<i64>()),
            (DataType::U64, std::mem::size_of::<u64>()),
        ];
        for (t, bytes) in rust {
            assert_eq!(t.size(), bytes, "{t}");
            assert_eq!(
                t.is_float(),
                t.short_name().starts_with('f') || t == DataType::Bf16
            );
        }
    }
}
