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

const D_IN: usize = 16;
const D_OUT: usize = 4;
const LAYERS: usize = 3;

type BoxError = Box<dyn std::error::Error>;

fn arg(name: &str, default: f64) -> Result<f64, BoxError> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name) {
        Some(i) => Ok(args
            .get(i + 1)
            .ok_or(format!("{name} needs a value"))?
            .parse()?),
        None => Ok(default),
    }
}

/// Sample `i` of the stream and the output of a fixed "teacher".
fn sample(i: usize) -> (Vec<f32>, Vec<f32>) {
    let x: Vec<f32> = (0..D_IN)
        .map(|j| ((i * 7 + j * 3) as f32 * 0.37).sin())
        .collect();
    let t = (0..D_OUT)
        .map(|o| (x[o] * x[(o + 5) % D_IN] + 0.5 * x[(o + 9) % D_IN]).tanh())
        .collect();
    (x, t)
}

fn main() -> Result<(), BoxError> {
    let steps = arg("--steps", 50.0)? as usize;
    let batch = arg("--batch", 32.0)? as usize;
    let hidden = arg("--hidden", 64.0)? as usize;
    let lr = arg("--lr", 0.2)?;

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
    let dims: Vec<(usize, usize)> = (0..LAYERS)
        .map(|l| {
            let d_in = if l == 0 { D_IN } else { hidden };
            let d_out = if l + 1 == LAYERS { D_OUT } else { hidden };
            (d_in, d_out)
        })
        .collect();
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
                // A hash of (p, i) spread over [-1, 1), Kaiming-uniform scale.
                let k = ((p as u64) << 32 | i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                let u = (k >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
                *x = u / fan_in.sqrt();
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
        let (mut xs, mut ts) = (Vec::new(), Vec::new());
        for i in first..first + shard {
            let (x, t) = sample(i);
            xs.extend(x);
            ts.extend(t);
        }
        let x = Tensor::from_vec(xs, (shard, D_IN), &dev)?;
        let t = Tensor::from_vec(ts, (shard, D_OUT), &dev)?;
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
