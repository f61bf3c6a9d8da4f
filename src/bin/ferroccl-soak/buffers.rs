//! The buffers of a call: a vector, or a slice of a window made for the
//! call by every rank together, at an offset drawn from the call. Owns the
//! check that a call wrote nothing around its buffer in the window; what
//! goes in the buffer is the caller's (reference.rs).

use crate::check::Checked;
use crate::random::hash;
use crate::sequence::Call;
use ferroccl::{Communicator, Element, Window};

pub(crate) fn make<T: Element>(n: usize, f: impl Fn(usize) -> f64) -> Vec<T> {
    (0..n).map(|i| T::from_f64(f(i))).collect()
}

/// A buffer of a call: a vector, or `len` elements at `at` in a window made
/// for the call (zeroed; the elements around the buffer must stay zero).
pub(crate) enum Buf<T: Element> {
    Vec(Vec<T>),
    Window {
        win: Window<T>,
        at: usize,
        len: usize,
    },
}

impl<T: Element> std::ops::Deref for Buf<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        match self {
            Buf::Vec(v) => v,
            Buf::Window { win, at, len } => &win[*at..*at + *len],
        }
    }
}

impl<T: Element> std::ops::DerefMut for Buf<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        match self {
            Buf::Vec(v) => v,
            Buf::Window { win, at, len } => &mut win[*at..*at + *len],
        }
    }
}

impl<T: Element> Buf<T> {
    /// In a window: that the call wrote nothing outside the buffer.
    pub(crate) fn untouched_around(&self) -> Checked {
        let Buf::Window { win, at, len } = self else {
            return Ok(());
        };
        let outside = (0..*at).chain(at + len..win.len());
        match outside.into_iter().find(|&i| win[i].to_f64() != 0.0) {
            None => Ok(()),
            Some(i) => Err(format!(
                "wrote outside its buffer: element {i} of the window (buffer at {at}, {len} \
                 elements) is {}",
                win[i].to_f64()
            )),
        }
    }
}

/// Buffer number `k` of call `c` on this rank: `len` elements `f(i)`, in a
/// vector or (if the call says so) in a window made for it, every rank
/// together: half the time at the same offset on every rank (buffers that
/// lie alike against cache lines take the fused kernels), else at one of
/// its own.
pub(crate) fn buffer<T: Element>(
    comm: &Communicator,
    c: &Call,
    k: u64,
    len: usize,
    f: &dyn Fn(usize) -> f64,
) -> Result<Buf<T>, String> {
    if !c.windows {
        return Ok(Buf::Vec(make(len, f)));
    }
    let alike = hash(&[c.salt, 7, k]) & 1 == 0;
    let who = if alike { u64::MAX } else { comm.rank() as u64 };
    let at = (hash(&[c.salt, 6, k, who]) % 65) as usize;
    let mut win = comm
        .alloc_window::<T>(at + len + 1)
        .map_err(|e| format!("alloc_window: {e}"))?;
    for (i, x) in win[at..at + len].iter_mut().enumerate() {
        *x = T::from_f64(f(i));
    }
    Ok(Buf::Window { win, at, len })
}
