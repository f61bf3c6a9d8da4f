//! Element types a collective can carry, and reduction operators.
//!
//! `Element` is sealed: the wire fingerprint and the kernels know exactly
//! these ten types. f16 and bf16 come from the `half` crate. This is the
//! vocabulary only: the kernels and the `Element` impls are in
//! `crate::reduce`, which this module must not import.

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

    pub(crate) fn code(self) -> u8 {
        match self {
            ReduceOp::Sum => 1,
            ReduceOp::Prod => 2,
            ReduceOp::Min => 3,
            ReduceOp::Max => 4,
            ReduceOp::Avg => 5,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|op| op.code() == code)
    }

    /// The operator applied while data moves; Avg moves as Sum and divides
    /// once at the end.
    pub(crate) fn combining(self) -> ReduceOp {
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

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DataType::I8 | DataType::U8 => 1,
            DataType::F16 | DataType::Bf16 => 2,
            DataType::F32 | DataType::I32 | DataType::U32 => 4,
            DataType::F64 | DataType::I64 | DataType::U64 => 8,
        }
    }

    pub(crate) fn code(self) -> u8 {
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

    pub(crate) fn from_code(code: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.code() == code)
    }
}

impl std::fmt::Display for DataType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

pub(crate) mod sealed {
    pub trait Sealed {}
}

/// A type collectives can carry. Sealed: implemented for f32, f64, f16,
/// bf16, i8, u8, i32, u32, i64, u64.
pub trait Element:
    sealed::Sealed + bytemuck::Pod + PartialEq + Send + Sync + std::fmt::Debug + 'static
{
    /// The runtime tag of this type.
    const DTYPE: DataType;
    /// Combine `src` into `dst` elementwise with `op` (Avg acts as Sum).
    fn reduce_into(op: ReduceOp, dst: &mut [Self], src: &[Self]);
    /// `out = a op b` elementwise (Avg acts as Sum); all three have one length.
    fn reduce_to(op: ReduceOp, out: &mut [Self], a: &[Self], b: &[Self]);
    /// Internal: every output `= ins[0] op ins[1] op ...` with streaming
    /// stores, in one pass (`reduce_to_streams`); false where this type has
    /// no such kernel (nothing written then).
    #[doc(hidden)]
    fn reduce_to_streams(op: ReduceOp, ins: &[&[Self]], outs: &mut [&mut [Self]]) -> bool {
        let _ = (op, ins, outs);
        false
    }
    /// Divide every element by `n` (the end of Avg).
    fn divide(buf: &mut [Self], n: usize);
    /// Convert to f64 (for references and checks).
    fn to_f64(self) -> f64;
    /// Convert from f64, rounding or wrapping as the type does.
    fn from_f64(v: f64) -> Self;
}

#[cfg(test)]
mod tests {
    use super::{DataType, ReduceOp};

    #[test]
    fn names_round_trip() {
        for t in DataType::ALL {
            assert_eq!(DataType::from_name(t.name()), Some(t));
            assert_eq!(DataType::from_code(t.code()), Some(t));
        }
        for op in ReduceOp::ALL {
            assert_eq!(ReduceOp::from_name(op.name()), Some(op));
            assert_eq!(ReduceOp::from_code(op.code()), Some(op));
        }
    }
}
