//! One slot buffer of the TCP transport: where a frame's payload waits
//! between the socket and the consumer, and where `send_with` lets its
//! closure fill a frame. Plain memory; who holds a slot when is the
//! business of `connection` and `wire`.

/// One slot buffer, 8-byte aligned so that the layer above can view it as
/// a slice of 8-byte elements.
#[derive(Debug)]
pub(crate) struct Slot {
    words: Vec<u64>,
}

impl Slot {
    pub(crate) fn new(chunk_bytes: usize) -> Self {
        Slot {
            words: vec![0u64; chunk_bytes.div_ceil(8)],
        }
    }

    /// The first `len` bytes (`len` is at most the slot size).
    pub(crate) fn bytes(&self, len: usize) -> &[u8] {
        &bytemuck::cast_slice(&self.words)[..len]
    }

    /// The first `len` bytes, writable.
    pub(crate) fn bytes_mut(&mut self, len: usize) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut(&mut self.words)[..len]
    }
}
