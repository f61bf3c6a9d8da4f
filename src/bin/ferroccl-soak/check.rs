//! `Soak`, the per-rank state of a run, and the calls it checks: each kind
//! of collective made on its buffers and every element of the result (and
//! of the buffers that must not change) compared with the reference.
//! Stepping through the sequence is run.rs's.

use crate::buffers::{buffer, make, Buf};
use crate::reference::{garbage, input, moved, reference};
use crate::sequence::{Call, Kind};
use ferroccl::{Communicator, Element, Work};
use std::cell::Cell;

/// A check's outcome: what went wrong, if anything.
pub(crate) type Checked = Result<(), String>;

/// Runs the sequence on one rank.
pub(crate) struct Soak {
    pub(crate) seed: u64,
    pub(crate) verbose: bool,
    /// One wrong expectation left to plant (FERROCCL_SOAK_SABOTAGE=1).
    pub(crate) sabotage: Cell<bool>,
    /// Calls that ran without the slots (inline in the check-in, directly
    /// between windows, or by cross-memory attach), as the communicators
    /// count them.
    pub(crate) direct: Cell<u64>,
}

impl Soak {
    /// Compare `got` with `want(i) = (value, tolerance)`; name the first
    /// difference. `inputs(i)`, where given, lists every rank's input there.
    fn check<T: Element>(
        &self,
        what: &str,
        got: &[T],
        want: impl Fn(usize) -> (f64, f64),
        inputs: Option<&dyn Fn(usize) -> Vec<f64>>,
    ) -> Checked {
        for (i, v) in got.iter().enumerate() {
            let (g, (mut w, tol)) = (v.to_f64(), want(i));
            if self.sabotage.get() {
                self.sabotage.set(false);
                w += 1.0;
            }
            if g.is_nan() || (g - w).abs() > tol {
                let mut msg = format!(
                    "wrong result: {what}: element {i} of {} is {g}, expected {w}",
                    got.len()
                );
                if tol > 0.0 {
                    msg += &format!(" within {tol:e}");
                }
                if let Some(inputs) = inputs {
                    msg += &format!(" (inputs by rank: {:?})", inputs(i));
                }
                return Err(msg);
            }
        }
        Ok(())
    }

    fn check_reduced<T: Element>(
        &self,
        what: &str,
        c: &Call,
        n: usize,
        got: &[T],
        offset: usize,
    ) -> Checked {
        let inputs = |i: usize| (0..n).map(|r| input(c, n, r, offset + i)).collect();
        self.check(what, got, |i| reference(c, n, offset + i), Some(&inputs))
    }

    /// One call on `comm`, checked.
    pub(crate) fn call<T: Element>(&self, comm: &Communicator, c: &Call) -> Checked {
        let (rank, n, count) = (comm.rank(), comm.size(), c.count);
        let err = |e: ferroccl::Error| e.to_string();
        let exact = |v: f64| (v, 0.0);
        let made = Cell::new(0u64);
        // Every rank makes the same number of buffers, in the same order
        // (windows are made by all together).
        let buf = |len: usize, f: &dyn Fn(usize) -> f64| {
            let k = made.get();
            made.set(k + 1);
            buffer::<T>(comm, c, k, len, f)
        };
        let mine = |len: usize| buf(len, &|i| input(c, n, rank, i));
        let junk = |len: usize| buf(len, &|i| garbage(c, i));
        let moving = |len: usize, r: usize| buf(len, &|i| moved(c, r, i));
        match c.kind {
            Kind::AllReduce => {
                let send = mine(count)?;
                let mut recv = junk(count)?;
                comm.all_reduce(&send, &mut recv, c.op).map_err(err)?;
                self.check_reduced("result", c, n, &recv, 0)?;
                self.check("send buffer", &send, |i| exact(input(c, n, rank, i)), None)?;
                send.untouched_around().and(recv.untouched_around())
            }
            Kind::AllReduceInPlace | Kind::AllReduceAsync => {
                let mut buf = mine(count)?;
                comm.all_reduce_in_place(&mut buf, c.op).map_err(err)?;
                self.check_reduced("result", c, n, &buf, 0)?;
                buf.untouched_around()
            }
            Kind::ReduceScatter => {
                let send = mine(count * n)?;
                let mut recv = junk(count)?;
                comm.reduce_scatter(&send, &mut recv, c.op).map_err(err)?;
                self.check_reduced("result", c, n, &recv, rank * count)?;
                self.check("send buffer", &send, |i| exact(input(c, n, rank, i)), None)?;
                send.untouched_around().and(recv.untouched_around())
            }
            Kind::ReduceScatterInPlace => {
                let mut buf = mine(count * n)?;
                comm.reduce_scatter_in_place(&mut buf, c.op).map_err(err)?;
                let block = &buf[rank * count..(rank + 1) * count];
                self.check_reduced("own block", c, n, block, rank * count)?;
                buf.untouched_around()
            }
            Kind::AllGather => {
                let send = moving(count, rank)?;
                let mut recv = junk(count * n)?;
                comm.all_gather(&send, &mut recv).map_err(err)?;
                let want = |j: usize| exact(moved(c, j / count, j % count));
                self.check("result", &recv, want, None)?;
                send.untouched_around().and(recv.untouched_around())
            }
            Kind::AllGatherInPlace => {
                let mut buf = buf(count * n, &|j| {
                    if j / count == rank {
                        moved(c, rank, j % count)
                    } else {
                        garbage(c, j)
                    }
                })?;
                comm.all_gather_in_place(&mut buf).map_err(err)?;
                let want = |j: usize| exact(moved(c, j / count, j % count));
                self.check("result", &buf, want, None)?;
                buf.untouched_around()
            }
            Kind::Broadcast => {
                let mut buf = if rank == c.root {
                    moving(count, rank)?
                } else {
                    junk(count)?
                };
                comm.broadcast(&mut buf, c.root).map_err(err)?;
                self.check("result", &buf, |i| exact(moved(c, c.root, i)), None)?;
                buf.untouched_around()
            }
            Kind::Reduce => {
                let send = mine(count)?;
                let mut recv = if rank != c.root && c.empty_recv {
                    junk(0)?
                } else {
                    junk(count)?
                };
                comm.reduce(&send, &mut recv, c.op, c.root).map_err(err)?;
                if rank == c.root {
                    self.check_reduced("result on the root", c, n, &recv, 0)?;
                } else {
                    let what = "receive buffer off the root (must stay untouched)";
                    self.check(what, &recv, |i| exact(garbage(c, i)), None)?;
                }
                self.check("send buffer", &send, |i| exact(input(c, n, rank, i)), None)?;
                send.untouched_around().and(recv.untouched_around())
            }
            Kind::ReduceInPlace => {
                let mut buf = mine(count)?;
                comm.reduce_in_place(&mut buf, c.op, c.root).map_err(err)?;
                if rank == c.root {
                    self.check_reduced("result on the root", c, n, &buf, 0)?;
                } else {
                    let what = "buffer off the root (must stay unchanged)";
                    self.check(what, &buf, |i| exact(input(c, n, rank, i)), None)?;
                }
                buf.untouched_around()
            }
            Kind::SendRecv => {
                if rank == c.root {
                    let send: Vec<T> = make(count, |i| moved(c, rank, i));
                    comm.send(&send, c.peer).map_err(err)?;
                    self.check("send buffer", &send, |i| exact(moved(c, rank, i)), None)
                } else if rank == c.peer {
                    let mut recv: Vec<T> = make(count, |i| garbage(c, i));
                    comm.recv(&mut recv, c.root).map_err(err)?;
                    self.check("received", &recv, |i| exact(moved(c, c.root, i)), None)
                } else {
                    Ok(())
                }
            }
            Kind::AllToAll => {
                let send = buf(count * n, &|j| moved(c, rank, j))?;
                let mut recv = junk(count * n)?;
                comm.all_to_all(&send, &mut recv).map_err(err)?;
                // Block r of the result is block `rank` of rank r's input.
                let want = |j: usize| exact(moved(c, j / count, rank * count + j % count));
                self.check("result", &recv, want, None)?;
                send.untouched_around().and(recv.untouched_around())
            }
            Kind::Barrier => comm.barrier().map_err(err),
        }
    }

    /// Issue one async allreduce; the returned closure waits and checks.
    pub(crate) fn issue<'a, T: Element>(
        &'a self,
        comm: &Communicator,
        c: &'a Call,
    ) -> Result<Box<dyn FnOnce() -> Checked + 'a>, String> {
        let (rank, n) = (comm.rank(), comm.size());
        let buf: Buf<T> = buffer(comm, c, 0, c.count, &|i| input(c, n, rank, i))?;
        let work: Work<Buf<T>> = comm
            .all_reduce_async(buf, c.op)
            .map_err(|e| e.to_string())?;
        Ok(Box::new(move || {
            let out = work.wait().map_err(|e| e.to_string())?;
            if out.len() != c.count {
                return Err(format!(
                    "wait() returned {} elements, expected {}",
                    out.len(),
                    c.count
                ));
            }
            self.check_reduced("result", c, n, &out, 0)?;
            out.untouched_around()
        }))
    }
}
