//! The buffers of a call and where they live. `Io` says whether a call's
//! memory is the host's (slices the CPU reads and writes: `HostIo`, which the
//! host interpreter and the direct window kernels work on) or a device's
//! (`DeviceIo`: addresses the CPU must not touch, moved by the staged
//! executor, `staged`, or by the device executor's kernel, which
//! `comm::device_exec` launches from `ExecIo`). This module owns the
//! offset arithmetic over a call's buffers, in place and out of place; it
//! knows nothing of peers or transports.

use crate::algo::{Operand, Step};
use crate::call::Memory;
use crate::element::{Element, ReduceOp};
use crate::reduce::{
    reduce_into, reduce_into_both, reduce_to_both, reduce_to_output, store, Store,
};
use ferroccl_cuda::device::DevicePtr;
use std::borrow::Cow;
use std::ops::Range;

/// A call's buffers in device memory: where element 0 of the input and of
/// the output live (in place: the same allocation at the plan's bases).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceBuffers {
    pub(crate) input: DevicePtr,
    pub(crate) output: DevicePtr,
}

/// Avg's end on a rank that holds a result: divide `range` of the output
/// by `ranks`, on the device, after the schedule.
#[derive(Debug, Clone)]
pub(crate) struct AvgFinish {
    pub(crate) range: Range<usize>,
    pub(crate) ranks: usize,
}

/// A call's buffers, by where they live.
pub(crate) enum Io<'a, T> {
    /// Host memory.
    Host(HostIo<'a, T>),
    /// Device memory (the device executor or the staged one; made by
    /// `Communicator::device_collective` for the device entry points,
    /// `crate::cuda`). Boxed: a host call moves its `Io` through the
    /// layers, and the device half's descriptor is several times a host
    /// call's (a move of it was a `memcpy` call on every host call).
    Device(Box<DeviceIo>),
}

impl<'a, T> Io<'a, T> {
    /// Separate input and output in host memory.
    pub(crate) fn out_of_place(input: &'a [T], output: &'a mut [T]) -> Self {
        Io::Host(HostIo::OutOfPlace { input, output })
    }

    /// One host buffer; the input starts at `input_base`, the output at
    /// `output_base`.
    pub(crate) fn in_place(buf: &'a mut [T], input_base: usize, output_base: usize) -> Self {
        Io::Host(HostIo::InPlace {
            buf,
            input_base,
            output_base,
        })
    }

    /// Where the buffers live, for the planner.
    #[inline]
    pub(crate) fn memory(&self) -> Memory {
        match self {
            Io::Host(_) => Memory::Host,
            Io::Device(d) => Memory::Device { ordinal: d.ordinal },
        }
    }
}

/// A call's buffers in the memory of one CUDA device: addresses in the
/// device's address space, which the host never dereferences, with the
/// engine that moves them (CUDA, or the host stand-in in tests) and the
/// caller's stream, whose earlier work the call waits for.
#[derive(Clone)]
pub(crate) struct DeviceIo {
    /// The device's ordinal.
    pub(crate) ordinal: u32,
    /// Where the schedule's input and output start.
    pub(crate) bufs: DeviceBuffers,
    /// The device's engine with the communicator's staging resources.
    pub(crate) pool: std::sync::Arc<ferroccl_cuda::stager::StagePool>,
    /// Recorded on the caller's stream at the call: its earlier work,
    /// which the call waits for before its first copy.
    pub(crate) ready: ferroccl_cuda::device::Event,
    /// Avg's division, where this rank holds a result.
    pub(crate) avg: Option<AvgFinish>,
    /// What the device executor needs besides (`comm::device_exec`).
    pub(crate) exec: ExecIo,
    /// The caller's gate and the call's number there: the executor raises
    /// it in stream order after its kernel.
    pub(crate) gate: Option<(ferroccl_cuda::device::Gate, u32)>,
    /// The executor kernels (op, type) this call loads before it runs: a
    /// call that does this does not park its stream (the device rule).
    pub(crate) prepare: Option<(Option<ReduceOp>, crate::element::DataType)>,
}

/// How a device call's buffers lie for the device executor's program.
#[derive(Clone, Copy)]
pub(crate) struct ExecIo {
    /// The call as described by its method.
    pub(crate) coll: crate::coll::CollCall,
    /// Separate (`bufs` as they are) or one buffer at `base` with the
    /// plan's bases.
    pub(crate) layout: crate::algo::encode::Layout,
    /// In place on one buffer: where it starts.
    pub(crate) base: ferroccl_cuda::device::DevicePtr,
}

/// The buffers of a call. Offsets in a schedule are relative to the input
/// and the output; in place, both live in one buffer at the given bases.
pub(crate) enum HostIo<'a, T> {
    /// Separate input and output.
    OutOfPlace { input: &'a [T], output: &'a mut [T] },
    /// One buffer; input starts at `input_base`, output at `output_base`.
    InPlace {
        buf: &'a mut [T],
        input_base: usize,
        output_base: usize,
    },
}

impl<T: Element> HostIo<'_, T> {
    #[inline(always)]
    pub(super) fn input(&self, off: usize, len: usize) -> &[T] {
        match self {
            HostIo::OutOfPlace { input, .. } => &input[off..off + len],
            HostIo::InPlace {
                buf, input_base, ..
            } => &buf[input_base + off..input_base + off + len],
        }
    }

    pub(super) fn output_ref(&self, off: usize, len: usize) -> &[T] {
        match self {
            HostIo::OutOfPlace { output, .. } => &output[off..off + len],
            HostIo::InPlace {
                buf, output_base, ..
            } => &buf[*output_base + off..*output_base + off + len],
        }
    }

    /// The step's local operand: its input, or a partial result in the
    /// output.
    pub(super) fn local(&self, step: &Step) -> &[T] {
        match step.local {
            Operand::Input => self.input(step.input, step.len),
            Operand::Output => self.output_ref(step.output, step.len),
        }
    }

    /// In place with input and output at one place: the output holds the
    /// input already.
    #[inline(always)]
    pub(super) fn in_place_at_one_place(&self) -> bool {
        matches!(self, HostIo::InPlace { input_base, output_base, .. } if input_base == output_base)
    }

    #[inline(always)]
    pub(super) fn output(&mut self, off: usize, len: usize) -> &mut [T] {
        match self {
            HostIo::OutOfPlace { output, .. } => &mut output[off..off + len],
            HostIo::InPlace {
                buf, output_base, ..
            } => &mut buf[*output_base + off..*output_base + off + len],
        }
    }

    /// The step's output, and its local operand unless that is the output
    /// itself (a partial result there, or in place at the same place). An
    /// in-place input elsewhere in the buffer comes as a copy (no schedule
    /// does that today; it stays correct anyway).
    pub(super) fn output_and_input(&mut self, step: &Step) -> (&mut [T], Option<Cow<'_, [T]>>) {
        let len = step.len;
        if step.local == Operand::Output {
            return (self.output(step.output, len), None);
        }
        match self {
            HostIo::OutOfPlace { input, output } => (
                &mut output[step.output..step.output + len],
                Some(Cow::Borrowed(&input[step.input..step.input + len])),
            ),
            HostIo::InPlace {
                buf,
                input_base,
                output_base,
            } => {
                let (i, o) = (*input_base + step.input, *output_base + step.output);
                let input = (i != o).then(|| Cow::Owned(buf[i..i + len].to_vec()));
                (&mut buf[o..o + len], input)
            }
        }
    }

    /// `output[out..] = data op input[inp..]`, whatever aliasing in place.
    pub(super) fn reduce_to_output(&mut self, mode: Store, op: ReduceOp, step: &Step, data: &[T]) {
        match self.output_and_input(step) {
            (out, None) => reduce_into(op, out, data),
            (out, Some(input)) => reduce_to_output(mode, op, out, data, &input),
        }
    }

    /// `reduce_to_output`, and the result also into `copy` (a send slot) in
    /// the same pass.
    pub(super) fn reduce_to_output_and_copy(
        &mut self,
        mode: Store,
        op: ReduceOp,
        step: &Step,
        data: &[T],
        copy: &mut [T],
    ) {
        match self.output_and_input(step) {
            (out, None) => reduce_into_both(mode, op, out, copy, data),
            (out, Some(input)) => reduce_to_both(mode, op, out, copy, data, &input),
        }
    }

    /// `output[out..] = output[out..] op input[inp..]`. In place with both
    /// at the same memory this is `x op x`, as the primitive says.
    pub(super) fn reduce_input_into_output(&mut self, op: ReduceOp, step: &Step) {
        let len = step.len;
        match self {
            HostIo::OutOfPlace { input, output } => reduce_into(
                op,
                &mut output[step.output..step.output + len],
                &input[step.input..step.input + len],
            ),
            HostIo::InPlace {
                buf,
                input_base,
                output_base,
            } => {
                let (i, o) = (*input_base + step.input, *output_base + step.output);
                let input = buf[i..i + len].to_vec();
                reduce_into(op, &mut buf[o..o + len], &input);
            }
        }
    }

    /// `output[out..] = input[inp..]` (a no-op when they are the same memory).
    pub(super) fn copy_input_to_output(&mut self, mode: Store, step: &Step) {
        let len = step.len;
        if step.local == Operand::Output {
            return;
        }
        match self {
            HostIo::OutOfPlace { input, output } => store(
                mode,
                &mut output[step.output..step.output + len],
                &input[step.input..step.input + len],
            ),
            HostIo::InPlace {
                buf,
                input_base,
                output_base,
            } => {
                let (i, o) = (*input_base + step.input, *output_base + step.output);
                if i != o {
                    buf.copy_within(i..i + len, o);
                }
            }
        }
    }

    /// Addresses of the input's and the output's first elements, to find
    /// the window they lie in (`window`).
    pub(super) fn addresses(&self) -> (usize, usize) {
        let elem = std::mem::size_of::<T>();
        match self {
            HostIo::OutOfPlace { input, output } => {
                (input.as_ptr() as usize, output.as_ptr() as usize)
            }
            HostIo::InPlace {
                buf,
                input_base,
                output_base,
            } => {
                let base = buf.as_ptr() as usize;
                (
                    base.wrapping_add(input_base * elem),
                    base.wrapping_add(output_base * elem),
                )
            }
        }
    }

    /// Elements of the larger of input and output (in place: of the whole
    /// buffer).
    pub(super) fn extent_len(&self) -> usize {
        match self {
            HostIo::OutOfPlace { input, output } => input.len().max(output.len()),
            HostIo::InPlace { buf, .. } => buf.len(),
        }
    }

    /// Elements of the output (in place: of the whole buffer).
    pub(super) fn output_len(&self) -> usize {
        match self {
            HostIo::OutOfPlace { output, .. } => output.len(),
            HostIo::InPlace { buf, .. } => buf.len(),
        }
    }
}
