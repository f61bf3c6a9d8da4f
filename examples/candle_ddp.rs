//! Data-parallel training through a real framework: Candle (candle-core,
//! candle-nn) on the CPU, with ferroccl's reducer averaging the gradients.
//!
//! ```sh
//! cargo build --release -p ferroccl-run -p ferroccl --bin ferroccl-run --features candle --example candle_ddp
//! target/release/ferroccl-run -n 2 -- target/release/examples/candle_ddp --steps 50
//! ```
//!
//! How a framework hands gradients over: Candle's `backward()` returns all
//! gradients at once in a `GradStore` (it has no per-tensor hooks), so the
//! loop gives them to the reducer after backward, last layer first; the
//! buckets still pipeline (the first bucket is reduced while later ones are
//! copied in). The averaged gradients are put back into the `GradStore` and
//! Candle's own SGD applies them. Flags: `--steps` [50], `--batch` [32]
//! global, `--hidden` [64], `--lr` [0.2].

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::{Linear, Module, Optimizer, VarBuilder, VarMap, SGD};
use ferroccl::ddp::{broadcast_parameters, ParamSpec, Reducer, ReducerConfig};
use ferroccl::{Communicator, ReduceOp};

#[path = "common/candle_data.rs"]
mod candle_data;
use candle_data::{batch as sample_batch, initial, layer_dims, num, BoxError, LAYERS};

fn main() -> Result<(), BoxError> {
    let steps = num("--steps", 50.0)? as usize;
    let batch = num("--batch", 32.0)? as usize;
    let hidden = num("--hidden", 64.0)? as usize;
    let lr = num("--lr", 0.2)?;

    let comm = Communicator::from_env()?;
    let (rank, size) = (comm.rank(), comm.size());
    if !batch.is_multiple_of(size) {
        return Err(format!("--batch {batch} is not divisible by {size} ranks").into());
    }
    let shard = batch / size;
    let dev = Device::Cpu;

    // The model, built the framework's way; each process draws its own
    // random initial weights.
    let varmap = VarMap::new();
    let vb = VarBuilder::from_varmap(&varmap, DType::F32, &dev);
    let dims = layer_dims(hidden);
    let layers: Vec<Linear> = dims
        .iter()
        .enumerate()
        .map(|(l, &(i, o))| candle_nn::linear(i, o, vb.pp(format!("fc{l}"))))
        .collect::<candle_core::Result<_>>()?;

    // The parameters in registration (forward) order: the same on every
    // rank, which a HashMap's iteration order would not be.
    let names: Vec<String> = (0..LAYERS)
        .flat_map(|l| [format!("fc{l}.weight"), format!("fc{l}.bias")])
        .collect();
    let vars: Vec<Var> = {
        let data = varmap.data().lock().map_err(|e| e.to_string())?;
        names
            .iter()
            .map(|n| data.get(n).cloned().ok_or(format!("no variable {n}")))
            .collect::<Result<_, _>>()?
    };

    // DDP starts every replica from rank 0's weights. Rank 0 replaces its
    // random draw by a fixed one, so that runs on any number of ranks can be
    // compared (the other ranks keep Candle's draw: the broadcast fixes it).
    let mut host: Vec<Vec<f32>> = vars
        .iter()
        .map(|v| v.as_tensor().flatten_all()?.to_vec1::<f32>())
        .collect::<candle_core::Result<_>>()?;
    if rank == 0 {
        for (p, h) in host.iter_mut().enumerate() {
            let fan_in = dims[p / 2].0 as f32;
            for (i, x) in h.iter_mut().enumerate() {
                *x = initial(p, i, fan_in);
            }
        }
    }
    {
        let mut views: Vec<&mut [f32]> = host.iter_mut().map(|v| &mut v[..]).collect();
        broadcast_parameters(&comm, &mut views)?;
    }
    for (v, h) in vars.iter().zip(&host) {
        v.set(&Tensor::from_slice(h, v.shape(), &dev)?)?;
    }

    let specs: Vec<ParamSpec> = names
        .iter()
        .zip(&host)
        .map(|(n, h)| ParamSpec::new(n.clone(), h.len()))
        .collect();
    let mut reducer = Reducer::<f32>::new(&comm, &specs, ReducerConfig::default())?;
    let mut sgd = SGD::new(vars.clone(), lr)?;

    let mut loss_value = 0f32;
    for step in 0..steps {
        let first = step * batch + rank * shard;
        let (x, t) = sample_batch(first, shard, &dev)?;
        let mut h = x;
        for (l, layer) in layers.iter().enumerate() {
            h = layer.forward(&h)?;
            if l + 1 < LAYERS {
                h = h.relu()?;
            }
        }
        let loss = candle_nn::loss::mse(&h, &t)?;
        loss_value = loss.to_scalar::<f32>()?;

        // Candle computes every gradient here, at once.
        let mut grads = loss.backward()?;
        // Hand them over last layer first, the order backward produced them.
        for (p, var) in vars.iter().enumerate().rev() {
            match grads.get(var) {
                Some(g) => reducer.mark_ready(p, &g.flatten_all()?.to_vec1::<f32>()?)?,
                None => reducer.mark_unused(p)?,
            }
        }
        reducer.finish()?;
        // Put the averages back where the framework's optimizer looks.
        for (p, var) in vars.iter().enumerate() {
            let g = reducer.grad(p).ok_or("no averaged gradient")?;
            grads.insert(var.as_tensor(), Tensor::from_slice(g, var.shape(), &dev)?);
        }
        sgd.step(&grads)?;
        if rank == 0 && (step % 10 == 0 || step + 1 == steps) {
            println!("step {step}: local loss {loss_value:.6}");
        }
    }

    let mut loss = [loss_value];
    comm.all_reduce_in_place(&mut loss, ReduceOp::Avg)?;
    let mut checksum = 0f64;
    for v in &vars {
        for (i, x) in v
            .as_tensor()
            .flatten_all()?
            .to_vec1::<f32>()?
            .iter()
            .enumerate()
        {
            checksum += f64::from(*x) * (1.0 + (i % 7) as f64);
        }
    }
    if rank == 0 {
        println!(
            "ranks={size} steps={steps} loss={:.6} checksum={checksum:.6}",
            loss[0]
        );
    }
    Ok(())
}
