//! The reduction kernels: one source (`kernels/*.cu`), every (op, type)
//! instantiated from it, compiled by NVRTC at first use and cached per
//! device. (Being written.)
