//! Host staging of device buffers: the order of copies, transfers and
//! kernels, over an engine that is CUDA on a GPU and a host stand-in in
//! the tests. (Being written.)
