//! The shared library answers to NCCL's SONAME, so that a program linked
//! against libnccl.so.2 (or an LD_PRELOAD of it) binds to this library.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    println!("cargo:rerun-if-changed=build.rs");
}
