//! Communication hooks: how a filled bucket becomes the average of that
//! bucket over all ranks. The reducer hands a hook each bucket (or chunk)
//! as an owned [`Bucket`] the moment it is complete; the hook starts
//! whatever collectives it likes and returns a [`PendingBucket`] that
//! yields the averaged bucket. Hooks see only the public communicator API.

use crate::{Communicator, DataType, Element, ReduceOp, Result, Window, Work};
use half::{bf16, f16};

/// A bucket's buffer, owned by whoever holds it: a window that every rank
/// maps (the reducer's default on one host: an allreduce of it runs
/// directly between the ranks' buckets, see
/// [`Communicator::alloc_window`]) or a plain vector. Used as a `[T]`.
pub struct Bucket<T: Element> {
    buf: Buf<T>,
}

enum Buf<T: Element> {
    Vec(Vec<T>),
    Window(Window<T>),
}

impl<T: Element> Bucket<T> {
    /// A bucket in the memory of `window`.
    pub fn from_window(window: Window<T>) -> Self {
        Bucket {
            buf: Buf::Window(window),
        }
    }

    /// Whether the bucket lives in a window shared with the other ranks.
    pub fn is_shared(&self) -> bool {
        matches!(&self.buf, Buf::Window(w) if w.is_shared())
    }

    /// The elements as a vector (a copy for a window).
    pub fn into_vec(self) -> Vec<T> {
        match self.buf {
            Buf::Vec(v) => v,
            Buf::Window(w) => w.to_vec(),
        }
    }
}

impl<T: Element> From<Vec<T>> for Bucket<T> {
    fn from(v: Vec<T>) -> Self {
        Bucket { buf: Buf::Vec(v) }
    }
}

impl<T: Element> std::ops::Deref for Bucket<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match &self.buf {
            Buf::Vec(v) => v,
            Buf::Window(w) => w,
        }
    }
}

impl<T: Element> std::ops::DerefMut for Bucket<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match &mut self.buf {
            Buf::Vec(v) => v,
            Buf::Window(w) => w,
        }
    }
}

impl<T: Element> std::fmt::Debug for Bucket<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bucket")
            .field("len", &self.len())
            .field("shared", &self.is_shared())
            .finish()
    }
}

/// A bucket whose reduction is under way; [`PendingBucket::wait`] gives the
/// buffer back holding the average over ranks.
#[must_use = "a bucket's errors are only seen through wait()"]
pub struct PendingBucket<T: Element> {
    inner: Box<dyn Pending<T>>,
}

impl<T: Element> std::fmt::Debug for PendingBucket<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingBucket")
            .field("complete", &self.inner.is_complete())
            .finish()
    }
}

trait Pending<T: Element>: Send {
    fn wait(self: Box<Self>) -> Result<Bucket<T>>;
    fn is_complete(&self) -> bool;
}

struct Then<B, F> {
    work: Work<B>,
    then: F,
}

impl<T, B, F> Pending<T> for Then<B, F>
where
    T: Element,
    B: Send + 'static,
    F: FnOnce(B) -> Result<Bucket<T>> + Send,
{
    fn wait(self: Box<Self>) -> Result<Bucket<T>> {
        let done = self.work.wait()?;
        (self.then)(done)
    }
    fn is_complete(&self) -> bool {
        self.work.is_complete()
    }
}

struct Done<T: Element>(Result<Bucket<T>>);

impl<T: Element> Pending<T> for Done<T> {
    fn wait(self: Box<Self>) -> Result<Bucket<T>> {
        self.0
    }
    fn is_complete(&self) -> bool {
        true
    }
}

impl<T: Element> PendingBucket<T> {
    /// A collective whose result is the averaged bucket itself.
    pub fn from_work(work: Work<Bucket<T>>) -> Self {
        Self::then(work, Ok)
    }

    /// A collective on some buffer `B` (a compressed copy, say) and the
    /// step that turns its result into the averaged bucket; `then` runs in
    /// [`wait`](Self::wait), on the caller's thread.
    pub fn then<B: Send + 'static>(
        work: Work<B>,
        then: impl FnOnce(B) -> Result<Bucket<T>> + Send + 'static,
    ) -> Self {
        PendingBucket {
            inner: Box::new(Then { work, then }),
        }
    }

    /// A bucket that needs no waiting (a hook that finished synchronously).
    pub fn ready(result: Result<Bucket<T>>) -> Self {
        PendingBucket {
            inner: Box::new(Done(result)),
        }
    }

    /// Wait for the reduction and return the averaged bucket. Bounded by
    /// the communicator's timeout.
    pub fn wait(self) -> Result<Bucket<T>> {
        self.inner.wait()
    }

    /// Whether [`wait`](Self::wait) would return at once.
    pub fn is_complete(&self) -> bool {
        self.inner.is_complete()
    }
}

/// What the reducer calls for every complete bucket (PyTorch's
/// `register_comm_hook`). Implementations must issue the same collectives
/// on every rank for the same bucket: the reducer hands buckets over in the
/// same order everywhere.
pub trait CommHook<T: Element>: Send + Sync {
    /// Start reducing `bucket`, this rank's gradients, so that the result
    /// is their average over the ranks of `comm` (a parameter a rank did not
    /// use counts as zero there). Must not block on other ranks.
    fn launch(&self, comm: &Communicator, bucket: Bucket<T>) -> Result<PendingBucket<T>>;

    /// A short name, for logs and for checking that every rank uses the
    /// same hook.
    fn name(&self) -> &str;
}

/// A boxed hook is a hook, so hooks can be chosen at run time.
impl<T: Element, H: CommHook<T> + ?Sized> CommHook<T> for Box<H> {
    fn launch(&self, comm: &Communicator, bucket: Bucket<T>) -> Result<PendingBucket<T>> {
        (**self).launch(comm, bucket)
    }
    fn name(&self) -> &str {
        (**self).name()
    }
}

/// The default: one allreduce with [`ReduceOp::Avg`] per bucket (sum on the
/// wire, one division by the world size at the end, on each rank).
#[derive(Debug, Clone, Copy, Default)]
pub struct AllReduceHook;

impl<T: Element> CommHook<T> for AllReduceHook {
    fn launch(&self, comm: &Communicator, bucket: Bucket<T>) -> Result<PendingBucket<T>> {
        Ok(PendingBucket::from_work(
            comm.all_reduce_async(bucket, ReduceOp::Avg)?,
        ))
    }
    fn name(&self) -> &str {
        "allreduce"
    }
}

/// A 16-bit float the compression hooks can carry.
trait Half: Element + Copy {
    fn from_f32s(src: &[f32], dst: &mut [Self]);
    fn to_f32s(src: &[Self], dst: &mut [f32]);
}

impl Half for f16 {
    fn from_f32s(src: &[f32], dst: &mut [Self]) {
        half::slice::HalfFloatSliceExt::convert_from_f32_slice(dst, src);
    }
    fn to_f32s(src: &[Self], dst: &mut [f32]) {
        half::slice::HalfFloatSliceExt::convert_to_f32_slice(src, dst);
    }
}

impl Half for bf16 {
    fn from_f32s(src: &[f32], dst: &mut [Self]) {
        half::slice::HalfFloatSliceExt::convert_from_f32_slice(dst, src);
    }
    fn to_f32s(src: &[Self], dst: &mut [f32]) {
        half::slice::HalfFloatSliceExt::convert_to_f32_slice(src, dst);
    }
}

/// Divide by the world size, cast to `H`, allreduce (sum) in `H`, cast back
/// into the original buffer. The division comes first, as in PyTorch's
/// compression hooks, so that sums of many ranks cannot overflow f16's
/// range; it costs the precision of values that drop into f16's subnormals.
fn compress_launch<T: Element, H: Half>(
    comm: &Communicator,
    mut bucket: Bucket<T>,
) -> Result<PendingBucket<T>> {
    let n = comm.size() as f64;
    let mut small = vec![<H as Element>::from_f64(0.0); bucket.len()];
    if T::DTYPE == DataType::F32 {
        // The common case, through half's vectorised conversion.
        let src: &mut [f32] = bytemuck::cast_slice_mut(&mut bucket[..]);
        let inv = (1.0 / n) as f32;
        for v in src.iter_mut() {
            *v *= inv;
        }
        H::from_f32s(src, &mut small);
    } else {
        for (s, v) in small.iter_mut().zip(bucket.iter()) {
            *s = <H as Element>::from_f64(v.to_f64() / n);
        }
    }
    let work = comm.all_reduce_async(small, ReduceOp::Sum)?;
    Ok(PendingBucket::then(work, move |small: Vec<H>| {
        if T::DTYPE == DataType::F32 {
            H::to_f32s(&small, bytemuck::cast_slice_mut(&mut bucket[..]));
        } else {
            for (v, s) in bucket.iter_mut().zip(&small) {
                *v = T::from_f64(s.to_f64());
            }
        }
        Ok(bucket)
    }))
}

/// Compress buckets to IEEE half precision on the wire (PyTorch's
/// `fp16_compress_hook`): half the bytes of f32, about three decimal
/// digits, range up to 65504 (values are divided by the world size before
/// the cast, so sums stay in range).
#[derive(Debug, Clone, Copy, Default)]
pub struct Fp16CompressHook;

impl<T: Element> CommHook<T> for Fp16CompressHook {
    fn launch(&self, comm: &Communicator, bucket: Bucket<T>) -> Result<PendingBucket<T>> {
        compress_launch::<T, f16>(comm, bucket)
    }
    fn name(&self) -> &str {
        "fp16_compress"
    }
}

/// Compress buckets to bfloat16 on the wire (PyTorch's
/// `bf16_compress_hook`): half the bytes of f32, f32's range, about two
/// decimal digits.
#[derive(Debug, Clone, Copy, Default)]
pub struct Bf16CompressHook;

impl<T: Element> CommHook<T> for Bf16CompressHook {
    fn launch(&self, comm: &Communicator, bucket: Bucket<T>) -> Result<PendingBucket<T>> {
        compress_launch::<T, bf16>(comm, bucket)
    }
    fn name(&self) -> &str {
        "bf16_compress"
    }
}
