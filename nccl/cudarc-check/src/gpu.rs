//! `gpu` mode: the machine's GPU(s) in Candle's pattern (`Id`,
//! `Comm::from_rank`, `all_reduce` of `CudaSlice`s).

use crate::rank::{compare, exchange_id, input, nccl_err, ok};
use cudarc::driver::{CudaContext, CudaSlice};
use cudarc::nccl::{Comm, ReduceOp};
use std::path::Path;

fn drv(call: &str, e: cudarc::driver::DriverError) -> String {
    format!("{call}: {e:?}")
}

pub(crate) fn run(rank: usize, world: usize, dir: &Path) -> Result<(), String> {
    // cudarc's safe `Comm` needs a `CudaStream`, whose context is made
    // through cudarc's driver loader, which panics where libcuda
    // cannot be loaded: say so instead. (Its NCCL calls themselves
    // load only libnccl: the host mode runs without a driver.)
    // SAFETY: tries to open libcuda under cudarc's candidate names.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(
            "no CUDA driver (libcuda) to load: cudarc's safe Comm needs a CudaStream; \
             `host` mode runs cudarc's NCCL calls without one"
                .into(),
        );
    }
    let id = exchange_id(rank, dir, "gpu")?;
    let devices = CudaContext::device_count().map_err(|e| drv("cuDeviceGetCount", e))? as usize;
    if devices == 0 {
        return Err("no CUDA device".into());
    }
    // Ranks share the GPUs round robin: with one GPU, all on it (which
    // real NCCL refuses, ferroccl does not).
    let ctx = CudaContext::new(rank % devices).map_err(|e| drv("CudaContext::new", e))?;
    let stream = ctx.new_stream().map_err(|e| drv("new_stream", e))?;
    let comm = Comm::from_rank(stream.clone(), rank, world, id)
        .map_err(|e| nccl_err("Comm::from_rank", e))?;
    println!(
        "rank {rank}: Comm::from_rank on device {} of {devices}",
        rank % devices
    );

    for n in [1usize, 1000, 4099, 1 << 20, (1 << 22) + 3] {
        let x: Vec<f32> = (0..n).map(|i| input(rank, i) as f32).collect();
        let send = stream.clone_htod(&x).map_err(|e| drv("clone_htod", e))?;
        let mut recv: CudaSlice<f32> = stream.alloc_zeros(n).map_err(|e| drv("alloc_zeros", e))?;
        ok(
            "Comm::all_reduce",
            comm.all_reduce(&send, &mut recv, &ReduceOp::Sum),
        )?;
        let got = stream.clone_dtoh(&recv).map_err(|e| drv("clone_dtoh", e))?;
        compare(&format!("all_reduce sum f32, {n} elements"), &got, |i| {
            (0..world).map(|r| input(r, i)).sum()
        })?;
    }
    println!("rank {rank}: all_reduce (sum, f32, 1 to 4M+3 elements) OK");

    let n = 100_003;
    let mut buf = stream
        .clone_htod(&(0..n).map(|i| input(rank, i)).collect::<Vec<f64>>())
        .map_err(|e| drv("clone_htod", e))?;
    ok(
        "Comm::all_reduce_in_place",
        comm.all_reduce_in_place(&mut buf, &ReduceOp::Max),
    )?;
    let got = stream.clone_dtoh(&buf).map_err(|e| drv("clone_dtoh", e))?;
    compare("all_reduce_in_place max f64", &got, |i| input(world - 1, i))?;

    let root = world - 1;
    let value = |i: usize| i as f32 * 0.25 - 7.0;
    let src = stream
        .clone_htod(&(0..n).map(value).collect::<Vec<f32>>())
        .map_err(|e| drv("clone_htod", e))?;
    let mut dst: CudaSlice<f32> = stream.alloc_zeros(n).map_err(|e| drv("alloc_zeros", e))?;
    let send = (rank == root).then_some(&src);
    ok(
        "Comm::broadcast",
        comm.broadcast(send, &mut dst, root as i32),
    )?;
    let got = stream.clone_dtoh(&dst).map_err(|e| drv("clone_dtoh", e))?;
    compare("broadcast f32", &got, |i| f64::from(value(i)))?;

    let m = 65_537;
    let mine = |r: usize, i: usize| (r * 1_000_003 + i) as i32;
    let src = stream
        .clone_htod(&(0..m).map(|i| mine(rank, i)).collect::<Vec<i32>>())
        .map_err(|e| drv("clone_htod", e))?;
    let mut dst: CudaSlice<i32> = stream
        .alloc_zeros(world * m)
        .map_err(|e| drv("alloc_zeros", e))?;
    ok("Comm::all_gather", comm.all_gather(&src, &mut dst))?;
    let got = stream.clone_dtoh(&dst).map_err(|e| drv("clone_dtoh", e))?;
    compare("all_gather i32", &got, |j| f64::from(mine(j / m, j % m)))?;
    println!("rank {rank}: all_reduce_in_place (max f64), broadcast, all_gather OK");

    // Dropping a `Comm` calls ncclCommAbort (cudarc's Drop), which
    // panics on an error.
    drop(comm);
    println!("rank {rank}: Comm dropped (ncclCommAbort)");
    Ok(())
}
