//! A 2-rank broadcast and reduce (root 0, f32 sum) of ordinary buffers on
//! a communicator without and with a shared window, and of buffers in
//! windows (thread ranks, `ferroccl::testing::run_ranks`): µs a call,
//! rank 0 and rank 1, median of 5 rounds of 20,000 calls.
//! Run: cargo run --release --example mixed_rooted
use std::time::Instant;

fn time(comm: &ferroccl::Communicator, mut f: impl FnMut()) -> f64 {
    let mut rounds = Vec::new();
    for _ in 0..5 {
        comm.barrier().unwrap();
        for _ in 0..1000 {
            f();
        }
        comm.barrier().unwrap();
        let t = Instant::now();
        for _ in 0..20_000 {
            f();
        }
        comm.barrier().unwrap();
        rounds.push(t.elapsed().as_secs_f64() * 1e6 / 20_000.0);
    }
    rounds.sort_by(|a, b| a.partial_cmp(b).unwrap());
    rounds[2]
}

fn main() {
    let sizes = [4096usize, 8192, 12288, 16384];
    let out = ferroccl::testing::run_ranks(2, |comm| {
        let r = comm.rank() as f32;
        let mut rows = Vec::new();
        let calls =
            |comm: &ferroccl::Communicator, rows: &mut Vec<(usize, String, f64)>, what: &str| {
                for &bytes in &sizes {
                    let n = bytes / 4;
                    let mut buf = vec![r; n];
                    let t = time(comm, || comm.broadcast(&mut buf, 0).unwrap());
                    assert!(buf.iter().all(|&v| v == 0.0));
                    rows.push((bytes, format!("broadcast {what}"), t));
                    let mine = vec![r + 1.0; n];
                    let mut got = vec![0f32; n];
                    let t = time(comm, || {
                        comm.reduce(&mine, &mut got, ferroccl::ReduceOp::Sum, 0)
                            .unwrap()
                    });
                    assert!(comm.rank() != 0 || got.iter().all(|&v| v == 3.0));
                    rows.push((bytes, format!("reduce {what}"), t));
                }
            };
        calls(&comm, &mut rows, "plain, no window");
        let mut a = comm.alloc_window::<f32>(1 << 14).unwrap();
        let mut b = comm.alloc_window::<f32>(1 << 14).unwrap();
        calls(&comm, &mut rows, "plain, window allocated");
        for &bytes in &sizes {
            let n = bytes / 4;
            a[..n].fill(r);
            let t = time(&comm, || comm.broadcast(&mut a[..n], 0).unwrap());
            assert!(a[..n].iter().all(|&v| v == 0.0));
            rows.push((bytes, "broadcast in windows".into(), t));
            a[..n].fill(r + 1.0);
            let t = time(&comm, || {
                comm.reduce(&a[..n], &mut b[..n], ferroccl::ReduceOp::Sum, 0)
                    .unwrap()
            });
            assert!(comm.rank() != 0 || b[..n].iter().all(|&v| v == 3.0));
            rows.push((bytes, "reduce in windows".into(), t));
        }
        rows
    });
    for (i, row) in out[0].iter().enumerate() {
        let (bytes, what, us) = row;
        println!(
            "{bytes:6} B  {what:34} rank 0 {us:7.3} us  rank 1 {:7.3} us",
            out[1][i].2
        );
    }
}
