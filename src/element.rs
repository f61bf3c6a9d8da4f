//! Element types a collective can carry, and reduction operators.
//!
//! The names ([`DataType`], [`ReduceOp`]) are the `ferroccl-types` crate's,
//! shared with the CUDA kernels and the NCCL ABI. `Element` is sealed: the
//! wire fingerprint and the kernels know exactly these ten types. f16 and bf16 come from the `half` crate. This is the
//! vocabulary only: the kernels and the `Element` impls are in
//! `crate::reduce`, which this module must not import.

pub use ferroccl_types::{DataType, ReduceOp};

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
