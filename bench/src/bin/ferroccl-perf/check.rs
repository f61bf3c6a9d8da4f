//! A row's buffers and their check: what every call of a row shares
//! ([`Shape`]), the buffers ([`Buffers`]), inputs of small integers whose
//! every reduction is exact in every element type, and the count of
//! elements that differ from the f64 reference.

use ferroccl::{Communicator, DataType, Element, ReduceOp};
use ferroccl_bench::coll::Coll;
use ferroccl_bench::options::Options;

/// The buffers of one size: `send` and `recv` for the out-of-place call,
/// `inplace` for the in-place one.
pub(crate) struct Buffers<T: Element> {
    pub(crate) send: Buf<T>,
    pub(crate) recv: Buf<T>,
    pub(crate) inplace: Buf<T>,
}

/// A plain buffer, or a window (`-R 2`).
pub(crate) enum Buf<T: Element> {
    Plain(Vec<T>),
    Window(ferroccl::Window<T>),
}

impl<T: Element> Buf<T> {
    pub(crate) fn new(comm: &Communicator, len: usize, window: bool) -> ferroccl::Result<Self> {
        Ok(if window {
            Buf::Window(comm.alloc_window(len)?)
        } else {
            Buf::Plain(vec![T::from_f64(0.0); len])
        })
    }
}

impl<T: Element> std::ops::Deref for Buf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Buf::Plain(v) => v,
            Buf::Window(w) => w,
        }
    }
}

impl<T: Element> std::ops::DerefMut for Buf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Buf::Plain(v) => v,
            Buf::Window(w) => w,
        }
    }
}

/// What every call of one row shares.
#[derive(Clone, Copy)]
pub(crate) struct Shape {
    pub(crate) coll: Coll,
    pub(crate) op: ReduceOp,
    pub(crate) root: usize,
    pub(crate) rank: usize,
    pub(crate) ranks: usize,
    /// Elements per block (see [`Coll::block_count`]).
    pub(crate) block: usize,
}

impl Shape {
    /// The shape of the row of `bytes` in `elem`-byte elements, and the
    /// element count of the array its size describes.
    pub(crate) fn of(
        comm: &Communicator,
        opts: &Options,
        op: Option<ReduceOp>,
        bytes: usize,
        elem: usize,
    ) -> (Shape, usize) {
        let ranks = comm.size();
        let block = opts.coll.block_count(bytes, elem, ranks);
        let shape = Shape {
            coll: opts.coll,
            op: op.unwrap_or(ReduceOp::Sum),
            root: opts.root,
            rank: comm.rank(),
            ranks,
            block,
        };
        (shape, opts.coll.total_count(block, ranks))
    }
}

/// Lengths of (send, recv, in-place buffer) for one shape.
pub(crate) fn lengths(s: Shape) -> (usize, usize, usize) {
    let (b, all) = (s.block, s.block * s.ranks);
    match s.coll {
        Coll::AllReduce | Coll::Reduce => (b, b, b),
        Coll::ReduceScatter => (all, b, all),
        Coll::AllGather => (b, all, all),
        // Broadcast works in place: the out-of-place column uses `recv`.
        Coll::Broadcast => (0, b, b),
        Coll::AllToAll => (all, all, 0),
        Coll::SendRecv => (b, b, 0),
    }
}

/// Input of `rank` at element `i` of the whole (gathered) array: small
/// integers, so that every sum, product, min and max over up to 50 ranks is
/// exact in every element type, bf16 and int8 included.
pub(crate) fn input_value(s: Shape, signed: bool, rank: usize, i: usize) -> f64 {
    if s.op == ReduceOp::Prod {
        // One rank per element contributes 2 (or -1), the others 1.
        return if rank != i % s.ranks {
            1.0
        } else if signed && (i / s.ranks) % 2 == 1 {
            -1.0
        } else {
            2.0
        };
    }
    let mixed = (i ^ (i >> 5)).wrapping_mul(40_503) >> 4;
    let k = (mixed + 7 * rank) % 3;
    if signed {
        k as f64 - 1.0
    } else {
        k as f64
    }
}

/// A value no result can take: it marks output that nothing wrote.
pub(crate) const SENTINEL: f64 = 101.0;

pub(crate) fn is_signed(dtype: DataType) -> bool {
    !matches!(dtype, DataType::U8 | DataType::U32 | DataType::U64)
}

/// Fill the inputs of the out-of-place or in-place call and poison its
/// outputs.
pub(crate) fn fill<T: Element>(s: Shape, b: &mut Buffers<T>, in_place: bool) {
    let signed = is_signed(T::DTYPE);
    let v = |rank: usize, i: usize| T::from_f64(input_value(s, signed, rank, i));
    let poison = T::from_f64(SENTINEL);
    let (r, blk) = (s.rank, s.block);
    if in_place {
        let buf = &mut b.inplace;
        for (i, x) in buf.iter_mut().enumerate() {
            *x = match s.coll {
                Coll::AllGather if i / blk != r => poison,
                Coll::AllGather => v(r, i),
                Coll::Broadcast if r != s.root => poison,
                Coll::Broadcast => v(s.root, i),
                _ => v(r, i),
            };
        }
        return;
    }
    for (i, x) in b.send.iter_mut().enumerate() {
        *x = match s.coll {
            Coll::AllGather => v(r, r * blk + i),
            _ => v(r, i),
        };
    }
    for (i, x) in b.recv.iter_mut().enumerate() {
        *x = match s.coll {
            Coll::Broadcast if r == s.root => v(s.root, i),
            _ => poison,
        };
    }
}

/// The f64 reference of the reduction at element `i` of the whole array.
pub(crate) fn reduced(s: Shape, signed: bool, float: bool, i: usize) -> f64 {
    let vals = (0..s.ranks).map(|r| input_value(s, signed, r, i));
    match s.op {
        ReduceOp::Sum => vals.sum(),
        ReduceOp::Prod => vals.product(),
        ReduceOp::Min => vals.fold(f64::INFINITY, f64::min),
        ReduceOp::Max => vals.fold(f64::NEG_INFINITY, f64::max),
        ReduceOp::Avg => {
            let avg = vals.sum::<f64>() / s.ranks as f64;
            // Integer Avg truncates toward zero, as NCCL's does.
            if float {
                avg
            } else {
                avg.trunc()
            }
        }
    }
}

/// Wrong elements of the last call's output, summed over ranks.
pub(crate) fn count_wrong<T: Element>(
    comm: &Communicator,
    s: Shape,
    b: &Buffers<T>,
    in_place: bool,
) -> ferroccl::Result<u64> {
    let dtype = T::DTYPE;
    let signed = is_signed(dtype);
    let float = matches!(
        dtype,
        DataType::F32 | DataType::F64 | DataType::F16 | DataType::Bf16
    );
    // Only Avg on floats rounds (once, in the final division).
    let rel_tol = match (s.op, dtype) {
        (ReduceOp::Avg, DataType::F16) => 2f64.powi(-10),
        (ReduceOp::Avg, DataType::Bf16) => 2f64.powi(-7),
        (ReduceOp::Avg, DataType::F32) => 2f64.powi(-23),
        (ReduceOp::Avg, DataType::F64) => 2f64.powi(-52),
        _ => 0.0,
    };
    let (r, blk) = (s.rank, s.block);
    let red = |i: usize| reduced(s, signed, float, i);
    let inp = |rank: usize, i: usize| input_value(s, signed, rank, i);
    // (the slice to check, the expected value of its element j)
    let (got, want): (&[T], Box<dyn Fn(usize) -> f64>) = match (s.coll, in_place) {
        (Coll::AllReduce, false) => (&b.recv, Box::new(red)),
        (Coll::AllReduce, true) => (&b.inplace, Box::new(red)),
        (Coll::ReduceScatter, false) => (&b.recv, Box::new(move |j| red(r * blk + j))),
        (Coll::ReduceScatter, true) => (
            &b.inplace[r * blk..(r + 1) * blk],
            Box::new(move |j| red(r * blk + j)),
        ),
        (Coll::AllGather, false) => (&b.recv, Box::new(move |j| inp(j / blk, j))),
        (Coll::AllGather, true) => (&b.inplace, Box::new(move |j| inp(j / blk, j))),
        (Coll::Broadcast, false) => (&b.recv, Box::new(move |j| inp(s.root, j))),
        (Coll::Broadcast, true) => (&b.inplace, Box::new(move |j| inp(s.root, j))),
        (Coll::Reduce, false) if r == s.root => (&b.recv, Box::new(red)),
        (Coll::Reduce, false) => (&[], Box::new(red)),
        // Non-root buffers are inputs only and must come back unchanged.
        (Coll::Reduce, true) if r == s.root => (&b.inplace, Box::new(red)),
        (Coll::Reduce, true) => (&b.inplace, Box::new(move |j| inp(r, j))),
        (Coll::AllToAll, _) => (&b.recv, Box::new(move |j| inp(j / blk, r * blk + j % blk))),
        (Coll::SendRecv, _) => (
            &b.recv,
            Box::new(move |j| inp((r + s.ranks - 1) % s.ranks, j)),
        ),
    };
    let wrong = got
        .iter()
        .enumerate()
        .filter(|&(j, x)| {
            let (g, w) = (x.to_f64(), want(j));
            (g - w).abs() > w.abs() * rel_tol
        })
        .count() as u64;
    let mut total = [wrong];
    comm.all_reduce_in_place(&mut total, ReduceOp::Sum)?;
    Ok(total[0])
}
