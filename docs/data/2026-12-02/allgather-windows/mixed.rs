//! A 2-rank allgather of ordinary buffers on a communicator with and
//! without a shared window, and of buffers in windows (thread ranks,
//! `ferroccl::testing::run_ranks`): µs a call, rank 0, median of 5 rounds
//! of 20,000 calls. Run: cargo run --release --example mixed
use std::time::Instant;

fn time(comm: &ferroccl::Communicator, mut f: impl FnMut()) -> f64 {
    let mut rounds = Vec::new();
    for _ in 0..5 {
        comm.barrier().unwrap();
        for _ in 0..1000 {
            f();
        }
        let t = Instant::now();
        for _ in 0..20_000 {
            f();
        }
        rounds.push(t.elapsed().as_secs_f64() * 1e6 / 20_000.0);
    }
    rounds.sort_by(|a, b| a.partial_cmp(b).unwrap());
    rounds[2]
}

fn main() {
    let sizes = [256usize, 512, 1024, 2048, 4096, 8192];
    let out = ferroccl::testing::run_ranks(2, |comm| {
        let mut rows = Vec::new();
        for &bytes in &sizes {
            let n = bytes / 4;
            let mine = vec![comm.rank() as f32; n];
            let mut got = vec![0f32; 2 * n];
            let plain = time(&comm, || comm.all_gather(&mine, &mut got).unwrap());
            rows.push((bytes, "plain, no window", plain));
        }
        let mut a = comm.alloc_window::<f32>(1 << 16).unwrap();
        let mut b = comm.alloc_window::<f32>(1 << 16).unwrap();
        for &bytes in &sizes {
            let n = bytes / 4;
            let mine = vec![comm.rank() as f32; n];
            let mut got = vec![0f32; 2 * n];
            let mixed = time(&comm, || comm.all_gather(&mine, &mut got).unwrap());
            rows.push((bytes, "plain, window allocated", mixed));
            a[..n].fill(comm.rank() as f32);
            let win = time(&comm, || comm.all_gather(&a[..n], &mut b[..2 * n]).unwrap());
            assert!(b[..n].iter().all(|&v| v == 0.0) && b[n..2 * n].iter().all(|&v| v == 1.0));
            rows.push((bytes, "in windows", win));
        }
        rows
    });
    let ar = ferroccl::testing::run_ranks(2, |comm| {
        let mut rows = Vec::new();
        let sizes = [4096usize, 8192, 16384];
        for &bytes in &sizes {
            let n = bytes / 4;
            let mine = vec![1f32; n];
            let mut got = vec![0f32; n];
            let plain = time(&comm, || comm.all_reduce(&mine, &mut got, ferroccl::ReduceOp::Sum).unwrap());
            rows.push((bytes, "allreduce plain, no window", plain));
        }
        let mut a = comm.alloc_window::<f32>(1 << 14).unwrap();
        let mut b = comm.alloc_window::<f32>(1 << 14).unwrap();
        for &bytes in &sizes {
            let n = bytes / 4;
            let mine = vec![1f32; n];
            let mut got = vec![0f32; n];
            let mixed = time(&comm, || comm.all_reduce(&mine, &mut got, ferroccl::ReduceOp::Sum).unwrap());
            rows.push((bytes, "allreduce plain, window allocated", mixed));
            a[..n].fill(1.0);
            let win = time(&comm, || comm.all_reduce(&a[..n], &mut b[..n], ferroccl::ReduceOp::Sum).unwrap());
            rows.push((bytes, "allreduce in windows", win));
        }
        rows
    });
    for (bytes, what, us) in out[0].iter().chain(&ar[0]) {
        println!("{bytes:6} B input  {what:24} {us:7.3} us");
    }
}
