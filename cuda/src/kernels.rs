//! The reduction kernels: one source (`kernels/reduce.cu`), every (op,
//! type) instantiated from it, compiled by NVRTC ([`crate::nvrtc`]) for the
//! device's own architecture.
//!
//! The `.cu` file defines each op once and each element type once; the
//! `extern "C"` kernels are one line each, generated here from [`ReduceOp::ALL`]
//! and [`DataType::ALL`] and appended to the file's text ([`source`]), so the
//! table below and the compiled module cannot disagree.
//!
//! Per type there are five kernels: `ferroccl_reduce_{sum,prod,min,max}_T`,
//! `dst[i] = op(a[i], b[i])` for `i < count` (`dst` may equal `a`), and
//! `ferroccl_avg_finish_T`, `buf[i] /= n` once at the end of an Avg. Avg
//! reduces with the Sum kernel. Signatures (`T` the element):
//!
//! ```text
//! ferroccl_reduce_OP_T(T *dst, const T *a, const T *b, unsigned long long count)
//! ferroccl_avg_finish_T(T *buf, unsigned long long count, unsigned long long n)
//! ```
//!
//! Every kernel is a grid-stride loop: launch [`BLOCK_THREADS`] threads per
//! block and any number of blocks (a few per multiprocessor is enough).

use crate::{DataType, ReduceOp};
use std::fmt::Write as _;
use std::sync::OnceLock;

/// The hand-written part of the source: element types, ops and loops.
pub const KERNELS_CU: &str = include_str!("../kernels/reduce.cu");

/// Threads per block every kernel is compiled for (`__launch_bounds__`).
pub const BLOCK_THREADS: u32 = 256;

/// The kernels one (op, type) runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernels {
    pub op: ReduceOp,
    pub ty: DataType,
    /// The combining kernel (for Avg, the Sum kernel of the type).
    pub reduce: String,
    /// The finishing kernel, for Avg only: divides by the rank count.
    pub finish: Option<String>,
}

/// The element struct of the `.cu` source for a type.
pub(crate) const fn element(ty: DataType) -> &'static str {
    match ty {
        DataType::F32 => "EF32",
        DataType::F64 => "EF64",
        DataType::F16 => "EF16",
        DataType::Bf16 => "EBF16",
        DataType::I8 => "EI8",
        DataType::U8 => "EU8",
        DataType::I32 => "EI32",
        DataType::U32 => "EU32",
        DataType::I64 => "EI64",
        DataType::U64 => "EU64",
    }
}

/// The op struct of the `.cu` source that combines for an op.
pub(crate) const fn combiner(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum | ReduceOp::Avg => "OpSum",
        ReduceOp::Prod => "OpProd",
        ReduceOp::Min => "OpMin",
        ReduceOp::Max => "OpMax",
    }
}

/// The op whose kernel combines for `op` (Avg combines as Sum).
pub(crate) const fn combining(op: ReduceOp) -> ReduceOp {
    match op {
        ReduceOp::Avg => ReduceOp::Sum,
        other => other,
    }
}

/// Name of the combining kernel of (op, type), e.g. `ferroccl_reduce_sum_f32`.
pub fn reduce_name(op: ReduceOp, ty: DataType) -> String {
    format!(
        "ferroccl_reduce_{}_{}",
        combining(op).name(),
        ty.short_name()
    )
}

/// Name of the Avg finishing kernel of a type, e.g. `ferroccl_avg_finish_bf16`.
pub fn finish_name(ty: DataType) -> String {
    format!("ferroccl_avg_finish_{}", ty.short_name())
}

/// The kernels of (op, type).
pub fn kernels(op: ReduceOp, ty: DataType) -> Kernels {
    Kernels {
        op,
        ty,
        reduce: reduce_name(op, ty),
        finish: (op == ReduceOp::Avg).then(|| finish_name(ty)),
    }
}

/// The table: the kernels of every (op, type), ops in [`ReduceOp::ALL`] order,
/// types in [`DataType::ALL`] order within each.
pub fn table() -> &'static [Kernels] {
    static TABLE: OnceLock<Vec<Kernels>> = OnceLock::new();
    TABLE.get_or_init(|| {
        ReduceOp::ALL
            .iter()
            .flat_map(|&op| DataType::ALL.iter().map(move |&ty| kernels(op, ty)))
            .collect()
    })
}

/// Every kernel the source defines, each once: the combining kernels of
/// Sum, Prod, Min and Max and the finishing kernel, per type.
pub fn names() -> &'static [String] {
    static NAMES: OnceLock<Vec<String>> = OnceLock::new();
    NAMES.get_or_init(|| {
        let mut v = Vec::new();
        for ty in DataType::ALL {
            for op in ReduceOp::ALL.into_iter().filter(|&op| combining(op) == op) {
                v.push(reduce_name(op, ty));
            }
            v.push(finish_name(ty));
        }
        v
    })
}

/// Whether the source defines a kernel of this name.
pub fn exists(name: &str) -> bool {
    names().iter().any(|n| n == name)
}

/// The full source NVRTC compiles: `kernels/reduce.cu` followed by one
/// `extern "C"` line per kernel of [`names`].
pub fn source() -> &'static str {
    static SOURCE: OnceLock<String> = OnceLock::new();
    SOURCE.get_or_init(|| {
        let mut s = String::from(KERNELS_CU);
        s.push('\n');
        for ty in DataType::ALL {
            let e = element(ty);
            for op in ReduceOp::ALL.into_iter().filter(|&op| combining(op) == op) {
                let _ = writeln!(
                    s,
                    "extern \"C\" __global__ void __launch_bounds__({BLOCK_THREADS}) {name}(\
                     ferroccl::{e}::T* dst, const ferroccl::{e}::T* a, const ferroccl::{e}::T* b, \
                     unsigned long long count) {{ ferroccl::reduce<ferroccl::{e}, ferroccl::{c}>\
                     (dst, a, b, count); }}",
                    name = reduce_name(op, ty),
                    c = combiner(op),
                );
            }
            let _ = writeln!(
                s,
                "extern \"C\" __global__ void __launch_bounds__({BLOCK_THREADS}) {name}(\
                 ferroccl::{e}::T* buf, unsigned long long count, unsigned long long n) \
                 {{ ferroccl::avg_finish<ferroccl::{e}>(buf, count, n); }}",
                name = finish_name(ty),
            );
        }
        s
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn table_covers_every_op_and_type_once() {
        let t = table();
        assert_eq!(t.len(), ReduceOp::ALL.len() * DataType::ALL.len());
        let pairs: HashSet<(ReduceOp, DataType)> = t.iter().map(|k| (k.op, k.ty)).collect();
        assert_eq!(pairs.len(), t.len(), "a pair appears twice");
        for op in ReduceOp::ALL {
            for ty in DataType::ALL {
                let k = t.iter().find(|k| k.op == op && k.ty == ty).unwrap();
                assert_eq!(*k, kernels(op, ty));
                assert!(
                    k.reduce.ends_with(&format!("_{}", ty.short_name())),
                    "{k:?}"
                );
                assert_eq!(k.finish.is_some(), op == ReduceOp::Avg, "{k:?}");
                assert!(exists(&k.reduce), "{k:?}");
                if let Some(f) = &k.finish {
                    assert!(exists(f), "{k:?}");
                }
            }
        }
        assert_eq!(
            kernels(ReduceOp::Avg, DataType::Bf16).reduce,
            "ferroccl_reduce_sum_bf16"
        );
        assert_eq!(
            kernels(ReduceOp::Avg, DataType::Bf16).finish.as_deref(),
            Some("ferroccl_avg_finish_bf16")
        );
        assert_eq!(
            kernels(ReduceOp::Min, DataType::I8).reduce,
            "ferroccl_reduce_min_i8"
        );
    }

    #[test]
    fn names_are_distinct_and_each_is_defined_once_in_the_source() {
        let n = names();
        assert_eq!(n.len(), 5 * DataType::ALL.len());
        assert_eq!(n.iter().collect::<HashSet<_>>().len(), n.len());
        let used: HashSet<&str> = table()
            .iter()
            .flat_map(|k| std::iter::once(k.reduce.as_str()).chain(k.finish.as_deref()))
            .collect();
        assert_eq!(used.len(), n.len(), "a kernel no (op, type) uses");
        let src = source();
        for name in n {
            // The definition: the name followed by its parameter list, once.
            let def = format!(" {name}(");
            assert_eq!(src.matches(&def).count(), 1, "{name}");
        }
        assert!(!exists("ferroccl_reduce_avg_f32"), "Avg combines with Sum");
        assert!(!exists("ferroccl_reduce_sum_f128"));
    }

    #[test]
    fn the_source_has_no_include_and_one_definition_per_op() {
        let cu = KERNELS_CU;
        assert!(
            !cu.lines().any(|l| l.trim_start().starts_with("#include")),
            "NVRTC ships no headers"
        );
        for op in ["OpSum", "OpProd", "OpMin", "OpMax"] {
            assert_eq!(cu.matches(&format!("struct {op} ")).count(), 1, "{op}");
        }
        for ty in DataType::ALL {
            assert!(cu.contains(element(ty)), "{ty:?}");
        }
    }
}
