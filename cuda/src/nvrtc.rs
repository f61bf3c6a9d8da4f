//! NVRTC: finding the library and compiling the kernels (log, spills).
//! (Being written.)
