//! The device executor's kernels (`kernels/executor.cu`): one kernel per
//! (protocol, op, type) that runs a rank's encoded program (ferroccl's
//! `algo::encode`, docs/device-executor.md), one thread block per channel,
//! over FIFOs in device memory (docs/cuda-ipc.md).
//!
//! This module holds the source NVRTC compiles (`kernels/reduce.cu` for the
//! element types and ops, then `kernels/executor.cu`, then one generated
//! `extern "C"` line per kernel), the kernels' names, and the structures
//! the launcher shares with them ([`Conn`], [`Control`]) laid out as the
//! kernel's C structs are: their sizes and every field's offset are checked
//! against the C compiler's in the host run of the kernels (ferroccl's
//! `exec::oracle` tests) and here against the documented numbers.
//!
//! Signature of every kernel (`T` the element):
//!
//! ```text
//! ferroccl_exec_{bulk,ll}_{sum,prod,min,max}_T(const unsigned char *program,
//!     T *input, T *output, Conn *conns, Control *ctl)
//! ```
//!
//! Grid: the program's channel count; block: [`EXEC_THREADS`] threads.
//! Avg runs the Sum kernel (the program's finish divides); calls that
//! reduce nothing run the Sum kernel of their type too.

use crate::error::{CudaError, Result};
use crate::{kernels, DataType, ReduceOp};
use std::sync::OnceLock;

/// The executor's part of the source.
pub const EXECUTOR_CU: &str = include_str!("../kernels/executor.cu");

/// The lines that let the host's C++ compiler build the kernels' source,
/// for tests that run it on the CPU (`kernels/host_emulation.h`).
pub const HOST_EMULATION_H: &str = include_str!("../kernels/host_emulation.h");

/// Threads per block of every executor kernel (`__launch_bounds__`).
pub const EXEC_THREADS: u32 = 512;

/// How frames travel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Protocol {
    /// Slots of several hundred KiB: data, a fence, then the tail counter.
    Bulk,
    /// 16-byte lines of 8 data bytes and two flags: no counter, no fence.
    LowLatency,
}

impl Protocol {
    /// Both, bulk first.
    pub const ALL: [Protocol; 2] = [Protocol::Bulk, Protocol::LowLatency];

    /// The name in kernel names and logs: `bulk`, `ll`.
    pub const fn name(self) -> &'static str {
        match self {
            Protocol::Bulk => "bulk",
            Protocol::LowLatency => "ll",
        }
    }

    /// The kernel's template argument (`BULK`, `LL`).
    const fn code(self) -> u32 {
        match self {
            Protocol::Bulk => 0,
            Protocol::LowLatency => 1,
        }
    }
}

/// One peer on one channel as the kernel sees it (`struct Conn` of
/// `executor.cu`): the FIFO toward the peer, in the peer's memory and
/// mapped here, and the FIFO from the peer, ours. Pointers are device
/// addresses (0 where there is no connection). The counts persist from
/// call to call; only one block touches an entry while a kernel runs.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Conn {
    /// Bulk: `slots * slot_bytes` bytes in the peer's memory.
    pub send_slots: u64,
    /// Bulk: a word per slot in the peer's memory, `len | tag << 32`.
    pub send_meta: u64,
    /// Bulk: frames published, the peer's word.
    pub send_tail: u64,
    /// Bulk: frames the peer has freed, our word.
    pub send_head: u64,
    /// LL: `ll_slots * ll_lines` lines of 16 bytes, the peer's.
    pub send_ll: u64,
    /// LL: frames the peer has freed, our word.
    pub send_ll_head: u64,
    /// Bulk: our slots.
    pub recv_slots: u64,
    /// Bulk: our meta words.
    pub recv_meta: u64,
    /// Bulk: our tail word, which the peer raises.
    pub recv_tail: u64,
    /// Bulk: the peer's `send_head` word, which we raise.
    pub recv_head: u64,
    /// LL: our lines.
    pub recv_ll: u64,
    /// LL: the peer's `send_ll_head`, which we raise.
    pub recv_ll_head: u64,
    /// Bulk frames sent so far.
    pub sent: u64,
    /// Bulk frames received so far.
    pub received: u64,
    /// LL frames sent so far (cleaning frames included).
    pub ll_sent: u64,
    /// LL frames received so far (cleaning frames included).
    pub ll_received: u64,
    /// LL: the cleaning's period in frames (nonzero): the receiver
    /// rewrites `ll_slots` slots in every `ll_clean` frames.
    pub ll_clean: u64,
    /// Bulk slots.
    pub slots: u32,
    /// Bytes of a bulk slot (a multiple of 16).
    pub slot_bytes: u32,
    /// LL slots.
    pub ll_slots: u32,
    /// Lines of an LL slot, the header line included.
    pub ll_lines: u32,
}

/// Bytes of [`Conn`] (and of the C struct).
pub const CONN_BYTES: usize = 152;

impl Conn {
    /// The entry as the kernel reads it: 152 little-endian bytes.
    pub fn to_bytes(&self) -> [u8; CONN_BYTES] {
        let mut b = [0u8; CONN_BYTES];
        let words = [
            self.send_slots,
            self.send_meta,
            self.send_tail,
            self.send_head,
            self.send_ll,
            self.send_ll_head,
            self.recv_slots,
            self.recv_meta,
            self.recv_tail,
            self.recv_head,
            self.recv_ll,
            self.recv_ll_head,
            self.sent,
            self.received,
            self.ll_sent,
            self.ll_received,
            self.ll_clean,
        ];
        for (i, w) in words.iter().enumerate() {
            b[8 * i..8 * i + 8].copy_from_slice(&w.to_le_bytes());
        }
        for (i, w) in [self.slots, self.slot_bytes, self.ll_slots, self.ll_lines]
            .iter()
            .enumerate()
        {
            b[136 + 4 * i..140 + 4 * i].copy_from_slice(&w.to_le_bytes());
        }
        b
    }
}

/// A table of entries as the kernel reads it.
pub fn conns_to_bytes(conns: &[Conn]) -> Vec<u8> {
    conns.iter().flat_map(|c| c.to_bytes()).collect()
}

/// Per launch: the abort word and the first error (`struct Control`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Control {
    /// Device address of the abort word (mapped host memory).
    pub abort: u64,
    /// Spins between reads of the abort word.
    pub spin_check: u32,
    /// Blocks that have ended; the last resets it to 0.
    pub done: u32,
    /// The first error's code ([`ExecFault`]), 0 for none.
    pub error: u32,
    /// Where: the channel.
    pub channel: u32,
    /// Where: the record's index in its channel.
    pub record: u32,
    /// Where: the peer.
    pub peer: u32,
    /// What was expected.
    pub want: u64,
    /// What came.
    pub got: u64,
}

/// Bytes of [`Control`] (and of the C struct).
pub const CONTROL_BYTES: usize = 48;

impl Control {
    /// As the kernel reads it: 48 little-endian bytes.
    pub fn to_bytes(&self) -> [u8; CONTROL_BYTES] {
        let mut b = [0u8; CONTROL_BYTES];
        b[0..8].copy_from_slice(&self.abort.to_le_bytes());
        for (i, w) in [
            self.spin_check,
            self.done,
            self.error,
            self.channel,
            self.record,
            self.peer,
        ]
        .iter()
        .enumerate()
        {
            b[8 + 4 * i..12 + 4 * i].copy_from_slice(&w.to_le_bytes());
        }
        b[32..40].copy_from_slice(&self.want.to_le_bytes());
        b[40..48].copy_from_slice(&self.got.to_le_bytes());
        b
    }

    /// What a kernel left, from its bytes; `None` unless 48 bytes.
    pub fn from_bytes(b: &[u8]) -> Option<Control> {
        if b.len() != CONTROL_BYTES {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Some(Control {
            abort: u64_at(0),
            spin_check: u32_at(8),
            done: u32_at(12),
            error: u32_at(16),
            channel: u32_at(20),
            record: u32_at(24),
            peer: u32_at(28),
            want: u64_at(32),
            got: u64_at(40),
        })
    }
}

/// One launch of the device executor's kernel: what
/// [`Engine::launch_executor`](crate::device::Engine::launch_executor)
/// enqueues. Every address is in the kernels' address space (device
/// pointers; the stand-in's are host addresses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecLaunch {
    /// The protocol of the kernel.
    pub protocol: Protocol,
    /// The reduction (`None`: a call that reduces nothing runs Sum's).
    pub op: Option<ReduceOp>,
    /// The element type.
    pub ty: DataType,
    /// Blocks: the program's channels (at least 1).
    pub channels: u32,
    /// The program image.
    pub program: u64,
    /// The input buffer (in place: the one buffer, given twice).
    pub input: u64,
    /// The output buffer.
    pub output: u64,
    /// The `Conn` table, `channels * ranks` entries.
    pub conns: u64,
    /// The call's [`Control`].
    pub ctl: u64,
}

/// The LL cleaning's period in production: no line is older than this
/// plus the slot count, far below the 2^32 frames at which a flag repeats.
pub const LL_CLEAN_FRAMES: u64 = 1 << 30;

/// What a kernel reports in [`Control::error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExecFault {
    /// The abort word was set (abort(), the timeout, a peer's failure).
    Aborted,
    /// A frame carried another tag.
    Tag,
    /// A frame carried another length.
    Length,
    /// A frame larger than a slot.
    TooBig,
    /// No connection to the peer on the channel.
    NoConnection,
    /// The image does not fit the kernel (magic, version, element size,
    /// grid).
    Program,
}

impl ExecFault {
    /// The fault of a nonzero code; `None` for 0 and for codes the kernel
    /// does not write.
    pub fn from_code(code: u32) -> Option<ExecFault> {
        Some(match code {
            1 => ExecFault::Aborted,
            2 => ExecFault::Tag,
            3 => ExecFault::Length,
            4 => ExecFault::TooBig,
            5 => ExecFault::NoConnection,
            6 => ExecFault::Program,
            _ => return None,
        })
    }

    /// Says what went wrong where, from a kernel's [`Control`].
    pub fn describe(ctl: &Control) -> Option<String> {
        let fault = ExecFault::from_code(ctl.error)?;
        let at = format!(
            "channel {} record {} (peer {})",
            ctl.channel, ctl.record, ctl.peer
        );
        Some(match fault {
            ExecFault::Aborted => format!("aborted while waiting at {at}"),
            ExecFault::Tag => format!(
                "frame tagged {} where {} was due at {at}",
                ctl.got, ctl.want
            ),
            ExecFault::Length => format!(
                "frame of {} elements where {} were due at {at}",
                ctl.got, ctl.want
            ),
            ExecFault::TooBig => format!(
                "frame of {} bytes larger than a slot of {} at {at}",
                ctl.got, ctl.want
            ),
            ExecFault::NoConnection => format!("no connection at {at}"),
            ExecFault::Program => format!(
                "program does not fit the kernel (want {}, got {})",
                ctl.want, ctl.got
            ),
        })
    }
}

/// The ops that have kernels of their own (Avg runs Sum's).
pub const KERNEL_OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max];

/// The op whose kernel a call runs: its combining op (Avg combines as
/// Sum), and Sum for a call that reduces nothing.
pub fn kernel_op(op: Option<ReduceOp>) -> ReduceOp {
    op.map_or(ReduceOp::Sum, kernels::combining)
}

/// Name of the kernel of (protocol, op, type), e.g.
/// `ferroccl_exec_ll_sum_bf16`; `None` (a call that reduces nothing) and
/// Avg name the Sum kernel.
pub fn kernel_name(protocol: Protocol, op: Option<ReduceOp>, ty: DataType) -> String {
    let op = kernel_op(op);
    format!(
        "ferroccl_exec_{}_{}_{}",
        protocol.name(),
        op.name(),
        ty.short_name()
    )
}

/// Every kernel of the source, each once.
pub fn names() -> &'static [String] {
    static NAMES: OnceLock<Vec<String>> = OnceLock::new();
    NAMES.get_or_init(|| {
        let mut v = Vec::new();
        for p in Protocol::ALL {
            for op in KERNEL_OPS {
                for ty in DataType::ALL {
                    v.push(kernel_name(p, Some(op), ty));
                }
            }
        }
        v
    })
}

/// The element struct of `reduce.cu` that a type's kernels use
/// (`EF32`, `EBF16`, ...), for code that calls the kernels by type.
pub fn element_struct(ty: DataType) -> &'static str {
    kernels::element(ty)
}

/// The variable that sets how many 16-byte units a thread of the
/// executor reads before it writes them (the kernel's
/// `FERROCCL_EXEC_UNROLL`, 4 unless set): for measuring, 1 to 4 (8
/// spills registers, which the compile refuses).
pub const UNROLL_ENV: &str = "FERROCCL_EXEC_UNROLL";

/// The compile option for [`UNROLL_ENV`]'s `value`: none where it is
/// unset or empty, the define where it is 1 to 4, an error naming the
/// variable otherwise.
pub fn unroll_option(value: Option<&str>) -> Result<Option<String>> {
    let Some(v) = value.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    match v.parse::<u32>() {
        Ok(u) if (1..=4).contains(&u) => Ok(Some(format!("-DFERROCCL_EXEC_UNROLL={u}"))),
        _ => Err(CudaError::InvalidArgument(format!(
            "{UNROLL_ENV}='{v}': units a thread reads before it writes, 1 to 4"
        ))),
    }
}

/// The `extern "C"` line of one kernel.
pub fn entry_point(protocol: Protocol, op: ReduceOp, ty: DataType) -> String {
    let (e, c) = (kernels::element(ty), kernels::combiner(op));
    format!(
        "extern \"C\" __global__ void __launch_bounds__({EXEC_THREADS}, 1) {name}(\
         const unsigned char* program, ferroccl::{e}::T* input, ferroccl::{e}::T* output, \
         ferroccl::Conn* conns, ferroccl::Control* ctl) {{ ferroccl::execute<ferroccl::{e}, \
         ferroccl::{c}, {proto}>(program, input, output, conns, ctl); }}\n",
        name = kernel_name(protocol, Some(op), ty),
        proto = protocol.code(),
    )
}

/// The `extern "C"` kernel lines (without the hand-written part).
pub fn entry_points() -> &'static str {
    static LINES: OnceLock<String> = OnceLock::new();
    LINES.get_or_init(|| {
        let mut s = String::new();
        for p in Protocol::ALL {
            for op in KERNEL_OPS {
                for ty in DataType::ALL {
                    s.push_str(&entry_point(p, op, ty));
                }
            }
        }
        s
    })
}

/// The source of the executor with only the given kernels: what a
/// launcher compiles on first use of a (protocol, op, type), and what the
/// host run of the kernels builds.
pub fn source_for(kernels: &[(Protocol, ReduceOp, DataType)]) -> String {
    let mut s = format!("{}\n{EXECUTOR_CU}\n", kernels::KERNELS_CU);
    for &(p, op, ty) in kernels {
        s.push_str(&entry_point(p, op, ty));
    }
    s
}

/// The full source NVRTC compiles for the executor.
pub fn source() -> &'static str {
    static SOURCE: OnceLock<String> = OnceLock::new();
    SOURCE.get_or_init(|| format!("{}\n{EXECUTOR_CU}\n{}", kernels::KERNELS_CU, entry_points()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::mem::{offset_of, size_of};

    #[test]
    fn unroll_is_a_define_from_1_to_4_or_an_error_naming_the_variable() {
        assert_eq!(unroll_option(None).unwrap(), None);
        assert_eq!(unroll_option(Some(" ")).unwrap(), None);
        assert_eq!(
            unroll_option(Some("2")).unwrap().as_deref(),
            Some("-DFERROCCL_EXEC_UNROLL=2")
        );
        for bad in ["0", "5", "8", "x", "-1"] {
            let e = unroll_option(Some(bad)).unwrap_err().to_string();
            assert!(e.contains(UNROLL_ENV) && e.contains(bad), "{e}");
        }
    }

    #[test]
    fn structs_have_the_documented_layout() {
        assert_eq!(size_of::<Conn>(), CONN_BYTES);
        assert_eq!(offset_of!(Conn, recv_slots), 48);
        assert_eq!(offset_of!(Conn, sent), 96);
        assert_eq!(offset_of!(Conn, ll_clean), 128);
        assert_eq!(offset_of!(Conn, slots), 136);
        assert_eq!(offset_of!(Conn, ll_lines), 148);
        assert_eq!(size_of::<Control>(), CONTROL_BYTES);
        assert_eq!(offset_of!(Control, error), 16);
        assert_eq!(offset_of!(Control, want), 32);
    }

    #[test]
    fn every_kernel_is_defined_once() {
        let n = names();
        assert_eq!(n.len(), 2 * 4 * DataType::ALL.len());
        assert_eq!(n.iter().collect::<HashSet<_>>().len(), n.len());
        let src = source();
        for name in n {
            assert_eq!(src.matches(&format!(" {name}(")).count(), 1, "{name}");
        }
        assert_eq!(
            kernel_name(Protocol::LowLatency, Some(ReduceOp::Avg), DataType::Bf16),
            "ferroccl_exec_ll_sum_bf16"
        );
        assert_eq!(
            kernel_name(Protocol::Bulk, None, DataType::U8),
            "ferroccl_exec_bulk_sum_u8"
        );
        assert!(!EXECUTOR_CU
            .lines()
            .any(|l| l.trim_start().starts_with("#include")));
    }

    #[test]
    fn bytes_sit_at_the_struct_offsets() {
        let c = Conn {
            recv_slots: 0x1122,
            sent: 7,
            ll_clean: 9,
            slots: 3,
            ll_lines: 17,
            ..Conn::default()
        };
        let b = c.to_bytes();
        let at = |o: usize, n: usize| {
            u64::from_le_bytes({
                let mut w = [0u8; 8];
                w[..n].copy_from_slice(&b[o..o + n]);
                w
            })
        };
        assert_eq!(at(offset_of!(Conn, recv_slots), 8), 0x1122);
        assert_eq!(at(offset_of!(Conn, sent), 8), 7);
        assert_eq!(at(offset_of!(Conn, ll_clean), 8), 9);
        assert_eq!(at(offset_of!(Conn, slots), 4), 3);
        assert_eq!(at(offset_of!(Conn, ll_lines), 4), 17);
        assert_eq!(conns_to_bytes(&[c, c]).len(), 2 * CONN_BYTES);
        let k = Control {
            abort: 0xdead,
            spin_check: 5,
            error: 2,
            peer: 4,
            want: 6,
            got: 8,
            ..Control::default()
        };
        assert_eq!(Control::from_bytes(&k.to_bytes()), Some(k));
        assert_eq!(Control::from_bytes(&[0; 47]), None);
    }

    #[test]
    fn faults_are_described() {
        for code in 1..=6 {
            let ctl = Control {
                error: code,
                channel: 3,
                record: 7,
                peer: 2,
                want: 5,
                got: 9,
                ..Control::default()
            };
            let s = ExecFault::describe(&ctl).unwrap();
            assert!(!s.is_empty());
            if code != 6 {
                assert!(s.contains("channel 3 record 7 (peer 2)"), "{s}");
            }
        }
        assert_eq!(ExecFault::from_code(0), None);
        assert_eq!(ExecFault::from_code(7), None);
    }
}
