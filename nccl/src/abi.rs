//! The values and layouts of NCCL's C API that callers compiled against
//! NCCL's header depend on: result codes, data types, reduction operators,
//! the 128-byte unique id and the versioned config struct. Read off NCCL's
//! public header; nothing here moves data. The result codes are defined
//! in `status` (beside the failure that carries one) and re-exported here;
//! a PreMulSum operator ([`PreMul`]) is here so that `comm` keeps them
//! without importing `call`.

use crate::status::Failure;
use ferroccl::{DataType, ReduceOp};
use std::ffi::c_int;

/// `ncclResult_t` values (defined beside `Failure`, which carries one,
/// so that status needs nothing of this module).
pub use crate::status::result;

/// The version this library reports (`ncclGetVersion`): the ABI of NCCL
/// 2.28, whose symbols PyTorch 2.11 imports.
pub const VERSION_CODE: c_int = 2 * 10000 + 28 * 100 + 3;

/// `NCCL_API_MAGIC`: the magic of every versioned struct (the config).
pub const API_MAGIC: u32 = 0xcafe_beef;

/// `NCCL_SPLIT_NOCOLOR`.
pub const SPLIT_NOCOLOR: c_int = -1;
/// `NCCL_SHRINK_DEFAULT`: the parent is left as it is.
pub const SHRINK_DEFAULT: c_int = 0x00;
/// `NCCL_SHRINK_ABORT`: the parent's calls in flight are ended first.
pub const SHRINK_ABORT: c_int = 0x01;

/// `ncclNumOps`: the first value of a user-created operator.
pub const NUM_OPS: c_int = 5;

/// `NCCL_UNIQUE_ID_BYTES`.
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`: 128 opaque bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId {
    /// What ranks need to meet (`crate::uid`).
    pub internal: [u8; UNIQUE_ID_BYTES],
}

/// The element type of a C `ncclDataType_t` (the library's one
/// vocabulary, `ferroccl-types`); fp8 (10, 11) and anything else are
/// refused.
pub fn data_type(value: c_int) -> Result<DataType, Failure> {
    Ok(match value {
        0 => DataType::I8,
        1 => DataType::U8,
        2 => DataType::I32,
        3 => DataType::U32,
        4 => DataType::I64,
        5 => DataType::U64,
        6 => DataType::F16,
        7 => DataType::F32,
        8 => DataType::F64,
        9 => DataType::Bf16,
        10 | 11 => {
            return Err(Failure::invalid_argument(format!(
                "datatype {value} ({}) is not supported yet",
                if value == 10 {
                    "ncclFloat8e4m3"
                } else {
                    "ncclFloat8e5m2"
                }
            )))
        }
        other => {
            return Err(Failure::invalid_argument(format!(
                "datatype {other} is not an ncclDataType_t (0 to 11)"
            )))
        }
    })
}

/// A built-in `ncclRedOp_t` (below `ncclNumOps`), or `None` for a value at
/// or above it (a user operator, looked up on the communicator).
pub fn builtin_op(value: c_int) -> Result<Option<ReduceOp>, Failure> {
    Ok(Some(match value {
        0 => ReduceOp::Sum,
        1 => ReduceOp::Prod,
        2 => ReduceOp::Max,
        3 => ReduceOp::Min,
        4 => ReduceOp::Avg,
        v if v >= NUM_OPS => return Ok(None),
        v => {
            return Err(Failure::invalid_argument(format!(
                "op {v} is not an ncclRedOp_t (0 to 4 built in, {NUM_OPS} and up created)"
            )))
        }
    }))
}

/// The head of `ncclConfig_t` that every version shares, and the fields
/// this library reads; later fields are read only where `size` says the
/// caller's struct has them.
#[repr(C)]
pub struct ConfigHead {
    /// `sizeof(ncclConfig_t)` of the caller's header.
    pub size: usize,
    /// `NCCL_API_MAGIC`.
    pub magic: u32,
    /// `NCCL_VERSION_CODE` of the caller's header.
    pub version: u32,
    /// 0: non-blocking communicator (calls may return `ncclInProgress`).
    pub blocking: c_int,
}

/// The smallest config a caller can hand over: NCCL 2.14's, the first
/// with the struct (size, magic, version, blocking, cgaClusterSize,
/// minCTAs, maxCTAs, netName).
pub const CONFIG_MIN_SIZE: usize = 40;
/// A bound on the size of any config: far beyond every version's.
pub const CONFIG_MAX_SIZE: usize = 4096;
/// `NCCL_VERSION(2, 14, 0)`: the first version with the config struct.
pub const CONFIG_MIN_VERSION: u32 = 21400;
/// Byte offset of `commName` (a `const char*`), present in every config
/// of at least `COMM_NAME_OFFSET + 8` bytes.
pub const COMM_NAME_OFFSET: usize = 48;

/// What this library takes from a caller's config.
#[derive(Debug, Clone, Default)]
pub struct CommConfig {
    /// The config asked for a non-blocking communicator (which this
    /// library serves by completing every call before it returns).
    pub nonblocking: bool,
    /// `commName`, for messages.
    pub name: Option<String>,
}

/// Check and read a caller's `ncclConfig_t` (NULL: the defaults).
///
/// # Safety
/// `config` is NULL or points at a readable struct of at least
/// `CONFIG_MIN_SIZE` bytes whose `size` field tells its true size, and
/// whose `commName`, where present and not NULL, is a NUL-terminated
/// string.
pub unsafe fn read_config(config: *const ConfigHead) -> Result<CommConfig, Failure> {
    if config.is_null() {
        return Ok(CommConfig::default());
    }
    // SAFETY: the caller vouches for a readable head of the struct.
    let head = unsafe { &*config };
    if head.magic != API_MAGIC {
        return Err(Failure::invalid_argument(format!(
            "config: magic {:#x} is not NCCL_API_MAGIC ({API_MAGIC:#x}): initialise the struct \
             with NCCL_CONFIG_INITIALIZER",
            head.magic
        )));
    }
    if !(CONFIG_MIN_SIZE..=CONFIG_MAX_SIZE).contains(&head.size) || head.size % 8 != 0 {
        return Err(Failure::invalid_argument(format!(
            "config: size {} is not the size of an ncclConfig_t (a multiple of 8 from \
             {CONFIG_MIN_SIZE} bytes): initialise the struct with NCCL_CONFIG_INITIALIZER",
            head.size
        )));
    }
    if head.version < CONFIG_MIN_VERSION {
        return Err(Failure::invalid_argument(format!(
            "config: version {} is older than the first config struct (NCCL 2.14, {})",
            head.version, CONFIG_MIN_VERSION
        )));
    }
    let mut out = CommConfig {
        nonblocking: head.blocking == 0,
        name: None,
    };
    if head.size >= COMM_NAME_OFFSET + 8 {
        // SAFETY: the struct is `size` bytes long (the caller vouches) and
        // holds a pointer at this offset, aligned as the struct is.
        let name = unsafe {
            *(config as *const u8)
                .add(COMM_NAME_OFFSET)
                .cast::<*const std::ffi::c_char>()
        };
        if !name.is_null() {
            // SAFETY: a non-NULL commName is a NUL-terminated string.
            let name = unsafe { std::ffi::CStr::from_ptr(name) };
            out.name = Some(name.to_string_lossy().into_owned());
        }
    }
    Ok(out)
}

/// A `ncclRedOpCreatePreMulSum` operator's scalar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scalar {
    /// Read at creation (`ncclScalarHostImmediate`): the value's bytes.
    Value([u8; 8]),
    /// Read at each call (`ncclScalarDevice` given a host address).
    HostPtr(usize),
    /// In CUDA device memory (`ncclScalarDevice`): read on the stream
    /// when it reaches each call; device calls only.
    DevicePtr(usize),
}

/// A user operator: multiply each input by the scalar, then sum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreMul {
    /// The only type it may be used with.
    pub dtype: DataType,
    /// The scalar.
    pub scalar: Scalar,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config as a caller's header lays it out: the head, then
    /// `size - 20` bytes of later fields.
    #[repr(C, align(8))]
    struct Raw([u8; 128]);

    fn config(size: usize, magic: u32, version: u32, name: *const std::ffi::c_char) -> Raw {
        let mut raw = Raw([0; 128]);
        raw.0[..8].copy_from_slice(&size.to_ne_bytes());
        raw.0[8..12].copy_from_slice(&magic.to_ne_bytes());
        raw.0[12..16].copy_from_slice(&version.to_ne_bytes());
        raw.0[16..20].copy_from_slice(&0i32.to_ne_bytes());
        raw.0[COMM_NAME_OFFSET..COMM_NAME_OFFSET + 8]
            .copy_from_slice(&(name as usize).to_ne_bytes());
        raw
    }

    fn read(raw: &Raw) -> Result<CommConfig, Failure> {
        // SAFETY: 128 readable bytes, aligned, every size tried is at most
        // that; the name is NULL or a C string literal.
        unsafe { read_config((raw as *const Raw).cast()) }
    }

    #[test]
    fn configs_are_checked_by_magic_size_and_version_and_read_by_size() {
        let name = c"trainer".as_ptr();
        let good = read(&config(112, API_MAGIC, 22803, name)).unwrap();
        assert!(good.nonblocking);
        assert_eq!(good.name.as_deref(), Some("trainer"));
        // NCCL 2.14's struct ends before commName: the pointer is not read.
        let old = read(&config(40, API_MAGIC, 21400, name)).unwrap();
        assert_eq!(old.name, None);
        for (size, magic, version, field) in [
            (112, 0xcafe_babe, 22803, "magic"),
            (32, API_MAGIC, 22803, "size"),
            (44, API_MAGIC, 22803, "size"),
            (8192, API_MAGIC, 22803, "size"),
            (112, API_MAGIC, 21304, "version"),
        ] {
            let e = read(&config(size, magic, version, name)).unwrap_err();
            assert_eq!(e.code, result::INVALID_ARGUMENT, "{field}: {}", e.message);
            assert!(e.message.contains(field), "{field}: {}", e.message);
        }
        // SAFETY: NULL is the documented "defaults".
        let none = unsafe { read_config(std::ptr::null()) }.unwrap();
        assert!(!none.nonblocking && none.name.is_none());
    }

    #[test]
    fn data_types_and_operators_have_nccls_values() {
        let expected = [
            (0, DataType::I8),
            (1, DataType::U8),
            (2, DataType::I32),
            (3, DataType::U32),
            (4, DataType::I64),
            (5, DataType::U64),
            (6, DataType::F16),
            (7, DataType::F32),
            (8, DataType::F64),
            (9, DataType::Bf16),
        ];
        for (value, dt) in expected {
            assert_eq!(data_type(value).unwrap(), dt);
        }
        for refused in [10, 11, 12, -1] {
            let e = data_type(refused).unwrap_err();
            assert_eq!(e.code, result::INVALID_ARGUMENT);
        }
        let ops = [
            ReduceOp::Sum,
            ReduceOp::Prod,
            ReduceOp::Max,
            ReduceOp::Min,
            ReduceOp::Avg,
        ];
        for (value, op) in ops.into_iter().enumerate() {
            assert_eq!(builtin_op(value as c_int).unwrap(), Some(op));
        }
        assert_eq!(builtin_op(NUM_OPS).unwrap(), None);
        assert!(builtin_op(-1).is_err());
        assert_eq!(std::mem::size_of::<UniqueId>(), 128);
    }
}
